package groupcommit

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/memstore"
)

// counted commits through a memstore and counts the transactions, and
// holds each commit until release is closed, so callers pile up behind it.
type counted struct {
	st      store.Store
	commits atomic.Int32
	entered chan struct{}
	release chan struct{}
}

func (c *counted) update(ctx context.Context, fn func(tx store.Tx) error) error {
	c.commits.Add(1)
	select {
	case c.entered <- struct{}{}:
	default:
	}
	<-c.release
	return c.st.Update(ctx, fn)
}

func putNode(id string) func(tx store.Tx) error {
	return func(tx store.Tx) error { return tx.PutNode(store.Node{ID: id}) }
}

// TestCallersQueuedBehindACommitShareTheNext: while one commit is in
// progress, callers that arrive wait, and then commit together in one
// transaction; each gets its own answer and its own write.
func TestCallersQueuedBehindACommitShareTheNext(t *testing.T) {
	c := &counted{st: memstore.New(), entered: make(chan struct{}, 1), release: make(chan struct{})}
	var sizes []int
	g := New(c.update, c.update, 0, func(n int) { sizes = append(sizes, n) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go g.Run(ctx)
	for !g.Running() {
		runtime.Gosched()
	}
	first := make(chan error, 1)
	go func() { first <- g.Update(ctx, putNode("first")) }()
	<-c.entered // the first commit is in progress, holding the loop
	const n = 20
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = g.Update(ctx, putNode(fmt.Sprint("n", i))) }()
	}
	// The first commit ends once every caller is waiting to hand in its
	// transaction (blocked on the loop, which is busy committing).
	for waitingSenders() < n+1 { // the first caller waits for its answer in there too
		runtime.Gosched()
	}
	close(c.release)
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("caller %d: %v", i, err)
		}
	}
	if got := c.commits.Load(); got != 2 {
		t.Errorf("%d commits for 1+%d callers; want 2 (the first alone, the rest together)", got, n)
	}
	if len(sizes) != 1 || sizes[0] != n {
		t.Errorf("group sizes observed %v; want [%d]", sizes, n)
	}
	wantNodes(t, c.st, n+1, fmt.Sprint(n+1))
}

// waitingSenders is how many goroutines are inside Update (enqueue). With
// the loop busy committing, every one of them is blocked handing in its
// transaction: none can have been taken yet.
func waitingSenders() int {
	buf := make([]byte, 1<<20)
	return strings.Count(string(buf[:runtime.Stack(buf, true)]), "groupcommit.(*Committer).enqueue(")
}

// TestAFailingCallerFailsOnlyItself: one caller's error aborts the group's
// transaction; everyone is run again alone, so only that caller fails and
// the others' writes are kept.
func TestAFailingCallerFailsOnlyItself(t *testing.T) {
	st := memstore.New()
	g := New(st.Update, st.UpdateLocked, 0, nil)
	refused := errors.New("refused")
	live := make([]*job, 0, 3)
	for i, fn := range []func(tx store.Tx) error{putNode("a"), func(store.Tx) error { return refused }, putNode("b")} {
		live = append(live, &job{ctx: context.Background(), fn: fn, done: make(chan error, 1), locked: i != 1})
	}
	g.commit(context.Background(), live)
	if err := <-live[0].done; err != nil {
		t.Errorf("a: %v", err)
	}
	if err := <-live[1].done; !errors.Is(err, refused) {
		t.Errorf("the failing caller got %v; want its own error", err)
	}
	if err := <-live[2].done; err != nil {
		t.Errorf("b: %v", err)
	}
	wantNodes(t, st, 2, "a and b")
}

// TestAPanicAnswersTheGroup: a panic in one caller's transaction answers
// every caller of the group with ErrPanicked, then goes on to Run's caller.
func TestAPanicAnswersTheGroup(t *testing.T) {
	st := memstore.New()
	g := New(st.Update, st.UpdateLocked, 0, nil)
	jobs := []*job{
		{ctx: context.Background(), fn: putNode("a"), done: make(chan error, 1)},
		{ctx: context.Background(), fn: func(store.Tx) error { panic("a bug") }, done: make(chan error, 1)},
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the panic did not reach commit's caller")
			}
		}()
		g.commit(context.Background(), jobs)
	}()
	for i, j := range jobs {
		if err := <-j.done; !errors.Is(err, ErrPanicked) {
			t.Errorf("caller %d got %v; want ErrPanicked", i, err)
		}
	}
}

// TestWithoutALoopEachCallerCommitsAlone: before Run, Update and
// UpdateWith commit at once (a server used through its handler alone).
func TestWithoutALoopEachCallerCommitsAlone(t *testing.T) {
	st := memstore.New()
	g := New(st.Update, st.UpdateLocked, 0, nil)
	if err := g.Update(context.Background(), putNode("a")); err != nil {
		t.Fatal(err)
	}
	g.SetShare((&recordingShare{}).share)
	if err := g.UpdateWith(context.Background(), "need-b", true, putNode("b")); err != nil {
		t.Fatal(err)
	}
	wantNodes(t, st, 2, "a, and b through its Share's finish")
}

// recordingShare is a Share that records the needs of each call and holds
// the writes of the fns it serves (node IDs put through its transaction)
// until finish, as a memo would.
type recordingShare struct {
	calls    [][]any
	finished int
}

type heldTx struct {
	store.Tx
	held *[]string
}

func (h heldTx) PutNode(n store.Node) error { *h.held = append(*h.held, n.ID); return nil }

func (r *recordingShare) share(tx store.Tx, needs []any) (store.Tx, func() error, error) {
	r.calls = append(r.calls, append([]any(nil), needs...))
	var held []string
	return heldTx{Tx: tx, held: &held}, func() error {
		r.finished++
		for _, id := range held {
			if err := tx.PutNode(store.Node{ID: id}); err != nil {
				return err
			}
		}
		return nil
	}, nil
}

// TestSharedCallersReadTogether: the callers of a group with a need are
// prepared by one Share call, with every need in order, and run before the
// plain callers, which see their writes (finished before them); a failing
// shared caller sends everyone back alone, each shared one through a Share
// of its own.
func TestSharedCallersReadTogether(t *testing.T) {
	st := memstore.New()
	g := New(st.Update, st.UpdateLocked, 0, nil)
	rec := &recordingShare{}
	g.SetShare(rec.share)
	var plainSaw int
	plain := func(tx store.Tx) error {
		nodes, err := tx.ListNodes()
		plainSaw = len(nodes)
		return err
	}
	jobs := []*job{
		{ctx: context.Background(), fn: putNode("a"), done: make(chan error, 1), need: "need-a", locked: true},
		{ctx: context.Background(), fn: plain, done: make(chan error, 1)},
		{ctx: context.Background(), fn: putNode("b"), done: make(chan error, 1), need: "need-b", locked: true},
	}
	g.commit(context.Background(), jobs)
	for i, j := range jobs {
		if err := <-j.done; err != nil {
			t.Errorf("caller %d: %v", i, err)
		}
	}
	if len(rec.calls) != 1 || fmt.Sprint(rec.calls[0]) != "[need-a need-b]" || rec.finished != 1 {
		t.Errorf("Share calls %v, finished %d; want one call with [need-a need-b], finished once", rec.calls, rec.finished)
	}
	if plainSaw != 2 {
		t.Errorf("the plain caller saw %d nodes; want the shared callers' 2, finished before it ran", plainSaw)
	}

	rec.calls, rec.finished = nil, 0
	refused := errors.New("refused")
	jobs = []*job{
		{ctx: context.Background(), fn: putNode("c"), done: make(chan error, 1), need: "need-c"},
		{ctx: context.Background(), fn: func(store.Tx) error { return refused }, done: make(chan error, 1), need: "need-x"},
	}
	g.commit(context.Background(), jobs)
	if err := <-jobs[0].done; err != nil {
		t.Errorf("c: %v", err)
	}
	if err := <-jobs[1].done; !errors.Is(err, refused) {
		t.Errorf("the failing shared caller got %v; want its own error", err)
	}
	if fmt.Sprint(rec.calls) != "[[need-c need-x] [need-c] [need-x]]" || rec.finished != 1 {
		t.Errorf("Share calls %v, finished %d; want the group, then each alone, and only c finished", rec.calls, rec.finished)
	}
	wantNodes(t, st, 3, "a, b and c")
	if err := New(st.Update, st.UpdateLocked, 0, nil).UpdateWith(context.Background(), "n", false, putNode("d")); err == nil {
		t.Error("UpdateWith without a Share succeeded; want a programming error")
	}
}

// wantNodes fails t unless st holds n nodes (want says which).
func wantNodes(t *testing.T, st store.Store, n int, want string) {
	t.Helper()
	if err := st.View(context.Background(), func(tx store.Tx) error {
		nodes, err := tx.ListNodes()
		if len(nodes) != n {
			t.Errorf("%d nodes stored; want %s", len(nodes), want)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// TestUpdateLockedTakesTheLockedPath: a caller of UpdateLocked is committed
// through the store's UpdateLocked, one of Update through Update, alone
// (before Run) and in a group alike; a group with one caller of Update
// runs through Update.
func TestUpdateLockedTakesTheLockedPath(t *testing.T) {
	st := memstore.New()
	var plain, locked int
	count := func(n *int, commit func(context.Context, func(store.Tx) error) error) func(context.Context, func(store.Tx) error) error {
		return func(ctx context.Context, fn func(store.Tx) error) error { *n++; return commit(ctx, fn) }
	}
	g := New(count(&plain, st.Update), count(&locked, st.UpdateLocked), 0, nil)
	if err := g.UpdateLocked(context.Background(), putNode("a")); err != nil {
		t.Fatal(err)
	}
	if err := g.Update(context.Background(), putNode("b")); err != nil {
		t.Fatal(err)
	}
	if plain != 1 || locked != 1 {
		t.Fatalf("alone: %d plain and %d locked commits, want 1 and 1", plain, locked)
	}
	mk := func(id string, lock bool) *job {
		return &job{ctx: context.Background(), fn: putNode(id), done: make(chan error, 1), locked: lock}
	}
	g.commit(context.Background(), []*job{mk("c", true), mk("d", true)})
	g.commit(context.Background(), []*job{mk("e", true), mk("f", false)})
	if plain != 2 || locked != 2 {
		t.Errorf("groups: %d plain and %d locked commits, want 2 and 2", plain, locked)
	}
	wantNodes(t, st, 6, "a to f")
}
