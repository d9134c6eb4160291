package content

import (
	"bytes"
	"crypto/rand"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/internal/pgtest"
)

// startPostgres opens the PostgreSQL store on dsn behind a server of its
// own, as one control-plane replica serves it.
func startPostgres(t testing.TB, dsn string) (*Postgres, *httptest.Server) {
	t.Helper()
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	p, err := OpenPostgres(t.Context(), dsn, srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	mux.HandleFunc("GET "+ReadPath+"{digest}", p.ServeRead)
	return p, srv
}

func TestPostgresConformance(t *testing.T) {
	p, _ := startPostgres(t, pgtest.FreshSchema(t))
	conformance(t, p)
}

// TestPostgresReplicasShareContent is why the store exists: content put
// through one replica is served by another, from a read either minted (the
// signing key is shared through the database), whole and by range across
// chunk boundaries.
func TestPostgresReplicasShareContent(t *testing.T) {
	dsn := pgtest.FreshSchema(t)
	a, srvA := startPostgres(t, dsn)
	b, srvB := startPostgres(t, dsn)
	data := make([]byte, 2*chunkSize+12345) // three chunks, the last short
	rand.Read(data)
	d := digestOf(data)
	if err := a.Put(t.Context(), d, stage(t, data), int64(len(data))); err != nil {
		t.Fatal(err)
	}
	if size, err := b.Stat(t.Context(), d); err != nil || size != int64(len(data)) {
		t.Fatalf("replica B's Stat = %d, %v; want %d", size, err, len(data))
	}
	u, _, err := a.ReadURL(t.Context(), d, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	onB := strings.Replace(u, srvA.URL, srvB.URL, 1)
	code, got := fetch(t, onB, nil)
	if code != http.StatusOK || !bytes.Equal(got, data) {
		t.Fatalf("read minted by A, served by B: %d, %d bytes; want 200 with the %d bytes", code, len(got), len(data))
	}
	lo := chunkSize - 10
	code, got = fetch(t, onB, http.Header{"Range": {"bytes=" + strconv.Itoa(lo) + "-" + strconv.Itoa(chunkSize+9)}})
	if code != http.StatusPartialContent || !bytes.Equal(got, data[lo:chunkSize+10]) {
		t.Fatalf("a range across a chunk boundary: %d, %d bytes", code, len(got))
	}
	// A read B did not mint for this digest is refused there too.
	if code, _ := fetch(t, srvB.URL+ReadPath+d, nil); code != http.StatusUnauthorized {
		t.Errorf("an unsigned read on B: %d, want 401", code)
	}
}

// BenchmarkPostgresRead reads a 64 MiB object through a minted read from
// the PostgreSQL store and, in the same run, from the local directory (the
// baseline), and reports both rates and their ratio.
func BenchmarkPostgresRead(b *testing.B) {
	data := make([]byte, 64<<20)
	rand.Read(data)
	d := digestOf(data)
	dir := b.TempDir()
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	defer srv.Close()
	local, err := OpenLocal(dir+"/content", dir+"/key", srv.URL, nil)
	if err != nil {
		b.Fatal(err)
	}
	pg, _ := startPostgres(b, pgtest.FreshSchema(b))
	mux.HandleFunc("GET "+ReadPath+"{digest}", local.ServeRead)
	rate := func(s Store) float64 {
		if err := s.Put(b.Context(), d, stage(b, data), int64(len(data))); err != nil {
			b.Fatal(err)
		}
		u, _, err := s.ReadURL(b.Context(), d, time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		for range b.N {
			resp, err := http.Get(u)
			if err != nil {
				b.Fatal(err)
			}
			n, _ := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if n != int64(len(data)) {
				b.Fatalf("read %d bytes, want %d", n, len(data))
			}
		}
		return float64(b.N) * float64(len(data)) / time.Since(start).Seconds() / 1e6
	}
	l, p := rate(local), rate(pg)
	b.ReportMetric(p, "postgres-MB/s")
	b.ReportMetric(l, "local-MB/s")
	b.ReportMetric(p/l, "ratio")
}
