// Package controlplane is Mercator's control plane: the public HTTP API, the
// node protocol every agent connects to, and the reconcile loop that turns
// pending runs into placements and operations.
//
// It owns no state of its own beyond caches: everything durable is in the
// store.Store, so a restarted control plane loses no run, command or event.
// Commands reach nodes through the store (pending operations are redelivered
// on every new session until the node reports their result), which is also
// what lets several replicas share one PostgreSQL database (replicas_signal.go
// says how they wake each other).
//
// It is split by resource, each file or package named for what it owns:
//
//   - runs: runs_handlers.go (the /v1/runs API), runs_validate.go,
//     runs_reconcile.go (placement and recovery, driving the pure
//     scheduler; internal/plancommit writes its plan), runs_schedstate.go and internal/schedcopy (the
//     reconcile loop's copies), runs_artifacts.go and runs_pins.go (what a
//     run's spec is pinned to);
//   - nodes: nodes_handlers.go (the /v1/nodes API), nodes_protocol.go
//     (enroll, renew, events, logs) and internal/nodereport (what an
//     event does to the records), nodes_session.go (the command stream),
//     nodes_mailbox.go, internal/livesession, nodes_auth.go, and the liveness
//     tracker (internal/liveness);
//   - artifacts and content: package artifact;
//   - registry credentials: package registry;
//   - named API credentials with roles, the audit log, node revocation:
//     routes.go (who may call what), package access, internal/httpapi
//     (the credential cache and the audit queue), nodes_revoke.go;
//   - functions: package function, behind function.Host (functions_host.go);
//   - plumbing: routes.go (every route, one place), internal/limits (what
//     each route may hold: timeouts, bodies, requests in flight),
//     internal/httpapi (decode, errors, paging, credentials),
//     store_commit.go (group commit), replicas_signal.go and
//     internal/signals (waking other replicas), sealing.go,
//     internal/broadcast, and the Prometheus series (internal/metrics).
//
// It imports no store driver and no replica coordinator: the composition
// root (package daemon) opens those and passes them in. Package daemon, and
// tests, import it.
package controlplane

import (
	"context"
	"crypto/ed25519"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mercator/mercator/controlplane/upgrade"

	"github.com/mercator/mercator/content"
	"github.com/mercator/mercator/controlplane/access"
	"github.com/mercator/mercator/controlplane/artifact"
	"github.com/mercator/mercator/controlplane/function"
	"github.com/mercator/mercator/controlplane/internal/broadcast"
	"github.com/mercator/mercator/controlplane/internal/expiring"
	"github.com/mercator/mercator/controlplane/internal/groupcommit"
	"github.com/mercator/mercator/controlplane/internal/history"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/controlplane/internal/limits"
	"github.com/mercator/mercator/controlplane/internal/liveness"
	"github.com/mercator/mercator/controlplane/internal/livesession"
	"github.com/mercator/mercator/controlplane/internal/metrics"
	"github.com/mercator/mercator/controlplane/internal/nodeauth"
	"github.com/mercator/mercator/controlplane/internal/readbatch"
	"github.com/mercator/mercator/controlplane/internal/retention"
	"github.com/mercator/mercator/controlplane/internal/schedcopy"
	"github.com/mercator/mercator/controlplane/internal/signals"
	"github.com/mercator/mercator/controlplane/project"
	"github.com/mercator/mercator/controlplane/registry"
	"github.com/mercator/mercator/internal/supervise"
	"github.com/mercator/mercator/store"
)

// ImageResolver pins an image reference to a manifest digest by asking its
// registry. Errors are failure kinds: ErrInvalid when the reference or the
// image does not exist (the user can fix it), ErrUnavailable when the
// registry cannot be reached.
type ImageResolver interface {
	Resolve(ctx context.Context, ref string) (pinned string, err error)
}

// Config is the control plane's configuration. Zero durations take the
// defaults documented on each field.
type Config struct {
	// PublicURL is the address agents and clients use to reach this server;
	// it appears in the agent command lines invitations print.
	PublicURL string
	// CAFingerprint is the SHA-256 fingerprint of the CA agents pin; every
	// invitation carries it, so an agent needs nothing else to trust this
	// control plane. Empty (plain HTTP on loopback) leaves invitations plain.
	CAFingerprint string
	// ReplicaURL is the address agents use to reach this replica itself
	// rather than any replica behind PublicURL: function calls relayed by
	// this replica send agents here (package function). Empty means PublicURL,
	// which is right for one replica.
	ReplicaURL string
	// Lease is how long a node stays ready without reporting (default 30s).
	Lease time.Duration
	// SessionTTL is a session credential's life (default 24h).
	SessionTTL time.Duration
	// InvitationTTL is the default life of an invitation (default 24h).
	InvitationTTL time.Duration
	// ReconcileEvery is the reconcile loop's idle period (default 1s); work
	// that arrives earlier wakes it at once.
	ReconcileEvery time.Duration
	// KeepAlive is the session stream's keep-alive period (default 10s: a
	// third of the agent's 30 s idle limit, and at ten thousand sessions
	// every keep-alive a second costs both ends a write and a read).
	KeepAlive time.Duration
	// WriteConcurrency is how many batched write transactions may run at
	// once (default 1, right for SQLite's single writer; Run sets more for
	// PostgreSQL). See store_commit.go.
	WriteConcurrency int
	// UnencryptedHTTP2 serves plaintext HTTP/2 (prior knowledge) besides
	// HTTP/1.1: a client that multiplexes many agents' streams over a few
	// connections (the fleet simulator with --http2, a proxy in front of a
	// fleet) then needs a few connections here rather than one per stream.
	UnencryptedHTTP2 bool
	// WriteBatch bounds the callers one batched write transaction carries
	// (default 256; Run sets fewer for PostgreSQL, where every statement
	// is a round trip and a long transaction a likelier conflict).
	WriteBatch int
	Logger     *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Content holds Artifact content (package content); nil means this
	// control plane cannot hold Artifacts. ContentReadTTL is the life of a
	// minted read (default artifact.DefaultContentReadTTL), and UploadDir where
	// uploads in progress are staged (default: under the system's temporary
	// directory). See package artifact.
	Content        content.Store
	ContentReadTTL time.Duration
	UploadDir      string
	// RegistryKey seals registry credentials and the values of secret
	// configuration at rest (RegistryKeySize bytes, AES-256-GCM); nil
	// means neither can be stored. See sealing.go.
	RegistryKey []byte
	// MetricsPublic serves /metrics without a credential; otherwise it
	// needs a reader's.
	MetricsPublic bool
	// Retention is how long what the store holds is kept, and the caps
	// on logs and uploads (retention.go).
	Retention RetentionConfig
	// ReleaseKey, when set, is the Ed25519 public key every agent release
	// must be signed with (docs/upgrades.md); nodes check it again.
	ReleaseKey ed25519.PublicKey
	// Limits bound connections, requests in flight, bodies and timeouts
	// (package limits; every zero field takes its default). Serve applies
	// the timeouts; LimitListener the connection cap.
	Limits Limits
	// Teams (runs_teams.go, docs/teams.md). MaxGrace is the longest grace
	// period a run may ask for between SIGTERM and SIGKILL (default 5
	// minutes); PreemptWindow how long an attempt preempted for a reason is
	// not preempted again for it (default 10 minutes); ShareHalfLife how
	// fast a project's past use fades from fair share (default 30 minutes).
	MaxGrace      time.Duration
	PreemptWindow time.Duration
	ShareHalfLife time.Duration
}

// Limits are the server's limits: timeouts, connections, requests in
// flight overall and per caller, node bodies in flight. See package
// controlplane/internal/limits, and docs/hardening.md ("Bounded servers").
type Limits = limits.Options

func (c *Config) defaults() {
	if c.Lease == 0 {
		c.Lease = 30 * time.Second
	}
	if c.SessionTTL == 0 {
		c.SessionTTL = 24 * time.Hour
	}
	if c.InvitationTTL == 0 {
		c.InvitationTTL = 24 * time.Hour
	}
	if c.ReconcileEvery == 0 {
		c.ReconcileEvery = time.Second
	}
	if c.KeepAlive == 0 {
		c.KeepAlive = 10 * time.Second
	}
	if c.WriteConcurrency == 0 {
		c.WriteConcurrency = 1
	}
	c.Retention = c.Retention.WithDefaults()
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.MaxGrace == 0 {
		c.MaxGrace = 5 * time.Minute
	}
	if c.PreemptWindow == 0 {
		c.PreemptWindow = 10 * time.Minute
	}
	if c.ShareHalfLife == 0 {
		c.ShareHalfLife = 30 * time.Minute
	}
}

// Server is one control-plane process.
type Server struct {
	cfg      Config
	store    store.Store
	resolver ImageResolver
	log      *slog.Logger

	reconcileWake chan struct{}
	runs          *broadcast.Broadcast // a run changed
	nodeWake      sync.Map             // node ID → *broadcast: new operations for it
	logs          *broadcast.Broadcast // a log grew
	metrics       *metrics.Set
	coord         Coordinator          // nil for a single replica
	artifacts     *artifact.Service    // Artifacts and content (package artifact)
	registries    *registry.Service    // registry credentials (package registry)
	projects      *project.Service     // projects (package project)
	access        *access.Service      // named tokens, the audit log, invitations (package access)
	upgrades      *upgrade.Service     // agent releases and rollouts (package upgrade)
	fn            *function.Service    // Functions (package function)
	streams       livesession.Registry // sessions held here

	live      *liveness.Tracker      // package liveness
	sched     schedcopy.Copy         // the reconcile loop's copies (runs_schedstate.go)
	queued    schedcopy.Queue        // the leader's copy of the queued runs (runs_schedstate.go)
	schedView schedView              // the reconcile loop's view of the nodes (runs_schedstate.go)
	teams     project.History        // runs_teams.go: projects' decayed shares
	queue     project.Queue          // runs_queue.go: queue positions
	commits   *groupcommit.Committer // the hot write paths' group commit (batch)
	// sessionReads batches session streams' reads (nodes_session.go).
	sessionReads *readbatch.Batcher[sessionReq, sessionAnswer]
	outbox       *signals.Outbox // replicas_signal.go: signals for other replicas
	replicaID    string
	pins         pinCache             // runs_pins.go
	auth         nodeauth.Cache       // nodes_auth.go, internal/nodeauth
	tokens       *httpapi.Tokens      // API credentials, cached briefly (access_handlers.go)
	audit        *httpapi.Auditor     // the audit log's queue
	mailboxes    sync.Map             // node ID → *mailbox (nodes_mailbox.go)
	limiter      *limits.Limiter      // every route's limits (package limits)
	watermarks   retention.Watermarks // event watermarks written (package retention)
	epoch        atomic.Int64         // the scheduling epoch this replica leads under (startEpoch)
	epochPlaced  atomic.Bool          // whether the epoch has placed yet (notePlaced)

	fleetCache expiring.Map[fleet]    // nodes_handlers.go: fleetCopy
	sealKey    atomic.Pointer[[]byte] // Config.RegistryKey (sealing.go)

	// The web console's series (console_stats.go, package history).
	history   *history.Recorder
	fnLatency *history.Tap // the functions' latency histogram, set aside
}

// New returns a server over st. It does nothing until Serve or Handler.
// coord is nil for a single replica; replicas sharing one database pass
// their Coordinator (see Coordinator).
func New(cfg Config, st store.Store, resolver ImageResolver, coord Coordinator) *Server {
	cfg.defaults()
	s := &Server{
		cfg: cfg, store: st, resolver: resolver, log: cfg.Logger,
		reconcileWake: make(chan struct{}, 1),
		runs:          broadcast.New(), logs: broadcast.New(), metrics: metrics.New(), coord: coord,
		live:      liveness.New(cfg.Lease),
		replicaID: httpapi.NewID(""),
		tokens:    &httpapi.Tokens{Store: st, Now: cfg.Now},
	}
	s.outbox = signals.NewOutbox(1<<16, s.metrics.SignalsDropped.Inc)
	key := cfg.RegistryKey
	s.sealKey.Store(&key)
	s.commits = groupcommit.New(s.update, s.updateLocked, cfg.WriteBatch, func(n int) { s.metrics.BatchSize.Observe(float64(n)) })
	s.commits.SetShare(shareEvents)
	s.sessionReads = readbatch.New(sessionReadSlots, sessionReadMax, s.readSessions)
	s.limiter = limits.New(cfg.Limits, limits.Observer{Refused: s.metrics.Throttle, InFlight: s.metrics.AddInFlight})
	s.audit = &httpapi.Auditor{Store: st, Now: s.now, Log: s.log, Dropped: s.metrics.AuditDropped.Inc,
		Retention: cfg.Retention.Audit, MaxRows: cfg.Retention.AuditMaxRows}
	s.artifacts = artifact.New(artifact.Config{Store: st, Now: s.now, Logger: s.log, Content: cfg.Content,
		ReadTTL: cfg.ContentReadTTL, UploadDir: cfg.UploadDir, MaxUploadSize: cfg.Retention.MaxUploadSize})
	s.registries = registry.New(st, s.now, s.log, serverKey{s})
	s.projects = project.New(st, s.now, s.log)
	s.projects.ReadNodesWith(func(ctx context.Context) ([]store.Node, error) { return s.nodeList(ctx, s.nodeListAge()) }) // function reservations
	s.access = access.New(st, s.now, s.tokenRemoved)
	s.upgrades = s.newUpgrades() // upgrades.go
	var pub function.Publisher
	if coord != nil {
		pub = coord
	}
	s.history, s.fnLatency = history.New(), history.NewTap(s.metrics.Registry) // console_stats.go
	s.fn = function.New(function.Config{Store: st, Now: s.now, Logger: s.log, PublicURL: cfg.PublicURL, ReplicaURL: cfg.ReplicaURL,
		Registry: s.fnLatency, Publisher: pub}, fnHost{s}, serverKey{s})
	return s
}

// Serve serves the API on l and runs the reconcile loop until ctx ends.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	// Secrets an earlier version stored in the clear are sealed before
	// anything is served (package function); failing that, they keep working
	// in the clear until the next start.
	if err := s.fn.SealClearSecrets(ctx); err != nil {
		s.log.Error("secret configuration left in the clear", "err", err)
	}
	srv := &http.Server{Handler: s.Handler(), BaseContext: func(net.Listener) context.Context { return ctx }}
	s.limiter.Options().Server(srv) // read, write, idle timeouts (package limits)
	if s.cfg.UnencryptedHTTP2 {
		srv.Protocols = new(http.Protocols)
		srv.Protocols.SetHTTP1(true)
		srv.Protocols.SetUnencryptedHTTP2(true)
	}
	errc := make(chan error, 2)
	// Every background loop runs supervised (package supervise): a panic in
	// one is logged with its stack, counted (mercator_loop_panics_total)
	// and the loop restarted, rather than ending the process.
	sup := supervise.Supervisor{Log: s.log, Panicked: s.metrics.LoopPanicked}
	loops := sup.Start(ctx)
	loops.Go("audit", s.audit.Run)
	loops.Go("sweep", s.sweeper().Run) // retention (package retention)
	loops.Go("liveness", func(ctx context.Context) {
		s.live.FlushLoop(ctx, liveness.Flusher{Store: s.store, Log: s.log, Lapses: func(n int) { s.metrics.LeaseLapses.Add(float64(n)) }})
	})
	loops.Go("publish", s.publishLoop)
	loops.Go("rollouts", s.upgrades.Run) // agent upgrades (package upgrade)
	loops.Go("history", s.historyLoop)   // the console's charts (console_stats.go)
	for range s.cfg.WriteConcurrency {
		loops.Go("batch", s.commits.Run)
	}
	// The store outlives the loops that write to it: Run closes it after
	// Serve returns.
	defer loops.Wait()
	go func() { errc <- srv.Serve(l) }()
	go func() { sup.Run(ctx, "reconcile", s.reconcileLoop); errc <- nil }()
	go sup.Run(ctx, "receive", s.receive)
	fnDone := s.fn.StartAsync(ctx, sup) // durable calls
	defer func() { <-fnDone }()         // claims handed back before the store closes
	select {
	case <-ctx.Done():
	case err := <-errc:
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if srv.Shutdown(shutdown) != nil {
		// A request still in its handler after the grace period is cut:
		// left open, its connection would go on being served by a
		// replica that has stopped (in one process, until it exits).
		srv.Close()
	}
	return nil
}

// LimitListener caps the connections open on l at Limits.MaxConns: a
// connection over the cap is closed at once (and counted in
// mercator_http_throttled_total{reason="connections"}). l must be the plain
// TCP listener, below any TLS: the HTTP server must see the TLS connection
// itself to serve HTTP/2.
func (s *Server) LimitListener(l net.Listener) net.Listener {
	return limits.Listener(l, s.limiter.Options().MaxConns, func() { s.metrics.Throttle("connections") })
}

func (s *Server) now() time.Time { return s.cfg.Now().UTC() }

// RegistryCredentials is what tag resolution at submit asks for a
// registry's credential (imageref.Resolver.Credentials, with a context);
// see registry.Service.Credentials.
func (s *Server) RegistryCredentials(ctx context.Context, host string) (user, password string, ok bool) {
	return s.registries.Credentials(ctx, host)
}

func (s *Server) nodeBroadcast(nodeID string) *broadcast.Broadcast {
	b, _ := s.nodeWake.LoadOrStore(nodeID, broadcast.New())
	return b.(*broadcast.Broadcast)
}

// HashToken is how every credential is stored (httpapi.HashToken): the
// composition root (package daemon) stores the admin credential's hash
// with it.
func HashToken(tok string) string { return httpapi.HashToken(tok) }

// NewAdminToken returns a fresh API credential (prefix mca_).
func NewAdminToken() string { return access.NewSecret() }
