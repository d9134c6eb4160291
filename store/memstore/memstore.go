// Package memstore is an in-memory store.Store: the fake that unit tests of
// the control plane's logic use instead of a database. It keeps nothing
// across processes, so nothing else should use it.
//
// It passes the same conformance suite (storetest) as sqlstore, so a test
// that passes against it exercises the Store contract, not an accident of
// the fake. Records are held as their JSON encoding, which is how copies in
// and out are made and why a record comes back exactly as sqlstore would
// return it (times keep their instant and zone offset, empty maps come back
// nil).
//
// Only tests of control-plane packages import memstore.
package memstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/internal/record"
)

// ErrClosed is returned by Update and View after Close.
var ErrClosed = errors.New("memstore: closed")

// errReadOnly is returned by a write inside View.
var errReadOnly = errors.New("memstore: write in a read-only transaction")

// errTxDone is returned by a Tx used after its fn returned.
var errTxDone = errors.New("memstore: transaction used after it ended")

// Store is an in-memory store.Store. Its zero value is not usable; call New.
//
// Update is serializable: one Update runs at a time, on a copy of the state
// that replaces the committed state only when fn succeeds. View runs on the
// committed state of the moment it starts, concurrently with Updates and
// other Views. Safe for concurrent use.
type Store struct {
	wmu sync.Mutex // held by the one running Update

	mu     sync.RWMutex // guards cur and closed
	cur    *state       // committed; never modified once committed
	closed bool
}

// New returns an empty Store.
func New() *Store {
	return &Store{cur: &state{
		nodes:       map[string][]byte{},
		nodeRevs:    map[string]int64{},
		nodeSeen:    map[string]time.Time{},
		invitations: map[string][]byte{},
		sessions:    map[string][]byte{},
		runs:        map[string][]byte{},
		operations:  map[string][]byte{},
		tokens:      map[string][]byte{},
		audit:       map[string][]byte{},
		artifacts:   map[string][]byte{},
		registries:  map[string][]byte{},
		projects:    map[string][]byte{},
		releases:    map[string][]byte{},
		rollouts:    map[string][]byte{},
		functions:   newFunctionTables(),
		events:      map[eventKey]time.Time{},
		watermarks:  map[eventKey]int64{},
		logs:        map[nodeproto.WorkloadKey][]byte{},
	}}
}

// state is one version of everything. Maps are shared between versions until
// a transaction writes to one, which clones it first (copy on write), so a
// committed state is never modified and Views need no lock while they read.
// Log byte slices are never appended to in place, for the same reason.
type state struct {
	nodes       map[string][]byte
	nodeRevs    map[string]int64     // store.NodeVersion.Rev, by node
	nodeSeen    map[string]time.Time // the latest moment NodesSeen recorded, by node
	invitations map[string][]byte
	sessions    map[string][]byte
	runs        map[string][]byte
	operations  map[string][]byte
	tokens      map[string][]byte
	audit       map[string][]byte // by entry ID
	artifacts   map[string][]byte // by record.ArtifactKey
	registries  map[string][]byte
	projects    map[string][]byte
	releases    map[string][]byte // agent releases, by record.AgentReleaseKey
	rollouts    map[string][]byte
	functions   functionTables
	events      map[eventKey]time.Time
	watermarks  map[eventKey]int64 // by node and incarnation
	logs        map[nodeproto.WorkloadKey][]byte
	epoch       int64 // the scheduling epoch (Store.Lead)
}

type eventKey struct{ node, event string }

// Update implements store.Update. fn runs at most once.
func (s *Store) Update(ctx context.Context, fn func(tx store.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.RLock()
	cur, closed := s.cur, s.closed
	s.mu.RUnlock()
	if closed {
		return ErrClosed
	}
	next := *cur
	tx := &tx{st: &next, write: true, cloned: map[string]bool{}}
	defer func() { tx.done = true }()
	if err := fn(tx); err != nil {
		return err
	}
	tx.done = true
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	s.cur = &next
	return nil
}

// UpdateLocked implements store.UpdateLocked: one writer at a time, as
// Update, which is stronger than row locks.
func (s *Store) UpdateLocked(ctx context.Context, fn func(tx store.Tx) error) error {
	return s.Update(ctx, fn)
}

// View implements store.View: fn sees the state committed when View began.
// Writes inside fn fail.
func (s *Store) View(ctx context.Context, fn func(tx store.Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.RLock()
	cur, closed := s.cur, s.closed
	s.mu.RUnlock()
	if closed {
		return ErrClosed
	}
	tx := &tx{st: cur}
	defer func() { tx.done = true }()
	return fn(tx)
}

// Close drops the state. Update and View fail with ErrClosed afterwards.
// Closing twice is harmless.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.cur = nil
	return nil
}

// tx is a store.Tx over one state. It is not safe for concurrent use.
type tx struct {
	st     *state
	write  bool
	done   bool
	cloned map[string]bool // tables this tx has copied and may modify
}

func (t *tx) readable() error {
	if t.done {
		return errTxDone
	}
	return nil
}

func (t *tx) writable() error {
	if t.done {
		return errTxDone
	}
	if !t.write {
		return errReadOnly
	}
	return nil
}

// table returns the map for name, cloned on this tx's first write to it.
func table[K comparable, V any](t *tx, name string, m *map[K]V) map[K]V {
	if !t.cloned[name] {
		*m = maps.Clone(*m)
		t.cloned[name] = true
	}
	return *m
}

func encode(what, id string, v any) ([]byte, error) {
	b, err := record.Encode(v)
	if err != nil {
		return nil, fmt.Errorf("memstore: encode %s %q: %w", what, id, err)
	}
	return b, nil
}

func decode[T any](what, id string, b []byte) (T, error) {
	v, err := record.Decode[T](b)
	if err != nil {
		return v, fmt.Errorf("memstore: decode %s %q: %w", what, id, err)
	}
	return v, nil
}

func get[T any](t *tx, m map[string][]byte, what, id string) (T, error) {
	var zero T
	if err := t.readable(); err != nil {
		return zero, err
	}
	b, ok := m[id]
	if !ok {
		return zero, failure.NotFound(what, id)
	}
	return decode[T](what, id, b)
}

// list decodes the records of m that keep accepts, in no order.
func list[T any](t *tx, m map[string][]byte, what string, keep func(T) bool) ([]T, error) {
	if err := t.readable(); err != nil {
		return nil, err
	}
	out := []T{}
	for id, b := range m {
		v, err := decode[T](what, id, b)
		if err != nil {
			return nil, err
		}
		if keep(v) {
			out = append(out, v)
		}
	}
	return out, nil
}

// put stores v under id in the named table. mode says what must hold first.
func put(t *tx, name string, m *map[string][]byte, what, id string, v any, mode putMode) error {
	if err := t.writable(); err != nil {
		return err
	}
	_, exists := (*m)[id]
	switch {
	case mode == create && exists:
		return failure.Conflict("%s %q already exists", what, id)
	case mode == replace && !exists:
		return failure.NotFound(what, id)
	}
	b, err := encode(what, id, v)
	if err != nil {
		return err
	}
	table(t, name, m)[id] = b
	return nil
}

type putMode int

const (
	upsert  putMode = iota // create or replace
	create                 // conflict if it exists
	replace                // not found if it does not exist
)

func (t *tx) GetNode(id string) (store.Node, error) {
	return get[store.Node](t, t.st.nodes, "node", id)
}

func (t *tx) PutNode(n store.Node) error {
	if err := record.Node(n); err != nil {
		return err
	}
	if heard, ok := t.st.nodeSeen[n.ID]; ok && (n.LastSeenAt == nil || heard.After(*n.LastSeenAt)) {
		n.LastSeenAt = &heard // the contract: never back past NodesSeen's moment
	}
	if err := put(t, "nodes", &t.st.nodes, "node", n.ID, n, upsert); err != nil {
		return err
	}
	table(t, "nodeRevs", &t.st.nodeRevs)[n.ID]++
	return nil
}

// NodeVersions implements store.Tx.
func (t *tx) NodeVersions() ([]store.NodeVersion, error) {
	nodes, err := t.ListNodes()
	if err != nil {
		return nil, err
	}
	out := make([]store.NodeVersion, len(nodes))
	for i, n := range nodes {
		out[i] = store.NodeVersion{ID: n.ID, Rev: t.st.nodeRevs[n.ID], LastSeenAt: n.LastSeenAt}
	}
	return out, nil
}

func (t *tx) ListNodes() ([]store.Node, error) {
	if err := t.readable(); err != nil {
		return nil, err
	}
	ids := slices.Sorted(maps.Keys(t.st.nodes))
	nodes := make([]store.Node, 0, len(ids))
	for _, id := range ids {
		n, err := decode[store.Node]("node", id, t.st.nodes[id])
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, n)
	}
	return nodes, nil
}

func (t *tx) CreateInvitation(inv store.Invitation) error {
	if err := record.Invitation(inv); err != nil {
		return err
	}
	return put(t, "invitations", &t.st.invitations, "invitation", inv.TokenHash, inv, create)
}

func (t *tx) GetInvitation(tokenHash string) (store.Invitation, error) {
	return get[store.Invitation](t, t.st.invitations, "invitation", tokenHash)
}

func (t *tx) PutInvitation(inv store.Invitation) error {
	if err := record.Invitation(inv); err != nil {
		return err
	}
	return put(t, "invitations", &t.st.invitations, "invitation", inv.TokenHash, inv, replace)
}

func (t *tx) ListInvitations(nodeID string) ([]store.Invitation, error) {
	invs, err := list(t, t.st.invitations, "invitation", func(inv store.Invitation) bool { return inv.NodeID == nodeID })
	record.SortInvitations(invs)
	return invs, err
}

func (t *tx) DeleteInvitation(tokenHash string) error {
	return remove(t, "invitations", &t.st.invitations, "invitation", tokenHash)
}

func (t *tx) PutSession(s store.Session) error {
	if err := record.Session(s); err != nil {
		return err
	}
	return put(t, "sessions", &t.st.sessions, "session", s.TokenHash, s, upsert)
}

func (t *tx) GetSession(tokenHash string) (store.Session, error) {
	return get[store.Session](t, t.st.sessions, "session", tokenHash)
}

func (t *tx) DeleteSessions(nodeID string) error {
	if err := t.writable(); err != nil {
		return err
	}
	var doomed []string
	for hash, b := range t.st.sessions {
		s, err := decode[store.Session]("session", hash, b)
		if err != nil {
			return err
		}
		if s.NodeID == nodeID {
			doomed = append(doomed, hash)
		}
	}
	if len(doomed) == 0 {
		return nil
	}
	m := table(t, "sessions", &t.st.sessions)
	for _, hash := range doomed {
		delete(m, hash)
	}
	return nil
}

func (t *tx) CreateRun(r store.Run) error {
	if err := record.Run(r); err != nil {
		return err
	}
	return put(t, "runs", &t.st.runs, "run", r.ID, r, create)
}

func (t *tx) GetRun(id string) (store.Run, error) {
	return get[store.Run](t, t.st.runs, "run", id)
}

func (t *tx) PutRun(r store.Run) error {
	if err := record.Run(r); err != nil {
		return err
	}
	return put(t, "runs", &t.st.runs, "run", r.ID, r, replace)
}

func (t *tx) ListRuns(opts store.ListRunsOptions) ([]store.Run, error) {
	if err := t.readable(); err != nil {
		return nil, err
	}
	if err := opts.CheckAnyOrder(); err != nil {
		return nil, err
	}
	var cursor *store.Run
	if opts.Before != "" {
		c, err := t.GetRun(opts.Before)
		if err != nil {
			return nil, err
		}
		cursor = &c
	}
	runs := []store.Run{}
	for id, b := range t.st.runs {
		r, err := decode[store.Run]("run", id, b)
		if err != nil {
			return nil, err
		}
		if len(opts.Statuses) > 0 && !slices.Contains(opts.Statuses, r.Status) {
			continue
		}
		if opts.NodeID != "" && !slices.Contains(record.NodeIDs(r), opts.NodeID) {
			continue
		}
		if opts.Project != "" && record.RunProject(r) != opts.Project {
			continue
		}
		if cursor != nil && store.NewestFirst(r, *cursor) <= 0 {
			continue
		}
		runs = append(runs, r)
	}
	if !opts.AnyOrder { // the map's order is already any
		slices.SortFunc(runs, store.NewestFirst)
	}
	if opts.Limit > 0 && len(runs) > opts.Limit {
		runs = runs[:opts.Limit]
	}
	return runs, nil
}

func (t *tx) PutOperation(op store.Operation) error {
	if err := record.Operation(op); err != nil {
		return err
	}
	return put(t, "operations", &t.st.operations, "operation", op.ID, op, upsert)
}

func (t *tx) GetOperation(id string) (store.Operation, error) {
	return get[store.Operation](t, t.st.operations, "operation", id)
}

// PendingOperationsOf implements store.Tx.
func (t *tx) PendingOperationsOf(nodeIDs []string) (map[string][]store.Operation, error) {
	return store.PendingOfEach(nodeIDs, t.PendingOperations)
}

func (t *tx) PendingOperations(nodeID string) ([]store.Operation, error) {
	if err := t.readable(); err != nil {
		return nil, err
	}
	ops := []store.Operation{}
	for id, b := range t.st.operations {
		op, err := decode[store.Operation]("operation", id, b)
		if err != nil {
			return nil, err
		}
		if op.NodeID == nodeID && op.Result == nil {
			ops = append(ops, op)
		}
	}
	slices.SortFunc(ops, func(a, b store.Operation) int {
		return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), cmp.Compare(a.ID, b.ID))
	})
	return ops, nil
}

func (t *tx) SeeEvent(nodeID, eventID string, at time.Time) (bool, error) {
	if err := record.Event(nodeID, eventID); err != nil {
		return false, err
	}
	if err := t.writable(); err != nil {
		return false, err
	}
	k := eventKey{nodeID, eventID}
	if _, seen := t.st.events[k]; seen || t.belowWatermark(nodeID, eventID) {
		return false, nil
	}
	table(t, "events", &t.st.events)[k] = at
	return true, nil
}

func (t *tx) AppendLog(key nodeproto.WorkloadKey, offset int64, data []byte) (int64, error) {
	if err := record.LogKey(key, offset); err != nil {
		return 0, err
	}
	if err := t.writable(); err != nil {
		return 0, err
	}
	log := t.st.logs[key]
	tail := record.LogTail(int64(len(log)), offset, data)
	if len(tail) == 0 {
		return int64(len(log)), nil
	}
	// The three-index slice forces append to copy: log may be shared with
	// a committed state that a View is reading.
	log = append(log[:len(log):len(log)], tail...)
	table(t, "logs", &t.st.logs)[key] = log
	return int64(len(log)), nil
}

func (t *tx) ReadLog(key nodeproto.WorkloadKey, offset int64, max int) ([]byte, int64, error) {
	if err := record.LogKey(key, offset); err != nil {
		return nil, 0, err
	}
	if err := record.ReadMax(key, max); err != nil {
		return nil, 0, err
	}
	if err := t.readable(); err != nil {
		return nil, 0, err
	}
	log := t.st.logs[key]
	size := int64(len(log))
	if offset >= size {
		return []byte{}, size, nil
	}
	end := min(size, offset+int64(max))
	return slices.Clone(log[offset:end]), size, nil
}

func (t *tx) CreateArtifact(a store.Artifact) error {
	if err := record.Artifact(a); err != nil {
		return err
	}
	if _, exists := t.st.artifacts[record.ArtifactKey(a.Name, a.Version)]; exists && t.readable() == nil {
		return failure.Conflict("artifact %q already exists", a.Name+"@"+a.Version)
	}
	return put(t, "artifacts", &t.st.artifacts, "artifact", record.ArtifactKey(a.Name, a.Version), a, create)
}

func (t *tx) GetArtifact(name, version string) (store.Artifact, error) {
	a, err := get[store.Artifact](t, t.st.artifacts, "artifact", record.ArtifactKey(name, version))
	if errors.Is(err, failure.ErrNotFound) {
		return a, failure.NotFound("artifact", name+"@"+version)
	}
	return a, err
}

func (t *tx) ListArtifacts(name string) ([]store.Artifact, error) {
	if err := t.readable(); err != nil {
		return nil, err
	}
	out := []store.Artifact{}
	for key, b := range t.st.artifacts {
		a, err := decode[store.Artifact]("artifact", key, b)
		if err != nil {
			return nil, err
		}
		if name == "" || a.Name == name {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, func(a, b store.Artifact) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Seq, b.Seq), cmp.Compare(a.Version, b.Version))
	})
	return out, nil
}

func (t *tx) PutRegistryCredential(c store.RegistryCredential) error {
	if err := record.RegistryCredential(c); err != nil {
		return err
	}
	return put(t, "registries", &t.st.registries, "registry credential", registryKey(c.Project, c.Host), c, upsert)
}

// registryKey files a credential under its project and host; the keys
// sort by project, then host.
func registryKey(project, host string) string { return api.ProjectOf(project) + "\x00" + host }

func (t *tx) GetRegistryCredential(project, host string) (store.RegistryCredential, error) {
	c, err := get[store.RegistryCredential](t, t.st.registries, "registry credential", registryKey(project, host))
	if errors.Is(err, failure.ErrNotFound) {
		return c, failure.NotFound("registry credential", host) // named as sqlstore names it
	}
	return c, err
}

func (t *tx) ListRegistryCredentials() ([]store.RegistryCredential, error) {
	if err := t.readable(); err != nil {
		return nil, err
	}
	out := []store.RegistryCredential{}
	for _, key := range slices.Sorted(maps.Keys(t.st.registries)) {
		c, err := decode[store.RegistryCredential]("registry credential", key, t.st.registries[key])
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

func (t *tx) DeleteRegistryCredential(project, host string) error {
	if err := t.writable(); err != nil {
		return err
	}
	key := registryKey(project, host)
	if _, ok := t.st.registries[key]; !ok {
		return failure.NotFound("registry credential", host)
	}
	delete(table(t, "registries", &t.st.registries), key)
	return nil
}

var _ store.Store = (*Store)(nil)

func (t *tx) SeeEvents(nodeID string, eventIDs []string, at time.Time) ([]bool, error) {
	return store.SeeEach(nodeID, eventIDs, at, t.SeeEvent)
}

func (t *tx) SeeEventBatches(batches []store.EventCheck) ([][]bool, error) {
	return store.SeeBatches(batches, t.SeeEvents)
}

func (t *tx) GetOperations(ids []string) ([]store.Operation, error) {
	return store.GetEach(ids, t.GetOperation)
}

func (t *tx) CreateRuns(runs []store.Run) error { return store.Each(runs, t.CreateRun) }
