package httpapi

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/mercator/mercator/store"
)

// The audit log records every mutating call and every refused credential:
// when, who (a token's name, or "node:ID"), from where, what (method, route
// pattern, the object the path names) and the answer's status; never a
// secret or a body. Function invocation is not recorded call by call (it
// is not a mutation of the control plane's state, and it is the hot path;
// its refusals are recorded).
//
// Writes stay off the request's path: Record queues an entry, and Run
// writes what is queued in batches, one transaction each. The queue is
// bounded; an entry that does not fit is dropped and counted (Dropped),
// never waited for.

// auditQueue bounds the entries waiting to be written.
const auditQueue = 8192

// auditBatch bounds the entries one transaction writes.
const auditBatch = 512

// Auditor queues audit entries and writes them. Set Store, Now and Log;
// Dropped, when set, counts entries the full queue refused. Retention and
// MaxRows are the log's retention rule, which Prune applies (the control
// plane's retention sweeper calls it, package sweep).
type Auditor struct {
	Store     store.Store
	Now       func() time.Time
	Log       *slog.Logger
	Dropped   func()
	Retention time.Duration
	MaxRows   int

	once sync.Once
	q    chan store.AuditEntry
}

func (a *Auditor) queue() chan store.AuditEntry {
	a.once.Do(func() { a.q = make(chan store.AuditEntry, auditQueue) })
	return a.q
}

// Record queues e, never blocking. A nil Auditor records nothing.
func (a *Auditor) Record(e store.AuditEntry) {
	if a == nil {
		return
	}
	if e.ID == "" {
		e.ID = NewID("aud-")
	}
	if e.At.IsZero() {
		e.At = a.Now().UTC()
	}
	select {
	case a.queue() <- e:
	default:
		if a.Dropped != nil {
			a.Dropped()
		}
	}
}

// Run writes queued entries until ctx ends, then what is still queued.
func (a *Auditor) Run(ctx context.Context) {
	q := a.queue()
	// Entries already queued are written even as ctx ends: they record
	// calls that were answered.
	write := context.WithoutCancel(ctx)
	for {
		select {
		case <-ctx.Done():
			a.flush(write, q, nil)
			return
		case e := <-q:
			a.flush(write, q, []store.AuditEntry{e})
		}
	}
}

// flush writes batch and whatever else is queued, auditBatch at a time.
func (a *Auditor) flush(ctx context.Context, q chan store.AuditEntry, batch []store.AuditEntry) {
	for {
	fill:
		for len(batch) < auditBatch {
			select {
			case e := <-q:
				batch = append(batch, e)
			default:
				break fill
			}
		}
		if len(batch) == 0 {
			return
		}
		if err := a.Store.Update(ctx, func(tx store.Tx) error { return tx.AppendAudit(batch) }); err != nil {
			a.Log.Warn("audit entries not written", "entries", len(batch), "err", err)
		}
		if len(batch) < auditBatch {
			return
		}
		batch = batch[:0]
	}
}

// Prune applies the log's retention rule once and reports how many
// entries it deleted.
func (a *Auditor) Prune(ctx context.Context) (int, error) {
	if a.Retention <= 0 && a.MaxRows <= 0 {
		return 0, nil
	}
	var before time.Time
	if a.Retention > 0 {
		before = a.Now().Add(-a.Retention)
	}
	var n int
	err := a.Store.Update(ctx, func(tx store.Tx) error { var err error; n, err = tx.PruneAudit(before, a.MaxRows); return err })
	return n, err
}

type auditKey struct{}

// auditNote is what a handler learns about the caller, for the entry its
// wrapper writes.
type auditNote struct {
	mu                sync.Mutex
	who, role, detail string
}

// NoteWho tells the audit wrapper around this request who the caller is.
func NoteWho(ctx context.Context, who, role string) {
	if n, ok := ctx.Value(auditKey{}).(*auditNote); ok {
		n.mu.Lock()
		n.who, n.role = who, role
		n.mu.Unlock()
	}
}

// NoteDetail tells the audit wrapper around this request what it changed
// that its entry should say (store.AuditEntry.Detail); details noted
// earlier in the same request are kept, joined by "; ".
func NoteDetail(ctx context.Context, detail string) {
	if n, ok := ctx.Value(auditKey{}).(*auditNote); ok {
		n.mu.Lock()
		if n.detail != "" {
			detail = n.detail + "; " + detail
		}
		n.detail = detail
		n.mu.Unlock()
	}
}

// Wrap records r in the audit log once h has answered it when it is a
// mutating call (unless skipMutations: the invocation routes) or was
// refused (401, 403).
func (a *Auditor) Wrap(h http.Handler, skipMutations bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		note := &auditNote{}
		rec := &statusWriter{ResponseWriter: w, code: http.StatusOK}
		h.ServeHTTP(rec, r.WithContext(context.WithValue(r.Context(), auditKey{}, note)))
		mutating := r.Method != http.MethodGet && r.Method != http.MethodHead && r.Method != http.MethodOptions
		refused := rec.code == http.StatusUnauthorized || rec.code == http.StatusForbidden
		if !refused && (!mutating || skipMutations) {
			return
		}
		note.mu.Lock()
		who, role, detail := note.who, note.role, note.detail
		note.mu.Unlock()
		a.Record(store.AuditEntry{Who: who, Role: role, Remote: r.RemoteAddr, Method: r.Method,
			Route: r.Pattern, Object: objectOf(r), Status: rec.code, Detail: detail})
	})
}

// objectOf is the first path value the request's pattern names: the ID
// of the object a call concerns.
func objectOf(r *http.Request) string {
	_, path, _ := strings.Cut(r.Pattern, " ")
	for _, seg := range strings.Split(path, "/") {
		if name, ok := strings.CutPrefix(seg, "{"); ok {
			name = strings.TrimSuffix(strings.TrimSuffix(name, "}"), "...")
			return r.PathValue(name)
		}
	}
	return ""
}

// statusWriter captures the status a handler wrote, and passes Flush
// and http.ResponseController's other methods through.
type statusWriter struct {
	http.ResponseWriter
	code  int
	wrote bool
}

func (s *statusWriter) WriteHeader(code int) {
	if !s.wrote {
		s.code, s.wrote = code, true
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	s.wrote = true
	return s.ResponseWriter.Write(b)
}

func (s *statusWriter) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }
