package daemon

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/mercator/mercator/content"
	"github.com/mercator/mercator/controlplane"
	"github.com/mercator/mercator/imageref"
	"github.com/mercator/mercator/pki"
	"github.com/mercator/mercator/replica"
	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/sqlstore"
)

// ServerOptions is what `mercator server` is started with.
type ServerOptions struct {
	// DB is the store: "sqlite://PATH" (default: SQLite under DataDir) or
	// "postgres://USER:PASSWORD@HOST/DB" (several replicas may share one).
	DB string
	// Listen is the address to serve on (default 127.0.0.1:7070). Port 0
	// picks a free one; Ready reports which.
	Listen string
	// Listener, when set, is served instead of listening on Listen, and is
	// closed when RunServer returns. The fleet simulator passes one it can close
	// abruptly, with every connection it accepted, to kill a replica the
	// way a crash would.
	Listener net.Listener
	// DataDir holds the admin credential, the CA (ca.pem; its key too when
	// the server made it), the issued certificate and, by default, the
	// database.
	DataDir string
	// PublicURL is how agents and clients reach this server (default
	// https://LISTEN-ADDRESS).
	PublicURL string
	// InsecureHTTP serves plain HTTP instead of HTTPS; it is refused unless
	// the listen address is loopback (tests, the fleet simulator).
	InsecureHTTP bool
	// TLS is where the certificate comes from; the zero value is the
	// server's own CA under DataDir.
	TLS TLSOptions
	// TuneTLS, when set, is handed the server's TLS configuration before
	// it serves, to add what a caller measures: the fleet simulator counts
	// full and resumed handshakes through VerifyConnection. It must not
	// weaken the configuration. Unused with InsecureHTTP.
	TuneTLS func(*tls.Config)
	// InsecureRegistries are further registries reached over plain HTTP
	// when pinning images (loopback registries always are).
	InsecureRegistries []string
	// Content is the content store for Artifacts: "" (a directory under
	// DataDir, served with signed URLs) or s3://BUCKET/PREFIX?endpoint=…
	// (see content.Options).
	Content string
	// RegistryKey seals registry credentials and secret configuration at
	// rest: a 32-byte key in hex or base64. Empty means the key in
	// DataDir/registry-key, generated on first start.
	RegistryKey string
	// Config is the control plane's configuration; Config.Limits holds the
	// server's limits (timeouts, connection and in-flight caps, node body
	// budget: `mercator server --read-timeout` and the flags beside it).
	Config controlplane.Config
	Logger *slog.Logger
	// Ready, when set, is called once the server accepts connections, with
	// its URL and the path of the admin credential file ("" when that
	// credential was removed with `mercator token rm`). Over HTTPS the CA
	// clients pin is in CAFile(DataDir).
	Ready func(url, tokenFile string)
	// LocalAgent, when set, is the node agent for this machine, run in
	// the server's own process (`mercator server --local-agent NODE_ID`,
	// runLocalAgent): LocalAgent.NodeID is its node; the server fills in
	// where to reach it and enrolls it. One process then serves the API
	// and runs the work, as Fn's fnserver does, and a function call
	// crosses no process boundary between the two.
	LocalAgent *AgentOptions
}

// RunServer opens the store, makes sure an admin credential exists, and
// serves the control plane until ctx ends.
func RunServer(ctx context.Context, o ServerOptions) error {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if err := o.check(); err != nil {
		return err
	}
	if err := o.Config.Limits.Defaults().Check(); err != nil {
		return err
	}
	if o.DB == "" {
		o.DB = "sqlite://" + filepath.Join(o.DataDir, "mercator.db")
	}
	if o.Listen == "" {
		o.Listen = "127.0.0.1:7070"
	}
	if !strings.HasPrefix(o.DB, "sqlite://") && !sqlstore.IsPostgres(o.DB) {
		return fmt.Errorf("--db %q: want sqlite://PATH or postgres://USER:PASSWORD@HOST/DB", sqlstore.Redacted(o.DB))
	}
	postgres := sharedDSN(o.DB) != ""
	if postgres && !o.InsecureHTTP && o.TLS.CertFile == "" && o.TLS.CACertFile == "" {
		return errNoSharedCA
	}
	st, err := sqlstore.Open(ctx, o.DB) // dispatches on the scheme
	if err != nil {
		return fmt.Errorf("open store %s: %w", sqlstore.Redacted(o.DB), err)
	}
	defer st.Close()
	tokenFile, err := EnsureAdminToken(ctx, st, o.DataDir, time.Now())
	if err != nil {
		return err
	}
	l, url, certs, err := listen(ctx, o)
	if err != nil {
		return err
	}
	cfg := o.Config
	cfg.Logger = o.Logger
	if cfg.PublicURL = o.PublicURL; cfg.PublicURL == "" {
		cfg.PublicURL = url
	}
	if certs != nil {
		cfg.CAFingerprint = certs.Fingerprint()
	}
	if cfg.Content == nil {
		if cfg.Content, err = content.Open(ctx, content.Options{Spec: o.Content, Database: sharedDSN(o.DB), DataDir: o.DataDir, PublicURL: cfg.PublicURL, Now: cfg.Now}); err != nil {
			return fmt.Errorf("content store: %w", err)
		}
	}
	if cfg.UploadDir == "" {
		cfg.UploadDir = filepath.Join(o.DataDir, "uploads")
	}
	if cfg.RegistryKey == nil {
		if cfg.RegistryKey, err = controlplane.LoadRegistryKey(o.RegistryKey, filepath.Join(o.DataDir, "registry-key")); err != nil {
			return err
		}
	}
	var coord controlplane.Coordinator
	if postgres {
		// Replicas may share a PostgreSQL store: coordinate with them.
		rc, err := replica.Open(ctx, o.DB, o.Logger.With("component", "replica"))
		if err != nil {
			return err
		}
		defer rc.Close()
		// Leadership is given up as the shutdown begins, not once it has
		// ended: another replica schedules while this one drains.
		defer context.AfterFunc(ctx, rc.Resign)()
		coord = rc
		if cfg.WriteConcurrency == 0 {
			cfg.WriteConcurrency = pgWriteConcurrency
		}
		if cfg.WriteBatch == 0 {
			cfg.WriteBatch = pgWriteBatch
		}
	}
	resolver := &refResolver{r: &imageref.Resolver{Insecure: o.InsecureRegistries}}
	srv := controlplane.New(cfg, st, resolver, coord)
	resolver.creds = srv.RegistryCredentials
	// The connection cap counts TCP connections, below TLS (the HTTP
	// server must see the TLS connection itself to offer HTTP/2).
	l = srv.LimitListener(l)
	if certs != nil {
		l = tls.NewListener(l, o.tlsConfig(certs))
	}
	o.Logger.Info("control plane listening", "url", url, "db", sqlstore.Redacted(o.DB), "admin_token_file", tokenFile,
		"content", cfg.Content.Describe())
	if certs != nil {
		logTLS(o.Logger, certs)
	}
	if o.Ready != nil {
		o.Ready(url, tokenFile)
	}
	if o.LocalAgent == nil {
		return srv.Serve(ctx, l)
	}
	return serveWithLocalAgent(ctx, srv, st, l, url, o)
}

// listen opens the listener RunServer serves (o.Listener, or one on
// o.Listen) and, unless o.InsecureHTTP, the TLS certificates it serves
// with (kept renewed until ctx ends); url is the server's own.
func listen(ctx context.Context, o ServerOptions) (l net.Listener, url string, certs *pki.Server, err error) {
	if l = o.Listener; l == nil {
		if l, err = net.Listen("tcp", o.Listen); err != nil {
			return nil, "", nil, fmt.Errorf("listen on %s: %w", o.Listen, err)
		}
	}
	if o.InsecureHTTP {
		if err := checkInsecureListen(l.Addr()); err != nil {
			l.Close()
			return nil, "", nil, err
		}
		return l, "http://" + l.Addr().String(), nil, nil
	}
	if certs, err = serverTLS(o, l); err != nil {
		l.Close()
		return nil, "", nil, fmt.Errorf("TLS: %w", err)
	}
	go certs.Run(ctx)
	return l, "https://" + l.Addr().String(), certs, nil
}

// EnsureAdminToken returns the path of the admin credential file in dataDir,
// creating the credential on this data directory's first start: a named
// token with the admin role, "admin" (or "admin-N" when a replica sharing
// the database took that name), listed by `mercator token ls` and
// removable with `mercator token rm` like any other once another admin
// exists. The file is mode 0600; the store keeps only the hash. A file
// whose token was removed stays removed: the path returned is then "" and
// nothing is minted; a file whose token the store never held (the
// database was replaced) is an error.
func EnsureAdminToken(ctx context.Context, st store.Store, dataDir string, now time.Time) (path string, err error) {
	path = filepath.Join(dataDir, "admin-token")
	if data, err := os.ReadFile(path); err == nil {
		tok := strings.TrimSpace(string(data))
		var admins int
		err = st.View(ctx, func(tx store.Tx) error {
			if _, err := tx.GetToken(controlplane.HashToken(tok)); err == nil {
				admins = -1
				return nil
			}
			toks, err := tx.ListTokens()
			for _, t := range toks {
				if t.Role == "" || t.Role == "admin" {
					admins++
				}
			}
			return err
		})
		switch {
		case err != nil:
			return "", err
		case admins < 0:
			return path, nil
		case admins > 0:
			return "", nil // removed with `mercator token rm`; other admins remain
		}
		return "", fmt.Errorf("admin token in %s is not known to this database (was the database replaced?); remove the file to mint a new one", path)
	}
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return "", err
	}
	tok := controlplane.NewAdminToken()
	if err := st.Update(ctx, func(tx store.Tx) error {
		toks, err := tx.ListTokens()
		if err != nil {
			return err
		}
		taken := map[string]bool{}
		for _, t := range toks {
			taken[t.Name] = true
		}
		name := "admin"
		for n := 2; taken[name]; n++ {
			name = fmt.Sprintf("admin-%d", n)
		}
		return tx.CreateToken(store.Token{Hash: controlplane.HashToken(tok), Name: name, Role: "admin", CreatedAt: now.UTC()})
	}); err != nil {
		return "", err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(tok+"\n"), 0o600); err != nil {
		return "", err
	}
	return path, os.Rename(tmp, path)
}

// PostgreSQL takes concurrent writers, so replicas on it run several
// group-commit loops (controlplane/store_commit.go), each carrying up to
// pgWriteBatch callers. Once transactions ran unbatched here (8 loops of
// 1): under SERIALIZABLE a longer transaction was a likelier conflict, and
// 3,000 simulated nodes placing 20,000 runs measured 176 placements/s in
// batches of 64, 264 unbatched. Node event batches have since moved to
// row locks (store.UpdateLocked) and read together when grouped
// (groupcommit.Share), and a CPU-bound machine pays for every transaction:
// 5,000 simulated nodes, 30,000 runs, two replicas on a 2-core machine
// (docs/performance.md, round 30) placed 177–198/s at 8 loops of 1,
// 319–391/s at 4 of 16, 337/s at 2 of 64, 263/s at 4 of 64, 292/s at 2
// of 32.
const pgWriteConcurrency, pgWriteBatch = 4, 16

// refResolver adapts imageref.Resolver to ImageResolver, asking creds (the
// stored registry credentials) for the reference's registry.
type refResolver struct {
	r     *imageref.Resolver
	creds func(ctx context.Context, host string) (user, password string, ok bool)
}

func (a *refResolver) Resolve(ctx context.Context, s string) (string, error) {
	ref, err := imageref.Parse(s)
	if err != nil {
		return "", err
	}
	r := a.r
	if a.creds != nil {
		withCreds := *a.r
		withCreds.Credentials = func(host string) (string, string, bool) { return a.creds(ctx, host) }
		r = &withCreds
	}
	pinned, err := r.Resolve(ctx, ref)
	if err != nil {
		return "", err
	}
	return pinned.String(), nil
}

// sharedDSN is the store's DSN when replicas may share it (PostgreSQL),
// "" for SQLite: what content.Options.Database wants.
func sharedDSN(db string) string {
	if strings.HasPrefix(db, "sqlite://") {
		return ""
	}
	return db
}
