package controlplane

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/nodeagent"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

const (
	uuidA   = "GPU-aaaaaaaa-0000-1111-2222-333344445555"
	uuidB   = "GPU-bbbbbbbb-0000-1111-2222-333344445555"
	uuidDup = "GPU-dddddddd-0000-1111-2222-333344445555"
	h100Mem = 81559 << 20 // what nvidia-smi reports for an H100 80GB
)

func h100(uuid string) nodeproto.Accelerator {
	return nodeproto.Accelerator{Vendor: "nvidia", Model: "NVIDIA H100 80GB HBM3", UUID: uuid, MemoryBytes: h100Mem}
}

// factsNode is a node speaking the node protocol over HTTP to the fixture's
// server, reporting whatever facts a test makes up.
type factsNode struct {
	id, token string
	tr        *nodeagent.HTTPTransport
	seq       int
}

func (f *runsFixture) enrollFactsNode(id string) *factsNode {
	f.t.Helper()
	var inv api.Invitation
	f.want(http.StatusCreated, &inv, "POST", "/v1/nodes/"+id+"/invitations", nil)
	tr := nodeagent.NewHTTPTransport(f.http.URL, nil)
	e, err := tr.Enroll(context.Background(), nodeproto.EnrollmentRequest{NodeID: id, Invitation: inv.Token, CapabilityVersion: nodeproto.Version})
	if err != nil {
		f.t.Fatalf("enroll %s: %v", id, err)
	}
	return &factsNode{id: id, token: e.SessionToken, tr: tr}
}

func (n *factsNode) report(t *testing.T, facts nodeproto.NodeFacts) {
	t.Helper()
	n.seq++
	facts.CapabilityVersion = nodeproto.Version
	ev := nodeproto.Event{ID: fmt.Sprintf("%s-%d", n.id, n.seq), Kind: nodeproto.EventFacts, At: time.Now(), Facts: &facts}
	acked, err := n.tr.SendEvents(context.Background(), n.id, n.token, []nodeproto.Event{ev})
	if err != nil || len(acked) != 1 {
		t.Fatalf("node %s facts: acked %v, %v (a refused report is acknowledged all the same)", n.id, acked, err)
	}
}

func (f *runsFixture) node(id string) api.Node {
	f.t.Helper()
	var n api.Node
	f.want(http.StatusOK, &n, "GET", "/v1/nodes/"+id, nil)
	return n
}

func (f *runsFixture) pendingOps(nodeID string) []store.Operation {
	f.t.Helper()
	var ops []store.Operation
	if err := f.srv.store.View(context.Background(), func(tx store.Tx) error {
		var err error
		ops, err = tx.PendingOperations(nodeID)
		return err
	}); err != nil {
		f.t.Fatal(err)
	}
	return ops
}

func (f *runsFixture) submitAndReconcile(spec api.RunSpec) api.Run {
	f.t.Helper()
	var run api.Run
	f.want(http.StatusCreated, &run, "POST", "/v1/runs", spec)
	if err := f.srv.reconcile(context.Background()); err != nil {
		f.t.Fatal(err)
	}
	f.want(http.StatusOK, &run, "GET", "/v1/runs/"+run.ID, nil)
	return run
}

func flagCount(t *testing.T, srv *Server, kind string) float64 {
	return counterValue(t, &protoFixture{srv: srv}, `mercator_node_fact_flags_total{kind="`+kind+`"}`)
}

// TestLyingNodeIsRefusedAndGetsNoWork: a node claiming 100,000 CPUs and a
// pebibyte of memory (which once received every Run) has its report
// refused and flagged, gets no command, and takes work again once it
// reports facts within bounds.
func TestLyingNodeIsRefusedAndGetsNoWork(t *testing.T) {
	f := newRunsFixture(t)
	liar, honest := f.enrollFactsNode("liar"), f.enrollFactsNode("honest")
	liar.report(t, nodeproto.NodeFacts{Hostname: "liar", CPUs: 100000, MemoryBytes: 1 << 50})
	honest.report(t, nodeproto.NodeFacts{Hostname: "honest", CPUs: 16, MemoryBytes: 64 << 30})

	n := f.node("liar")
	if n.Facts != nil || len(n.Flags) != 1 || n.Flags[0].Kind != api.NodeFlagFactsRefused || !strings.Contains(n.Flags[0].Detail, "cpus: 100000 is above the maximum of 4096") {
		t.Fatalf("liar after its report: facts %v, flags %+v", n.Facts, n.Flags)
	}
	if got := flagCount(t, f.srv, api.NodeFlagFactsRefused); got != 1 {
		t.Fatalf("facts_refused counted %v times, want 1", got)
	}
	for i := range 3 {
		if run := f.submitAndReconcile(specAt(i, "reg/app:1")); run.Status != api.RunPlaced || run.Attempts[0].NodeID != "honest" {
			t.Fatalf("run %d: %s on %+v, want placed on honest", i, run.Status, run.Attempts)
		}
	}
	if ops := f.pendingOps("liar"); len(ops) != 0 {
		t.Fatalf("the refused node was sent %d commands", len(ops))
	}
	// Negative CPUs the same; then the truth, which is applied.
	liar.report(t, nodeproto.NodeFacts{Hostname: "liar", CPUs: -8, MemoryBytes: 64 << 30})
	if n := f.node("liar"); len(n.Flags) != 1 || !strings.Contains(n.Flags[0].Detail, "cpus: -8 is negative") {
		t.Fatalf("negative CPUs: flags %+v", n.Flags)
	}
	liar.report(t, nodeproto.NodeFacts{Hostname: "liar", CPUs: 32, MemoryBytes: 256 << 30})
	if n := f.node("liar"); n.Facts == nil || len(n.Flags) != 0 {
		t.Fatalf("after an honest report: facts %v, flags %+v", n.Facts, n.Flags)
	}
	if run := f.submitAndReconcile(specAt(9, "reg/app:1")); run.Status != api.RunPlaced || run.Attempts[0].NodeID != "liar" {
		t.Fatalf("run after the honest report: %s on %+v, want placed on the roomier node", run.Status, run.Attempts)
	}
	// A lie after the truth: the facts it had stay on record, but a node
	// whose word was just refused takes no new work.
	liar.report(t, nodeproto.NodeFacts{Hostname: "liar", CPUs: 32, MemoryBytes: 256 << 30, Accelerators: make([]nodeproto.Accelerator, 65)})
	if n := f.node("liar"); n.Facts == nil || len(n.Flags) != 1 || !strings.Contains(n.Flags[0].Detail, "accelerators: 65 entries") {
		t.Fatalf("65 GPUs: facts %v, flags %+v", n.Facts, n.Flags)
	}
	before := len(f.pendingOps("liar"))
	if run := f.submitAndReconcile(specAt(10, "reg/app:1")); run.Status != api.RunPlaced || run.Attempts[0].NodeID != "honest" {
		t.Fatalf("run after a refused report: %s on %+v, want placed on honest", run.Status, run.Attempts)
	}
	if after := len(f.pendingOps("liar")); after != before {
		t.Fatalf("the refused node was sent %d new commands", after-before)
	}
}

// TestGPUDisputes: two nodes naming one GPU UUID are both flagged and
// neither gets work on it; one listing a UUID twice has it once; an
// operator's clear gives the GPU back to the node whose claim stands, and
// only to it.
func TestGPUDisputes(t *testing.T) {
	f := newRunsFixture(t)
	a, b := f.enrollFactsNode("a"), f.enrollFactsNode("b")
	a.report(t, nodeproto.NodeFacts{CPUs: 64, MemoryBytes: 512 << 30, Accelerators: []nodeproto.Accelerator{h100(uuidA), h100(uuidDup), h100(uuidA)}})
	b.report(t, nodeproto.NodeFacts{CPUs: 64, MemoryBytes: 512 << 30, Accelerators: []nodeproto.Accelerator{h100(uuidB), h100(uuidDup)}})

	for _, id := range []string{"a", "b"} {
		n := f.node(id)
		var disputed []string
		for _, fl := range n.Flags {
			if fl.Kind == api.NodeFlagGPUDisputed {
				disputed = append(disputed, fl.GPU)
			}
		}
		if len(disputed) != 1 || disputed[0] != uuidDup {
			t.Fatalf("node %s flags %+v, want %s disputed", id, n.Flags, uuidDup)
		}
	}
	if n := f.node("a"); len(n.Flags) != 2 || n.Flags[0].Kind != api.NodeFlagGPUDuplicate || len((*n.Facts)["accelerators"].([]any)) != 2 {
		t.Fatalf("node a (lists %s twice): flags %+v, facts %v", uuidA, n.Flags, (*n.Facts)["accelerators"])
	}
	if got := flagCount(t, f.srv, api.NodeFlagGPUDisputed); got != 2 {
		t.Fatalf("gpu_disputed counted %v times, want 2 (one per node)", got)
	}

	// Each node has one GPU that may be placed on: a run asking for two
	// waits, one asking for one takes a node's undisputed GPU.
	spec := specAt(0, "reg/app:1")
	spec.GPUs = 2
	two := f.submitAndReconcile(spec)
	if two.Status != api.RunQueued || !strings.Contains(two.Reason, "2 nodes have fewer than 2 matching GPUs") {
		t.Fatalf("2-GPU run: %s, %q", two.Status, two.Reason)
	}
	if ops := append(f.pendingOps("a"), f.pendingOps("b")...); len(ops) != 0 {
		t.Fatalf("%d commands sent while the GPU is disputed", len(ops))
	}

	// The operator looks, and a's claim stands.
	var n api.Node
	f.want(http.StatusOK, &n, "POST", "/v1/nodes/a/gpus/"+uuidDup+"/clear", nil)
	if len(n.Flags) != 1 || n.Flags[0].Kind != api.NodeFlagGPUDuplicate {
		t.Fatalf("a after the clear: %+v", n.Flags)
	}
	f.want(http.StatusNotFound, nil, "POST", "/v1/nodes/a/gpus/"+uuidDup+"/clear", nil)
	if err := f.srv.reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	f.want(http.StatusOK, &two, "GET", "/v1/runs/"+two.ID, nil)
	if two.Status != api.RunPlaced || two.Attempts[0].NodeID != "a" || strings.Join(two.Attempts[0].GPUs, ",") != uuidA+","+uuidDup {
		t.Fatalf("2-GPU run after the clear: %s on %+v", two.Status, two.Attempts)
	}
	if n := f.node("b"); len(n.Flags) != 1 || n.Flags[0].Kind != api.NodeFlagGPUDisputed {
		t.Fatalf("b's dispute must stay until it is cleared there: %+v", n.Flags)
	}
	// b's next report (its GPUs unchanged) keeps its dispute, and its
	// Since.
	since := f.node("b").Flags[0].Since
	b.report(t, nodeproto.NodeFacts{CPUs: 64, MemoryBytes: 500 << 30, Accelerators: []nodeproto.Accelerator{h100(uuidB), h100(uuidDup)}})
	if n := f.node("b"); len(n.Flags) != 1 || !n.Flags[0].Since.Equal(since) {
		t.Fatalf("b after a report: %+v", n.Flags)
	}
}

// TestFunctionShareGPUs: a GPU a node sets aside for functions is never
// given to a Run (and naming one no longer crashes the reconcile pass,
// whose map of used GPUs was nil when the share filled it).
func TestFunctionShareGPUs(t *testing.T) {
	f := newRunsFixture(t)
	n := f.enrollFactsNode("fnnode")
	n.report(t, nodeproto.NodeFacts{CPUs: 64, MemoryBytes: 512 << 30, Accelerators: []nodeproto.Accelerator{h100(uuidA), h100(uuidB)},
		Functions: &nodeproto.FunctionCapacity{MemoryBytes: 8 << 30, MilliCPUs: 4000, GPUs: []string{uuidB}}})
	spec := specAt(0, "reg/app:1")
	spec.GPUs = 1
	if run := f.submitAndReconcile(spec); run.Status != api.RunPlaced || strings.Join(run.Attempts[0].GPUs, ",") != uuidA {
		t.Fatalf("first GPU run: %s on %+v, want %s", run.Status, run.Attempts, uuidA)
	}
	spec = specAt(1, "reg/app:1")
	spec.GPUs = 1
	if run := f.submitAndReconcile(spec); run.Status != api.RunQueued {
		t.Fatalf("second GPU run: %s on %+v, want it waiting (the other GPU is the function share's)", run.Status, run.Attempts)
	}
}
