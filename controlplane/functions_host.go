package controlplane

import (
	"context"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/function"
	"github.com/mercator/mercator/controlplane/internal/factcheck"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// fnHost is what the control plane lends Functions (function.Host): the
// sessions this replica holds, the scheduler's view of the nodes, image
// pinning and registry credentials. The server's key is serverKey.
type fnHost struct{ s *Server }

var (
	_ function.Host   = fnHost{}
	_ function.Sealer = serverKey{}
)

func (h fnHost) Send(nodeID string, cmd nodeproto.Command) (<-chan struct{}, bool, bool) {
	return h.s.streams.Send(nodeID, cmd)
}

func (h fnHost) AttachInvokes(nodeID string, fencing uint64, send func(fencing uint64, cmd *nodeproto.InvokeCommand) bool) (detach func()) {
	return h.s.streams.AttachInvokes(nodeID, fencing, send)
}

func (h fnHost) Holds(nodeID string) bool { return h.s.streams.Get(nodeID) != nil }

// NodeReady: inside its lease, and its last facts report not refused
// (factcheck): a node whose word was just refused takes no calls either.
func (h fnHost) NodeReady(n store.Node) bool {
	return h.s.nodeStatus(n) == api.NodeReady && !factcheck.Has(n, api.NodeFlagFactsRefused)
}

// Nodes: the scheduler's copy, read again from the store only when older
// than metricsNodeAge. On the leader every pass keeps the copy fresh; on
// another replica nothing does, and reading every node's record at each
// scrape (every 5 s in bench fleet) was 12% of that replica's CPU at 2,000
// nodes.
func (h fnHost) Nodes(ctx context.Context) ([]store.Node, error) {
	return h.s.nodeList(ctx, max(h.s.nodeListAge(), metricsNodeAge))
}

// metricsNodeAge is how old the copy of the nodes' records behind the
// function-container gauges may be: a Prometheus scrape interval or two.
const metricsNodeAge = 30 * time.Second

func (h fnHost) Resolve(ctx context.Context, image string) (string, error) {
	return h.s.resolver.Resolve(ctx, image)
}

func (h fnHost) RegistryAuth(ctx context.Context, project, image string) string {
	return h.s.registries.Auth(ctx, project, image)
}
