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
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/capability"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/node"
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
		{"ListRuns", testListRuns},
		{"ListRunsNodeIndex", testListRunsNodeIndex},
		{"ListRunsPages", testListRunsPages},
		{"Operations", testOperations},
		{"Events", testEvents},
		{"Log", testLog},
		{"LogModel", testLogModel},
		{"Tokens", testTokens},
		{"Artifacts", testArtifacts},
		{"RegistryCredentials", testRegistryCredentials},
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
		{"SnapshotViews", testSnapshotViews},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := h.start(t)
			tc.fn(t, s)
		})
	}
	t.Run("CallsAfterClose", h.testCallsAfterClose)
	t.Run("Persistence", h.testPersistence)
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
		Facts: &capability.NodeFacts{
			Hostname:    "host-" + id,
			OS:          "linux",
			Arch:        "amd64",
			CPUs:        16,
			MemoryBytes: 64 << 30,
			Images:      []string{"registry.local/a@sha256:0a"},
			Accelerators: []capability.Accelerator{
				{Vendor: "nvidia", Model: "H100", UUID: "GPU-" + id + "-0", MemoryBytes: 80 << 30},
			},
			Notes: []string{"measured"},
		},
		FactsAt:      ptr(at(2 * time.Minute)),
		AgentVersion: "1.0.0",
		Capability:   capability.Version,
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
		Command: node.Command{
			OperationID:  id,
			FencingToken: 4,
			Kind:         node.KindLaunchWorkload,
			LaunchWorkload: &capability.LaunchWorkloadCommand{
				WorkloadKey: capability.WorkloadKey{RunID: "run-" + id, Attempt: 1},
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

func testNodes(t *testing.T, s store.Store) {
	view(t, s, func(tx store.Tx) error {
		_, err := tx.GetNode("node-missing")
		wantKind(t, err, failure.ErrNotFound, "node-missing")
		nodes := must1[[]store.Node](t)(tx.ListNodes())
		if len(nodes) != 0 {
			t.Errorf("ListNodes on an empty store = %d nodes", len(nodes))
		}
		return nil
	})
	update(t, s, func(tx store.Tx) error {
		for _, id := range []string{"node-b", "node-c", "node-a"} {
			must(t, tx.PutNode(sampleNode(id)))
		}
		return nil
	})
	view(t, s, func(tx store.Tx) error {
		same(t, "GetNode", must1[store.Node](t)(tx.GetNode("node-b")), sampleNode("node-b"))
		nodes := must1[[]store.Node](t)(tx.ListNodes())
		wantIDs(t, "ListNodes", ids(nodes, func(n store.Node) string { return n.ID }), []string{"node-a", "node-b", "node-c"})
		for _, n := range nodes {
			same(t, "ListNodes "+n.ID, n, sampleNode(n.ID))
		}
		return nil
	})
	// PutNode replaces, including dropping optional fields.
	replaced := sampleNode("node-b")
	replaced.FencingToken = 9
	replaced.Facts = nil
	replaced.LastSeenAt = nil
	update(t, s, func(tx store.Tx) error { return tx.PutNode(replaced) })
	view(t, s, func(tx store.Tx) error {
		got := must1[store.Node](t)(tx.GetNode("node-b"))
		same(t, "replaced node", got, replaced)
		if got.Facts != nil || got.FencingToken != 9 {
			t.Errorf("replaced node kept old fields: %+v", got)
		}
		if n := len(must1[[]store.Node](t)(tx.ListNodes())); n != 3 {
			t.Errorf("ListNodes after replace = %d nodes, want 3", n)
		}
		return nil
	})
}

func testInvitations(t *testing.T, s store.Store) {
	inv := sampleInvitation("inv-hash-1", "node-a")
	update(t, s, func(tx store.Tx) error {
		_, err := tx.GetInvitation("inv-hash-1")
		wantKind(t, err, failure.ErrNotFound, "inv-hash-1")
		wantKind(t, tx.PutInvitation(inv), failure.ErrNotFound, "inv-hash-1")
		return tx.CreateInvitation(inv)
	})
	update(t, s, func(tx store.Tx) error {
		same(t, "GetInvitation", must1[store.Invitation](t)(tx.GetInvitation("inv-hash-1")), inv)
		dup := sampleInvitation("inv-hash-1", "node-z")
		wantKind(t, tx.CreateInvitation(dup), failure.ErrConflict, "inv-hash-1")
		return nil
	})
	spent := inv
	spent.SpentAt = ptr(at(time.Hour))
	update(t, s, func(tx store.Tx) error {
		// The failed duplicate did not overwrite.
		same(t, "invitation after conflict", must1[store.Invitation](t)(tx.GetInvitation("inv-hash-1")), inv)
		return tx.PutInvitation(spent)
	})
	view(t, s, func(tx store.Tx) error {
		got := must1[store.Invitation](t)(tx.GetInvitation("inv-hash-1"))
		same(t, "spent invitation", got, spent)
		if got.SpentAt == nil || !got.SpentAt.Equal(at(time.Hour)) {
			t.Errorf("SpentAt = %v, want %v", got.SpentAt, at(time.Hour))
		}
		return nil
	})
}

func testSessions(t *testing.T, s store.Store) {
	update(t, s, func(tx store.Tx) error {
		_, err := tx.GetSession("sess-missing")
		wantKind(t, err, failure.ErrNotFound, "sess-missing")
		must(t, tx.DeleteSessions("node-without-sessions"))
		must(t, tx.PutSession(sampleSession("sess-a1", "node-a")))
		must(t, tx.PutSession(sampleSession("sess-a2", "node-a")))
		return tx.PutSession(sampleSession("sess-b1", "node-b"))
	})
	renewed := sampleSession("sess-a1", "node-a")
	renewed.ExpiresAt = at(2 * time.Hour)
	update(t, s, func(tx store.Tx) error { return tx.PutSession(renewed) })
	view(t, s, func(tx store.Tx) error {
		same(t, "replaced session", must1[store.Session](t)(tx.GetSession("sess-a1")), renewed)
		same(t, "GetSession", must1[store.Session](t)(tx.GetSession("sess-b1")), sampleSession("sess-b1", "node-b"))
		return nil
	})
	update(t, s, func(tx store.Tx) error { return tx.DeleteSessions("node-a") })
	view(t, s, func(tx store.Tx) error {
		for _, h := range []string{"sess-a1", "sess-a2"} {
			_, err := tx.GetSession(h)
			wantKind(t, err, failure.ErrNotFound, h)
		}
		same(t, "other node's session", must1[store.Session](t)(tx.GetSession("sess-b1")), sampleSession("sess-b1", "node-b"))
		return nil
	})
}

func testRuns(t *testing.T, s store.Store) {
	r := sampleRun("run-1", at(0), api.RunRunning, "node-a")
	update(t, s, func(tx store.Tx) error {
		_, err := tx.GetRun("run-1")
		wantKind(t, err, failure.ErrNotFound, "run-1")
		wantKind(t, tx.PutRun(r), failure.ErrNotFound, "run-1")
		return tx.CreateRun(r)
	})
	update(t, s, func(tx store.Tx) error {
		same(t, "GetRun", must1[store.Run](t)(tx.GetRun("run-1")), r)
		dup := sampleRun("run-1", at(time.Hour), api.RunQueued)
		wantKind(t, tx.CreateRun(dup), failure.ErrConflict, "run-1")
		return nil
	})
	done := sampleRun("run-1", at(0), api.RunSucceeded, "node-a")
	done.ExitCode = ptr(0)
	done.FinishedAt = ptr(at(time.Hour))
	done.NextCheck = nil
	update(t, s, func(tx store.Tx) error {
		same(t, "run after conflict", must1[store.Run](t)(tx.GetRun("run-1")), r)
		return tx.PutRun(done)
	})
	view(t, s, func(tx store.Tx) error {
		got := must1[store.Run](t)(tx.GetRun("run-1"))
		same(t, "replaced run", got, done)
		if got.Status != api.RunSucceeded || got.NextCheck != nil || got.FinishedAt == nil {
			t.Errorf("replaced run = %+v", got)
		}
		return nil
	})
}

func testListRuns(t *testing.T, s store.Store) {
	plus2 := time.FixedZone("UTC+2", 2*60*60)
	runs := []store.Run{
		sampleRun("r-old", at(-time.Hour), api.RunSucceeded, "node-a"),
		sampleRun("r-tie-a", at(0), api.RunRunning, "node-b"),
		sampleRun("r-tie-b", at(0), api.RunQueued),
		sampleRun("r-tie-c", at(0), api.RunFailed, "node-a", "node-b"),
		// An hour after t0 on the clock, but an hour before in UTC: order
		// is by instant, not by the text of the time.
		sampleRun("r-zoned", at(time.Hour).In(plus2).Add(-2*time.Hour), api.RunRunning, "node-c"),
		sampleRun("r-new", at(time.Hour), api.RunQueued),
		sampleRun("r-ns", at(time.Nanosecond), api.RunCancelled, "node-a"),
	}
	update(t, s, func(tx store.Tx) error {
		for _, i := range []int{3, 0, 5, 1, 6, 4, 2} { // not in order
			must(t, tx.CreateRun(runs[i]))
		}
		return nil
	})
	all := []string{"r-new", "r-ns", "r-tie-c", "r-tie-b", "r-tie-a", "r-zoned", "r-old"}
	list := func(tx store.Tx, opts store.ListRunsOptions) []string {
		t.Helper()
		got, err := tx.ListRuns(opts)
		if err != nil {
			t.Fatalf("ListRuns(%+v): %v", opts, err)
		}
		return runIDs(got)
	}
	view(t, s, func(tx store.Tx) error {
		got := must1[[]store.Run](t)(tx.ListRuns(store.ListRunsOptions{}))
		wantIDs(t, "all runs", runIDs(got), all)
		for _, r := range got {
			want := runs[slices.IndexFunc(runs, func(x store.Run) bool { return x.ID == r.ID })]
			same(t, "listed "+r.ID, r, want)
		}
		wantIDs(t, "Statuses running,queued", list(tx, store.ListRunsOptions{Statuses: []string{api.RunRunning, api.RunQueued}}),
			[]string{"r-new", "r-tie-b", "r-tie-a", "r-zoned"})
		wantIDs(t, "Statuses succeeded", list(tx, store.ListRunsOptions{Statuses: []string{api.RunSucceeded}}), []string{"r-old"})
		wantIDs(t, "Statuses unknown", list(tx, store.ListRunsOptions{Statuses: []string{"nonsense"}}), nil)
		wantIDs(t, "NodeID node-a", list(tx, store.ListRunsOptions{NodeID: "node-a"}), []string{"r-ns", "r-tie-c", "r-old"})
		wantIDs(t, "NodeID node-b", list(tx, store.ListRunsOptions{NodeID: "node-b"}), []string{"r-tie-c", "r-tie-a"})
		wantIDs(t, "NodeID unknown", list(tx, store.ListRunsOptions{NodeID: "node-z"}), nil)
		wantIDs(t, "Limit 2", list(tx, store.ListRunsOptions{Limit: 2}), all[:2])
		wantIDs(t, "Limit beyond", list(tx, store.ListRunsOptions{Limit: 100}), all)
		wantIDs(t, "Before r-tie-c", list(tx, store.ListRunsOptions{Before: "r-tie-c"}), []string{"r-tie-b", "r-tie-a", "r-zoned", "r-old"})
		wantIDs(t, "Before r-tie-a", list(tx, store.ListRunsOptions{Before: "r-tie-a"}), []string{"r-zoned", "r-old"})
		wantIDs(t, "Before r-old", list(tx, store.ListRunsOptions{Before: "r-old"}), nil)
		wantIDs(t, "Before r-new", list(tx, store.ListRunsOptions{Before: "r-new"}), all[1:])
		// The cursor marks a position even when its run is filtered out.
		wantIDs(t, "Before r-tie-b, node-a, limit 1",
			list(tx, store.ListRunsOptions{Before: "r-tie-b", NodeID: "node-a", Limit: 1}), []string{"r-old"})
		wantIDs(t, "Statuses and NodeID",
			list(tx, store.ListRunsOptions{Statuses: []string{api.RunRunning}, NodeID: "node-b"}), []string{"r-tie-a"})
		_, err := tx.ListRuns(store.ListRunsOptions{Before: "r-missing"})
		wantKind(t, err, failure.ErrNotFound, "r-missing")
		return nil
	})
	// A status change is seen by the Statuses filter.
	update(t, s, func(tx store.Tx) error {
		r := must1[store.Run](t)(tx.GetRun("r-old"))
		r.Status = api.RunQueued
		return tx.PutRun(r)
	})
	view(t, s, func(tx store.Tx) error {
		wantIDs(t, "Statuses succeeded after change", list(tx, store.ListRunsOptions{Statuses: []string{api.RunSucceeded}}), nil)
		wantIDs(t, "Statuses queued after change", list(tx, store.ListRunsOptions{Statuses: []string{api.RunQueued}}),
			[]string{"r-new", "r-tie-b", "r-old"})
		return nil
	})
}

// testListRunsNodeIndex checks that the NodeID filter follows a run's
// attempts as PutRun changes them.
func testListRunsNodeIndex(t *testing.T, s store.Store) {
	byNode := func(nodeID string) []string {
		t.Helper()
		var got []store.Run
		view(t, s, func(tx store.Tx) error {
			got = must1[[]store.Run](t)(tx.ListRuns(store.ListRunsOptions{NodeID: nodeID}))
			return nil
		})
		return runIDs(got)
	}
	update(t, s, func(tx store.Tx) error { return tx.CreateRun(sampleRun("run-1", at(0), api.RunQueued)) })
	wantIDs(t, "no attempts", byNode("node-a"), nil)

	update(t, s, func(tx store.Tx) error { return tx.PutRun(sampleRun("run-1", at(0), api.RunRunning, "node-a")) })
	wantIDs(t, "first attempt", byNode("node-a"), []string{"run-1"})

	update(t, s, func(tx store.Tx) error {
		return tx.PutRun(sampleRun("run-1", at(0), api.RunRunning, "node-a", "node-b"))
	})
	wantIDs(t, "retried on node-b: node-a", byNode("node-a"), []string{"run-1"})
	wantIDs(t, "retried on node-b: node-b", byNode("node-b"), []string{"run-1"})

	update(t, s, func(tx store.Tx) error { return tx.PutRun(sampleRun("run-1", at(0), api.RunRunning, "node-c")) })
	wantIDs(t, "attempts replaced: node-a", byNode("node-a"), nil)
	wantIDs(t, "attempts replaced: node-b", byNode("node-b"), nil)
	wantIDs(t, "attempts replaced: node-c", byNode("node-c"), []string{"run-1"})

	// The same changes made after reading the run in the transaction (a
	// store may keep what it read to write only what changed).
	reput := func(nodes ...string) {
		t.Helper()
		update(t, s, func(tx store.Tx) error {
			r := must1[store.Run](t)(tx.GetRun("run-1"))
			next := sampleRun("run-1", at(0), api.RunRunning, nodes...)
			r.Status, r.Attempts = next.Status, next.Attempts
			must(t, tx.PutRun(r))
			r.UpdatedAt = r.UpdatedAt.Add(time.Second) // and again, unchanged nodes
			return tx.PutRun(r)
		})
	}
	reput("node-c", "node-d")
	wantIDs(t, "read, then retried on node-d: node-c", byNode("node-c"), []string{"run-1"})
	wantIDs(t, "read, then retried on node-d: node-d", byNode("node-d"), []string{"run-1"})
	reput("node-a")
	wantIDs(t, "read, then replaced: node-a", byNode("node-a"), []string{"run-1"})
	wantIDs(t, "read, then replaced: node-c", byNode("node-c"), nil)
	wantIDs(t, "read, then replaced: node-d", byNode("node-d"), nil)
	reput()
	wantIDs(t, "read, then no attempts: node-a", byNode("node-a"), nil)
}

// testListRunsPages walks all runs with Before and Limit, as the API pages.
func testListRunsPages(t *testing.T, s store.Store) {
	const n = 23
	var want []string
	update(t, s, func(tx store.Tx) error {
		for i := range n {
			// Three runs share each instant, so ties cross page boundaries.
			r := sampleRun(fmt.Sprintf("run-%02d", i), at(time.Duration(i/3)*time.Second), api.RunQueued)
			must(t, tx.CreateRun(r))
		}
		return nil
	})
	for i := n - 1; i >= 0; i-- {
		want = append(want, fmt.Sprintf("run-%02d", i))
	}
	var got []string
	before := ""
	for page := 0; ; page++ {
		if page > n {
			t.Fatal("paging does not end")
		}
		var runs []store.Run
		view(t, s, func(tx store.Tx) error {
			runs = must1[[]store.Run](t)(tx.ListRuns(store.ListRunsOptions{Before: before, Limit: 5}))
			return nil
		})
		if len(runs) > 5 {
			t.Fatalf("page of %d runs, Limit 5", len(runs))
		}
		if len(runs) == 0 {
			break
		}
		got = append(got, runIDs(runs)...)
		before = runs[len(runs)-1].ID
	}
	wantIDs(t, "paged runs", got, want)
}

func testOperations(t *testing.T, s store.Store) {
	update(t, s, func(tx store.Tx) error {
		_, err := tx.GetOperation("op-missing")
		wantKind(t, err, failure.ErrNotFound, "op-missing")
		ops := must1[[]store.Operation](t)(tx.PendingOperations("node-a"))
		if len(ops) != 0 {
			t.Errorf("PendingOperations on an empty store = %d", len(ops))
		}
		// Stored out of order; "op-tie-*" share an instant.
		must(t, tx.PutOperation(sampleOperation("op-3", "node-a", at(3*time.Second))))
		must(t, tx.PutOperation(sampleOperation("op-tie-b", "node-a", at(time.Second))))
		must(t, tx.PutOperation(sampleOperation("op-1", "node-a", at(0))))
		must(t, tx.PutOperation(sampleOperation("op-tie-a", "node-a", at(time.Second))))
		must(t, tx.PutOperation(sampleOperation("op-b", "node-b", at(0))))
		done := sampleOperation("op-done", "node-a", at(-time.Second))
		done.Result = &node.Result{OperationID: "op-done", FencingToken: 4, Kind: node.KindLaunchWorkload, Outcome: node.OutcomeOK, At: at(time.Second)}
		return tx.PutOperation(done)
	})
	view(t, s, func(tx store.Tx) error {
		got := must1[[]store.Operation](t)(tx.PendingOperations("node-a"))
		wantIDs(t, "pending node-a", opIDs(got), []string{"op-1", "op-tie-a", "op-tie-b", "op-3"})
		for _, op := range got {
			same(t, "pending "+op.ID, op, sampleOperation(op.ID, "node-a", op.CreatedAt))
		}
		wantIDs(t, "pending node-b", opIDs(must1[[]store.Operation](t)(tx.PendingOperations("node-b"))), []string{"op-b"})
		wantIDs(t, "pending node-z", opIDs(must1[[]store.Operation](t)(tx.PendingOperations("node-z"))), []string{})
		got1 := must1[store.Operation](t)(tx.GetOperation("op-done"))
		if got1.Result == nil || got1.Result.Outcome != node.OutcomeOK {
			t.Errorf("GetOperation op-done result = %+v", got1.Result)
		}
		return nil
	})
	// Recording a result takes it off the pending list.
	var withResult store.Operation
	update(t, s, func(tx store.Tx) error {
		op := must1[store.Operation](t)(tx.GetOperation("op-tie-a"))
		op.Result = &node.Result{OperationID: op.ID, Kind: op.Command.Kind, Outcome: node.OutcomeFailed, Error: "no such image", At: at(time.Minute)}
		withResult = op
		return tx.PutOperation(op)
	})
	view(t, s, func(tx store.Tx) error {
		wantIDs(t, "pending after result", opIDs(must1[[]store.Operation](t)(tx.PendingOperations("node-a"))), []string{"op-1", "op-tie-b", "op-3"})
		same(t, "operation with result", must1[store.Operation](t)(tx.GetOperation("op-tie-a")), withResult)
		return nil
	})
}

func testEvents(t *testing.T, s store.Store) {
	see := func(tx store.Tx, nodeID, eventID string, want bool) {
		t.Helper()
		fresh, err := tx.SeeEvent(nodeID, eventID, at(0))
		if err != nil {
			t.Fatalf("SeeEvent(%s, %s): %v", nodeID, eventID, err)
		}
		if fresh != want {
			t.Errorf("SeeEvent(%s, %s) fresh = %v, want %v", nodeID, eventID, fresh, want)
		}
	}
	update(t, s, func(tx store.Tx) error {
		see(tx, "node-a", "000001", true)
		see(tx, "node-a", "000001", false) // within the same transaction
		see(tx, "node-a", "000002", true)
		see(tx, "node-b", "000001", true) // IDs are per node
		return nil
	})
	update(t, s, func(tx store.Tx) error {
		see(tx, "node-a", "000001", false)
		see(tx, "node-a", "000002", false)
		see(tx, "node-b", "000001", false)
		see(tx, "node-b", "000002", true)
		return nil
	})
}

func testLog(t *testing.T, s store.Store) {
	k1 := capability.WorkloadKey{RunID: "run-1", Attempt: 1}
	k2 := capability.WorkloadKey{RunID: "run-1", Attempt: 2}
	appendLog := func(tx store.Tx, k capability.WorkloadKey, off int64, data string, want int64) {
		t.Helper()
		size, err := tx.AppendLog(k, off, []byte(data))
		if err != nil {
			t.Fatalf("AppendLog(%v, %d, %q): %v", k, off, data, err)
		}
		if size != want {
			t.Errorf("AppendLog(%v, %d, %q) size = %d, want %d", k, off, data, size, want)
		}
	}
	readLog := func(tx store.Tx, k capability.WorkloadKey, off int64, max int, want string, wantSize int64) {
		t.Helper()
		data, size, err := tx.ReadLog(k, off, max)
		if err != nil {
			t.Fatalf("ReadLog(%v, %d, %d): %v", k, off, max, err)
		}
		if string(data) != want || size != wantSize {
			t.Errorf("ReadLog(%v, %d, %d) = %q, %d; want %q, %d", k, off, max, data, size, want, wantSize)
		}
	}
	view(t, s, func(tx store.Tx) error {
		readLog(tx, k1, 0, 100, "", 0) // nobody wrote: empty, not an error
		return nil
	})
	update(t, s, func(tx store.Tx) error {
		appendLog(tx, k1, 0, "hello", 5)
		appendLog(tx, k1, 0, "hello", 5)       // redelivered
		appendLog(tx, k1, 3, "loWorld", 10)    // overlaps: only "World" is new
		appendLog(tx, k1, 2, "llo", 10)        // entirely held
		appendLog(tx, k1, 10, "", 10)          // nothing
		appendLog(tx, k1, 20, "!!", 12)        // a gap: appended as if contiguous
		appendLog(tx, k2, 0, "second try", 10) // attempts are separate logs
		readLog(tx, k1, 0, 100, "helloWorld!!", 12)
		return nil
	})
	update(t, s, func(tx store.Tx) error {
		appendLog(tx, k1, 12, "\n", 13) // in a later transaction
		return nil
	})
	view(t, s, func(tx store.Tx) error {
		readLog(tx, k1, 0, 100, "helloWorld!!\n", 13)
		readLog(tx, k1, 0, 5, "hello", 13)
		readLog(tx, k1, 3, 4, "loWo", 13) // across appended pieces
		readLog(tx, k1, 5, 5, "World", 13)
		readLog(tx, k1, 11, 100, "!\n", 13)
		readLog(tx, k1, 12, 1, "\n", 13)
		readLog(tx, k1, 13, 10, "", 13)
		readLog(tx, k1, 50, 10, "", 13)
		readLog(tx, k1, 0, 0, "", 13)
		readLog(tx, k2, 0, 100, "second try", 10)
		readLog(tx, capability.WorkloadKey{RunID: "run-1", Attempt: 3}, 0, 100, "", 0)
		readLog(tx, capability.WorkloadKey{RunID: "run-2", Attempt: 1}, 0, 100, "", 0)
		return nil
	})
}

// testLogModel appends random, overlapping, redelivered and gapped chunks
// and compares the log, and random reads of it, with a model.
func testLogModel(t *testing.T, s store.Store) {
	rng := rand.New(rand.NewPCG(1, 2))
	k := capability.WorkloadKey{RunID: "run-model", Attempt: 1}
	var model []byte
	src := make([]byte, 4096)
	for i := range src {
		src[i] = byte('a' + rng.IntN(26))
	}
	update(t, s, func(tx store.Tx) error {
		for range 120 {
			size := int64(len(model))
			var off int64
			switch rng.IntN(4) {
			case 0: // redelivery from somewhere before the end
				off = rng.Int64N(size + 1)
			case 1: // a gap
				off = size + 1 + rng.Int64N(50)
			default: // contiguous
				off = size
			}
			n := rng.IntN(40)
			var data []byte
			if off < size {
				// Redelivered bytes are the bytes the log already holds.
				end := min(size, off+int64(n))
				data = append(slices.Clone(model[off:end]), src[rng.IntN(len(src)-n):][:max(0, n-int(end-off))]...)
			} else {
				data = slices.Clone(src[rng.IntN(len(src)-n):][:n])
			}
			if off+int64(len(data)) > size {
				if off >= size {
					model = append(model, data...)
				} else {
					model = append(model, data[size-off:]...)
				}
			}
			got, err := tx.AppendLog(k, off, data)
			if err != nil {
				t.Fatalf("AppendLog(%d, %d bytes): %v", off, len(data), err)
			}
			if got != int64(len(model)) {
				t.Fatalf("AppendLog(%d, %d bytes) size = %d, want %d", off, len(data), got, len(model))
			}
		}
		return nil
	})
	view(t, s, func(tx store.Tx) error {
		all, size, err := tx.ReadLog(k, 0, len(model)+10)
		must(t, err)
		if size != int64(len(model)) || string(all) != string(model) {
			t.Fatalf("whole log: %d bytes, size %d; want %d bytes", len(all), size, len(model))
		}
		for range 200 {
			off := rng.Int64N(int64(len(model)) + 5)
			n := rng.IntN(100)
			got, _, err := tx.ReadLog(k, off, n)
			must(t, err)
			var want []byte
			if off < int64(len(model)) {
				want = model[off:min(int64(len(model)), off+int64(n))]
			}
			if string(got) != string(want) {
				t.Fatalf("ReadLog(%d, %d) = %q, want %q", off, n, got, want)
			}
		}
		return nil
	})
}

func testTokens(t *testing.T, s store.Store) {
	update(t, s, func(tx store.Tx) error {
		_, err := tx.GetToken("tok-missing")
		wantKind(t, err, failure.ErrNotFound, "tok-missing")
		must(t, tx.CreateToken(sampleToken("tok-1")))
		must(t, tx.CreateToken(sampleToken("tok-2")))
		dup := sampleToken("tok-1")
		dup.Name = "impostor"
		wantKind(t, tx.CreateToken(dup), failure.ErrConflict, "tok-1")
		return nil
	})
	view(t, s, func(tx store.Tx) error {
		same(t, "GetToken tok-1", must1[store.Token](t)(tx.GetToken("tok-1")), sampleToken("tok-1"))
		same(t, "GetToken tok-2", must1[store.Token](t)(tx.GetToken("tok-2")), sampleToken("tok-2"))
		return nil
	})
}

func sampleArtifact(name string, seq int) store.Artifact {
	return store.Artifact{Seq: seq, ArtifactVersion: api.ArtifactVersion{
		Name: name, Version: fmt.Sprintf("v%d", seq), SHA256: strings.Repeat(fmt.Sprintf("%x", seq%16), 64),
		Size: int64(1000 * seq), Format: api.ArtifactFile, CreatedAt: at(time.Duration(seq) * time.Minute),
	}}
}

func sampleRegistryCredential(host string) store.RegistryCredential {
	return store.RegistryCredential{Host: host, Username: "user-" + host, Sealed: []byte{0, 1, 2, 0xff, byte(len(host))},
		CreatedAt: at(0), UpdatedAt: at(time.Minute)}
}

func artifactRefs(as []store.Artifact) []string {
	return ids(as, func(a store.Artifact) string { return a.Name + "@" + a.Version })
}

// testArtifacts: versions are created once, never replaced, and listed by
// name and then by Seq (numerically, so v10 follows v9).
func testArtifacts(t *testing.T, s store.Store) {
	view(t, s, func(tx store.Tx) error {
		_, err := tx.GetArtifact("data", "v1")
		wantKind(t, err, failure.ErrNotFound, "data@v1")
		wantIDs(t, "ListArtifacts on an empty store", artifactRefs(must1[[]store.Artifact](t)(tx.ListArtifacts(""))), []string{})
		return nil
	})
	update(t, s, func(tx store.Tx) error {
		for _, seq := range []int{10, 2, 1, 9} {
			must(t, tx.CreateArtifact(sampleArtifact("data", seq)))
		}
		must(t, tx.CreateArtifact(sampleArtifact("weights", 1)))
		must(t, tx.CreateArtifact(sampleArtifact("audio", 3)))
		dup := sampleArtifact("data", 2)
		dup.SHA256 = strings.Repeat("e", 64)
		wantKind(t, tx.CreateArtifact(dup), failure.ErrConflict, "data@v2")
		return nil
	})
	view(t, s, func(tx store.Tx) error {
		same(t, "GetArtifact", must1[store.Artifact](t)(tx.GetArtifact("data", "v2")), sampleArtifact("data", 2))
		wantIDs(t, "ListArtifacts(data)", artifactRefs(must1[[]store.Artifact](t)(tx.ListArtifacts("data"))),
			[]string{"data@v1", "data@v2", "data@v9", "data@v10"})
		wantIDs(t, "ListArtifacts()", artifactRefs(must1[[]store.Artifact](t)(tx.ListArtifacts(""))),
			[]string{"audio@v3", "data@v1", "data@v2", "data@v9", "data@v10", "weights@v1"})
		wantIDs(t, "ListArtifacts(missing)", artifactRefs(must1[[]store.Artifact](t)(tx.ListArtifacts("missing"))), []string{})
		_, err := tx.GetArtifact("weights", "v2")
		wantKind(t, err, failure.ErrNotFound, "weights@v2")
		return nil
	})
	// A failed transaction creates nothing.
	_ = s.Update(t.Context(), func(tx store.Tx) error {
		must(t, tx.CreateArtifact(sampleArtifact("rolled-back", 1)))
		return errBoom
	})
	view(t, s, func(tx store.Tx) error {
		_, err := tx.GetArtifact("rolled-back", "v1")
		wantKind(t, err, failure.ErrNotFound, "rolled-back@v1")
		return nil
	})
	update(t, s, func(tx store.Tx) error {
		invalid := func(what string, err error) {
			t.Helper()
			if !errors.Is(err, failure.ErrInvalid) {
				t.Errorf("%s: error = %v, want ErrInvalid", what, err)
			}
		}
		invalid("CreateArtifact without name", tx.CreateArtifact(sampleArtifact("", 1)))
		noVersion := sampleArtifact("x", 1)
		noVersion.Version = ""
		invalid("CreateArtifact without version", tx.CreateArtifact(noVersion))
		invalid("PutRegistryCredential without host", tx.PutRegistryCredential(sampleRegistryCredential("")))
		return nil
	})
}

// testRegistryCredentials: upsert by host, list by host, delete once; the
// sealed bytes come back exactly.
func testRegistryCredentials(t *testing.T, s store.Store) {
	update(t, s, func(tx store.Tx) error {
		_, err := tx.GetRegistryCredential("ghcr.io")
		wantKind(t, err, failure.ErrNotFound, "ghcr.io")
		wantKind(t, tx.DeleteRegistryCredential("ghcr.io"), failure.ErrNotFound, "ghcr.io")
		for _, h := range []string{"ghcr.io", "127.0.0.1:5000", "docker.io"} {
			must(t, tx.PutRegistryCredential(sampleRegistryCredential(h)))
		}
		return nil
	})
	replaced := sampleRegistryCredential("ghcr.io")
	replaced.Username, replaced.Sealed = "other", []byte("resealed")
	update(t, s, func(tx store.Tx) error { return tx.PutRegistryCredential(replaced) })
	view(t, s, func(tx store.Tx) error {
		same(t, "GetRegistryCredential", must1[store.RegistryCredential](t)(tx.GetRegistryCredential("ghcr.io")), replaced)
		got := must1[[]store.RegistryCredential](t)(tx.ListRegistryCredentials())
		wantIDs(t, "ListRegistryCredentials", ids(got, func(c store.RegistryCredential) string { return c.Host }),
			[]string{"127.0.0.1:5000", "docker.io", "ghcr.io"})
		same(t, "listed docker.io", got[1], sampleRegistryCredential("docker.io"))
		return nil
	})
	update(t, s, func(tx store.Tx) error {
		must(t, tx.DeleteRegistryCredential("docker.io"))
		_, err := tx.GetRegistryCredential("docker.io")
		wantKind(t, err, failure.ErrNotFound, "docker.io")
		return nil
	})
	view(t, s, func(tx store.Tx) error {
		got := must1[[]store.RegistryCredential](t)(tx.ListRegistryCredentials())
		wantIDs(t, "after delete", ids(got, func(c store.RegistryCredential) string { return c.Host }), []string{"127.0.0.1:5000", "ghcr.io"})
		return nil
	})
}

// testInvalidKeys: a record without its key is refused, not stored under "".
func testInvalidKeys(t *testing.T, s store.Store) {
	update(t, s, func(tx store.Tx) error {
		invalid := func(what string, err error) {
			t.Helper()
			if !errors.Is(err, failure.ErrInvalid) {
				t.Errorf("%s: error = %v, want ErrInvalid", what, err)
			}
		}
		invalid("PutNode", tx.PutNode(sampleNode("")))
		invalid("CreateInvitation", tx.CreateInvitation(sampleInvitation("", "node-a")))
		invalid("PutSession without hash", tx.PutSession(sampleSession("", "node-a")))
		invalid("PutSession without node", tx.PutSession(sampleSession("h", "")))
		invalid("CreateRun", tx.CreateRun(sampleRun("", at(0), api.RunQueued)))
		invalid("PutOperation without ID", tx.PutOperation(sampleOperation("", "node-a", at(0))))
		invalid("PutOperation without node", tx.PutOperation(sampleOperation("op", "", at(0))))
		invalid("CreateToken", tx.CreateToken(sampleToken("")))
		_, err := tx.SeeEvent("node-a", "", at(0))
		invalid("SeeEvent", err)
		_, err = tx.AppendLog(capability.WorkloadKey{RunID: "r", Attempt: 1}, -1, []byte("x"))
		invalid("AppendLog negative offset", err)
		_, _, err = tx.ReadLog(capability.WorkloadKey{RunID: "r", Attempt: 1}, 0, -1)
		invalid("ReadLog negative max", err)
		_, err = tx.GetNode("")
		wantKind(t, err, failure.ErrNotFound, "")
		return nil
	})
}

// testCopiesIn: mutating a record after storing it changes nothing stored.
func testCopiesIn(t *testing.T, s store.Store) {
	k := capability.WorkloadKey{RunID: "run-1", Attempt: 1}
	update(t, s, func(tx store.Tx) error {
		n := sampleNode("node-a")
		r := sampleRun("run-1", at(0), api.RunRunning, "node-a")
		op := sampleOperation("op-1", "node-a", at(0))
		data := []byte("hello")
		must(t, tx.PutNode(n))
		must(t, tx.CreateRun(r))
		must(t, tx.PutOperation(op))
		must1[int64](t)(tx.AppendLog(k, 0, data))

		n.Facts.Hostname = "mutated"
		n.Facts.Accelerators[0].UUID = "mutated"
		*n.EnrolledAt = at(99 * time.Hour)
		r.Attempts[0].NodeID = "mutated"
		r.Env["EPOCHS"] = "mutated"
		r.Command[0] = "mutated"
		*r.Attempts[0].ExitCode = 99
		op.Command.LaunchWorkload.GPUs[0] = "mutated"
		op.Command.LaunchWorkload.Env["K"] = "mutated"
		copy(data, "XXXXX")

		// Checked inside the same transaction and after it.
		same(t, "node in tx", must1[store.Node](t)(tx.GetNode("node-a")), sampleNode("node-a"))
		same(t, "run in tx", must1[store.Run](t)(tx.GetRun("run-1")), sampleRun("run-1", at(0), api.RunRunning, "node-a"))
		same(t, "operation in tx", must1[store.Operation](t)(tx.GetOperation("op-1")), sampleOperation("op-1", "node-a", at(0)))
		return nil
	})
	view(t, s, func(tx store.Tx) error {
		same(t, "node", must1[store.Node](t)(tx.GetNode("node-a")), sampleNode("node-a"))
		same(t, "run", must1[store.Run](t)(tx.GetRun("run-1")), sampleRun("run-1", at(0), api.RunRunning, "node-a"))
		same(t, "operation", must1[store.Operation](t)(tx.GetOperation("op-1")), sampleOperation("op-1", "node-a", at(0)))
		data, _, err := tx.ReadLog(k, 0, 100)
		must(t, err)
		if string(data) != "hello" {
			t.Errorf("log = %q after mutating the appended slice, want %q", data, "hello")
		}
		return nil
	})
}

// testCopiesOut: mutating a returned record changes nothing stored.
func testCopiesOut(t *testing.T, s store.Store) {
	k := capability.WorkloadKey{RunID: "run-1", Attempt: 1}
	update(t, s, func(tx store.Tx) error {
		must(t, tx.PutNode(sampleNode("node-a")))
		must(t, tx.CreateRun(sampleRun("run-1", at(0), api.RunRunning, "node-a")))
		must(t, tx.PutOperation(sampleOperation("op-1", "node-a", at(0))))
		must(t, tx.PutSession(sampleSession("sess-1", "node-a")))
		must(t, tx.CreateInvitation(sampleInvitation("inv-1", "node-a")))
		must(t, tx.CreateToken(sampleToken("tok-1")))
		must1[int64](t)(tx.AppendLog(k, 0, []byte("hello")))
		return nil
	})
	check := func(tx store.Tx) {
		t.Helper()
		same(t, "node", must1[store.Node](t)(tx.GetNode("node-a")), sampleNode("node-a"))
		same(t, "run", must1[store.Run](t)(tx.GetRun("run-1")), sampleRun("run-1", at(0), api.RunRunning, "node-a"))
		same(t, "operation", must1[store.Operation](t)(tx.GetOperation("op-1")), sampleOperation("op-1", "node-a", at(0)))
		same(t, "session", must1[store.Session](t)(tx.GetSession("sess-1")), sampleSession("sess-1", "node-a"))
		same(t, "invitation", must1[store.Invitation](t)(tx.GetInvitation("inv-1")), sampleInvitation("inv-1", "node-a"))
		same(t, "token", must1[store.Token](t)(tx.GetToken("tok-1")), sampleToken("tok-1"))
		data, _, err := tx.ReadLog(k, 0, 100)
		must(t, err)
		if string(data) != "hello" {
			t.Errorf("log = %q after mutating a read, want %q", data, "hello")
		}
	}
	mutate := func(tx store.Tx) {
		t.Helper()
		n := must1[store.Node](t)(tx.GetNode("node-a"))
		n.Facts.Hostname = "mutated"
		n.Facts.Accelerators[0].UUID = "mutated"
		*n.LastSeenAt = at(99 * time.Hour)
		r := must1[store.Run](t)(tx.GetRun("run-1"))
		r.Env["EPOCHS"] = "mutated"
		r.Attempts[0].NodeID = "mutated"
		*r.Attempts[0].StartedAt = at(99 * time.Hour)
		*r.NextCheck = at(99 * time.Hour)
		op := must1[store.Operation](t)(tx.GetOperation("op-1"))
		op.Command.LaunchWorkload.GPUs[0] = "mutated"
		sess := must1[store.Session](t)(tx.GetSession("sess-1"))
		sess.NodeID = "mutated"
		_ = sess
		for _, n := range must1[[]store.Node](t)(tx.ListNodes()) {
			n.Facts.Notes[0] = "mutated"
		}
		for _, r := range must1[[]store.Run](t)(tx.ListRuns(store.ListRunsOptions{})) {
			r.Command[0] = "mutated"
			*r.Attempts[0].ExitCode = 99
		}
		for _, op := range must1[[]store.Operation](t)(tx.PendingOperations("node-a")) {
			op.Command.LaunchWorkload.Env["K"] = "mutated"
		}
		data, _, err := tx.ReadLog(k, 0, 100)
		must(t, err)
		copy(data, "XXXXX")
	}
	update(t, s, func(tx store.Tx) error {
		mutate(tx)
		check(tx)
		return nil
	})
	view(t, s, func(tx store.Tx) error {
		mutate(tx)
		check(tx)
		return nil
	})
}

// testReadYourWrites: a transaction sees its own uncommitted writes.
func testReadYourWrites(t *testing.T, s store.Store) {
	update(t, s, func(tx store.Tx) error {
		must(t, tx.CreateRun(sampleRun("run-1", at(0), api.RunQueued)))
		r := must1[store.Run](t)(tx.GetRun("run-1"))
		r.Status = api.RunPlaced
		r.Attempts = append(r.Attempts, api.Attempt{Number: 1, NodeID: "node-a", Status: api.AttemptPlaced, PlacedAt: at(time.Second)})
		must(t, tx.PutRun(r))
		same(t, "run in tx", must1[store.Run](t)(tx.GetRun("run-1")), r)
		wantIDs(t, "ListRuns in tx", runIDs(must1[[]store.Run](t)(tx.ListRuns(store.ListRunsOptions{NodeID: "node-a", Statuses: []string{api.RunPlaced}}))), []string{"run-1"})
		must(t, tx.PutOperation(sampleOperation("op-1", "node-a", at(0))))
		wantIDs(t, "pending in tx", opIDs(must1[[]store.Operation](t)(tx.PendingOperations("node-a"))), []string{"op-1"})
		must(t, tx.PutSession(sampleSession("sess-1", "node-a")))
		must(t, tx.DeleteSessions("node-a"))
		_, err := tx.GetSession("sess-1")
		wantKind(t, err, failure.ErrNotFound, "sess-1")
		return nil
	})
}

// testRollback: when fn fails, nothing it did is kept, replacements included.
func testRollback(t *testing.T, s store.Store) {
	k := capability.WorkloadKey{RunID: "run-1", Attempt: 1}
	update(t, s, func(tx store.Tx) error {
		must(t, tx.PutNode(sampleNode("node-a")))
		must(t, tx.CreateRun(sampleRun("run-1", at(0), api.RunRunning, "node-a")))
		must(t, tx.PutSession(sampleSession("sess-1", "node-a")))
		must1[int64](t)(tx.AppendLog(k, 0, []byte("kept")))
		return nil
	})
	err := s.Update(t.Context(), func(tx store.Tx) error {
		n := sampleNode("node-a")
		n.FencingToken = 100
		must(t, tx.PutNode(n))
		must(t, tx.PutNode(sampleNode("node-b")))
		r := must1[store.Run](t)(tx.GetRun("run-1"))
		r.Status = api.RunFailed
		r.Attempts = nil
		must(t, tx.PutRun(r))
		must(t, tx.CreateRun(sampleRun("run-2", at(time.Hour), api.RunQueued, "node-b")))
		must(t, tx.CreateInvitation(sampleInvitation("inv-1", "node-b")))
		must(t, tx.DeleteSessions("node-a"))
		must(t, tx.PutOperation(sampleOperation("op-1", "node-a", at(0))))
		must1[bool](t)(tx.SeeEvent("node-a", "000001", at(0)))
		must1[int64](t)(tx.AppendLog(k, 4, []byte(" and lost")))
		must1[int64](t)(tx.AppendLog(capability.WorkloadKey{RunID: "run-2", Attempt: 1}, 0, []byte("lost")))
		must(t, tx.CreateToken(sampleToken("tok-1")))
		return fmt.Errorf("fn failed: %w", errBoom)
	})
	if !errors.Is(err, errBoom) {
		t.Fatalf("Update returned %v, want fn's error", err)
	}
	update(t, s, func(tx store.Tx) error {
		same(t, "node-a", must1[store.Node](t)(tx.GetNode("node-a")), sampleNode("node-a"))
		_, err := tx.GetNode("node-b")
		wantKind(t, err, failure.ErrNotFound, "node-b")
		same(t, "run-1", must1[store.Run](t)(tx.GetRun("run-1")), sampleRun("run-1", at(0), api.RunRunning, "node-a"))
		wantIDs(t, "runs on node-a", runIDs(must1[[]store.Run](t)(tx.ListRuns(store.ListRunsOptions{NodeID: "node-a"}))), []string{"run-1"})
		wantIDs(t, "runs on node-b", runIDs(must1[[]store.Run](t)(tx.ListRuns(store.ListRunsOptions{NodeID: "node-b"}))), nil)
		_, err = tx.GetRun("run-2")
		wantKind(t, err, failure.ErrNotFound, "run-2")
		_, err = tx.GetInvitation("inv-1")
		wantKind(t, err, failure.ErrNotFound, "inv-1")
		same(t, "session", must1[store.Session](t)(tx.GetSession("sess-1")), sampleSession("sess-1", "node-a"))
		_, err = tx.GetOperation("op-1")
		wantKind(t, err, failure.ErrNotFound, "op-1")
		wantIDs(t, "pending", opIDs(must1[[]store.Operation](t)(tx.PendingOperations("node-a"))), []string{})
		_, err = tx.GetToken("tok-1")
		wantKind(t, err, failure.ErrNotFound, "tok-1")
		data, size, err := tx.ReadLog(k, 0, 100)
		must(t, err)
		if string(data) != "kept" || size != 4 {
			t.Errorf("log = %q (size %d), want %q", data, size, "kept")
		}
		_, size, err = tx.ReadLog(capability.WorkloadKey{RunID: "run-2", Attempt: 1}, 0, 100)
		must(t, err)
		if size != 0 {
			t.Errorf("rolled-back log has size %d", size)
		}
		// The event was forgotten, so its redelivery is fresh.
		if fresh := must1[bool](t)(tx.SeeEvent("node-a", "000001", at(0))); !fresh {
			t.Error("SeeEvent after a rolled-back SeeEvent is not fresh")
		}
		return nil
	})
}

// testConflictKeepsTxUsable: a Create that conflicts fails alone; the
// transaction goes on and commits the rest.
func testConflictKeepsTxUsable(t *testing.T, s store.Store) {
	update(t, s, func(tx store.Tx) error { return tx.CreateRun(sampleRun("run-1", at(0), api.RunQueued)) })
	update(t, s, func(tx store.Tx) error {
		wantKind(t, tx.CreateRun(sampleRun("run-1", at(time.Hour), api.RunFailed)), failure.ErrConflict, "run-1")
		return tx.CreateRun(sampleRun("run-2", at(time.Hour), api.RunQueued))
	})
	view(t, s, func(tx store.Tx) error {
		wantIDs(t, "runs", runIDs(must1[[]store.Run](t)(tx.ListRuns(store.ListRunsOptions{}))), []string{"run-2", "run-1"})
		same(t, "run-1", must1[store.Run](t)(tx.GetRun("run-1")), sampleRun("run-1", at(0), api.RunQueued))
		return nil
	})
}

// testPanic: a panic in fn propagates, keeps nothing, and leaves the Store
// usable.
func testPanic(t *testing.T, s store.Store) {
	func() {
		defer func() {
			if recover() == nil {
				t.Error("panic in fn did not propagate")
			}
		}()
		_ = s.Update(t.Context(), func(tx store.Tx) error {
			must(t, tx.PutNode(sampleNode("node-a")))
			panic("storetest: panic in fn")
		})
	}()
	update(t, s, func(tx store.Tx) error {
		_, err := tx.GetNode("node-a")
		wantKind(t, err, failure.ErrNotFound, "node-a")
		return tx.PutNode(sampleNode("node-b"))
	})
	view(t, s, func(tx store.Tx) error {
		same(t, "node-b", must1[store.Node](t)(tx.GetNode("node-b")), sampleNode("node-b"))
		return nil
	})
}

// testViewIsReadOnly: writes inside View fail and are not kept.
func testViewIsReadOnly(t *testing.T, s store.Store) {
	_ = s.View(t.Context(), func(tx store.Tx) error {
		if err := tx.PutNode(sampleNode("node-a")); err == nil {
			t.Error("PutNode inside View succeeded")
		}
		if err := tx.CreateRun(sampleRun("run-1", at(0), api.RunQueued)); err == nil {
			t.Error("CreateRun inside View succeeded")
		}
		if _, err := tx.SeeEvent("node-a", "1", at(0)); err == nil {
			t.Error("SeeEvent inside View succeeded")
		}
		if _, err := tx.AppendLog(capability.WorkloadKey{RunID: "run-1"}, 0, []byte("x")); err == nil {
			t.Error("AppendLog inside View succeeded")
		}
		return nil
	})
	view(t, s, func(tx store.Tx) error {
		_, err := tx.GetNode("node-a")
		wantKind(t, err, failure.ErrNotFound, "node-a")
		_, err = tx.GetRun("run-1")
		wantKind(t, err, failure.ErrNotFound, "run-1")
		return nil
	})
}

// testViewSeesCommitted: each View sees everything committed before it
// began, and fn's error comes back from View.
func testViewSeesCommitted(t *testing.T, s store.Store) {
	for i := range 3 {
		id := fmt.Sprintf("run-%d", i)
		update(t, s, func(tx store.Tx) error { return tx.CreateRun(sampleRun(id, at(time.Duration(i)), api.RunQueued)) })
		view(t, s, func(tx store.Tx) error {
			n := len(must1[[]store.Run](t)(tx.ListRuns(store.ListRunsOptions{})))
			if n != i+1 {
				t.Errorf("View after %d commits sees %d runs", i+1, n)
			}
			same(t, id, must1[store.Run](t)(tx.GetRun(id)), sampleRun(id, at(time.Duration(i)), api.RunQueued))
			return nil
		})
	}
	if err := s.View(t.Context(), func(store.Tx) error { return errBoom }); !errors.Is(err, errBoom) {
		t.Errorf("View returned %v, want fn's error", err)
	}
}

// testTxAfterFn: a Tx kept past its fn refuses to be used.
func testTxAfterFn(t *testing.T, s store.Store) {
	var kept store.Tx
	update(t, s, func(tx store.Tx) error {
		kept = tx
		return tx.PutNode(sampleNode("node-a"))
	})
	if _, err := kept.GetNode("node-a"); err == nil {
		t.Error("GetNode on a finished Update's Tx succeeded")
	}
	if err := kept.PutNode(sampleNode("node-b")); err == nil {
		t.Error("PutNode on a finished Update's Tx succeeded")
	}
	view(t, s, func(tx store.Tx) error {
		kept = tx
		_, err := tx.GetNode("node-b")
		wantKind(t, err, failure.ErrNotFound, "node-b")
		return nil
	})
	if _, err := kept.GetNode("node-a"); err == nil {
		t.Error("GetNode on a finished View's Tx succeeded")
	}
}

func testCancelledContext(t *testing.T, s store.Store) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	called := false
	err := s.Update(ctx, func(tx store.Tx) error {
		called = true
		return tx.PutNode(sampleNode("node-a"))
	})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Update with a cancelled context = %v, want context.Canceled", err)
	}
	if called {
		t.Error("Update with a cancelled context ran fn")
	}
	err = s.View(ctx, func(store.Tx) error { called = true; return nil })
	if !errors.Is(err, context.Canceled) {
		t.Errorf("View with a cancelled context = %v, want context.Canceled", err)
	}
	if called {
		t.Error("View with a cancelled context ran fn")
	}
	view(t, s, func(tx store.Tx) error {
		_, err := tx.GetNode("node-a")
		wantKind(t, err, failure.ErrNotFound, "node-a")
		return nil
	})
}

// testConcurrentUpdates: read-modify-write Updates from many goroutines lose
// nothing, which is what serializable means here.
func testConcurrentUpdates(t *testing.T, s store.Store) {
	concurrentIncrements(t, s, s.Update)
}

// testConcurrentLockedUpdates: the same through UpdateLocked, whose promise
// is exactly that a record read by key and written back loses nothing.
// Each increment also reads a second record (a node) by key, and once one
// goroutine reads the two in the other order, so a store that locks rows
// meets a deadlock here (and, on PostgreSQL, the waits queued behind it:
// several seconds, deadlock_timeout being a second), which it must retry.
func testConcurrentLockedUpdates(t *testing.T, s store.Store) {
	update(t, s, func(tx store.Tx) error { return tx.PutNode(sampleNode("node-a")) })
	concurrentIncrements(t, s, s.UpdateLocked)
}

func concurrentIncrements(t *testing.T, s store.Store, commit func(context.Context, func(store.Tx) error) error) {
	const goroutines, increments = 8, 50
	update(t, s, func(tx store.Tx) error {
		r := sampleRun("counter", at(0), api.RunRunning)
		r.Retries = 0
		return tx.CreateRun(r)
	})
	ctx := t.Context()
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range increments {
				runs := 0
				err := commit(ctx, func(tx store.Tx) error {
					// Reversed on its first run only: a rerun in the
					// same order would deadlock again and again.
					runs++
					reversed := g == 1 && i == 5 && runs == 1
					if reversed { // the node first: the opposite order
						if _, err := tx.GetNode("node-a"); err != nil && !errors.Is(err, failure.ErrNotFound) {
							return err
						}
					}
					r, err := tx.GetRun("counter")
					if err != nil {
						return err
					}
					if !reversed {
						n, err := tx.GetNode("node-a")
						if err == nil {
							n.AgentVersion = fmt.Sprintf("v-%d-%d", g, i)
							err = tx.PutNode(n)
						}
						if err != nil && !errors.Is(err, failure.ErrNotFound) {
							return err
						}
					}
					r.Retries++
					if _, err := tx.SeeEvent("node-a", fmt.Sprintf("%d-%d", g, i), at(0)); err != nil {
						return err
					}
					return tx.PutRun(r)
				})
				if err != nil {
					t.Errorf("goroutine %d, increment %d: %v", g, i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	view(t, s, func(tx store.Tx) error {
		if got := must1[store.Run](t)(tx.GetRun("counter")).Retries; got != goroutines*increments {
			t.Errorf("counter = %d after %d increments", got, goroutines*increments)
		}
		return nil
	})
	update(t, s, func(tx store.Tx) error {
		for g := range goroutines {
			if must1[bool](t)(tx.SeeEvent("node-a", fmt.Sprintf("%d-%d", g, increments-1), at(0))) {
				t.Errorf("event of goroutine %d was not recorded", g)
			}
		}
		return nil
	})
}

// testSnapshotViews: Views running beside Updates that move a quantity
// between two runs always see the total unchanged.
func testSnapshotViews(t *testing.T, s store.Store) {
	const total, writers, moves = 1000, 4, 25
	update(t, s, func(tx store.Tx) error {
		a := sampleRun("run-a", at(0), api.RunRunning)
		a.Retries = total
		b := sampleRun("run-b", at(0), api.RunRunning)
		b.Retries = 0
		must(t, tx.CreateRun(a))
		return tx.CreateRun(b)
	})
	ctx := t.Context()
	var writersWG, readersWG sync.WaitGroup
	done := make(chan struct{})
	var mu sync.Mutex
	views := 0
	for range 2 {
		readersWG.Go(func() {
			for {
				err := s.View(ctx, func(tx store.Tx) error {
					a, err := tx.GetRun("run-a")
					if err != nil {
						return err
					}
					runs, err := tx.ListRuns(store.ListRunsOptions{})
					if err != nil {
						return err
					}
					sum := a.Retries
					for _, r := range runs {
						if r.ID == "run-b" {
							sum += r.Retries
						}
					}
					if sum != total {
						return fmt.Errorf("a View saw a total of %d, want %d", sum, total)
					}
					return nil
				})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				views++
				mu.Unlock()
				select {
				case <-done:
					return
				default:
				}
			}
		})
	}
	for range writers {
		writersWG.Go(func() {
			for range moves {
				err := s.Update(ctx, func(tx store.Tx) error {
					a, err := tx.GetRun("run-a")
					if err != nil {
						return err
					}
					a.Retries--
					if err := tx.PutRun(a); err != nil {
						return err
					}
					b, err := tx.GetRun("run-b")
					if err != nil {
						return err
					}
					b.Retries++
					return tx.PutRun(b)
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	writersWG.Wait()
	close(done)
	readersWG.Wait()
	if views == 0 {
		t.Error("no View completed")
	}
	view(t, s, func(tx store.Tx) error {
		a := must1[store.Run](t)(tx.GetRun("run-a")).Retries
		b := must1[store.Run](t)(tx.GetRun("run-b")).Retries
		if a != total-writers*moves || b != writers*moves {
			t.Errorf("after the moves: a = %d, b = %d; want %d, %d", a, b, total-writers*moves, writers*moves)
		}
		return nil
	})
}

func (h *harness) testCallsAfterClose(t *testing.T) {
	s, closeNow := h.start(t)
	update(t, s, func(tx store.Tx) error { return tx.PutNode(sampleNode("node-a")) })
	if err := closeNow(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	called := false
	if err := s.Update(t.Context(), func(store.Tx) error { called = true; return nil }); err == nil {
		t.Error("Update after Close succeeded")
	}
	if err := s.View(t.Context(), func(store.Tx) error { called = true; return nil }); err == nil {
		t.Error("View after Close succeeded")
	}
	if called {
		t.Error("fn ran after Close")
	}
}

// testPersistence: everything committed is there after Close and Reopen;
// nothing rolled back is.
func (h *harness) testPersistence(t *testing.T) {
	if h.opts.Reopen == nil {
		t.Skip("the implementation is not durable (Options.Reopen is nil)")
	}
	s, closeNow := h.start(t)
	k := capability.WorkloadKey{RunID: "run-1", Attempt: 1}
	spent := sampleInvitation("inv-1", "node-a")
	spent.SpentAt = ptr(at(time.Minute))
	done := sampleOperation("op-done", "node-a", at(0))
	done.Result = &node.Result{OperationID: "op-done", Kind: node.KindLaunchWorkload, Outcome: node.OutcomeOK, At: at(time.Second)}
	update(t, s, func(tx store.Tx) error {
		must(t, tx.PutNode(sampleNode("node-a")))
		must(t, tx.CreateInvitation(sampleInvitation("inv-1", "node-a")))
		must(t, tx.PutSession(sampleSession("sess-1", "node-a")))
		must(t, tx.CreateRun(sampleRun("run-1", at(0), api.RunRunning, "node-a")))
		must(t, tx.CreateRun(sampleRun("run-2", at(time.Second), api.RunQueued)))
		must(t, tx.PutOperation(sampleOperation("op-1", "node-a", at(0))))
		must(t, tx.PutOperation(done))
		must1[bool](t)(tx.SeeEvent("node-a", "000001", at(0)))
		must1[int64](t)(tx.AppendLog(k, 0, []byte("hello ")))
		must(t, tx.CreateToken(sampleToken("tok-1")))
		must(t, tx.CreateArtifact(sampleArtifact("data", 1)))
		must(t, tx.PutRegistryCredential(sampleRegistryCredential("ghcr.io")))
		return nil
	})
	update(t, s, func(tx store.Tx) error {
		must(t, tx.PutInvitation(spent))
		must1[int64](t)(tx.AppendLog(k, 6, []byte("world")))
		return nil
	})
	_ = s.Update(t.Context(), func(tx store.Tx) error {
		must(t, tx.PutNode(sampleNode("node-rolled-back")))
		return errBoom
	})
	if err := closeNow(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	s, _ = manage(t, h.opts.Reopen(t, s))
	update(t, s, func(tx store.Tx) error {
		same(t, "node", must1[store.Node](t)(tx.GetNode("node-a")), sampleNode("node-a"))
		_, err := tx.GetNode("node-rolled-back")
		wantKind(t, err, failure.ErrNotFound, "node-rolled-back")
		same(t, "invitation", must1[store.Invitation](t)(tx.GetInvitation("inv-1")), spent)
		same(t, "session", must1[store.Session](t)(tx.GetSession("sess-1")), sampleSession("sess-1", "node-a"))
		same(t, "run", must1[store.Run](t)(tx.GetRun("run-1")), sampleRun("run-1", at(0), api.RunRunning, "node-a"))
		wantIDs(t, "runs", runIDs(must1[[]store.Run](t)(tx.ListRuns(store.ListRunsOptions{}))), []string{"run-2", "run-1"})
		wantIDs(t, "runs on node-a", runIDs(must1[[]store.Run](t)(tx.ListRuns(store.ListRunsOptions{NodeID: "node-a"}))), []string{"run-1"})
		wantIDs(t, "pending", opIDs(must1[[]store.Operation](t)(tx.PendingOperations("node-a"))), []string{"op-1"})
		same(t, "operation with result", must1[store.Operation](t)(tx.GetOperation("op-done")), done)
		if must1[bool](t)(tx.SeeEvent("node-a", "000001", at(0))) {
			t.Error("an event seen before Close is fresh after reopening")
		}
		same(t, "token", must1[store.Token](t)(tx.GetToken("tok-1")), sampleToken("tok-1"))
		same(t, "artifact", must1[store.Artifact](t)(tx.GetArtifact("data", "v1")), sampleArtifact("data", 1))
		same(t, "registry credential", must1[store.RegistryCredential](t)(tx.GetRegistryCredential("ghcr.io")), sampleRegistryCredential("ghcr.io"))
		data, size, err := tx.ReadLog(k, 0, 100)
		must(t, err)
		if string(data) != "hello world" || size != 11 {
			t.Errorf("log = %q (size %d), want %q", data, size, "hello world")
		}
		if size := must1[int64](t)(tx.AppendLog(k, 0, []byte("hello world!"))); size != 12 {
			t.Errorf("AppendLog after reopening: size %d, want 12", size)
		}
		return nil
	})
}
