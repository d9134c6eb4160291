package controlplane

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"time"

	"github.com/mercator/mercator/content"
	"github.com/mercator/mercator/imageref"
	"github.com/mercator/mercator/replica"
	"github.com/mercator/mercator/store/sqlstore"
)

// Options is what `mercator server` is started with.
type Options struct {
	// DB is the store: "sqlite://PATH" (default: SQLite under DataDir) or
	// "postgres://USER:PASSWORD@HOST/DB" (several replicas may share one).
	DB string
	// Listen is the address to serve on (default 127.0.0.1:7070). Port 0
	// picks a free one; Ready reports which.
	Listen string
	// Listener, when set, is served instead of listening on Listen, and is
	// closed when Run returns. The fleet simulator passes one it can close
	// abruptly, with every connection it accepted, to kill a replica the
	// way a crash would.
	Listener net.Listener
	// DataDir holds the admin credential and, by default, the database.
	DataDir string
	// PublicURL is how agents and clients reach this server (default
	// http://LISTEN-ADDRESS).
	PublicURL string
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
	Config      Config
	Logger      *slog.Logger
	// Ready, when set, is called once the server accepts connections, with
	// its URL and the path of the admin credential file.
	Ready func(url, tokenFile string)
}

// Run opens the store, makes sure an admin credential exists, and serves
// until ctx ends.
func Run(ctx context.Context, o Options) error {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.DataDir == "" {
		return fmt.Errorf("a data directory is required (--data-dir)")
	}
	if o.DB == "" {
		o.DB = "sqlite://" + filepath.Join(o.DataDir, "mercator.db")
	}
	if o.Listen == "" {
		o.Listen = "127.0.0.1:7070"
	}
	if !strings.HasPrefix(o.DB, "sqlite://") && !strings.HasPrefix(o.DB, "postgres://") && !strings.HasPrefix(o.DB, "postgresql://") {
		return fmt.Errorf("--db %q: want sqlite://PATH or postgres://USER:PASSWORD@HOST/DB", sqlstore.Redacted(o.DB))
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
	l := o.Listener
	if l == nil {
		if l, err = net.Listen("tcp", o.Listen); err != nil {
			return fmt.Errorf("listen on %s: %w", o.Listen, err)
		}
	}
	url := "http://" + l.Addr().String()
	cfg := o.Config
	cfg.Logger = o.Logger
	if cfg.PublicURL = o.PublicURL; cfg.PublicURL == "" {
		cfg.PublicURL = url
	}
	if cfg.Content == nil {
		if cfg.Content, err = content.Open(content.Options{Spec: o.Content, DataDir: o.DataDir, PublicURL: cfg.PublicURL, Now: cfg.Now}); err != nil {
			return fmt.Errorf("content store: %w", err)
		}
	}
	if cfg.UploadDir == "" {
		cfg.UploadDir = filepath.Join(o.DataDir, "uploads")
	}
	if cfg.RegistryKey == nil {
		if cfg.RegistryKey, err = LoadRegistryKey(o.RegistryKey, filepath.Join(o.DataDir, "registry-key")); err != nil {
			return err
		}
	}
	var coord Coordinator
	if !strings.HasPrefix(o.DB, "sqlite://") {
		// Replicas may share a PostgreSQL store: coordinate with them.
		rc, err := replica.Open(ctx, o.DB, sqlstore.Redacted(o.DB), o.Logger.With("component", "replica"))
		if err != nil {
			return err
		}
		defer rc.Close()
		coord = rc
		if cfg.WriteConcurrency == 0 {
			cfg.WriteConcurrency = pgWriteConcurrency
		}
		if cfg.WriteBatch == 0 {
			cfg.WriteBatch = pgWriteBatch
		}
	}
	resolver := &refResolver{r: &imageref.Resolver{Insecure: o.InsecureRegistries}}
	srv := New(cfg, st, resolver, coord)
	resolver.creds = srv.RegistryCredentials
	o.Logger.Info("control plane listening", "url", url, "db", sqlstore.Redacted(o.DB), "admin_token_file", tokenFile,
		"content", cfg.Content.Describe())
	if o.Ready != nil {
		o.Ready(url, tokenFile)
	}
	return srv.Serve(ctx, l)
}

// PostgreSQL takes concurrent writers and commits concurrent transactions
// together itself; what costs is each statement's round trip, which a
// transaction makes one after the other, and under SERIALIZABLE a longer
// transaction is a likelier conflict. So replicas on PostgreSQL run
// transactions side by side rather than batched (commit.go): measured with
// 3,000 simulated nodes placing 20,000 runs, batches of 64 callers gave 176
// placements/s, of 16 gave 202/s, unbatched 264/s.
const pgWriteConcurrency, pgWriteBatch = 8, 1

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
