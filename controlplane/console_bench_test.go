package controlplane

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/history"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/sqlstore"
)

// benchSize reads a size from the environment, for the one measurement at
// scale; the defaults are the figures.
func benchSize(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// seedFleet stores nodes with 8 GPUs each and runs: a fifth queued, a fifth
// running (each holding one GPU of a node), the rest succeeded.
func seedFleet(b *testing.B, st store.Store, nodes, runs int) {
	now := time.Now()
	ctx := context.Background()
	ids := make([]string, nodes)
	for lo := 0; lo < nodes; lo += 2000 {
		if err := st.Update(ctx, func(tx store.Tx) error {
			for i := lo; i < min(lo+2000, nodes); i++ {
				ids[i] = fmt.Sprintf("node-%05d", i)
				f := &nodeproto.NodeFacts{Hostname: ids[i], CPUs: 64, MemoryBytes: 512 << 30, AgentVersion: "bench", RuntimeVersion: "28.2.2"}
				for g := range 8 {
					f.Accelerators = append(f.Accelerators, nodeproto.Accelerator{Vendor: "nvidia", Model: "H100", UUID: fmt.Sprintf("GPU-%05d-%d", i, g), MemoryBytes: 80 << 30})
				}
				if err := tx.PutNode(store.Node{ID: ids[i], CreatedAt: now, EnrolledAt: &now, LastSeenAt: &now, Facts: f}); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
	}
	for lo := 0; lo < runs; lo += 5000 {
		if err := st.Update(ctx, func(tx store.Tx) error {
			for i := lo; i < min(lo+5000, runs); i++ {
				r := api.Run{ID: httpapi.NewID("r-"), RunSpec: api.RunSpec{Image: "registry.example/train:v3", Command: []string{"python", "train.py", "--epoch", strconv.Itoa(i)}, GPUs: 1},
					PinnedImage: "registry.example/train@sha256:" + strings.Repeat("ab", 32), CreatedAt: now, UpdatedAt: now, Attempts: []api.Attempt{}}
				switch i % 5 {
				case 0:
					r.Status, r.Reason = api.RunQueued, "no node has a free GPU (10000 nodes: 10000 have no free GPU)"
				case 1:
					n := (i / 5) % nodes
					r.Status = api.RunRunning
					r.Attempts = []api.Attempt{{Number: 1, NodeID: ids[n], Status: api.RunRunning, GPUs: []string{fmt.Sprintf("GPU-%05d-%d", n, (i/5/nodes)%8)}, PlacedAt: now, StartedAt: &now}}
				default:
					code := 0
					r.Status, r.ExitCode, r.FinishedAt = api.RunSucceeded, &code, &now
					r.Attempts = []api.Attempt{{Number: 1, NodeID: ids[i%nodes], Status: api.RunSucceeded, ExitCode: &code, PlacedAt: now, StartedAt: &now, FinishedAt: &now}}
				}
				if err := tx.CreateRun(store.Run{Run: r}); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
	}
}

// fetchTiming is one request's time to first byte and the bytes of its body.
func fetchTiming(b *testing.B, hc *http.Client, req *http.Request) (time.Duration, int64) {
	var start, first time.Time
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{GotFirstResponseByte: func() { first = time.Now() }}))
	start = time.Now()
	resp, err := hc.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	n, err := io.Copy(io.Discard, resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		b.Fatalf("%s: %d %v", req.URL, resp.StatusCode, err)
	}
	return first.Sub(start), n
}

// BenchmarkConsolePages renders the console's Fleet and Runs pages over
// loopback HTTP, from a control plane on SQLite, at 10,000 nodes and
// 100,000 runs (MERCATOR_BENCH_NODES,
// MERCATOR_BENCH_RUNS), each beside the JSON API call that lists the same
// (the baseline, measured in the same run), and prints p50/p95 time to
// first byte, bytes sent and the ratio page/API.
func BenchmarkConsolePages(b *testing.B) {
	nodes, runs := benchSize("MERCATOR_BENCH_NODES", 10000), benchSize("MERCATOR_BENCH_RUNS", 100000)
	// SQLite, as one control plane runs (the in-memory store decodes every
	// run on every listing: a fake for tests, not a store to time).
	st, err := sqlstore.Open(context.Background(), "sqlite://"+filepath.Join(b.TempDir(), "bench.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	srv := New(Config{Lease: time.Hour}, st, pinResolver{}, nil)
	h := httptest.NewServer(srv.Handler())
	defer h.Close()
	tok := "mca_" + httpapi.RandomToken()
	if err := st.Update(context.Background(), func(tx store.Tx) error {
		return tx.CreateToken(store.Token{Hash: httpapi.HashToken(tok), Name: "bench", CreatedAt: time.Now()})
	}); err != nil {
		b.Fatal(err)
	}
	seedFleet(b, st, nodes, runs)
	// A full window of the fleet's GPU history, so the Fleet page draws
	// its chart as a replica up for six hours does.
	for i := range history.Points {
		srv.history.Fleet(history.FleetPoint{At: time.Now().Add(time.Duration(i-history.Points) * history.Period), Busy: i * nodes / 100, Idle: 8*nodes - i*nodes/100, Sick: i % 7})
	}
	hc := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := hc.PostForm(h.URL+"/ui/signin", url.Values{"token": {tok}})
	if err != nil || resp.StatusCode != http.StatusSeeOther || len(resp.Cookies()) == 0 {
		b.Fatalf("sign in: %v %v", err, resp)
	}
	cookie := resp.Cookies()[0]
	type target struct {
		name, page, api string
		ttfb            []time.Duration
		bytes           int64
	}
	pairs := []*[2]target{
		{{name: "Fleet page", page: "/ui/fleet"}, {name: "GET /v1/nodes", api: "/v1/nodes"}},
		{{name: "Runs page", page: "/ui/runs"}, {name: "GET /v1/runs?limit=50", api: "/v1/runs?limit=50"}},
		{{name: "Runs queue page", page: "/ui/runs?tab=queue"}, {name: "GET /v1/runs?status=queued&limit=50", api: "/v1/runs?status=queued&limit=50"}},
	}
	b.ResetTimer()
	for range b.N {
		for _, p := range pairs {
			for i := range p {
				t := &p[i]
				req, _ := http.NewRequest(http.MethodGet, h.URL+t.page+t.api, nil)
				if t.page != "" {
					req.AddCookie(cookie)
				} else {
					req.Header.Set("Authorization", "Bearer "+tok)
				}
				d, n := fetchTiming(b, hc, req)
				t.ttfb, t.bytes = append(t.ttfb, d), n
			}
		}
	}
	b.StopTimer()
	pct := func(ds []time.Duration, q float64) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[min(len(s)-1, int(q*float64(len(s))))]
	}
	fmt.Printf("console pages at %d nodes, %d runs, %d samples each:\n", nodes, runs, b.N)
	for _, p := range pairs {
		page, base := p[0], p[1]
		for _, t := range p {
			fmt.Printf("  %-40s ttfb p50 %8.2f ms  p95 %8.2f ms  %9d bytes\n", t.name, ms(pct(t.ttfb, 0.5)), ms(pct(t.ttfb, 0.95)), t.bytes)
		}
		fmt.Printf("  ratio %s / %s: ttfb p50 %.2f, bytes %.2f\n", page.name, base.name,
			float64(pct(page.ttfb, 0.5))/float64(pct(base.ttfb, 0.5)), float64(page.bytes)/float64(base.bytes))
		b.ReportMetric(ms(pct(page.ttfb, 0.5)), strings.ReplaceAll(strings.ToLower(page.name), " ", "-")+"-p50-ms")
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
