package storetest

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

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

// testRunGang: a gang run (issue 18) reads back with its size, its
// rendezvous port and each member's attempt set and rank, and is listed
// under every member's node.
func testRunGang(t *testing.T, s store.Store) {
	r := sampleRun("run-g", at(0), api.RunRunning, "node-g1", "node-g2")
	r.Nodes, r.MasterPort = 2, 29501
	for i := range r.Attempts {
		r.Attempts[i].Set, r.Attempts[i].Rank = 1, i
	}
	update(t, s, func(tx store.Tx) error { return tx.CreateRun(r) })
	view(t, s, func(tx store.Tx) error {
		same(t, "gang run", must1[store.Run](t)(tx.GetRun("run-g")), r)
		for _, node := range []string{"node-g1", "node-g2"} {
			listed := must1[[]store.Run](t)(tx.ListRuns(store.ListRunsOptions{NodeID: node}))
			if len(listed) != 1 || listed[0].ID != "run-g" {
				t.Errorf("runs listed for gang member node %s: %d, want run-g", node, len(listed))
			}
		}
		return nil
	})
}

// testRunSecrets: a run's secrets are stored only sealed, read back as
// they were written beside their redacted names, and a run carrying a
// secret in the clear (or a redacted name with nothing sealed) is refused.
func testRunSecrets(t *testing.T, s store.Store) {
	r := sampleRun("run-s", at(0), api.RunQueued)
	r.SealedSecrets = map[string][]byte{"TOKEN": {0, 1, 2, 0xff}, "KEY": {0xfe}}
	r.Secrets = store.RedactedSecrets(r.SealedSecrets)
	noNames := sampleRun("run-n", at(time.Second), api.RunQueued)
	noNames.SealedSecrets = map[string][]byte{"KEY": {7}}
	update(t, s, func(tx store.Tx) error {
		clear := sampleRun("run-c", at(0), api.RunQueued)
		clear.Secrets = map[string]string{"TOKEN": "s3cret"}
		clear.SealedSecrets = map[string][]byte{"TOKEN": {1}}
		wantKind(t, tx.CreateRun(clear), failure.ErrInvalid, "run-c")
		unsealed := sampleRun("run-u", at(0), api.RunQueued)
		unsealed.Secrets = map[string]string{"TOKEN": api.SecretRedacted}
		wantKind(t, tx.CreateRun(unsealed), failure.ErrInvalid, "run-u")
		must(t, tx.CreateRun(noNames))
		return tx.CreateRun(r)
	})
	update(t, s, func(tx store.Tx) error {
		same(t, "run with secrets", must1[store.Run](t)(tx.GetRun("run-s")), r)
		got := must1[store.Run](t)(tx.GetRun("run-n"))
		if got.Secrets["KEY"] != api.SecretRedacted || len(got.Secrets) != 1 {
			t.Errorf("a run stored with sealed secrets and no names reads back with Secrets %v, want KEY redacted", got.Secrets)
		}
		changed := r
		changed.Secrets = map[string]string{"TOKEN": "s3cret", "KEY": api.SecretRedacted}
		wantKind(t, tx.PutRun(changed), failure.ErrInvalid, "run-s")
		return nil
	})
	view(t, s, func(tx store.Tx) error {
		listed := must1[[]store.Run](t)(tx.ListRuns(store.ListRunsOptions{}))
		i := slices.IndexFunc(listed, func(x store.Run) bool { return x.ID == "run-s" })
		if i < 0 {
			t.Fatalf("ListRuns lacks run-s: %v", runIDs(listed))
		}
		same(t, "listed run with secrets", listed[i], r)
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
		// In any order: the same runs, in an order the test does not
		// depend on; a cursor or a limit, which need an order, refused.
		sorted := func(ids []string) []string { slices.Sort(ids); return ids }
		wantIDs(t, "AnyOrder all", sorted(list(tx, store.ListRunsOptions{AnyOrder: true})), sorted(slices.Clone(all)))
		wantIDs(t, "AnyOrder running,queued,placed",
			sorted(list(tx, store.ListRunsOptions{Statuses: []string{api.RunRunning, api.RunQueued, api.RunPlaced}, AnyOrder: true})),
			[]string{"r-new", "r-tie-a", "r-tie-b", "r-zoned"})
		wantIDs(t, "AnyOrder, NodeID node-a", sorted(list(tx, store.ListRunsOptions{NodeID: "node-a", AnyOrder: true})),
			[]string{"r-ns", "r-old", "r-tie-c"})
		_, err = tx.ListRuns(store.ListRunsOptions{AnyOrder: true, Limit: 2})
		wantKind(t, err, failure.ErrInvalid, "limit")
		_, err = tx.ListRuns(store.ListRunsOptions{AnyOrder: true, Before: "r-tie-c"})
		wantKind(t, err, failure.ErrInvalid, "cursor")
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

func testLog(t *testing.T, s store.Store) {
	k1 := nodeproto.WorkloadKey{RunID: "run-1", Attempt: 1}
	k2 := nodeproto.WorkloadKey{RunID: "run-1", Attempt: 2}
	appendLog := func(tx store.Tx, k nodeproto.WorkloadKey, off int64, data string, want int64) {
		t.Helper()
		size, err := tx.AppendLog(k, off, []byte(data))
		if err != nil {
			t.Fatalf("AppendLog(%v, %d, %q): %v", k, off, data, err)
		}
		if size != want {
			t.Errorf("AppendLog(%v, %d, %q) size = %d, want %d", k, off, data, size, want)
		}
	}
	readLog := func(tx store.Tx, k nodeproto.WorkloadKey, off int64, max int, want string, wantSize int64) {
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
		readLog(tx, nodeproto.WorkloadKey{RunID: "run-1", Attempt: 3}, 0, 100, "", 0)
		readLog(tx, nodeproto.WorkloadKey{RunID: "run-2", Attempt: 1}, 0, 100, "", 0)
		return nil
	})
}

// testLogModel appends random, overlapping, redelivered and gapped chunks
// and compares the log, and random reads of it, with a model.
func testLogModel(t *testing.T, s store.Store) {
	rng := rand.New(rand.NewPCG(1, 2))
	k := nodeproto.WorkloadKey{RunID: "run-model", Attempt: 1}
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
