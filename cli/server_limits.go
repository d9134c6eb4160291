package cli

import (
	"fmt"

	"github.com/mercator/mercator/controlplane"
	"github.com/mercator/mercator/internal/bytesize"
	"github.com/mercator/mercator/nodeproto"
)

// nodeBodyMin is the smallest --node-body-budget: one event batch of the
// largest size a node may send must fit, at what it costs in memory.
const nodeBodyMin = controlplane.NodeBodyCost * nodeproto.MaxEventBody

// limitFlags declares `mercator server`'s limit flags, defaulting to the
// control plane's defaults (docs/hardening.md, "Bounded servers"). The
// returned function reads the parsed flags into Limits.
func limitFlags(fs *flagSet) func() (controlplane.Limits, error) {
	def := controlplane.Limits{}.Defaults()
	l := def
	fs.DurationVar(&l.ReadHeaderTimeout, "read-header-timeout", def.ReadHeaderTimeout, "longest a client may take to send a request's headers")
	fs.DurationVar(&l.ReadTimeout, "read-timeout", def.ReadTimeout, "longest a client may take to send an ordinary request; for uploads and invocations, the longest wait for the next piece of the body")
	fs.DurationVar(&l.WriteTimeout, "write-timeout", def.WriteTimeout, "longest an ordinary answer may take to write; for streams (session streams, log follows, invocations, downloads), each single write")
	fs.DurationVar(&l.IdleTimeout, "idle-timeout", def.IdleTimeout, "how long a keep-alive connection may wait for its next request")
	fs.IntVar(&l.MaxConns, "max-connections", def.MaxConns, "open connections at most; more are closed at once (-1: no cap)")
	fs.IntVar(&l.MaxInFlight, "max-requests", def.MaxInFlight, "ordinary requests served at once; more are answered 503 with Retry-After (-1: no cap)")
	fs.IntVar(&l.MaxInFlightPerCaller, "max-requests-per-caller", def.MaxInFlightPerCaller, "ordinary requests one credential, node or (without a credential) address has in flight; more are answered 429 with Retry-After")
	fs.IntVar(&l.MaxStreams, "max-streams", def.MaxStreams, "streams held at once (a session stream per node, log follows, waits, invocations, downloads); more are answered 503")
	fs.IntVar(&l.MaxStreamsPerCaller, "max-streams-per-caller", def.MaxStreamsPerCaller, "streams one credential or address holds; more are answered 429")
	fs.IntVar(&l.MaxNodeBulkPerNode, "max-node-posts", def.MaxNodeBulkPerNode, "event and log posts one node has in flight; more are answered 429")
	budget := fs.String("node-body-budget", bytesize.Format(def.NodeBodyBudget), "`size` of memory node event and log bodies in flight may take across all nodes, counted at four times their length, e.g. 64MiB; more are answered 503")
	fs.DurationVar(&l.RetryAfter, "retry-after", def.RetryAfter, "what 429 and 503 answers ask clients to wait")
	return func() (controlplane.Limits, error) {
		n, err := bytesize.Parse(*budget)
		if err != nil {
			return l, fmt.Errorf("--node-body-budget: %w", err)
		}
		if n < nodeBodyMin {
			return l, fmt.Errorf("--node-body-budget %s is below %s, the largest event batch a node may send: a node could never deliver one", *budget, bytesize.Format(nodeBodyMin))
		}
		l.NodeBodyBudget = n
		for _, d := range []struct {
			name string
			v    int64
		}{{"read-header-timeout", int64(l.ReadHeaderTimeout)}, {"read-timeout", int64(l.ReadTimeout)}, {"write-timeout", int64(l.WriteTimeout)}, {"idle-timeout", int64(l.IdleTimeout)}, {"retry-after", int64(l.RetryAfter)}} {
			if d.v <= 0 {
				return l, fmt.Errorf("--%s must be positive, such as 30s", d.name)
			}
		}
		return l, nil
	}
}
