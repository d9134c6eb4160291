// Package function is Mercator's Functions: the Fn Project's v2 API (apps,
// functions, triggers, durable calls and their logs), the placement of
// calls on nodes and the relaying of their bodies, durable (detached)
// calls, and functions' secret configuration.
//
// It owns the store's function tables (apps, fns, triggers, calls) and the
// in-memory state of the calls this replica relays. What it needs of the
// rest of the control plane comes through Host (the node sessions this
// replica holds, the scheduler's view of the nodes, image pinning and
// registry credentials), Sealer (the control plane's key) and Publisher
// (the other replicas), all declared here, so that it holds no pointer to
// the control plane's server. Placement itself is the pure
// scheduler.PlaceFunction.
//
// Only package controlplane, which serves its routes and implements Host,
// may import it.
package function

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/nodeproto"

	"github.com/mercator/mercator/store"
)

// Host is what Functions need of the rest of the control plane. The
// control plane implements it; tests use a fake. Its methods are safe for
// concurrent use.
type Host interface {
	// Send hands an ephemeral command (invoke, call_log) down the node's
	// session held by this replica, setting its fencing token. held is
	// false when this replica holds no session of the node; sent is false
	// when the session is backed up. lost is closed when the session ends.
	// Callers send only to nodes whose agent speaks the command (placement
	// checks nodeproto.RequiredVersion against the node's facts).
	Send(nodeID string, cmd nodeproto.Command) (lost <-chan struct{}, held, sent bool)
	// AttachInvokes makes send, a node's call answers stream's way down
	// (nodeproto.HeaderCallInvokes), opened under the node's fencing
	// token, the way Send hands the node invokes while this replica holds
	// its session under that token and send takes them, until detach.
	AttachInvokes(nodeID string, fencing uint64, send func(fencing uint64, cmd *nodeproto.InvokeCommand) bool) (detach func())
	// Holds reports whether this replica holds a session of the node.
	Holds(nodeID string) bool
	// NodeReady reports whether the node is ready (enrolled, reporting
	// within its lease, neither cordoned nor draining).
	NodeReady(n store.Node) bool
	// Nodes is the nodes' records as the scheduler last read them (fresh
	// enough for metrics, never a read per call).
	Nodes(ctx context.Context) ([]store.Node, error)
	// Resolve pins an image reference to a manifest digest; errors are
	// failure kinds (ErrInvalid, ErrUnavailable).
	Resolve(ctx context.Context, image string) (string, error)
	// RegistryAuth is the pull credential project (the app's) holds for
	// the image's registry, encoded for the node; "" when it holds none.
	RegistryAuth(ctx context.Context, project, image string) string
}

// Sealer seals and opens values with the control plane's key, bound to
// additional data ad. Errors from Seal are failure kinds (ErrUnavailable
// without a key).
type Sealer interface {
	Seal(ad []byte, plain string) ([]byte, error)
	Unseal(ad, sealed []byte) (string, error)
}

// Publisher reaches the other replicas sharing this one's store: a
// payload published here is delivered to every replica's Service.Deliver.
type Publisher interface {
	Publish(ctx context.Context, payload string) error
}

// Config is a Service's configuration.
type Config struct {
	Store store.Store
	// Now is the clock, in UTC.
	Now    func() time.Time
	Logger *slog.Logger
	// PublicURL is the address clients use (trigger and invoke endpoints
	// in annotations); ReplicaURL the address agents use to reach this
	// replica itself (empty means PublicURL).
	PublicURL, ReplicaURL string
	// Registry takes the Functions metrics; nil registers none.
	Registry prometheus.Registerer
	// Publisher is nil for a single replica.
	Publisher Publisher
}

// Service is the Functions machinery a replica keeps in memory: the
// rendezvous of the calls it is relaying, caches, and metrics. Nothing in
// it is authoritative; the store is. Safe for concurrent use.
type Service struct {
	cfg    Config
	store  store.Store
	log    *slog.Logger
	host   Host
	sealer Sealer
	pub    Publisher

	rvs sync.Map // rendezvous ID → *rendezvous

	logAsks sync.Map // call_log request ID → *logAsk (logs.go)

	fns      sync.Map // fn ID → *fnEntry
	triggers sync.Map // app name NUL source → *triggerEntry

	nodesMu sync.Mutex
	nodes   atomic.Pointer[fnNodeList]

	metrics   *fnMetrics
	wakeAsync chan struct{}
}

// New returns the Functions service. It serves nothing until its routes
// are mounted, and delivers no durable call until StartAsync.
func New(cfg Config, host Host, sealer Sealer) *Service {
	s := &Service{cfg: cfg, store: cfg.Store, log: cfg.Logger, host: host, sealer: sealer, pub: cfg.Publisher,
		wakeAsync: make(chan struct{}, 1)}
	s.metrics = newFnMetrics(s)
	return s
}

func (s *Service) now() time.Time { return s.cfg.Now() }

// publicBase is the URL annotations point at.
func (s *Service) publicBase() string { return strings.TrimRight(s.cfg.PublicURL, "/") }

// replicaURL is where this replica's agents-facing calls paths are.
func (s *Service) replicaURL() string {
	if s.cfg.ReplicaURL != "" {
		return strings.TrimRight(s.cfg.ReplicaURL, "/")
	}
	return s.publicBase()
}

// NodesChanged drops the cached list of nodes that take calls, so the
// next call reads the fleet again: the control plane calls it when a
// node's session starts (a node is back).
func (s *Service) NodesChanged() { s.nodes.Store(nil) }

// Deliver applies a payload another replica published (or this one, with
// a single replica never): a call or a log question for a node whose
// session this replica holds. It reports whether the payload was a
// Functions one.
func (s *Service) Deliver(topic string) bool {
	switch {
	case strings.HasPrefix(topic, topicInvoke):
		s.deliverPublished(topic)
	case strings.HasPrefix(topic, topicCallLog):
		s.deliverCallLog(topic)
	default:
		return false
	}
	return true
}

// NodeRoutes are the node protocol's calls paths: an agent fetching a
// call's command or body, answering it, posting its log, or answering a
// call_log question. The control plane serves them behind a node's
// session credential.
func (s *Service) NodeRoutes() []httpapi.NodeRoute {
	return []httpapi.NodeRoute{
		{Pattern: "GET " + nodeproto.PathCalls + "{id}", Handler: s.callCommand},
		{Pattern: "GET " + nodeproto.PathCalls + "{id}/request", Handler: s.callRequestBody},
		{Pattern: "POST " + nodeproto.PathCalls + "{id}/response", Handler: s.callResponse},
		{Pattern: "POST " + nodeproto.PathCalls + "{id}/log", Handler: s.callLog},
		{Pattern: "POST " + nodeproto.PathCallLogs + "{id}", Handler: s.callLogAnswer},
		{Pattern: "POST " + nodeproto.PathCallAnswers, Handler: s.callAnswers},
	}
}
