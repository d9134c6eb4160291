package e2e

import (
	"bytes"
	"database/sql"
	"fmt"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	_ "modernc.org/sqlite" // the store's own driver, to measure its file

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/daemon"
	"github.com/mercator/mercator/internal/bytesize"
)

// sqliteBytes is the size of the data the control plane's SQLite database
// holds: its pages in use, read through a connection of its own (which
// sees what the write-ahead log holds too), so that the figure does not
// depend on when the log was last checkpointed or on free pages.
func sqliteBytes(t *testing.T, path string) int64 {
	t.Helper()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var pages, free, size int64
	for pragma, v := range map[string]*int64{"page_count": &pages, "freelist_count": &free, "page_size": &size} {
		if err := db.QueryRowContext(t.Context(), "PRAGMA "+pragma).Scan(v); err != nil {
			t.Fatalf("PRAGMA %s: %v", pragma, err)
		}
	}
	return (pages - free) * size
}

// TestHardeningRetentionLogCap: a Run writing 64 MiB under a 1 MiB log
// cap grows the database by at most the cap and a small margin (the run's
// record, its indexes, the node's events), and its log ends with the line
// saying where it was truncated.
func TestHardeningRetentionLogCap(t *testing.T) {
	const (
		written = 64 << 20
		limit   = 1 << 20
		margin  = 512 << 10
	)
	c := startClusterWith(t, 10*time.Second, func(o *daemon.ServerOptions) {
		o.Config.Retention.MaxLogLimit = 16 << 20
	})
	c.startAgent("logcap")
	db := filepath.Join(c.dataDir, "mercator.db")
	before := sqliteBytes(t, db)
	run, err := c.client.SubmitRun(c.ctx, api.RunSpec{Image: c.workload, Command: []string{"spew", strconv.Itoa(written)},
		LogLimitBytes: limit})
	if err != nil {
		t.Fatal(err)
	}
	run, err = c.client.WaitRun(c.ctx, run.ID)
	if err != nil || run.Status != api.RunSucceeded {
		t.Fatalf("run %s: %s (%s), %v", run.ID, run.Status, run.Reason, err)
	}
	line := fmt.Sprintf("\n[mercator: log truncated at %d bytes, the run's log limit (log_limit_bytes); later output was dropped]\n", limit)
	var log bytes.Buffer
	c.waitFor("the log truncated", func() bool {
		log.Reset()
		return c.client.Logs(c.ctx, run.ID, false, &log) == nil && bytes.HasSuffix(log.Bytes(), []byte(line))
	})
	after := sqliteBytes(t, db)
	grown := after - before
	fmt.Printf("log cap: run wrote %s under a %s cap; log kept %d bytes (%d + the truncation line); database %s -> %s, grown %s (%d bytes; bound cap + %s)\n",
		bytesize.Format(written), bytesize.Format(limit), log.Len(), limit, bytesize.Format(before), bytesize.Format(after),
		bytesize.Format(grown), grown, bytesize.Format(margin))
	if log.Len() != limit+len(line) {
		t.Errorf("log holds %d bytes, want the %d of the cap and the %d of the line", log.Len(), limit, len(line))
	}
	if grown > limit+margin {
		t.Errorf("database grew %d bytes for a log capped at %d: more than the cap plus %d", grown, limit, margin)
	}
}
