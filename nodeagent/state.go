package nodeagent

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/mercator/mercator/nodeproto"
)

// eventIDBlock is how many event IDs one durable write reserves. NextEventID
// is on the path of every observation, and an fsync per ID would cost more
// than the observation itself; reserving a block keeps IDs monotonic across a
// crash (a restart skips the unused rest of the block) at one fsync per
// block.
const eventIDBlock = 1024

// AppliedRetention is how long an operation stays in the applied memory
// after the control plane acknowledged its result. The control plane stops
// redelivering an operation once it holds the result, so what can still be
// redelivered is only what was already in flight on a session stream when
// the acknowledgement landed; an hour covers that with a wide margin and
// keeps the memory bounded by the rate of operations times one hour.
// Operations whose results were never acknowledged are kept however old they
// are, since those are exactly the ones the control plane will send again.
const AppliedRetention = time.Hour

// State is the agent's local durable memory. It exists for one reason: an
// agent that restarts must be able to say "I already did that" about a
// command it is handed again. Without it, every redelivered launch is a
// second container.
//
// It also holds the session credential, so a restarted agent resumes rather
// than re-enrolling, and the spool of events it owes the control plane.
//
// It never holds a command: an applied operation is remembered by its
// result event alone. Commands carry what must not reach the node's disk
// (a launch's secrets, registry credentials), and a restarted agent gets
// an unfinished launch again, values attached, from the control plane
// (docs/hardening.md, "Run secrets"); anything added here that keeps a
// command must strip those first.
//
// State is one bbolt file, laid out as state_schema.go draws it, with its
// schema version in the file: OpenState migrates an older file and refuses
// a newer one. Every write is one transaction, fsynced before the method
// returns. All methods are safe for concurrent use.
//
// Where this differs from the node-agent design's State: MarkApplied takes the result
// event and spools it in the same transaction as the applied mark, so there
// is no moment at which an operation is remembered as done but its result is
// not owed to the control plane; Acknowledge removes delivered events by ID
// instead of the design's ClearSpool, all-or-nothing, because new events are
// spooled while a batch is in flight.
type State struct {
	db  *bolt.DB
	now func() time.Time

	mu          sync.Mutex
	incarnation string
	nextEvent   uint64
	eventCeil   uint64
	fencing     uint64
	session     storedSession
	hasSession  bool
	told        map[nodeproto.WorkloadKey]nodeproto.WorkloadObservation
	// In memory beside the file, so the hot paths need not read it:
	// unacked maps the result event of every applied operation whose
	// result is not acknowledged yet to the operation (Acknowledge marks
	// exactly those instead of scanning the applied memory), lastPrune is
	// when acknowledged entries were last pruned, and stops holds what
	// RecordStop recorded (observations read it for every workload).
	unacked map[string]string
	stops   map[string]string
	// owed is the spool as the file holds it less what was acknowledged
	// (the file's copy, in memory: Spooled is on every delivery's path and
	// reading and decoding the file there cost a tenth of an agent's
	// time); acks, the acknowledged events not yet removed from the file,
	// with the applied operations whose results they were, and when
	// acknowledged entries were last pruned (see Acknowledge). Under
	// ackMu, not mu: the writes that carry them are made with mu held.
	ackMu     sync.Mutex
	owed      map[uint64]nodeproto.Event
	minting   map[uint64]bool // minted, not yet spooled (state_watermark.go)
	acks      map[uint64]bool
	ackOps    map[string]ackedResult // by operation
	ackSince  time.Time              // when the oldest of acks arrived
	lastPrune time.Time
	// spoolVersion counts the events spooled since the file was opened
	// (SpoolVersion).
	spoolVersion atomic.Uint64
}

type storedSession struct {
	Token     string    `json:"token"`
	ExpiresAt time.Time `json:"expires_at"`
}

// ackedResult is an applied operation's result event, acknowledged at At.
type ackedResult struct {
	ID string
	At time.Time
}

type appliedEntry struct {
	AppliedAt time.Time       `json:"applied_at"`
	Result    nodeproto.Event `json:"result"`
	AckedAt   *time.Time      `json:"acked_at,omitempty"` // only in entries written before bucketAcked
}

// StateOption changes how OpenState opens the state file.
type StateOption func(*bolt.Options)

// WithoutFsync opens the state file without fsync: writes reach the page
// cache and no further, so a crash of the machine (not of the process) may
// forget applied operations, a renewed credential or spooled events — every
// promise State exists for. It is for the fleet simulator, which runs
// thousands of agents on one disk where a real fleet has one disk each, and
// which labels its figures when it is used. Never use it for a real agent.
func WithoutFsync() StateOption { return func(o *bolt.Options) { o.NoSync = true } }

// OpenState opens (creating if needed) the state file in dir. A second
// process opening the same file waits up to a few seconds and then fails:
// two agents sharing one memory would each believe the other's work undone.
func OpenState(dir string, options ...StateOption) (*State, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create state directory %s: %w", dir, err)
	}
	path := filepath.Join(dir, "agent.db")
	// NoFreelistSync: the free-page list is rebuilt when the file is
	// opened instead of written at every commit (a page write less per
	// transaction; the file is small, so the rebuild is quick).
	bo := &bolt.Options{Timeout: 5 * time.Second, NoFreelistSync: true}
	for _, o := range options {
		o(bo)
	}
	db, err := bolt.Open(path, 0o600, bo)
	if err != nil {
		return nil, fmt.Errorf("open agent state %s (is another agent using this --state directory?): %w", path, err)
	}
	db.MaxBatchDelay = batchDelay
	s := &State{db: db, now: time.Now, told: map[nodeproto.WorkloadKey]nodeproto.WorkloadObservation{},
		unacked: map[string]string{}, stops: map[string]string{}, owed: map[uint64]nodeproto.Event{}}
	if err := s.load(); err != nil {
		db.Close()
		return nil, fmt.Errorf("read agent state %s: %w", path, err)
	}
	return s, nil
}

func (s *State) load() error {
	return s.db.Update(func(tx *bolt.Tx) error {
		if err := migrate(tx); err != nil {
			return err
		}
		meta := tx.Bucket(bucketMeta)
		if v := meta.Get(keyIncarnation); v != nil {
			s.incarnation = string(v)
		} else {
			var b [6]byte
			if _, err := rand.Read(b[:]); err != nil {
				return err
			}
			s.incarnation = hex.EncodeToString(b[:])
			if err := meta.Put(keyIncarnation, []byte(s.incarnation)); err != nil {
				return err
			}
		}
		// Start after the last reserved block: IDs handed out before a crash
		// may have reached the control plane, so none may be reused.
		s.eventCeil = getUint(meta.Get(keyEventCeil))
		s.nextEvent = s.eventCeil + 1
		s.eventCeil = s.nextEvent - 1 // forces a reservation on first use
		s.fencing = getUint(meta.Get(keyFencing))
		if v := meta.Get(keySession); v != nil {
			if err := json.Unmarshal(v, &s.session); err != nil {
				return fmt.Errorf("session record: %w", err)
			}
			s.hasSession = s.session.Token != ""
		}
		if err := tx.Bucket(bucketSpool).ForEach(func(k, v []byte) error {
			var e nodeproto.Event
			if err := json.Unmarshal(v, &e); err != nil {
				return fmt.Errorf("spooled event %x: %w", k, err)
			}
			s.owed[getUint(k)] = e
			return nil
		}); err != nil {
			return err
		}
		acked := tx.Bucket(bucketAcked)
		if err := tx.Bucket(bucketApplied).ForEach(func(k, v []byte) error {
			var e appliedEntry
			if json.Unmarshal(v, &e) == nil && e.AckedAt == nil && acked.Get(k) == nil {
				s.unacked[e.Result.ID] = string(k)
			}
			return nil
		}); err != nil {
			return err
		}
		if err := tx.Bucket(bucketStops).ForEach(func(k, v []byte) error {
			s.stops[string(k)] = string(v)
			return nil
		}); err != nil {
			return err
		}
		return tx.Bucket(bucketWorkloads).ForEach(func(_, v []byte) error {
			var o nodeproto.WorkloadObservation
			if err := json.Unmarshal(v, &o); err != nil {
				return fmt.Errorf("workload record: %w", err)
			}
			s.told[o.WorkloadKey] = o
			return nil
		})
	})
}

// Close closes the state file.
// Acknowledgements not yet written are written first, so a clean restart
// does not deliver them again.
func (s *State) Close() error {
	ackErr := s.update(nil)
	if err := s.db.Close(); err != nil {
		return err
	}
	return ackErr
}

// NodeID returns the node this state file belongs to, or "" if it has never
// enrolled.
func (s *State) NodeID() string {
	var id string
	s.db.View(func(tx *bolt.Tx) error {
		id = string(tx.Bucket(bucketMeta).Get(keyNodeID))
		return nil
	})
	return id
}

// NextEventID mints a stable, monotonic identity for one event, so the same
// fact carries the same ID however many times it is delivered. The ID is
// "<incarnation>-<sequence>": the incarnation is random per state file, so a
// machine whose state was wiped never reuses an ID the control plane has
// already seen; the sequence is zero-padded so IDs sort in minting order.
func (s *State) NextEventID() (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nextEvent > s.eventCeil {
		ceil := s.nextEvent + eventIDBlock - 1
		if err := s.update(func(tx *bolt.Tx) error {
			return tx.Bucket(bucketMeta).Put(keyEventCeil, putUint(ceil))
		}); err != nil {
			return "", fmt.Errorf("reserve event IDs: %w", err)
		}
		s.eventCeil = ceil
	}
	n := s.nextEvent
	s.nextEvent++
	s.minted(n)
	return nodeproto.FormatEventID(s.incarnation, n), nil
}

// eventSeq is the sequence part of an ID NextEventID minted; it orders the
// spool.
func eventSeq(id string) (uint64, error) {
	i := strings.LastIndexByte(id, '-')
	if i < 0 {
		return 0, fmt.Errorf("event ID %q has no sequence", id)
	}
	return strconv.ParseUint(id[i+1:], 10, 64)
}

// Enrolled records a fresh enrollment. A new fencing token means the control
// plane has superseded whatever this agent was doing, so the applied-operation
// memory stays and the session is replaced.
func (s *State) Enrolled(nodeID string, e nodeproto.Enrollment) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess := storedSession{Token: e.SessionToken, ExpiresAt: e.ExpiresAt}
	if err := s.update(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if err := meta.Put(keyNodeID, []byte(nodeID)); err != nil {
			return err
		}
		if err := meta.Put(keyFencing, putUint(e.FencingToken)); err != nil {
			return err
		}
		// An enrollment starts the machine's GPU inventory afresh
		// (state_gpus.go): re-enrolling is how a card taken out is forgotten.
		if err := putGPUInventory(tx, nil); err != nil {
			return err
		}
		return putJSON(meta, keySession, sess)
	}); err != nil {
		return fmt.Errorf("record enrollment: %w", err)
	}
	s.fencing, s.session, s.hasSession = e.FencingToken, sess, true
	return nil
}

// Renewed records a later credential for the session this agent already
// has. The fencing token comes back unchanged from a renewal, and it is
// written from the answer rather than left alone for the same reason every
// other field is: what this agent believes about itself is what the control
// plane last told it. The new credential is durable before this returns, so
// the agent never uses a credential it could forget.
func (s *State) Renewed(r nodeproto.SessionRenewal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	sess := storedSession{Token: r.SessionToken, ExpiresAt: r.ExpiresAt}
	if err := s.update(func(tx *bolt.Tx) error {
		meta := tx.Bucket(bucketMeta)
		if err := meta.Put(keyFencing, putUint(r.FencingToken)); err != nil {
			return err
		}
		return putJSON(meta, keySession, sess)
	}); err != nil {
		return fmt.Errorf("record renewal: %w", err)
	}
	s.fencing, s.session, s.hasSession = r.FencingToken, sess, true
	return nil
}

// ForgetSession drops the session credential (it was refused as expired or
// superseded); the agent needs a new invitation to enroll again.
func (s *State) ForgetSession() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Delete(keySession)
	}); err != nil {
		return err
	}
	s.session, s.hasSession = storedSession{}, false
	return nil
}

// Session returns the credential this agent holds and the moment it lapses,
// and whether it holds one at all.
//
// Whether the credential is still worth using is the agent's judgment rather
// than this file's, which is why the expiry is answered instead of compared.
func (s *State) Session() (string, time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.session.Token, s.session.ExpiresAt, s.hasSession
}

// FencingToken is the highest fencing token this agent has been given.
func (s *State) FencingToken() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fencing
}

// Applied reports whether the operation was already performed.
func (s *State) Applied(operationID string) bool {
	_, ok := s.AppliedResult(operationID)
	return ok
}

// AppliedResult returns the result event recorded when the operation was
// applied, so a redelivered command is answered with the very same event
// (same ID, same outcome) instead of being performed again.
func (s *State) AppliedResult(operationID string) (nodeproto.Event, bool) {
	var e appliedEntry
	var ok bool
	s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketApplied).Get([]byte(operationID))
		if v != nil && json.Unmarshal(v, &e) == nil {
			ok = true
		}
		return nil
	})
	return e.Result, ok
}

// MarkApplied records an operation as performed and spools its result event,
// in one durable transaction, before the result is reported. A crash between
// performing the operation and this call costs a redelivery that the daemon
// itself refuses (the container name is derived from the run and attempt); a
// crash after it costs a duplicate acknowledgement, never a duplicate
// container.
func (s *State) MarkApplied(operationID string, result nodeproto.Event) error {
	seq, err := eventSeq(result.ID)
	if err != nil {
		return err
	}
	entry := appliedEntry{AppliedAt: s.now().UTC(), Result: result}
	if err := s.batched(func(tx *bolt.Tx) error {
		if err := putJSON(tx.Bucket(bucketApplied), []byte(operationID), entry); err != nil {
			return err
		}
		if err := tx.Bucket(bucketAcked).Delete([]byte(operationID)); err != nil {
			return err
		}
		return putJSON(tx.Bucket(bucketSpool), putUint(seq), result)
	}); err != nil {
		s.abandon(seq)
		return err
	}
	s.owe(seq, result)
	s.mu.Lock()
	s.unacked[result.ID] = operationID
	s.mu.Unlock()
	return nil
}

// Spool holds an event the control plane is owed until Acknowledge removes
// it. It keeps its ID, so replaying it after a reconnection changes nothing.
func (s *State) Spool(event nodeproto.Event) error {
	seq, err := eventSeq(event.ID)
	if err != nil {
		return err
	}
	// A result spooled again (its command was redelivered) is owed again,
	// whatever acknowledgement of it is still waiting to be written.
	s.ackMu.Lock()
	delete(s.acks, seq)
	s.ackMu.Unlock()
	if err := s.update(func(tx *bolt.Tx) error {
		return putJSON(tx.Bucket(bucketSpool), putUint(seq), event)
	}); err != nil {
		s.abandon(seq)
		return err
	}
	s.owe(seq, event)
	return nil
}

// owe adds a spooled event, written, to what Spooled returns.
func (s *State) owe(seq uint64, e nodeproto.Event) {
	s.ackMu.Lock()
	s.owed[seq] = e
	delete(s.minting, seq)
	s.ackMu.Unlock()
	s.spoolVersion.Add(1)
}

// SpoolVersion changes whenever an event is spooled: a reader that found
// the spool empty at one version knows it is still empty while the version
// stays the same, without reading the file.
func (s *State) SpoolVersion() uint64 { return s.spoolVersion.Load() }

// Spooled returns up to max spooled events (0 means all) in the order they
// were minted.
func (s *State) Spooled(max int) ([]nodeproto.Event, error) {
	s.ackMu.Lock()
	defer s.ackMu.Unlock()
	seqs := slices.Sorted(maps.Keys(s.owed))
	if max > 0 && len(seqs) > max {
		seqs = seqs[:max]
	}
	out := make([]nodeproto.Event, len(seqs))
	for i, seq := range seqs {
		out[i] = s.owed[seq]
	}
	return out, nil
}

// SpoolDepth is how many events are waiting for the control plane.
func (s *State) SpoolDepth() int {
	s.ackMu.Lock()
	defer s.ackMu.Unlock()
	return len(s.owed)
}

// pruneEvery is how often acknowledgements being written also look for
// applied operations to prune: an acknowledged one is kept at least
// AppliedRetention and at most that plus pruneEvery. Looking means reading
// the whole applied memory, so it is not done at every acknowledgement.
const pruneEvery = AppliedRetention / 6

// ackLinger and ackBatch bound how long, and how many, acknowledgements
// wait to be written (see Acknowledge).
const (
	ackLinger = 10 * time.Second
	ackBatch  = 256
)

// Acknowledge records that the control plane holds these events: they are
// no longer returned by Spooled, and the applied operations whose results
// they were are marked acknowledged (AppliedRetention starts counting).
//
// Writing that is lazy, unlike every other write here: it rides along
// with the next write the agent makes anyway (a launch's result, an
// observation), or is made on its own once ackBatch acknowledgements are
// waiting or the oldest has waited ackLinger (FlushAcknowledged, which the
// agent calls every second, and Close): on a node that runs a launch every
// few seconds most of them ride along. Losing an unwritten
// acknowledgement in a crash costs only a second delivery of those
// events, which the control plane already deduplicates by ID, exactly as
// when an acknowledgement is lost on the wire; a durable write of its own
// per delivery cost the node a third of its writes per run.
func (s *State) Acknowledge(ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	now := s.now().UTC()
	s.mu.Lock()
	ops := map[string]ackedResult{}
	for _, id := range ids {
		if op, ok := s.unacked[id]; ok {
			ops[op] = ackedResult{ID: id, At: now}
			delete(s.unacked, id)
		}
	}
	s.mu.Unlock()
	s.ackMu.Lock()
	if len(s.acks) == 0 {
		s.ackSince = now
	}
	if s.acks == nil {
		s.acks, s.ackOps = map[uint64]bool{}, map[string]ackedResult{}
	}
	for _, id := range ids {
		if seq, err := eventSeq(id); err == nil {
			s.acks[seq] = true
			delete(s.owed, seq)
		}
	}
	for op, id := range ops {
		s.ackOps[op] = id
	}
	due := len(s.acks) >= ackBatch || now.Sub(s.ackSince) >= ackLinger
	s.ackMu.Unlock()
	if due {
		return s.update(nil)
	}
	return nil
}

// FlushAcknowledged writes acknowledgements that have waited ackLinger.
func (s *State) FlushAcknowledged() error {
	s.ackMu.Lock()
	due := len(s.acks) > 0 && s.now().Sub(s.ackSince) >= ackLinger
	s.ackMu.Unlock()
	if !due {
		return nil
	}
	return s.update(nil)
}

// update is every write after OpenState: fn (when not nil) and the
// acknowledgements waiting to be written, in one durable transaction. With
// fn nil and nothing waiting, it writes nothing.
func (s *State) update(fn func(tx *bolt.Tx) error) error {
	return s.write(s.db.Update, fn)
}

// batchDelay is how long a write made through batched waits for others to
// share its transaction.
const batchDelay = 5 * time.Millisecond

// batched is update for the two writes every launch makes at nearly the same
// moment from two goroutines, its result (MarkApplied) and its first
// running observation (SpoolWorkload): sharing one transaction (bolt's
// Batch) halves what the pair costs, one commit and, on a real machine,
// one fsync, for batchDelay of latency when a write finds no company.
func (s *State) batched(fn func(tx *bolt.Tx) error) error {
	return s.write(s.db.Batch, fn)
}

// write is update and batched: commit runs the transaction (bolt's Update
// or Batch; under Batch the function may run more than once, and does the
// same each time).
func (s *State) write(commit func(func(*bolt.Tx) error) error, fn func(tx *bolt.Tx) error) error {
	var seqs map[uint64]bool
	var ops map[string]ackedResult
	var pruned bool
	var now time.Time
	err := commit(func(tx *bolt.Tx) error {
		// What is waiting is taken inside the transaction, where writes are
		// serialized: a Spool that withdrew an acknowledgement (the event
		// is owed again) before this point is not undone by it.
		s.ackMu.Lock()
		seqs, ops = maps.Clone(s.acks), maps.Clone(s.ackOps)
		now = s.now().UTC()
		pruned = now.Sub(s.lastPrune) >= pruneEvery
		s.ackMu.Unlock()
		if fn == nil && len(seqs) == 0 {
			pruned = false
			return nil
		}
		if fn != nil {
			if err := fn(tx); err != nil {
				return err
			}
		}
		if len(seqs) == 0 {
			pruned = false
			return nil
		}
		return writeAcks(tx, seqs, ops, now, pruned)
	})
	if err != nil || len(seqs) == 0 {
		return err
	}
	s.ackMu.Lock()
	for seq := range seqs {
		delete(s.acks, seq)
	}
	for op := range ops {
		delete(s.ackOps, op)
	}
	if len(s.acks) > 0 {
		s.ackSince = now
	}
	if pruned {
		s.lastPrune = now
	}
	s.ackMu.Unlock()
	return nil
}

// writeAcks removes acknowledged events from the spool, records when the
// applied operations whose results they were were acknowledged, and, with
// prune, forgets applied operations acknowledged more than
// AppliedRetention ago (see AppliedRetention for why that bound is safe).
func writeAcks(tx *bolt.Tx, seqs map[uint64]bool, ops map[string]ackedResult, now time.Time, prune bool) error {
	spool := tx.Bucket(bucketSpool)
	for seq := range seqs {
		if err := spool.Delete(putUint(seq)); err != nil {
			return err
		}
	}
	acked := tx.Bucket(bucketAcked)
	for op, a := range ops {
		if err := acked.Put([]byte(op), putUint(uint64(a.At.UnixNano()))); err != nil {
			return err
		}
	}
	if !prune {
		return nil
	}
	applied := tx.Bucket(bucketApplied)
	expired := func(at time.Time) bool { return now.Sub(at) > AppliedRetention }
	if err := deleteWhere(acked, func(v []byte) bool { return expired(time.Unix(0, int64(getUint(v)))) }, applied); err != nil {
		return err
	}
	// Entries acknowledged before bucketAcked existed.
	return deleteWhere(applied, func(v []byte) bool {
		var e appliedEntry
		return json.Unmarshal(v, &e) == nil && e.AckedAt != nil && expired(*e.AckedAt)
	})
}

// deleteWhere deletes the keys of b whose values satisfy drop, from b and
// from each of also.
func deleteWhere(b *bolt.Bucket, drop func(v []byte) bool, also ...*bolt.Bucket) error {
	var keys [][]byte
	if err := b.ForEach(func(k, v []byte) error {
		if drop(v) {
			keys = append(keys, append([]byte(nil), k...))
		}
		return nil
	}); err != nil {
		return err
	}
	for _, k := range keys {
		for _, from := range append([]*bolt.Bucket{b}, also...) {
			if err := from.Delete(k); err != nil {
				return err
			}
		}
	}
	return nil
}

// AppliedCount is the size of the applied-operation memory.
func (s *State) AppliedCount() int {
	n := 0
	s.db.View(func(tx *bolt.Tx) error {
		n = tx.Bucket(bucketApplied).Stats().KeyN
		return nil
	})
	return n
}

// WorkloadChanged reports whether this observation says something the
// control plane has not already been told.
func (s *State) WorkloadChanged(o nodeproto.WorkloadObservation) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	prev, ok := s.told[o.WorkloadKey]
	return !ok || !prev.Same(o)
}

// SpoolWorkload spools an observation's event and records the observation
// as told (RecordWorkload) in one durable transaction: one fsync for what
// were two. With onlyFirst it does so only if nothing was told about the
// workload yet, and reports whether it spooled.
func (s *State) SpoolWorkload(event nodeproto.Event, o nodeproto.WorkloadObservation, onlyFirst bool) (bool, error) {
	seq, err := eventSeq(event.ID)
	if err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, told := s.told[o.WorkloadKey]; told && onlyFirst {
		s.abandon(seq)
		return false, nil
	}
	if err := s.batched(func(tx *bolt.Tx) error {
		if err := putJSON(tx.Bucket(bucketSpool), putUint(seq), event); err != nil {
			return err
		}
		return putJSON(tx.Bucket(bucketWorkloads), workloadKeyBytes(o.WorkloadKey), o)
	}); err != nil {
		s.abandon(seq)
		return false, err
	}
	s.owe(seq, event)
	s.told[o.WorkloadKey] = o
	return true, nil
}

// RecordWorkload remembers what the control plane was told, so an unchanged
// phase is not repeated on every tick, across restarts too.
func (s *State) RecordWorkload(o nodeproto.WorkloadObservation) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.update(func(tx *bolt.Tx) error {
		return putJSON(tx.Bucket(bucketWorkloads), workloadKeyBytes(o.WorkloadKey), o)
	}); err != nil {
		return err
	}
	s.told[o.WorkloadKey] = o
	return nil
}

// Told returns every observation the control plane was last told.
func (s *State) Told() []nodeproto.WorkloadObservation {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]nodeproto.WorkloadObservation, 0, len(s.told))
	for _, o := range s.told {
		out = append(out, o)
	}
	return out
}

// RecordStop remembers why the agent stopped a workload (a timeout, a
// cancellation), durably, so observations made after a restart still carry
// the reason; the daemon itself only knows that a signal arrived.
func (s *State) RecordStop(key nodeproto.WorkloadKey, reason string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := workloadKeyBytes(key)
	if _, ok := s.stops[string(k)]; ok {
		return nil // the first reason stands
	}
	if err := s.update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketStops)
		if v := b.Get(k); v != nil {
			s.stops[string(k)] = string(v)
			return nil
		}
		return b.Put(k, []byte(reason))
	}); err != nil {
		return err
	}
	if _, ok := s.stops[string(k)]; !ok {
		s.stops[string(k)] = reason
	}
	return nil
}

// StopReason returns the reason RecordStop recorded, or "". It reads the
// copy held in memory: observations ask for every workload on every pass.
func (s *State) StopReason(key nodeproto.WorkloadKey) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stops[string(workloadKeyBytes(key))]
}

func workloadKeyBytes(k nodeproto.WorkloadKey) []byte {
	return []byte(k.RunID + "/" + strconv.Itoa(k.Attempt))
}

func putJSON(b *bolt.Bucket, key []byte, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return b.Put(key, data)
}

func putUint(n uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], n)
	return b[:]
}

func getUint(b []byte) uint64 {
	if len(b) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(b)
}
