package daemon

import (
	"flag"
	"fmt"
	"github.com/mercator/mercator/agentrelease"
	"os"
	"strings"
	"time"

	"github.com/mercator/mercator/controlplane"
	"github.com/mercator/mercator/internal/bytesize"
	"github.com/mercator/mercator/nodeagent"
)

// ServerFlags declares `mercator server`'s flags on fs, the limit flags
// (LimitFlags) among them, and returns a function that gives, once fs is
// parsed, the options they set. The options and the flags that set them
// are kept together here so a new option and its flag land in one place.
// What no flag sets (Logger, Ready, Listener) is the caller's. env reads
// the environment: MERCATOR_REGISTRY_KEY is the registry key unless
// --registry-key-file names one; span parses spans of time as the rest of
// the command line does (RetentionFlags).
func ServerFlags(fs *flag.FlagSet, env func(string) string, span func(string) (time.Duration, error)) func() (ServerOptions, error) {
	var o ServerOptions
	fs.StringVar(&o.DB, "db", "", "store `URL`: sqlite://PATH or postgres://USER:PASSWORD@HOST/DB (default sqlite://DATA_DIR/mercator.db)")
	fs.StringVar(&o.Listen, "listen", "127.0.0.1:7070", "`address` to serve on")
	fs.StringVar(&o.DataDir, "data-dir", "/var/lib/mercator/server", "`directory` for the admin credential, the CA and its keys, and the default database")
	fs.StringVar(&o.PublicURL, "public-url", "", "`URL` agents and clients use to reach this server (default https://LISTEN); its host is in the server's certificate")
	fs.StringVar(&o.Config.ReplicaURL, "replica-url", "", "`URL` agents use to reach this replica itself, for the function calls it relays, when several replicas share --public-url (default --public-url)")
	fs.DurationVar(&o.Config.Lease, "lease", 30*time.Second, "how long a node stays ready without reporting")
	fs.DurationVar(&o.Config.SessionTTL, "session-ttl", 24*time.Hour, "life of a node's session credential; agents renew it after two thirds")
	insecure := fs.String("insecure-registries", "", "comma-separated `hosts` reached over plain HTTP when pinning images (loopback always is)")
	fs.StringVar(&o.Content, "content", "", "Artifact content store: local (under DATA_DIR, signed URLs; the default with SQLite), postgres (in the PostgreSQL store, served by every replica; the default with --db postgres://…) or `s3://BUCKET/PREFIX?endpoint=HOST:PORT` (credential from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)")
	keyFile := fs.String("registry-key-file", "", "`file` holding the 32-byte key (hex) that seals registry credentials and secret configuration (default: $MERCATOR_REGISTRY_KEY, else DATA_DIR/registry-key, generated on first start)")
	fs.StringVar(&o.TLS.CertFile, "tls-cert", "", "`file` of the server's certificate chain (PEM), instead of one from the server's own CA; re-read when it changes")
	fs.StringVar(&o.TLS.KeyFile, "tls-key", "", "`file` of the private key of --tls-cert")
	fs.StringVar(&o.TLS.CACertFile, "tls-ca-cert", "", "`file` of a CA certificate: with --tls-ca-key, the CA the server issues its certificate from (the same for every replica); with --tls-cert, the CA clients pin")
	fs.StringVar(&o.TLS.CAKeyFile, "tls-ca-key", "", "`file` of the private key of --tls-ca-cert")
	fs.BoolVar(&o.InsecureHTTP, "insecure-http", false, "serve plain HTTP instead of HTTPS; refused unless --listen is a loopback address")
	fs.BoolVar(&o.Config.MetricsPublic, "metrics-public", false, "serve /metrics without a credential (default: a reader's is needed)")
	releaseKey := fs.String("release-key", "", "`file` of the Ed25519 public key (PEM, or 32 bytes raw or base64) every agent release must be signed with (docs/upgrades.md); without it releases are checked by SHA-256 only")
	limits := LimitFlags(fs) // timeouts, connection and request caps
	retention := RetentionFlags(fs, span)
	localAgent := fs.String("local-agent", "", "also run the node agent for this machine, in the server's process, as node `ID` (the server enrolls it; its flags are `mercator agent`'s named --"+LocalAgentPrefix+"…, e.g. --"+LocalAgentPrefix+"fn-memory; docs/guide.md)")
	agentOptions := LocalAgentFlags(fs)
	return func() (ServerOptions, error) {
		var err error
		if o.LocalAgent, err = localAgentOptions(fs, *localAgent, agentOptions); err != nil {
			return o, err
		}
		if *insecure != "" {
			o.InsecureRegistries = strings.Split(*insecure, ",")
		}
		o.RegistryKey = env("MERCATOR_REGISTRY_KEY")
		if *keyFile != "" {
			key, err := nodeagent.ReadTokenFile(*keyFile)
			if err != nil {
				return o, fmt.Errorf("--registry-key-file: %w", err)
			}
			o.RegistryKey = key
		}
		if *releaseKey != "" {
			b, err := os.ReadFile(*releaseKey)
			if err != nil {
				return o, fmt.Errorf("--release-key: %w", err)
			}
			if o.Config.ReleaseKey, err = agentrelease.ParsePublicKey(b); err != nil {
				return o, fmt.Errorf("--release-key %s: %w", *releaseKey, err)
			}
		}
		o.Config.Limits, o.Config.Retention = limits(), *retention
		return o, nil
	}
}

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
	fs.Var((*bytesize.Value)(&l.NodeBodyBudget), "node-body-budget", "`size` of memory node event and log bodies in flight may take, all nodes together, a body counted at four times its length (e.g. 64MiB); more are answered 503")
	fs.DurationVar(&l.RetryAfter, "retry-after", def.RetryAfter, "what 429 and 503 answers ask clients to wait")
	return func() controlplane.Limits { return l }
}
