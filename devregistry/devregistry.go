// Package devregistry is the OCI registry that `mercator dev` serves on
// loopback (127.0.0.1:5000 by default), so that a laptop or a single box can
// push images and have its local agent pull them by digest without any
// registry of its own. What was pushed is kept on disk and survives restarts.
//
// It embeds the CNCF Distribution registry (github.com/distribution/
// distribution/v3, the code behind the "registry" image) as a library: its
// handlers.App with filesystem storage, served by this package's own
// http.Server. Nothing else of Distribution's runs: no debug/metrics server,
// no health-check pollers, no Redis, no notifications, no auth. The only
// background work is Distribution's purge of abandoned uploads (older than a
// week, once a day), which stops on Close. Distribution also starts one idle
// event-broadcaster goroutine per registry that it never stops; it outlives
// Close, which matters only to a process that starts many registries.
//
// Global state, because Distribution logs through logrus's standard logger
// and offers no per-instance logger: the first Start sets that logger's level
// to Warn, discards its own output, and forwards its entries to the
// *slog.Logger of the most recently started Registry (entries about errors
// answered to clients, such as "manifest unknown", at Debug; others at their
// own level). Anything else in the process that logs through logrus's
// standard logger ends up in that slog.Logger too. Importing Distribution also
// registers its storage and notification metrics with Prometheus's default
// registry and an expvar named "registry".
//
// The registry has no authentication, which is why Start refuses any address
// that is not loopback.
//
// Only cmd (the dev command) and end-to-end tests import this package.
package devregistry

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry/handlers"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem" // the storage driver Start configures
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/imageref"
	"github.com/sirupsen/logrus"
)

// DefaultAddr is where `mercator dev` serves its registry unless told
// otherwise. Docker treats 127.0.0.0/8 registries as insecure by default, so
// the daemon pulls from it over plain HTTP without configuration.
const DefaultAddr = "127.0.0.1:5000"

// Registry is a running registry. Its methods are safe for concurrent use.
type Registry struct {
	ln     net.Listener
	srv    *http.Server
	app    *handlers.App
	logger *slog.Logger
	served chan struct{} // closed when Serve has returned

	closeOnce sync.Once
	closeErr  error
}

// Start serves a registry on addr (host:port; "" means DefaultAddr; port 0
// picks a free one) that stores everything under dir, creating dir if needed.
// A dir that an earlier Registry used serves what was pushed to it then.
//
// addr must be a loopback address (127.0.0.0/8, ::1 or localhost): the
// registry has no authentication. Any other address yields failure.Invalid.
// An address already in use yields an error wrapping the listener's error.
//
// ctx bounds starting only; the registry runs until Close. logger receives
// the registry's own messages (nil means slog.Default()); see the package
// doc for how Distribution's logging reaches it.
func Start(ctx context.Context, addr, dir string, logger *slog.Logger) (*Registry, error) {
	if logger == nil {
		logger = slog.Default()
	}
	if addr == "" {
		addr = DefaultAddr
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, failure.Invalid("registry address", "%q is not host:port: %v; for example %s", addr, err, DefaultAddr)
	}
	if !imageref.IsLoopback(host) {
		return nil, failure.Invalid("registry address", "%q is not a loopback address; the development registry has no authentication, so it only listens on loopback, for example %s", addr, DefaultAddr)
	}
	if dir == "" {
		return nil, failure.Invalid("registry directory", "no directory given to keep the registry's images in")
	}
	root, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("devregistry: directory %s: %w", dir, err)
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("devregistry: creating %s: %w", root, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	routeLogrus(logger)

	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return nil, fmt.Errorf("devregistry: generating upload secret: %w", err)
	}
	cfg := &configuration.Configuration{Version: "0.1"}
	cfg.Storage = configuration.Storage{
		"filesystem": configuration.Parameters{"rootdirectory": root},
		"cache":      configuration.Parameters{"blobdescriptor": "inmemory"},
	}
	// The secret signs upload state between the requests of one push; a
	// random one per process only breaks pushes that span a restart.
	cfg.HTTP.Secret = hex.EncodeToString(secret)

	app, err := newApp(context.WithoutCancel(ctx), cfg)
	if err != nil {
		return nil, err
	}

	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		_ = app.Shutdown()
		return nil, fmt.Errorf("devregistry: listening on %s: %w", addr, err)
	}
	r := &Registry{
		ln:     ln,
		app:    app,
		logger: logger,
		served: make(chan struct{}),
		srv: &http.Server{
			Handler:           app,
			ReadHeaderTimeout: 30 * time.Second,
			ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelDebug),
		},
	}
	go func() {
		defer close(r.served)
		if err := r.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("development registry stopped serving", "addr", r.Addr(), "err", err)
		}
	}()
	logger.Info("development registry serving", "addr", r.Addr(), "dir", root)
	return r, nil
}

// newApp is handlers.NewApp with its panics (how it reports bad
// configuration) turned into errors.
func newApp(ctx context.Context, cfg *configuration.Configuration) (app *handlers.App, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("devregistry: configuring the registry: %v", p)
		}
	}()
	return handlers.NewApp(ctx, cfg), nil
}

// Addr is the host:port the registry listens on, with the actual port when
// Start was given port 0. It is the registry part of image references:
// Addr()+"/hello:1".
func (r *Registry) Addr() string { return r.ln.Addr().String() }

// Close stops accepting connections, waits for requests in flight to finish
// until ctx ends (then cuts them off), and stops Distribution's background
// work. Everything pushed is already on disk. Close may be called more than
// once; later calls return the first call's result.
func (r *Registry) Close(ctx context.Context) error {
	r.closeOnce.Do(func() {
		err := r.srv.Shutdown(ctx)
		if err != nil {
			_ = r.srv.Close()
		}
		<-r.served
		r.closeErr = errors.Join(err, r.app.Shutdown())
		logTarget.CompareAndSwap(r.logger, nil)
	})
	return r.closeErr
}

// Distribution's logging. See the package doc.
var (
	logrusOnce sync.Once
	logTarget  atomic.Pointer[slog.Logger]
)

func routeLogrus(logger *slog.Logger) {
	logTarget.Store(logger)
	logrusOnce.Do(func() {
		std := logrus.StandardLogger()
		std.SetOutput(io.Discard)
		std.SetLevel(logrus.WarnLevel)
		std.AddHook(slogHook{})
	})
}

// slogHook forwards logrus entries to logTarget (slog.Default() when no
// Registry is running).
type slogHook struct{}

func (slogHook) Levels() []logrus.Level { return logrus.AllLevels }

func (slogHook) Fire(e *logrus.Entry) error {
	logger := logTarget.Load()
	if logger == nil {
		logger = slog.Default()
	}
	level := slog.LevelDebug
	switch {
	case e.Data["err.code"] != nil:
		// An error Distribution answered to a client ("manifest unknown",
		// "blob unknown"): the client's business, routine when resolving.
		level = slog.LevelDebug
	case e.Level <= logrus.ErrorLevel:
		level = slog.LevelError
	case e.Level == logrus.WarnLevel:
		level = slog.LevelWarn
	case e.Level == logrus.InfoLevel:
		level = slog.LevelInfo
	}
	ctx := e.Context
	if ctx == nil {
		ctx = context.Background()
	}
	if !logger.Enabled(ctx, level) {
		return nil
	}
	attrs := make([]slog.Attr, 0, len(e.Data)+1)
	attrs = append(attrs, slog.String("component", "distribution"))
	for k, v := range e.Data {
		if k == "go.version" || k == "instance.id" {
			continue
		}
		attrs = append(attrs, slog.Any(k, v))
	}
	logger.LogAttrs(ctx, level, e.Message, attrs...)
	return nil
}
