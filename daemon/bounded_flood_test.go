package daemon

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/controlplane"
	"github.com/mercator/mercator/internal/registrytest"
	"github.com/mercator/mercator/nodeproto"
)

// TestOversizedNodeEventsKeepMemoryBounded: node event batches of 7.6 MB
// (the size that took the control plane from 48 MiB to 1,015 MiB when 40
// were posted at once) are refused, 40 at a time, whether they declare
// their length or not, and batches just under the limit from 40 nodes at
// once are held to the node body budget; the heap in use stays under
// heapBound above where it started.
func TestOversizedNodeEventsKeepMemoryBounded(t *testing.T) {
	const concurrent, oversized, nearLimit = 40, 7_600_000, nodeproto.MaxEventBody - 64<<10
	const heapBound = 160 << 20
	url, admin := startServer(t, ServerOptions{})
	nodes := make([]string, concurrent)
	for i := range nodes {
		nodes[i] = enrollNode(t, url, admin, fmt.Sprintf("n%02d", i))
	}
	sampler := startHeapSampler()
	base := sampler.base
	phases := []struct {
		name     string
		size     int
		declared bool
		spread   bool // from 40 nodes, else all from one
	}{
		{"7.6 MB, length declared, one node", oversized, true, false},
		{"7.6 MB, chunked, one node", oversized, false, false},
		{"3.9 MiB (under the limit), length declared, 40 nodes", nearLimit, true, true},
	}
	for _, ph := range phases {
		statuses := map[int]int{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i := range concurrent {
			wg.Add(1)
			go func() {
				defer wg.Done()
				node := nodes[0]
				if ph.spread {
					node = nodes[i]
				}
				code := postEvents(url, node, ph.size, ph.declared)
				mu.Lock()
				statuses[code]++
				mu.Unlock()
			}()
		}
		wg.Wait()
		t.Logf("%s × %d: answers %v; heap in use peaked %.1f MiB above the start", ph.name, concurrent, statuses, float64(sampler.peak()-base)/(1<<20))
		if ph.size > nodeproto.MaxEventBody && statuses[http.StatusOK] > 0 {
			t.Errorf("%s: %d oversized batches were accepted", ph.name, statuses[http.StatusOK])
		}
	}
	peak := sampler.stop()
	t.Logf("heap in use: %.1f MiB at the start, peak %.1f MiB (bound: start + %d MiB)", float64(base)/(1<<20), float64(peak)/(1<<20), heapBound>>20)
	if peak-base > heapBound {
		t.Errorf("heap in use peaked %.1f MiB above the start; bound %d MiB", float64(peak-base)/(1<<20), heapBound>>20)
	}
}

// TestOneCredentialsFloodIsRefused: with a share of 4 requests in flight
// per caller, a credential holding 4 submissions open (their bodies not
// yet sent) has every one of a flood of 200 more answered 429 with
// Retry-After, while another credential's submission is served; once its
// requests end, the first is served again.
func TestOneCredentialsFloodIsRefused(t *testing.T) {
	const share, flood = 4, 200
	limits := testLimits
	limits.MaxInFlightPerCaller = share
	limits.ReadTimeout = time.Minute // the held requests' life: longer than the test
	// Pooled connections are not closed under a request about to be sent
	// on them (an idle close racing a reuse is a transport error, not an
	// answer).
	limits.IdleTimeout = time.Minute
	url, admin := startServer(t, ServerOptions{Config: controlplane.Config{Limits: limits}})
	ctx := context.Background()
	image := pushRandomImage(t, registrytest.Start(t)+"/app:1") // submissions that pin and queue
	adm := client.New(url, admin, nil)
	tokens := map[string]string{}
	for _, name := range []string{"flooder", "bystander"} {
		created, err := adm.CreateToken(ctx, api.TokenRequest{Name: name, Role: "submitter"})
		if err != nil {
			t.Fatal(err)
		}
		tokens[name] = created.Secret
	}
	// The flooder's share, held: submissions whose bodies never finish.
	addr := strings.TrimPrefix(url, "http://")
	var held []net.Conn
	for range share {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "POST /v1/runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{", tokens["flooder"])
		held = append(held, c)
	}
	submit := func(who string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, url+"/v1/runs", strings.NewReader(`{"image":"`+image+`","command":["true"]}`))
		req.Header.Set("Authorization", "Bearer "+tokens[who])
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, resp.Header.Get("Retry-After")
	}
	// The held requests are counted once the server has read their
	// headers: wait until it serves them (and this metrics request).
	for requestsInFlight(t, url, admin) != share+1 {
	}
	statuses := map[int]int{}
	retryAfter := map[string]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range flood {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, ra := submit("flooder")
			mu.Lock()
			statuses[code]++
			retryAfter[ra]++
			mu.Unlock()
		}()
	}
	bystander, why := submit("bystander")
	wg.Wait()
	t.Logf("flood of %d submissions from one credential holding its share of %d: answers %v, Retry-After %v; another credential's submission: %d", flood, share, statuses, retryAfter, bystander)
	if statuses[http.StatusTooManyRequests] != flood || retryAfter["1"] != flood {
		t.Errorf("flood answers %v, Retry-After %v; want all %d refused 429 with Retry-After: 1", statuses, retryAfter, flood)
	}
	if bystander != http.StatusCreated {
		t.Errorf("another credential's submission was answered %d (%s) while the flood went on; want 201", bystander, why)
	}
	for _, c := range held {
		c.Close()
	}
	// Once the held requests end (the server notices the closed
	// connections), the flooder is served again.
	for probes := 1; ; probes++ {
		code, _ := submit("flooder")
		if probes == 1000 {
			t.Fatalf("the flooder is still refused after its held requests ended")
		}
		if code != http.StatusTooManyRequests {
			t.Logf("after its held requests ended, the flooder's submission: %d", code)
			if code != http.StatusCreated {
				t.Errorf("the flooder's submission after its held requests ended: %d, want 201", code)
			}
			break
		}
	}
}

// pushRandomImage pushes a small random image to ref (on a loopback
// registry) and returns ref.
func pushRandomImage(t *testing.T, ref string) string {
	t.Helper()
	img, err := random.Image(256, 1)
	if err != nil {
		t.Fatal(err)
	}
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	return ref
}

// requestsInFlight is the server's mercator_http_in_flight{kind="requests"},
// this request included.
func requestsInFlight(t *testing.T, url, admin string) float64 {
	req, _ := http.NewRequest(http.MethodGet, url+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+admin)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, `mercator_http_in_flight{kind="requests"} `); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metrics: %q: %v", line, err)
			}
			return n
		}
	}
	t.Fatalf("metrics lack mercator_http_in_flight{kind=\"requests\"}")
	return 0
}

// enrollNode invites and enrolls node id and returns its session token.
func enrollNode(t *testing.T, url, admin, id string) string {
	t.Helper()
	inv, err := client.New(url, admin, nil).InviteNode(context.Background(), id, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(nodeproto.EnrollmentRequest{NodeID: id, Invitation: inv.Token, AgentVersion: "test", CapabilityVersion: nodeproto.Version})
	resp, err := http.Post(url+nodeproto.PathEnroll, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var enr nodeproto.Enrollment
	if err := json.NewDecoder(resp.Body).Decode(&enr); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("enroll %s: %d %v", id, resp.StatusCode, err)
	}
	return id + " " + enr.SessionToken
}

// postEvents posts an event batch of size bytes as node (its "ID token"
// from enrollNode), with or without a declared length, and returns the
// status (0 when the server cut the connection before answering).
func postEvents(url, node string, size int, declared bool) int {
	id, tok, _ := strings.Cut(node, " ")
	body := factsBatch(size)
	if !declared {
		body = struct{ io.Reader }{body} // hides the length: sent chunked
	}
	req, _ := http.NewRequest(http.MethodPost, url+nodeproto.PathEvents, body)
	if declared {
		req.ContentLength = int64(size)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set(nodeproto.HeaderNodeID, id)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// factsBatch is an event batch of exactly size bytes of valid JSON, one
// facts event listing ever more images, produced as it is read so that the
// test's own memory stays small.
func factsBatch(size int) io.Reader {
	head := `{"events":[{"id":"big","kind":"facts","at":"2026-01-01T00:00:00Z","facts":{"hostname":"h","images":[`
	tail := `"last"]}}]}`
	item := `"registry.example/` + strings.Repeat("x", 80) + `",`
	items := (size - len(head) - len(tail)) / len(item)
	pad := size - len(head) - len(tail) - items*len(item)
	return io.MultiReader(strings.NewReader(head+strings.Repeat(" ", pad)), &repeated{s: item, left: items * len(item)}, strings.NewReader(tail))
}

// repeated reads s over and over, left bytes in all.
type repeated struct {
	s    string
	off  int
	left int
}

func (r *repeated) Read(p []byte) (int, error) {
	if r.left == 0 {
		return 0, io.EOF
	}
	n := 0
	for n < len(p) && r.left > 0 {
		c := copy(p[n:min(len(p), n+r.left)], r.s[r.off:])
		n, r.left, r.off = n+c, r.left-c, (r.off+c)%len(r.s)
	}
	return n, nil
}

// heapSampler records the peak of the heap in use (runtime.MemStats
// HeapInuse: the server runs in this process) until stopped.
type heapSampler struct {
	base  uint64
	mu    sync.Mutex
	max   uint64
	done  chan struct{}
	ended chan struct{}
}

func startHeapSampler() *heapSampler {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	s := &heapSampler{base: m.HeapInuse, max: m.HeapInuse, done: make(chan struct{}), ended: make(chan struct{})}
	go func() {
		defer close(s.ended)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-s.done:
				return
			case <-tick.C:
			}
			runtime.ReadMemStats(&m)
			s.mu.Lock()
			s.max = max(s.max, m.HeapInuse)
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *heapSampler) peak() uint64 { s.mu.Lock(); defer s.mu.Unlock(); return s.max }

func (s *heapSampler) stop() uint64 { close(s.done); <-s.ended; return s.peak() }
