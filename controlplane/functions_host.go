package controlplane

import (
	"context"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/function"
	"github.com/mercator/mercator/node"
	"github.com/mercator/mercator/store"
)

// fnHost is what the control plane lends Functions (function.Host and
// function.Sealer): the sessions this replica holds, the scheduler's view
// of the nodes, image pinning, registry credentials and the server's key.
type fnHost struct{ s *Server }

var (
	_ function.Host   = fnHost{}
	_ function.Sealer = fnHost{}
)

func (h fnHost) Send(nodeID string, cmd node.Command) (<-chan struct{}, bool, bool) {
	return h.s.streams.send(nodeID, cmd)
}

func (h fnHost) Holds(nodeID string) bool { return h.s.streams.get(nodeID) != nil }

func (h fnHost) NodeReady(n store.Node) bool { return h.s.nodeStatus(n) == api.NodeReady }

func (h fnHost) Nodes(ctx context.Context) ([]store.Node, error) {
	return h.s.nodeList(ctx, h.s.nodeListAge())
}

func (h fnHost) Resolve(ctx context.Context, image string) (string, error) {
	return h.s.resolver.Resolve(ctx, image)
}

func (h fnHost) RegistryAuth(ctx context.Context, image string) string {
	return h.s.registryAuth(ctx, image)
}

func (h fnHost) Seal(ad []byte, plain string) ([]byte, error) { return h.s.seal(ad, plain) }

func (h fnHost) Unseal(ad, sealed []byte) (string, error) { return h.s.unseal(ad, sealed) }
