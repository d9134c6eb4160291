package controlplane

import (
	"context"

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

func (h fnHost) Holds(nodeID string) bool { return h.s.streams.Get(nodeID) != nil }

// NodeReady: inside its lease, and its last facts report not refused
// (factcheck): a node whose word was just refused takes no calls either.
func (h fnHost) NodeReady(n store.Node) bool {
	return h.s.nodeStatus(n) == api.NodeReady && !factcheck.Has(n, api.NodeFlagFactsRefused)
}

func (h fnHost) Nodes(ctx context.Context) ([]store.Node, error) {
	return h.s.nodeList(ctx, h.s.nodeListAge())
}

func (h fnHost) Resolve(ctx context.Context, image string) (string, error) {
	return h.s.resolver.Resolve(ctx, image)
}

func (h fnHost) RegistryAuth(ctx context.Context, project, image string) string {
	return h.s.registries.Auth(ctx, project, image)
}
