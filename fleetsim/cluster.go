package fleetsim

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/mercator/mercator/controlplane"
	"github.com/mercator/mercator/daemon"
	"github.com/mercator/mercator/fleetsim/internal/killable"
)

// replica is one control-plane replica running in this process.
type replica struct {
	idx    int
	addr   string // host:port it listens on
	url    string
	token  string
	ln     *killable.Listener
	cancel context.CancelFunc
	done   chan error
	killed atomic.Bool
	hs     *handshakes

	mu      sync.Mutex
	metrics map[string]float64 // the last scrape
}

// startReplica runs daemon.RunServer on a listener of its own, with its
// goroutines labelled component=controlplane for the CPU split. With t it
// serves HTTPS with the run's certificate (see tls.go), else plain HTTP.
func startReplica(ctx context.Context, cfg *Config, t *runTLS, dir string, i int, log *slog.Logger) (*replica, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	hs := &handshakes{}
	kl := killable.New(l, &hs.accepted)
	rctx, cancel := context.WithCancel(ctx)
	scheme := "https://"
	if t == nil {
		scheme = "http://"
	}
	r := &replica{idx: i, addr: l.Addr().String(), url: scheme + l.Addr().String(), ln: kl, cancel: cancel, done: make(chan error, 1), hs: hs}
	db := cfg.DB
	if db == "" {
		db = "sqlite://" + filepath.Join(dir, "controlplane.db")
	}
	ready := make(chan string, 1)
	opts := daemon.ServerOptions{
		DB: db, DataDir: filepath.Join(dir, fmt.Sprintf("cp-%d", i)), Listener: kl, Logger: log.With("replica", i), InsecureHTTP: t == nil,
		Config: controlplane.Config{Lease: cfg.Lease, UnencryptedHTTP2: cfg.HTTP2 && t == nil, WriteConcurrency: cfg.WriteConcurrency, WriteBatch: cfg.WriteBatch},
		Ready:  func(_, tokenFile string) { ready <- tokenFile },
	}
	if t != nil {
		opts.TLS = daemon.TLSOptions{CertFile: t.certFile, KeyFile: t.keyFile, CACertFile: t.caFile}
		opts.TuneTLS = hs.tune
	}
	pprof.Do(rctx, pprof.Labels("component", "controlplane"), func(rctx context.Context) {
		go func() { r.done <- daemon.RunServer(rctx, opts) }()
	})
	select {
	case tokenFile := <-ready:
		data, err := os.ReadFile(tokenFile)
		if err != nil {
			cancel()
			return nil, err
		}
		r.token = strings.TrimSpace(string(data))
		return r, nil
	case err := <-r.done:
		cancel()
		return nil, fmt.Errorf("control-plane replica %d did not start: %w", i, err)
	case <-time.After(2 * time.Minute):
		cancel()
		return nil, fmt.Errorf("control-plane replica %d did not start within 2 minutes", i)
	}
}

// kill ends the replica the way a crashed process ends: its listener and
// every connection it accepted close at once, mid-stream, and only then is
// its context cancelled. Nothing is handed over; whatever it held only in
// memory is gone.
func (r *replica) kill() {
	r.killed.Store(true)
	r.ln.Kill()
	r.cancel()
}

// stop cancels the replica and waits up to d for it to return.
func (r *replica) stop(d time.Duration) {
	r.cancel()
	select {
	case <-r.done:
	case <-time.After(d):
	}
}

// dropConnections closes every connection the replica accepted, at once,
// mid-stream, and keeps accepting: what a network failure between the
// fleet and the control plane (or a load balancer restarting) does. It
// returns how many it closed.
func (r *replica) dropConnections() int { return r.ln.Drop() }

// pushImage puts a small random image in the registry at host and returns
// its reference pinned by digest: submissions name it, and the control
// plane verifies it against the registry on every submission, as it would
// any image.
func pushImage(ctx context.Context, host string) (string, error) {
	img, err := random.Image(512, 1)
	if err != nil {
		return "", err
	}
	ref, err := name.ParseReference(host+"/fleetsim/workload:1", name.Insecure)
	if err != nil {
		return "", err
	}
	if err := remote.Write(ref, img, remote.WithContext(ctx)); err != nil {
		return "", fmt.Errorf("push the simulated workload image: %w", err)
	}
	d, err := img.Digest()
	if err != nil {
		return "", err
	}
	return host + "/fleetsim/workload@" + d.String(), nil
}
