package dockerengine

import (
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/docker/docker/api/types/image"
)

func TestPullsCoalesce(t *testing.T) {
	var p Pulls
	var pulls atomic.Int32
	release := make(chan struct{})
	started := make(chan struct{})
	pull := func(context.Context) error {
		if pulls.Add(1) == 1 {
			close(started)
		}
		<-release
		return nil
	}
	var wg sync.WaitGroup
	errs := make(chan error, 5)
	wg.Add(1)
	go func() { defer wg.Done(); errs <- p.Do(context.Background(), "ref", pull) }()
	<-started
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- p.Do(context.Background(), "ref", pull) }()
	}
	time.Sleep(20 * time.Millisecond) // let the joiners wait on the pull
	close(release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("Do = %v", err)
		}
	}
	if n := pulls.Load(); n != 1 {
		t.Errorf("%d pulls for 5 concurrent callers, want 1", n)
	}
}

// TestPullsLeaving: a caller that gives up gets its context's error; the
// pull is cancelled once its last caller leaves, unless Keep.
func TestPullsLeaving(t *testing.T) {
	for _, keep := range []bool{false, true} {
		var bg sync.WaitGroup
		p := Pulls{Keep: keep, Background: &bg}
		cancelled := make(chan bool, 1)
		release := make(chan struct{})
		ctx, cancel := context.WithCancel(context.Background())
		go func() { time.Sleep(10 * time.Millisecond); cancel() }()
		err := p.Do(ctx, "ref", func(pullCtx context.Context) error {
			select {
			case <-pullCtx.Done():
				cancelled <- true
			case <-release:
				cancelled <- false
			}
			return nil
		})
		if err != context.Canceled {
			t.Errorf("keep=%v: Do whose caller left = %v, want context.Canceled itself", keep, err)
		}
		if keep {
			close(release)
		}
		bg.Wait() // Background counts the pull's goroutine
		if got := <-cancelled; got == keep {
			t.Errorf("keep=%v: pull cancelled = %v", keep, got)
		}
	}
}

// pullAPI is an API whose ImagePull answers with a stream or an error.
type pullAPI struct {
	API
	stream string
	err    error
}

func (f pullAPI) ImagePull(context.Context, string, image.PullOptions) (io.ReadCloser, error) {
	if f.err != nil {
		return nil, f.err
	}
	return io.NopCloser(strings.NewReader(f.stream)), nil
}

func TestPullReadsTheStream(t *testing.T) {
	refused := errors.New("denied by the daemon")
	for _, tc := range []struct {
		name    string
		api     pullAPI
		message string // of a *RefusedError; "" = success
		stream  bool   // a *StreamError
	}{
		{name: "success", api: pullAPI{stream: `{"status":"Pulling"}` + "\n" + `{"status":"Downloaded newer image"}`}},
		{name: "refused in the stream (errorDetail)", api: pullAPI{stream: `{"status":"Pulling"}{"errorDetail":{"message":"manifest unknown"},"error":"manifest unknown"}`}, message: "manifest unknown"},
		{name: "refused in the stream (error)", api: pullAPI{stream: `{"error":"unauthorized"}`}, message: "unauthorized"},
		{name: "refused request", api: pullAPI{err: refused}, message: refused.Error()},
		{name: "broken stream", api: pullAPI{stream: `{"status":"Pul`}, stream: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Pull(context.Background(), tc.api, "ref", "")
			var r *RefusedError
			var s *StreamError
			switch {
			case tc.stream:
				if !errors.As(err, &s) {
					t.Errorf("Pull = %v, want a *StreamError", err)
				}
			case tc.message != "":
				if !errors.As(err, &r) || r.Message != tc.message {
					t.Errorf("Pull = %v, want a *RefusedError saying %q", err, tc.message)
				}
				if tc.api.err != nil && !errors.Is(err, tc.api.err) {
					t.Errorf("Pull = %v, want it to wrap the request's error", err)
				}
			case err != nil:
				t.Errorf("Pull = %v, want success", err)
			}
		})
	}
}

func TestSafeName(t *testing.T) {
	for _, tc := range []struct {
		in   string
		max  int
		want string
		safe bool
	}{
		{"run-1_a.b", 0, "run-1_a.b", true},
		{"team/run 1", 0, "team-run-1", false},
		{"é", 0, "-", false},
		{"abcdef", 3, "abc", true},
	} {
		got, safe := SafeName(tc.in, tc.max)
		if got != tc.want || safe != tc.safe {
			t.Errorf("SafeName(%q, %d) = %q, %v; want %q, %v", tc.in, tc.max, got, safe, tc.want, tc.safe)
		}
	}
}

// TestPullReportsBytes: the bytes downloaded across layers, as the daemon's
// messages move them; a layer already held counts neither way.
func TestPullReportsBytes(t *testing.T) {
	stream := `{"status":"Pulling from x","id":"latest"}
{"status":"Already exists","id":"held"}
{"status":"Pulling fs layer","id":"a"}
{"status":"Downloading","progressDetail":{"current":100,"total":1000},"id":"a"}
{"status":"Downloading","progressDetail":{"current":50,"total":500},"id":"b"}
{"status":"Downloading","progressDetail":{"current":600,"total":1000},"id":"a"}
{"status":"Download complete","id":"b"}
{"status":"Extracting","progressDetail":{"current":10,"total":500},"id":"b"}
{"status":"Download complete","id":"a"}
{"status":"Pull complete","id":"a"}
{"status":"Digest: sha256:abc"}`
	var got [][2]int64
	ctx := WithPullProgress(context.Background(), func(done, total int64) { got = append(got, [2]int64{done, total}) })
	if err := Pull(ctx, pullAPI{stream: stream}, "ref", ""); err != nil {
		t.Fatal(err)
	}
	want := [][2]int64{{100, 1000}, {150, 1500}, {650, 1500}, {1100, 1500}, {1500, 1500}}
	if !slices.Equal(got, want) {
		t.Fatalf("progress %v, want %v", got, want)
	}
}
