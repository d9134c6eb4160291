package daemon

import (
	"flag"

	"github.com/mercator/mercator/controlplane"
	"github.com/mercator/mercator/internal/bytesize"
)

// LimitFlags declares `mercator server`'s limit flags on fs, each
// defaulting to the control plane's default (docs/hardening.md, "Bounded
// servers"), and returns what they were set to once fs is parsed. RunServer
// checks the result (controlplane.Limits.Check).
func LimitFlags(fs *flag.FlagSet) func() controlplane.Limits {
	def := controlplane.Limits{}.Defaults()
	l := def
	fs.DurationVar(&l.ReadHeaderTimeout, "read-header-timeout", def.ReadHeaderTimeout, "longest a client may take to send a request's headers")
	fs.DurationVar(&l.ReadTimeout, "read-timeout", def.ReadTimeout, "longest a client may take to send an ordinary request; for uploads and invocations, the longest wait for the next piece of the body")
	fs.DurationVar(&l.WriteTimeout, "write-timeout", def.WriteTimeout, "longest an ordinary answer may take to write; for streams (session streams, log follows, invocations, downloads), each single write")
	fs.DurationVar(&l.IdleTimeout, "idle-timeout", def.IdleTimeout, "how long a keep-alive connection may wait for its next request")
	fs.IntVar(&l.MaxConns, "max-connections", def.MaxConns, "open connections at most; more are closed at once (-1: no cap)")
	fs.IntVar(&l.MaxInFlight, "max-requests", def.MaxInFlight, "ordinary requests served at once; more are answered 503 with Retry-After (-1: no cap)")
	fs.IntVar(&l.MaxInFlightPerCaller, "max-requests-per-caller", def.MaxInFlightPerCaller, "ordinary requests one credential, node or (without a credential) address has in flight; more are answered 429 with Retry-After")
	fs.IntVar(&l.MaxStreams, "max-streams", def.MaxStreams, "streams held at once (session streams, log follows, waits, invocations, downloads); more are answered 503")
	fs.IntVar(&l.MaxStreamsPerCaller, "max-streams-per-caller", def.MaxStreamsPerCaller, "streams one credential or address holds; more are answered 429")
	fs.IntVar(&l.MaxNodeBulkPerNode, "max-node-posts", def.MaxNodeBulkPerNode, "event and log posts one node has in flight; more are answered 429")
	fs.Var((*sizeFlag)(&l.NodeBodyBudget), "node-body-budget", "`size` of memory node event and log bodies in flight may take, all nodes together, a body counted at four times its length (e.g. 64MiB); more are answered 503")
	fs.DurationVar(&l.RetryAfter, "retry-after", def.RetryAfter, "what 429 and 503 answers ask clients to wait")
	return func() controlplane.Limits { return l }
}

// sizeFlag is a byte count written for people ("64MiB", bytesize.Parse).
type sizeFlag int64

func (f *sizeFlag) String() string { return bytesize.Format(int64(*f)) }

func (f *sizeFlag) Set(s string) error {
	n, err := bytesize.Parse(s)
	*f = sizeFlag(n)
	return err
}
