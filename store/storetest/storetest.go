// Package storetest is the conformance suite for store.Store: every
// implementation, the memstore fake included, runs it from its own tests, so
// the control plane can rely on one contract whichever database is behind
// it.
//
// The suite checks behaviour through the interface only. What it cannot
// observe that way (how a database is opened, migrated or locked) is left to
// the implementation's own tests.
//
// Only tests of store implementations import storetest.
package storetest

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/nodeproto"

	"github.com/mercator/mercator/store"
)

// Options describes what an implementation can do beyond the interface.
type Options struct {
	// Reopen, when set, opens the data of a Store that the suite has just
	// closed (closed is that Store) and returns a new Store over it. A
	// durable implementation sets it so the suite checks that committed
	// data survives Close; nil means the implementation is not durable and
	// that check is skipped. The suite closes what Reopen returns.
	Reopen func(t *testing.T, closed store.Store) store.Store
	// WriteDocument, when set, replaces a record's stored document, so
	// that the golden documents (golden.go) are read through the Store's
	// own decoding path; nil means they are checked by decoding them into
	// the store's records and storing and reading those.
	WriteDocument DocumentWriter
}

// Run runs the suite with no Options. open returns a new, empty Store for
// each subtest; the suite closes it.
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	RunWithOptions(t, open, Options{})
}

// RunWithOptions runs the suite. open returns a new, empty Store for each
// subtest; the suite closes it (and checks that Close succeeds).
func RunWithOptions(t *testing.T, open func(t *testing.T) store.Store, opts Options) {
	h := &harness{open: open, opts: opts}
	tests := []struct {
		name string
		fn   func(t *testing.T, s store.Store)
	}{
		{"Nodes", testNodes},
		{"Invitations", testInvitations},
		{"Sessions", testSessions},
		{"Runs", testRuns},
		{"RunSecrets", testRunSecrets},
		{"RunGang", testRunGang},
		{"ListRuns", testListRuns},
		{"ListRunsNodeIndex", testListRunsNodeIndex},
		{"ListRunsPages", testListRunsPages},
		{"Operations", testOperations},
		{"Events", testEvents},
		{"Log", testLog},
		{"LogModel", testLogModel},
		{"Tokens", testTokens},
		{"TokenLifecycle", testTokenLifecycle},
		{"InvitationList", testInvitationList},
		{"Audit", testAudit},
		{"Artifacts", testArtifacts},
		{"RegistryCredentials", testRegistryCredentials},
		{"Projects", testProjects},
		{"ListRunsByProject", testListRunsByProject},
		{"AgentReleases", testAgentReleases},
		{"Rollouts", testRollouts},
		{"Apps", testApps},
		{"Fns", testFns},
		{"Triggers", testTriggers},
		{"Calls", testCalls},
		{"InvalidKeys", testInvalidKeys},
		{"CopiesIn", testCopiesIn},
		{"CopiesOut", testCopiesOut},
		{"ReadYourWrites", testReadYourWrites},
		{"Rollback", testRollback},
		{"ConflictKeepsTxUsable", testConflictKeepsTxUsable},
		{"Panic", testPanic},
		{"ViewIsReadOnly", testViewIsReadOnly},
		{"ViewSeesCommitted", testViewSeesCommitted},
		{"TxAfterFn", testTxAfterFn},
		{"CancelledContext", testCancelledContext},
		{"ConcurrentUpdates", testConcurrentUpdates},
		{"ConcurrentLockedUpdates", testConcurrentLockedUpdates},
		{"LockNode", testLockNode},
		{"SnapshotViews", testSnapshotViews},
		{"PruneRuns", testPruneRuns},
		{"PruneRecords", testPruneRecords},
		{"EventWatermark", testEventWatermark},
		{"Epochs", testEpochs},
		{"NodesSeen", testNodesSeen},
		{"NodeVersions", testNodeVersions},
		{"Batches", testBatches},
		{"LockedWritesInOrder", testLockedWritesInOrder},
		{"CreateRuns", testCreateRuns},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := h.start(t)
			tc.fn(t, s)
		})
	}
	t.Run("CallsAfterClose", h.testCallsAfterClose)
	t.Run("Persistence", h.testPersistence)
	t.Run("GoldenDocuments", h.testGoldenDocuments)
}

type harness struct {
	open func(t *testing.T) store.Store
	opts Options
}

// start opens a Store and closes it when t ends. The returned func closes it
// now (once) and returns Close's error.
func (h *harness) start(t *testing.T) (store.Store, func() error) {
	t.Helper()
	return manage(t, h.open(t))
}

func manage(t *testing.T, s store.Store) (store.Store, func() error) {
	t.Helper()
	if s == nil {
		t.Fatal("open returned a nil Store")
	}
	var once sync.Once
	var err error
	closeNow := func() error {
		once.Do(func() { err = s.Close() })
		return err
	}
	t.Cleanup(func() {
		if err := closeNow(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s, closeNow
}

// Fixtures. Every constructor returns fresh values, so a test can mutate
// what it stored and still compare against a pristine copy.

var t0 = time.Date(2026, 12, 1, 10, 0, 0, 123456789, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

func ptr[T any](v T) *T { return &v }

func sampleNode(id string) store.Node {
	return store.Node{
		ID:           id,
		FencingToken: 3,
		CreatedAt:    at(0),
		EnrolledAt:   ptr(at(time.Minute)),
		LastSeenAt:   ptr(at(2 * time.Minute)),
		Facts: &nodeproto.NodeFacts{
			Hostname:    "host-" + id,
			OS:          "linux",
			Arch:        "amd64",
			CPUs:        16,
			MemoryBytes: 64 << 30,
			Images:      []string{"registry.local/a@sha256:0a"},
			Accelerators: []nodeproto.Accelerator{
				{Vendor: "nvidia", Model: "H100", UUID: "GPU-" + id + "-0", MemoryBytes: 80 << 30},
			},
			Notes: []string{"measured"},
		},
		FactsAt:      ptr(at(2 * time.Minute)),
		AgentVersion: "1.0.0",
		Capability:   nodeproto.Version,
	}
}

func sampleInvitation(hash, nodeID string) store.Invitation {
	return store.Invitation{TokenHash: hash, NodeID: nodeID, CreatedAt: at(0), ExpiresAt: at(24 * time.Hour)}
}

func sampleSession(hash, nodeID string) store.Session {
	return store.Session{TokenHash: hash, NodeID: nodeID, FencingToken: 4, ExpiresAt: at(time.Hour), CreatedAt: at(0)}
}

// sampleRun has one attempt per node given.
func sampleRun(id string, created time.Time, status string, nodes ...string) store.Run {
	r := store.Run{Run: api.Run{
		ID: id,
		RunSpec: api.RunSpec{
			Image:       "registry.local/train:v1",
			Command:     []string{"python", "train.py"},
			Env:         map[string]string{"EPOCHS": "3"},
			CPU:         2,
			MemoryBytes: 1 << 30,
			Retries:     1,
		},
		PinnedImage: "registry.local/train@sha256:0b",
		Status:      status,
		Attempts:    []api.Attempt{},
		CreatedAt:   created,
		UpdatedAt:   created.Add(time.Second),
	}}
	for i, n := range nodes {
		r.Attempts = append(r.Attempts, api.Attempt{
			Number:    i + 1,
			NodeID:    n,
			Status:    api.AttemptRunning,
			ExitCode:  ptr(0),
			PlacedAt:  created.Add(time.Second),
			StartedAt: ptr(created.Add(2 * time.Second)),
		})
	}
	if len(nodes) > 0 {
		r.NextCheck = ptr(created.Add(time.Minute))
	}
	return r
}

func sampleOperation(id, nodeID string, created time.Time) store.Operation {
	return store.Operation{
		ID:        id,
		NodeID:    nodeID,
		CreatedAt: created,
		Command: nodeproto.Command{
			OperationID:  id,
			FencingToken: 4,
			Kind:         nodeproto.KindLaunchWorkload,
			LaunchWorkload: &nodeproto.LaunchWorkloadCommand{
				WorkloadKey: nodeproto.WorkloadKey{RunID: "run-" + id, Attempt: 1},
				Image:       "registry.local/train@sha256:0b",
				Command:     []string{"python", "train.py"},
				Env:         map[string]string{"K": "V"},
				GPUs:        []string{"GPU-0"},
				Timeout:     time.Hour,
			},
		},
	}
}

func sampleToken(hash string) store.Token {
	return store.Token{Hash: hash, Name: "admin " + hash, CreatedAt: at(0)}
}

var errBoom = errors.New("storetest: boom")

// Helpers that fail the test on error. They run fn on the test's goroutine,
// so fn may call t.Fatal.

func update(t *testing.T, s store.Store, fn func(tx store.Tx) error) {
	t.Helper()
	if err := s.Update(t.Context(), fn); err != nil {
		t.Fatalf("Update: %v", err)
	}
}

func view(t *testing.T, s store.Store, fn func(tx store.Tx) error) {
	t.Helper()
	if err := s.View(t.Context(), fn); err != nil {
		t.Fatalf("View: %v", err)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func must1[T any](t *testing.T) func(v T, err error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

// same compares records by their JSON encoding: what a Store keeps is the
// record's meaning, not Go pointer identity or a time's monotonic reading.
func same(t *testing.T, what string, got, want any) {
	t.Helper()
	g, err := json.Marshal(got)
	must(t, err)
	w, err := json.Marshal(want)
	must(t, err)
	if string(g) != string(w) {
		t.Errorf("%s:\n got  %s\n want %s", what, g, w)
	}
}

// wantKind checks err's kind and that its message names id.
func wantKind(t *testing.T, err, kind error, id string) {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Errorf("error = %v, want one that Is %v", err, kind)
		return
	}
	if id != "" && !strings.Contains(err.Error(), id) {
		t.Errorf("error %q does not name %q", err, id)
	}
}

func ids[T any](records []T, id func(T) string) []string {
	out := make([]string, len(records))
	for i, r := range records {
		out[i] = id(r)
	}
	return out
}

func runIDs(runs []store.Run) []string { return ids(runs, func(r store.Run) string { return r.ID }) }

func opIDs(ops []store.Operation) []string {
	return ids(ops, func(o store.Operation) string { return o.ID })
}

func wantIDs(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s = %q, want %q", what, got, want)
	}
}
