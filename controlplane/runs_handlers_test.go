package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/memstore"
)

// These tests drive POST /v1/runs/batch through the public API of a server
// over memstore, with the store and the image resolver wrapped to count
// what a batch asked of them.

// countingStore counts the write transactions committed through it.
type countingStore struct {
	store.Store
	updates atomic.Int32
}

func (c *countingStore) Update(ctx context.Context, fn func(tx store.Tx) error) error {
	c.updates.Add(1)
	return c.Store.Update(ctx, fn)
}

func (c *countingStore) UpdateLocked(ctx context.Context, fn func(tx store.Tx) error) error {
	c.updates.Add(1)
	return c.Store.UpdateLocked(ctx, fn)
}

// countingResolver counts the pins asked of it, by reference.
type countingResolver struct {
	ImageResolver
	mu   sync.Mutex
	refs map[string]int
}

func (c *countingResolver) Resolve(ctx context.Context, ref string) (string, error) {
	c.mu.Lock()
	c.refs[ref]++
	c.mu.Unlock()
	return c.ImageResolver.Resolve(ctx, ref)
}

type runsFixture struct {
	*fnFixture
	st  *countingStore
	res *countingResolver
}

// newRunsFixture serves the API of a server over a counting memstore and a
// counting pinResolver, with an admin token; requests go through
// fnFixture's helpers (do, want).
func newRunsFixture(t *testing.T) *runsFixture {
	return newRunsFixtureWith(t, Config{Lease: time.Minute})
}

// newRunsFixtureWith is newRunsFixture with the server's configuration
// given.
func newRunsFixtureWith(t *testing.T, cfg Config) *runsFixture {
	st := &countingStore{Store: memstore.New()}
	res := &countingResolver{ImageResolver: pinResolver{}, refs: map[string]int{}}
	srv := New(cfg, st, res, nil)
	h := httptest.NewServer(srv.Handler())
	t.Cleanup(h.Close)
	tok := "mca_" + httpapi.RandomToken()
	if err := st.Update(context.Background(), func(tx store.Tx) error {
		return tx.CreateToken(store.Token{Hash: httpapi.HashToken(tok), Name: "admin", CreatedAt: time.Now()})
	}); err != nil {
		t.Fatal(err)
	}
	return &runsFixture{fnFixture: &fnFixture{t: t, srv: srv, st: st, http: h, token: tok}, st: st, res: res}
}

// addNodes stores n ready nodes of 16 CPUs and 64 GiB, as enrollment and a
// fresh report would leave them.
func (f *runsFixture) addNodes(n int) {
	f.t.Helper()
	now := time.Now()
	for i := range n {
		err := f.srv.update(context.Background(), func(tx store.Tx) error {
			return tx.PutNode(store.Node{ID: fmt.Sprintf("n%d", i), CreatedAt: now, EnrolledAt: &now, LastSeenAt: &now,
				Facts: &nodeproto.NodeFacts{CPUs: 16, MemoryBytes: 64 << 30}})
		})
		if err != nil {
			f.t.Fatal(err)
		}
	}
}

// putNode stores a ready node of 16 CPUs and mem bytes whose agent speaks
// capability version.
func (f *runsFixture) putNode(id string, mem int64, version int) {
	f.t.Helper()
	now := time.Now()
	if err := f.srv.update(context.Background(), func(tx store.Tx) error {
		return tx.PutNode(store.Node{ID: id, CreatedAt: now, EnrolledAt: &now, LastSeenAt: &now,
			Facts: &nodeproto.NodeFacts{CPUs: 16, MemoryBytes: mem, CapabilityVersion: version}})
	}); err != nil {
		f.t.Fatal(err)
	}
}

// listRuns is every run the API lists.
func (f *runsFixture) listRuns() []api.Run {
	f.t.Helper()
	var l api.RunList
	f.want(http.StatusOK, &l, "GET", "/v1/runs?limit=1000", nil)
	return l.Runs
}

// refused posts body to the batch route and checks the answer is a 400 in
// the API's error shape naming field, with a message saying says, and that
// no run exists afterwards.
func (f *runsFixture) refused(body any, field, says string) {
	f.t.Helper()
	status, _, data := f.do("POST", "/v1/runs/batch", body)
	var e api.Error
	if err := json.Unmarshal(data, &e); err != nil {
		f.t.Fatalf("answer %d %s is not the API's error shape: %v", status, data, err)
	}
	if status != http.StatusBadRequest || e.Error.Code != "invalid" || e.Error.Field != field || !strings.Contains(e.Error.Message, says) {
		f.t.Errorf("answer %d %s, want 400 invalid naming %q and saying %q", status, data, field, says)
	}
	if runs := f.listRuns(); len(runs) != 0 {
		f.t.Errorf("a refused batch left %d runs, want none", len(runs))
	}
}

func specAt(i int, image string) api.RunSpec {
	return api.RunSpec{Image: image, Command: []string{"/work"}, CPU: 1, MemoryBytes: 1 << 30,
		Env: map[string]string{"MERCATOR_RUN_INDEX": fmt.Sprint(i)}}
}

// TestSubmitRunsBatch: a batch's runs come back in the order of its specs,
// pinned, queued and stored, in one transaction, with each distinct image
// pinned once; the reconcile loop is woken and places them as it places a
// run submitted alone.
func TestSubmitRunsBatch(t *testing.T) {
	f := newRunsFixture(t)
	f.addNodes(3)
	var single api.Run
	f.want(http.StatusCreated, &single, "POST", "/v1/runs", specAt(-1, "reg/solo:1"))

	images := []string{"reg/train:1", "reg/train:1", "reg/eval:2", "reg/train:1", "reg/eval:2", "reg/train:1"}
	batch := api.RunBatch{}
	for i, img := range images {
		batch.Runs = append(batch.Runs, specAt(i, img))
	}
	select { // drop the single submission's wake
	case <-f.srv.reconcileWake:
	default:
	}
	updates := f.st.updates.Load()
	var got api.RunList
	f.want(http.StatusCreated, &got, "POST", "/v1/runs/batch", batch)
	if n := f.st.updates.Load() - updates; n != 1 {
		t.Errorf("the batch took %d write transactions, want 1", n)
	}
	select {
	case <-f.srv.reconcileWake:
	default:
		t.Error("the batch did not wake the reconcile loop")
	}
	if f.res.refs["reg/train:1"] != 1 || f.res.refs["reg/eval:2"] != 1 {
		t.Errorf("pins asked of the registry: %v, want each image once", f.res.refs)
	}
	if len(got.Runs) != len(images) {
		t.Fatalf("%d runs back, want %d", len(got.Runs), len(images))
	}
	ids := map[string]bool{single.ID: true}
	for i, r := range got.Runs {
		name, _, _ := strings.Cut(images[i], ":")
		if r.Env["MERCATOR_RUN_INDEX"] != fmt.Sprint(i) || r.Image != images[i] {
			t.Errorf("runs[%d] is the spec of index %s, image %s: order not kept", i, r.Env["MERCATOR_RUN_INDEX"], r.Image)
		}
		if r.PinnedImage != name+"@sha256:"+strings.Repeat("a", 64) || r.Status != api.RunQueued || r.Attempts == nil {
			t.Errorf("runs[%d] = pinned %q, status %q, attempts %v", i, r.PinnedImage, r.Status, r.Attempts)
		}
		if !strings.HasPrefix(r.ID, "r-") || ids[r.ID] {
			t.Errorf("runs[%d] has ID %q: not a new run ID", i, r.ID)
		}
		ids[r.ID] = true
	}
	stored := f.listRuns()
	if len(stored) != len(images)+1 {
		t.Fatalf("%d runs stored, want %d", len(stored), len(images)+1)
	}
	for _, r := range stored {
		if !ids[r.ID] {
			t.Errorf("stored run %s was not answered", r.ID)
		}
	}

	if err := f.srv.reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	for id := range ids {
		var r api.Run
		f.want(http.StatusOK, &r, "GET", "/v1/runs/"+id, nil)
		if r.Status != api.RunPlaced || len(r.Attempts) != 1 || r.Attempts[0].NodeID == "" {
			t.Errorf("run %s after a reconcile pass: status %s, attempts %+v; want placed on a node", id, r.Status, r.Attempts)
		}
	}
}

// TestSubmitRunsRefusesTheWholeBatch: a spec refused at index k refuses
// the batch with that spec's error, its field prefixed with runs[k], and
// creates none of the others, valid ones before it included.
func TestSubmitRunsRefusesTheWholeBatch(t *testing.T) {
	cases := map[string]struct {
		at    int
		spoil func(*api.RunSpec)
		field string
		says  string
	}{
		"no image":         {3, func(s *api.RunSpec) { s.Image = " " }, "runs[3].image", "is required"},
		"first spec":       {0, func(s *api.RunSpec) { s.Command = nil }, "runs[0].command", "is required"},
		"negative cpu":     {4, func(s *api.RunSpec) { s.CPU = -1 }, "runs[4].cpu", "number of cores"},
		"bad env name":     {2, func(s *api.RunSpec) { s.Env["1X"] = "y" }, "runs[2].env", "not a valid variable name"},
		"unknown artifact": {1, func(s *api.RunSpec) { s.Artifacts = []api.ArtifactMount{{Name: "weights", MountPath: "/w"}} }, "runs[1].artifacts[0]", "does not exist"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			f := newRunsFixture(t)
			batch := api.RunBatch{}
			for i := range 5 {
				batch.Runs = append(batch.Runs, specAt(i, "reg/train:1"))
			}
			tc.spoil(&batch.Runs[tc.at])
			f.refused(batch, tc.field, tc.says)
		})
	}
}

// TestSubmitRunsBatchSize: an empty batch and one over api.MaxRunBatch are
// refused, telling the caller what to do; a full batch whose body is larger
// than a single submission's limit (httpapi.MaxBody) goes through.
func TestSubmitRunsBatchSize(t *testing.T) {
	f := newRunsFixture(t)
	f.refused(map[string]any{}, "runs", "is empty")
	f.refused(api.RunBatch{Runs: []api.RunSpec{}}, "runs", "is empty")
	var over api.RunBatch
	for i := range api.MaxRunBatch + 1 {
		over.Runs = append(over.Runs, specAt(i, "reg/train:1"))
	}
	f.refused(over, "runs", "split it into calls of at most 1000")
	huge := strings.Repeat("x", maxBatchBody/api.MaxRunBatch)
	for i := range over.Runs {
		over.Runs[i].Env["PAD"] = huge
	}
	f.refused(over, "", "larger than")

	full := api.RunBatch{Runs: over.Runs[:api.MaxRunBatch]}
	for i := range full.Runs {
		full.Runs[i].Env["PAD"] = strings.Repeat("x", 2<<10)
	}
	if raw, err := json.Marshal(full); err != nil || len(raw) <= httpapi.MaxBody {
		t.Fatalf("the full batch's body is %d bytes (%v), not over httpapi.MaxBody: the test proves nothing", len(raw), err)
	}
	var got api.RunList
	f.want(http.StatusCreated, &got, "POST", "/v1/runs/batch", full)
	if len(got.Runs) != api.MaxRunBatch || len(f.listRuns()) != api.MaxRunBatch {
		t.Errorf("%d runs answered, %d stored; want %d", len(got.Runs), len(f.listRuns()), api.MaxRunBatch)
	}
}
