package content

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver

	"github.com/mercator/mercator/failure"
)

// Postgres keeps content in the PostgreSQL database that control-plane
// replicas share, in chunks, and serves it through the same signed reads as
// Local. It is the default content store of a deployment on PostgreSQL:
// content pushed through one replica must be readable by a node whose
// session another replica holds, and a directory of one replica's is not
// (a read minted by replica A and sent, behind a load balancer, to replica
// B would find nothing). With it, every replica can serve every object
// without a call to another replica, and the deployment needs nothing
// beyond the database it already has. S3 remains the choice for scale:
// there the bytes go from the bucket to the node without passing through a
// replica.
//
// Layout: content_objects holds one row per object (digest, size), written
// in the same transaction as the object's chunks (content_chunks, chunkSize
// bytes each, stored uncompressed: Artifacts are mostly compressed data
// already). An object is therefore visible whole or not at all, and a Put
// that dies leaves nothing behind. The signing key is one row of
// content_keys, created by whichever replica starts first, so a read
// minted by any replica verifies on every other.
type Postgres struct {
	db   *sql.DB
	desc string
	signedReads
}

// chunkSize is the size of each stored piece of an object: large enough
// that a read of a large Artifact is a few hundred round trips per GiB,
// small enough that no single row strains the database's memory.
const chunkSize = 1 << 20

// pgSchemaLock is the advisory lock under which replicas create the tables,
// so two starting at once do not race on CREATE TABLE.
const pgSchemaLock = 0x6d657263636f6e74 // "merccont"

// OpenPostgres opens the content store in the database dsn names (a
// postgres:// URL, as the control plane's --db), creating its tables and
// the shared signing key when missing. baseURL is this replica's public
// URL, under which reads are minted. now may be nil.
func OpenPostgres(ctx context.Context, dsn, baseURL string, now func() time.Time) (*Postgres, error) {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, fmt.Errorf("content store in PostgreSQL: %w", err)
	}
	db.SetMaxOpenConns(16)
	key, err := pgSetup(ctx, db)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("content store in PostgreSQL: %w", err)
	}
	return &Postgres{db: db, desc: describeDSN(dsn), signedReads: newSignedReads(key, baseURL, now)}, nil
}

// pgSetup creates the tables (under an advisory lock) and returns the
// signing key, creating it if no replica has yet.
func pgSetup(ctx context.Context, db *sql.DB) ([]byte, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	stmts := []string{
		`SELECT pg_advisory_xact_lock(` + fmt.Sprint(pgSchemaLock) + `)`,
		`CREATE TABLE IF NOT EXISTS content_objects (digest text PRIMARY KEY, size bigint NOT NULL, stored_at timestamptz NOT NULL DEFAULT now())`,
		`CREATE TABLE IF NOT EXISTS content_chunks (digest text NOT NULL, seq integer NOT NULL, data bytea NOT NULL, PRIMARY KEY (digest, seq))`,
		`ALTER TABLE content_chunks ALTER COLUMN data SET STORAGE EXTERNAL`,
		`CREATE TABLE IF NOT EXISTS content_keys (name text PRIMARY KEY, key bytea NOT NULL)`,
	}
	for _, q := range stmts {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return nil, err
		}
	}
	fresh := make([]byte, keySize)
	if _, err := rand.Read(fresh); err != nil {
		return nil, err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO content_keys (name, key) VALUES ('reads', $1) ON CONFLICT (name) DO NOTHING`, fresh); err != nil {
		return nil, err
	}
	var key []byte
	if err := tx.QueryRowContext(ctx, `SELECT key FROM content_keys WHERE name = 'reads'`).Scan(&key); err != nil {
		return nil, err
	}
	if len(key) != keySize {
		return nil, fmt.Errorf("the signing key in content_keys is %d bytes, not %d; delete its row to have a new one made (reads already minted stop working)", len(key), keySize)
	}
	return key, tx.Commit()
}

// describeDSN names the database without its credentials.
func describeDSN(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return "PostgreSQL database"
	}
	return "PostgreSQL database " + u.Host + u.Path + " (content_objects, in 1 MiB chunks)"
}

// Close closes the store's connections.
func (p *Postgres) Close() error { return p.db.Close() }

// Describe implements Store.
func (p *Postgres) Describe() string { return p.desc }

// Stat implements Store.
func (p *Postgres) Stat(ctx context.Context, digest string) (int64, error) {
	if err := checkDigest(digest); err != nil {
		return 0, err
	}
	var size int64
	err := p.db.QueryRowContext(ctx, `SELECT size FROM content_objects WHERE digest = $1`, digest).Scan(&size)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, failure.NotFound("content", digest)
	}
	if err != nil {
		return 0, fmt.Errorf("content %s: %w", digest, err)
	}
	return size, nil
}

// Put implements Store: the file's chunks and the object's row in one
// transaction, then the file is removed.
func (p *Postgres) Put(ctx context.Context, digest, path string, size int64) error {
	if err := checkDigest(digest); err != nil {
		return err
	}
	if held, err := p.Stat(ctx, digest); err == nil {
		if held != size {
			return fmt.Errorf("content %s is held with %d bytes, not %d: the store is damaged", digest, held, size)
		}
		return os.Remove(path)
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	tx, err := p.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("content %s: %w", digest, err)
	}
	defer tx.Rollback()
	buf := make([]byte, chunkSize)
	var total int64
	for seq := 0; ; seq++ {
		n, err := io.ReadFull(f, buf)
		if n > 0 {
			if _, err := tx.ExecContext(ctx, `INSERT INTO content_chunks (digest, seq, data) VALUES ($1, $2, $3)
				ON CONFLICT (digest, seq) DO UPDATE SET data = EXCLUDED.data`, digest, seq, buf[:n]); err != nil {
				return fmt.Errorf("content %s: %w", digest, err)
			}
			total += int64(n)
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("content %s: %w", digest, err)
		}
	}
	if total != size {
		return fmt.Errorf("content %s: the staged file holds %d bytes, not %d", digest, total, size)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO content_objects (digest, size) VALUES ($1, $2) ON CONFLICT (digest) DO NOTHING`, digest, size); err != nil {
		return fmt.Errorf("content %s: %w", digest, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("content %s: %w", digest, err)
	}
	return os.Remove(path)
}

// ServeRead serves GET ReadPath+DIGEST from the database (see
// signedReads.serve), a chunk at a time.
func (p *Postgres) ServeRead(w http.ResponseWriter, r *http.Request) {
	p.serve(w, r, func(digest string) (io.ReadSeekCloser, time.Time, error) {
		var size int64
		var stored time.Time
		err := p.db.QueryRowContext(r.Context(), `SELECT size, stored_at FROM content_objects WHERE digest = $1`, digest).Scan(&size, &stored)
		if errors.Is(err, sql.ErrNoRows) {
			return nil, time.Time{}, failure.NotFound("content", digest)
		}
		if err != nil {
			return nil, time.Time{}, fmt.Errorf("content %s: %w", digest, err)
		}
		return &chunkReader{ctx: r.Context(), db: p.db, digest: digest, size: size}, stored, nil
	})
}

// chunkReader reads one object from its chunks, fetching each chunk when
// the read position first reaches it.
type chunkReader struct {
	ctx    context.Context
	db     *sql.DB
	digest string
	size   int64
	off    int64
	seq    int    // the chunk in buf, once loaded
	buf    []byte // chunk seq's bytes
	loaded bool
}

func (c *chunkReader) Read(b []byte) (int, error) {
	if c.off >= c.size {
		return 0, io.EOF
	}
	seq := int(c.off / chunkSize)
	if !c.loaded || seq != c.seq {
		c.buf = c.buf[:0]
		err := c.db.QueryRowContext(c.ctx, `SELECT data FROM content_chunks WHERE digest = $1 AND seq = $2`, c.digest, seq).Scan(&c.buf)
		if err != nil {
			return 0, fmt.Errorf("content %s chunk %d: %w", c.digest, seq, err)
		}
		c.seq, c.loaded = seq, true
	}
	at := int(c.off - int64(seq)*chunkSize)
	if at >= len(c.buf) {
		return 0, fmt.Errorf("content %s chunk %d holds %d bytes, short of offset %d: the store is damaged", c.digest, seq, len(c.buf), at)
	}
	n := copy(b, c.buf[at:])
	c.off += int64(n)
	return n, nil
}

func (c *chunkReader) Seek(offset int64, whence int) (int64, error) {
	switch whence {
	case io.SeekStart:
	case io.SeekCurrent:
		offset += c.off
	case io.SeekEnd:
		offset += c.size
	default:
		return 0, fmt.Errorf("seek: whence %d", whence)
	}
	if offset < 0 {
		return 0, fmt.Errorf("seek to %d: before the start", offset)
	}
	c.off = offset
	return offset, nil
}

func (c *chunkReader) Close() error { return nil }
