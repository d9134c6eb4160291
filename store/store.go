// Package store defines the control plane's durable state: the Store
// interface, the records it holds, and their contracts. Implementations live
// in sub-packages (sqlstore for SQLite and PostgreSQL, memstore as the fake
// for unit tests); every implementation passes the conformance suite in
// storetest.
//
// The interface is transactional rather than a list of domain operations:
// the control plane's logic decides what changes (a run's status, a new
// operation, a deduplicated event) and a Store makes a group of changes
// atomic. That keeps business rules in one place instead of once per
// database.
//
// Records are stored whole. Callers own what they pass in and what they get
// back: a Store copies on the way in and out, so mutating a returned record
// changes nothing until it is Put again. The records here embed api types
// for their callers' convenience, but they are not stored as those types'
// JSON: the stored documents have their own field names (store/internal/
// record), and golden documents of every stored format (store/storetest/
// testdata) must keep reading.
//
// Only the control plane imports store.
package store

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"
)

// Store is the control plane's durable state.
type Store interface {
	// Update runs fn in one read-write transaction. If fn returns an error,
	// nothing it did is kept and that error is returned. Update may call fn
	// more than once when the database reports a serialization conflict, so
	// fn must not have effects outside tx. Safe for concurrent use.
	Update(ctx context.Context, fn func(tx Tx) error) error
	// UpdateLocked is Update for transactions that read records by key and
	// write them back, and decide nothing from a List or from a record's
	// absence other than through a Create's conflict: the node event
	// batches and the scheduler's placements. Every Get in fn locks the
	// record it read until the transaction ends, so a record read and then
	// written cannot have changed in between; that is all it promises. A
	// List may miss a record committed meanwhile. A store may run fn as
	// Update does (SQLite's single writer, memstore); PostgreSQL runs it
	// under READ COMMITTED with row locks instead of SERIALIZABLE, because
	// under load concurrent serializable transactions over many runs
	// conflicted on shared index pages far more often than on the runs
	// themselves, and each conflict reran a whole transaction. fn may be
	// called more than once (a deadlock is retried), as with Update.
	UpdateLocked(ctx context.Context, fn func(tx Tx) error) error
	// View runs fn in a read-only transaction with a consistent snapshot.
	View(ctx context.Context, fn func(tx Tx) error) error
	// Lead starts a new scheduling epoch and returns it. From then on a
	// transaction that checks an older epoch (Tx.CheckEpoch) fails with
	// failure.ErrFenced, and every transaction that checked the old one
	// before has ended when Lead returns. A replica calls it as it starts
	// to schedule and checks its epoch in every placement transaction, so
	// a replica that still believes it leads after another took over is
	// refused by the database rather than trusted: no window exists in
	// which two replicas commit placements.
	Lead(ctx context.Context) (int64, error)
	// Close releases the database. Calls after Close fail.
	Close() error
}

// Tx is one transaction. Its methods use the context Update or View was
// given. Errors are failure kinds: failure.ErrNotFound for a missing record,
// failure.ErrConflict for a Create whose key exists, anything else wraps the
// database's error. A Tx must not be used after fn returns.
type Tx interface {
	// NodesSeen records that each node was heard from at its moment,
	// never moving a node's LastSeenAt backwards, and returns, for each
	// node stored, the LastSeenAt it had before (zero when it had none);
	// IDs of nodes not stored are skipped. It is liveness's narrow write:
	// a store writes the moment alone, without decoding and re-encoding
	// the node's record. It qualifies for UpdateLocked: what it reads
	// (the moments before) it locks until the transaction ends.
	NodesSeen(seen map[string]time.Time) (before map[string]time.Time, err error)
	// CheckEpoch fails with failure.ErrFenced unless epoch is the current
	// scheduling epoch (Store.Lead), and keeps it current until the
	// transaction ends. A store may make the check with the transaction's
	// last writes instead (PostgreSQL's UpdateLocked sends them together:
	// store/sqlstore/held.go); the ErrFenced then comes from Update or
	// UpdateLocked itself. Either way a transaction that checked a
	// superseded epoch commits nothing.
	CheckEpoch(epoch int64) error
	GetNode(id string) (Node, error)
	// LockNode is GetNode in a write transaction that also holds the
	// node's record against other writers until the transaction ends,
	// whatever the transaction's kind: a transaction that writes what it
	// derived from the record elsewhere (an operation under the node's
	// fencing token) and must not interleave with a writer of the record
	// (an enrollment replacing the token, which runs as UpdateLocked).
	// On PostgreSQL, in an Update, a record another transaction wrote
	// since this one's snapshot fails it as a conflict (retried). In a
	// View it fails: a read-only transaction holds nothing.
	LockNode(id string) (Node, error)
	// PutNode creates or replaces a node. Its LastSeenAt is the record's
	// unless NodesSeen recorded a later moment, which it keeps: a record
	// written back from a read that a liveness flush overtook does not
	// move the node's moment back.
	PutNode(n Node) error
	// ListNodes returns every node ordered by ID.
	ListNodes() ([]Node, error)
	// NodeVersions returns every node's version and last-seen moment,
	// ordered by ID, without its record: what a copy of the records reads
	// to learn which of them to read again (GetNodes). A copy of a record
	// read at the same Rev differs from the stored one at most in its
	// LastSeenAt.
	NodeVersions() ([]NodeVersion, error)
	// GetNodes returns the stored nodes among ids, ordered by ID (a
	// missing one is absent, not an error); in UpdateLocked each is locked,
	// in that order. The batch forms (GetNodes, GetRuns, PutRuns,
	// PutOperations) are what the scheduler's placements use: a store may
	// make each one statement for the whole batch, where a call per record
	// was a round trip per record (PostgreSQL).
	GetNodes(ids []string) ([]Node, error)

	// CreateInvitation stores a new invitation; ErrConflict if the hash exists.
	CreateInvitation(inv Invitation) error
	GetInvitation(tokenHash string) (Invitation, error)
	// PutInvitation replaces an existing invitation (to mark it spent).
	PutInvitation(inv Invitation) error
	// ListInvitations returns a node's invitations, oldest first (by
	// CreatedAt, then hash). Empty, not an error, when there are none.
	ListInvitations(nodeID string) ([]Invitation, error)
	// DeleteInvitation removes an invitation; ErrNotFound if there is none.
	DeleteInvitation(tokenHash string) error

	// PutSession creates or replaces a session credential.
	PutSession(s Session) error
	GetSession(tokenHash string) (Session, error)
	// DeleteSessions removes every session of a node (on re-enrollment).
	DeleteSessions(nodeID string) error

	// CreateRun stores a new run; ErrConflict if the ID exists.
	CreateRun(r Run) error
	// CreateRuns is CreateRun for each run: ErrConflict, naming the run, if
	// any ID exists or repeats (the transaction then keeps nothing, as with
	// any error fn returns). A batch of submissions is one statement or two
	// on PostgreSQL, where a run was a round trip.
	CreateRuns(runs []Run) error
	GetRun(id string) (Run, error)
	// PutRun replaces an existing run; ErrNotFound if it does not exist.
	PutRun(r Run) error
	// GetRuns returns the stored runs among ids, ordered by ID (a missing
	// one is absent, not an error); in UpdateLocked each is locked.
	GetRuns(ids []string) ([]Run, error)
	// PutRuns is PutRun for each run, IDs distinct; ErrNotFound if any
	// does not exist (the transaction then keeps nothing, as with any error
	// fn returns).
	PutRuns(runs []Run) error
	// ListRuns returns runs newest first (by CreatedAt, then ID).
	ListRuns(opts ListRunsOptions) ([]Run, error)

	// PutOperation creates or replaces an operation.
	PutOperation(op Operation) error
	// PutOperations is PutOperation for each operation, IDs distinct.
	PutOperations(ops []Operation) error
	GetOperation(id string) (Operation, error)
	// GetOperations returns the stored operations among ids, ordered by ID
	// (a missing one is absent, not an error); in UpdateLocked each is
	// locked, in that order, as GetNodes and GetRuns are. The node event
	// path reads the operations a batch's results name with it.
	GetOperations(ids []string) ([]Operation, error)
	// PendingOperations returns a node's operations without a result,
	// oldest first.
	PendingOperations(nodeID string) ([]Operation, error)
	// PendingOperationsOf is PendingOperations for each of nodeIDs, by
	// node (a node with none is absent). It is how a replica reads the
	// pending operations of every session stream woken together: one
	// statement on PostgreSQL, where each stream's read was a
	// transaction of its own.
	PendingOperationsOf(nodeIDs []string) (map[string][]Operation, error)

	// SeeEvent records that the node's event was applied. It returns false
	// if it was already recorded, or if its ID is at or below the node's
	// watermark for its incarnation (AdvanceEventWatermark), which is how a
	// redelivered event is recognised and applied once.
	SeeEvent(nodeID, eventID string, at time.Time) (fresh bool, err error)
	// SeeEvents is SeeEvent for each of one node's events, in order: fresh[i]
	// answers eventIDs[i], and an ID repeated in eventIDs is fresh at most
	// once (its first time). A store may make it one statement for the
	// whole batch (PostgreSQL), where a call per event was a round trip
	// per event; an invalid ID fails the whole call.
	SeeEvents(nodeID string, eventIDs []string, at time.Time) (fresh []bool, err error)
	// SeeEventBatches is SeeEvents for several nodes' batches at once:
	// fresh[k] answers batches[k] as SeeEvents would had the batches been
	// seen one after the other, in order (so a node named twice sees its
	// second batch after its first). A store may make it one statement for
	// them all (PostgreSQL); the control plane checks the event batches of
	// one group commit with it.
	SeeEventBatches(batches []EventCheck) (fresh [][]bool, err error)

	// AppendLog adds data at offset to an attempt's log and returns the log's
	// size afterwards. Bytes before the current size are ignored (already
	// held); a gap (offset beyond the size) is appended as if contiguous.
	AppendLog(key nodeproto.WorkloadKey, offset int64, data []byte) (size int64, err error)
	// ReadLog returns up to max bytes of an attempt's log from offset, and the
	// log's size. A log nobody wrote is empty, not an error.
	ReadLog(key nodeproto.WorkloadKey, offset int64, max int) (data []byte, size int64, err error)

	// Tokens and the audit log (access.go).
	AccessTx

	// Deleting what is no longer needed (retention.go).
	RetentionTx

	// CreateArtifact adds a version to the Artifact catalog; ErrConflict
	// if the name already has that version. Versions are immutable: there
	// is no Put.
	CreateArtifact(a Artifact) error
	// GetArtifact returns one version; ErrNotFound if the name has no such
	// version.
	GetArtifact(name, version string) (Artifact, error)
	// ListArtifacts returns the versions of one name, or of every name when
	// name is "", ordered by name and then by Seq (oldest first). The
	// result is empty, not an error, when there are none.
	ListArtifacts(name string) ([]Artifact, error)

	// PutRegistryCredential creates or replaces the credential of a
	// registry host in a project (a project's credentials are its own:
	// two projects may each hold one for the same host).
	PutRegistryCredential(c RegistryCredential) error
	// GetRegistryCredential returns project's credential for host; ""
	// is api.DefaultProject, as in every project argument below.
	GetRegistryCredential(project, host string) (RegistryCredential, error)
	// ListRegistryCredentials returns every credential ordered by project
	// and then host.
	ListRegistryCredentials() ([]RegistryCredential, error)
	// DeleteRegistryCredential removes project's credential for host;
	// ErrNotFound if there is none.
	DeleteRegistryCredential(project, host string) error

	// Projects (projects.go).
	ProjectsTx

	// Functions: apps, fns, triggers and durable calls (see functions.go
	// for the records and the ordering and uniqueness rules).
	FunctionsTx

	// Agent releases and rollouts (upgrades.go).
	UpgradeTx
}

// Node is one machine. FencingToken rises with every enrollment.
type Node struct {
	ID           string               `json:"id"`
	FencingToken uint64               `json:"fencing_token"`
	CreatedAt    time.Time            `json:"created_at"`
	EnrolledAt   *time.Time           `json:"enrolled_at,omitempty"`
	LastSeenAt   *time.Time           `json:"last_seen_at,omitempty"`
	Facts        *nodeproto.NodeFacts `json:"facts,omitempty"`
	FactsAt      *time.Time           `json:"facts_at,omitempty"`
	AgentVersion string               `json:"agent_version,omitempty"`
	Capability   int                  `json:"capability_version,omitempty"`
	// Cordoned nodes take no new work; their running work continues.
	Cordoned bool `json:"cordoned,omitempty"`
	// Draining nodes are cordoned and, once DrainDeadline passes (when
	// set), have their remaining attempts stopped.
	Draining      bool       `json:"draining,omitempty"`
	DrainDeadline *time.Time `json:"drain_deadline,omitempty"`
	// RemovedAt is set by `mercator node rm`: the node's credentials are
	// void, it takes no work, and its work is treated as on an unreachable
	// node. A new invitation clears it.
	RemovedAt *time.Time `json:"removed_at,omitempty"`
	// Flags are what the control plane found wrong with the node's facts
	// (package controlplane/internal/factcheck): replaced at every report, except the
	// GPU disputes, which only an operator clears.
	Flags []api.NodeFlag `json:"flags,omitempty"`
	// Labels are the labels its operator set (`mercator node label`).
	Labels map[string]string `json:"labels,omitempty"`
}

// Invitation is a single-use enrollment credential, stored by hash only.
type Invitation struct {
	TokenHash string     `json:"token_hash"`
	NodeID    string     `json:"node_id"`
	CreatedAt time.Time  `json:"created_at"`
	ExpiresAt time.Time  `json:"expires_at"`
	SpentAt   *time.Time `json:"spent_at,omitempty"`
}

// Session is a node's session credential, stored by hash only. It is valid
// while ExpiresAt is in the future and FencingToken is the node's current
// one.
type Session struct {
	TokenHash    string    `json:"token_hash"`
	NodeID       string    `json:"node_id"`
	FencingToken uint64    `json:"fencing_token"`
	ExpiresAt    time.Time `json:"expires_at"`
	CreatedAt    time.Time `json:"created_at"`
}

// Run is a run with the control plane's bookkeeping beside what the API shows.
type Run struct {
	api.Run
	// NextCheck, when set, is when the reconciler must look at this run again
	// without being prompted (a lease to check, a deadline to enforce).
	NextCheck *time.Time `json:"next_check,omitempty"`
	// SealedSecrets are the run's secrets, by name, each sealed by the
	// control plane (which alone holds the key) and bound to the run and
	// the name; the store never sees a secret in the clear. The embedded
	// api.RunSpec.Secrets shows them as a read does, each name with
	// api.SecretRedacted: a store reads it back so from SealedSecrets, and
	// refuses to write a record whose Secrets holds anything else
	// (failure.ErrInvalid), so a caller that forgot to seal fails rather
	// than writes the secret to disk.
	SealedSecrets map[string][]byte `json:"sealed_secrets,omitempty"`
	// Submission fingerprints the keyed submission that created the run
	// (api.HeaderIdempotencyKey: its caller, key and body), so a retry of
	// it is recognized and a reuse of its key for another body refused;
	// empty for a run submitted without a key.
	Submission string `json:"submission,omitempty"`
}

// RedactedSecrets is a run's secrets as every read shows them: each sealed
// name with api.SecretRedacted; nil when there are none.
func RedactedSecrets(sealed map[string][]byte) map[string]string {
	if len(sealed) == 0 {
		return nil
	}
	out := make(map[string]string, len(sealed))
	for name := range sealed {
		out[name] = api.SecretRedacted
	}
	return out
}

// ListRunsOptions filters ListRuns. Zero values mean no filter; Limit 0 means
// no limit.
type ListRunsOptions struct {
	Statuses []string
	NodeID   string // runs with an attempt on this node
	// Project, when set, returns only the project's runs (a run stored
	// without one is in api.DefaultProject).
	Project string
	// Before, when set, returns only runs created strictly before the run
	// with this ID (a cursor for pagination).
	Before string
	Limit  int
	// AnyOrder lets the store return the runs in any order; Before and
	// Limit must then be unset (failure.ErrInvalid otherwise). It is for a
	// read of a whole set whose reader keeps its own order, such as the
	// scheduler's copies of the active and queued runs: on PostgreSQL,
	// runs of several statuses ordered by creation were sorted with their
	// documents, which spilled to disk, and was the database's costliest
	// statement under a backlog.
	AnyOrder bool
}

// NewestFirst orders runs as ListRuns does: newest first (by CreatedAt,
// then ID, descending). For slices.SortFunc, to order a list read with
// AnyOrder.
func NewestFirst(a, b Run) int {
	if c := b.CreatedAt.Compare(a.CreatedAt); c != 0 {
		return c
	}
	return strings.Compare(b.ID, a.ID)
}

// CheckAnyOrder is the check every store makes of opts.AnyOrder: it
// cannot be combined with a cursor or a limit, which need an order.
func (opts ListRunsOptions) CheckAnyOrder() error {
	if opts.AnyOrder && (opts.Before != "" || opts.Limit > 0) {
		return failure.Invalid("any_order", "a list of runs in any order takes no cursor (before) and no limit")
	}
	return nil
}

// NodeVersion is what Tx.NodeVersions says of one node.
type NodeVersion struct {
	ID string
	// Rev changes with every PutNode of the node, and only then (NodesSeen
	// leaves it): equal Revs of one node mean the same record but for
	// LastSeenAt. Nodes are never deleted, so a node's Rev is never
	// reused.
	Rev        int64
	LastSeenAt *time.Time
}

// Operation is one command for one node, kept until the node reports its
// result, and redelivered on every new session until then.
type Operation struct {
	ID        string            `json:"id"`
	NodeID    string            `json:"node_id"`
	CreatedAt time.Time         `json:"created_at"`
	Command   nodeproto.Command `json:"command"`
	Result    *nodeproto.Result `json:"result,omitempty"`
}

// Artifact is one immutable version in the Artifact catalog. Its content
// lives in the content store under SHA256; the catalog is what gives it a
// name and a version.
type Artifact struct {
	api.ArtifactVersion
	// Seq is the version's number within its name: Version is "v" + Seq,
	// and the newest version is the one with the highest Seq.
	Seq int `json:"seq"`
}

// RegistryCredential is the credential for one registry host. The password
// is sealed by the control plane (AES-256-GCM under a key the store never
// sees), so a leaked database holds no usable registry credential.
type RegistryCredential struct {
	// Project is the project whose runs and functions pull with it
	// (docs/teams.md); "" in records written before credentials belonged
	// to projects, read as api.DefaultProject.
	Project  string `json:"project,omitempty"`
	Host     string `json:"host"`
	Username string `json:"username"`
	// Sealed is the nonce followed by the ciphertext of the password, with
	// the host as additional data, so a sealed password cannot be moved to
	// another host's record.
	Sealed    []byte    `json:"sealed"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// PendingOfEach is Tx.PendingOperationsOf made of one PendingOperations
// call per node: for a store whose reads cost no round trip.
func PendingOfEach(nodeIDs []string, pending func(nodeID string) ([]Operation, error)) (map[string][]Operation, error) {
	out := map[string][]Operation{}
	for _, id := range nodeIDs {
		ops, err := pending(id)
		if err != nil {
			return nil, err
		}
		if len(ops) > 0 {
			out[id] = ops
		}
	}
	return out, nil
}

// GetEach gets each of ids, in sorted order and once each, through get,
// skipping those get finds missing (failure.ErrNotFound): the batch reads
// (Tx.GetNodes, Tx.GetRuns) for a store, or a wrapper, that has no batch
// statement.
func GetEach[T any](ids []string, get func(string) (T, error)) ([]T, error) {
	ids = slices.Compact(slices.Sorted(slices.Values(ids)))
	out := make([]T, 0, len(ids))
	for _, id := range ids {
		v, err := get(id)
		if errors.Is(err, failure.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// EventCheck is one node's batch of event IDs for Tx.SeeEventBatches, seen
// at At.
type EventCheck struct {
	NodeID   string
	EventIDs []string
	At       time.Time
}

// SeeBatches is Tx.SeeEventBatches through see (Tx.SeeEvents), one batch at
// a time: the form for a store, or a wrapper, without a statement for
// several nodes.
func SeeBatches(batches []EventCheck, see func(nodeID string, eventIDs []string, at time.Time) ([]bool, error)) ([][]bool, error) {
	fresh := make([][]bool, len(batches))
	for k, b := range batches {
		var err error
		if fresh[k], err = see(b.NodeID, b.EventIDs, b.At); err != nil {
			return nil, err
		}
	}
	return fresh, nil
}

// SeeEach is Tx.SeeEvents through see (Tx.SeeEvent), one event at a time:
// the batch form for a store, or a wrapper, that has no batch statement.
// SeeEvent already answers a repeat within one transaction as seen.
func SeeEach(nodeID string, eventIDs []string, at time.Time, see func(nodeID, eventID string, at time.Time) (bool, error)) ([]bool, error) {
	fresh := make([]bool, len(eventIDs))
	for i, id := range eventIDs {
		var err error
		if fresh[i], err = see(nodeID, id, at); err != nil {
			return nil, err
		}
	}
	return fresh, nil
}

// Each is fn for every item in turn, stopping at the first error: the
// batch writes (Tx.CreateRuns, PutRuns, PutOperations) for a store, or a
// wrapper, that has no batch statement.
func Each[T any](items []T, fn func(T) error) error {
	for _, it := range items {
		if err := fn(it); err != nil {
			return err
		}
	}
	return nil
}
