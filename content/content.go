// Package content is the control plane's content store: where the bytes of
// every Artifact version live, keyed by their SHA-256 digest, and how a node
// is given one read of one object.
//
// Three implementations stand behind the Store interface. Local keeps
// content in a directory under the server's data directory and serves it
// itself, through URLs signed with an HMAC key the server generated on first
// start; it is the embedded default. Postgres keeps it in the PostgreSQL
// database replicas share, and every replica serves it the same way; it is
// the default there. S3 keeps content in any S3-compatible bucket
// and hands out presigned GETs, so the bytes go from the bucket to the node
// without passing through the control plane; it is the choice for scale.
//
// In both, what a node receives is a location for exactly one object that
// expires: the object store's own key, and the server's signing key, never
// leave the control plane. That is docs/design.md, promise 5 ("fetched only
// through a read the control plane minted for that one fetch"), and it is
// why the interface has ReadURL rather than a Get: the control plane itself
// never needs to read content back once it is stored.
//
// Content is addressed by digest, so Put is idempotent and two Artifact
// versions with the same bytes share one object. Nothing here knows Artifact
// names or versions; that is the control plane's catalog (store.Artifact).
//
// The control plane (package controlplane) and its tests import content.
package content

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/mercator/mercator/failure"
)

// Store holds immutable content by SHA-256 digest (64 lowercase hex digits,
// without an algorithm prefix). Implementations are safe for concurrent use.
type Store interface {
	// Stat returns the size of the content stored under digest, or an error
	// matching failure.ErrNotFound when there is none.
	Stat(ctx context.Context, digest string) (size int64, err error)
	// Put stores the file at path under digest. The caller has verified
	// that the file's bytes hash to digest and owns the file until Put
	// returns; Put may move it (the local store renames it into place), so
	// the caller must not rely on path existing afterwards. Putting content
	// that is already held succeeds and changes nothing.
	Put(ctx context.Context, digest, path string, size int64) error
	// ReadURL mints a location from which exactly this object can be read
	// with a plain GET until the returned moment, and by nobody's credential
	// but the one the URL itself carries. The content need not be checked
	// for existence here; a read of missing content fails at the GET.
	ReadURL(ctx context.Context, digest string, ttl time.Duration) (location string, expires time.Time, err error)
	// Describe says where content lives, for logs ("local directory
	// /var/lib/…", "s3 bucket b at host:9000"). It carries no secret.
	Describe() string
}

var digestPattern = regexp.MustCompile(`^[0-9a-f]{64}$`)

// ValidDigest reports whether d is 64 lowercase hexadecimal digits, the only
// spelling of a digest this package accepts.
func ValidDigest(d string) bool { return digestPattern.MatchString(d) }

func checkDigest(d string) error {
	if !ValidDigest(d) {
		return failure.Invalid("sha256", "%q is not a SHA-256 digest: want 64 lowercase hex digits", d)
	}
	return nil
}

// Options says how Open builds a Store.
type Options struct {
	// Spec is "local" for the directory under DataDir, "postgres" for the
	// PostgreSQL database Database names, "" for the default (postgres when
	// Database is set, else local), or
	// "s3://BUCKET[/PREFIX]?endpoint=HOST:PORT[&region=R][&insecure=true]"
	// for an S3-compatible store. The bucket's credentials come from Env:
	// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN
	// when set), never from the spec, so the spec can be logged.
	Spec string
	// Database is the control plane's store when it is PostgreSQL (its
	// postgres:// DSN), "" with SQLite. Replicas sharing that database
	// must share content, so the local store is refused beside it.
	Database string
	// DataDir is the server's data directory: the local store keeps its
	// content and its signing key under it.
	DataDir string
	// PublicURL is how nodes reach this control plane; the local store's
	// reads are URLs under it.
	PublicURL string
	// Env reads the environment (os.Getenv when nil).
	Env func(string) string
	// Now is the clock (time.Now when nil).
	Now func() time.Time
}

// Open builds the Store Options describe. A local store creates its
// directory and, on first start, its signing key (see OpenLocal); a
// PostgreSQL one its tables and the key the replicas share (OpenPostgres).
func Open(ctx context.Context, o Options) (Store, error) {
	if o.Env == nil {
		o.Env = os.Getenv
	}
	if o.Spec == "" {
		o.Spec = "local"
		if o.Database != "" {
			o.Spec = "postgres"
		}
	}
	switch {
	case o.Spec == "local" && o.Database != "":
		return nil, failure.Invalid("content", "--content local cannot serve replicas sharing a PostgreSQL store: content pushed through one replica must be readable through every other, and a local directory is one replica's alone; leave --content unset to keep content in PostgreSQL, or give every replica the same s3://BUCKET?endpoint=HOST:PORT")
	case o.Spec == "postgres":
		if o.Database == "" {
			return nil, failure.Invalid("content", "--content postgres keeps content in the control plane's PostgreSQL store, and this one is not on PostgreSQL (--db sqlite://…); use --content local")
		}
		return OpenPostgres(ctx, o.Database, o.PublicURL, o.Now)
	case o.Spec == "local":
		if o.DataDir == "" {
			return nil, fmt.Errorf("content store: a data directory is required for the local store")
		}
		return OpenLocal(filepath.Join(o.DataDir, "content"), filepath.Join(o.DataDir, "content-key"), o.PublicURL, o.Now)
	case strings.HasPrefix(o.Spec, "s3://"):
		u, err := url.Parse(o.Spec)
		if err != nil {
			return nil, failure.Invalid("content", "content store %q: %v", o.Spec, err)
		}
		q := u.Query()
		insecure, _ := strconv.ParseBool(q.Get("insecure"))
		return NewS3(S3Config{
			Endpoint:     q.Get("endpoint"),
			Bucket:       u.Host,
			Prefix:       strings.Trim(u.Path, "/"),
			Region:       q.Get("region"),
			Insecure:     insecure,
			AccessKey:    o.Env("AWS_ACCESS_KEY_ID"),
			SecretKey:    o.Env("AWS_SECRET_ACCESS_KEY"),
			SessionToken: o.Env("AWS_SESSION_TOKEN"),
		})
	}
	return nil, failure.Invalid("content", "content store %q: want \"local\", \"postgres\" or s3://BUCKET[/PREFIX]?endpoint=HOST:PORT", o.Spec)
}
