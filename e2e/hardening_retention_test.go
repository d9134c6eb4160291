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

// sqliteInt is one integer a query of the control plane's SQLite database
// answers, read through a connection of its own.
func sqliteInt(t *testing.T, path, query string) int64 {
	t.Helper()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n sql.NullInt64
	if err := db.QueryRowContext(t.Context(), query).Scan(&n); err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	return n.Int64
}

// TestHardeningRetentionEventPruning: with a real agent delivering the
// events of many runs and the sweep running every second, the node's
// de-duplication rows are pruned behind the watermark it declares: what is
// kept is bounded by the watermark's stride, not by how many events were
// applied.
func TestHardeningRetentionEventPruning(t *testing.T) {
	const runs = 150
	c := startClusterWith(t, 10*time.Second, func(o *daemon.ServerOptions) {
		o.Config.Retention.SweepEvery = time.Second
	})
	node := c.startAgent("prune")
	specs := make([]api.RunSpec, runs)
	for i := range specs {
		specs[i] = api.RunSpec{Image: c.workload, Command: []string{"echo", strconv.Itoa(i)}}
	}
	submitted, err := c.client.SubmitRuns(c.ctx, specs)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range submitted {
		if r, err := c.client.WaitRun(c.ctx, r.ID); err != nil || r.Status != api.RunSucceeded {
			t.Fatalf("run %s: %s, %v", r.ID, r.Status, err)
		}
	}
	db := filepath.Join(c.dataDir, "mercator.db")
	applied := func() int64 {
		return sqliteInt(t, db, "SELECT MAX(seq) FROM events WHERE node_id = '"+node+"'") + 1
	}
	var kept, watermark int64
	c.waitFor("the node's event rows pruned behind its watermark", func() bool {
		watermark = sqliteInt(t, db, "SELECT MAX(seq) FROM event_watermarks WHERE node_id = '"+node+"'")
		kept = sqliteInt(t, db, "SELECT COUNT(*) FROM events WHERE node_id = '"+node+"'")
		below := sqliteInt(t, db, fmt.Sprintf("SELECT COUNT(*) FROM events WHERE node_id = '%s' AND seq <= %d", node, watermark))
		return watermark > 0 && below == 0
	})
	total := applied()
	fmt.Printf("event pruning: %d runs, the node's events numbered 0..%d; its watermark at %d; %d de-duplication rows kept (before: one per event, %d)\n",
		runs, total-1, watermark, kept, total)
	if kept > total-watermark {
		t.Errorf("%d rows kept, more than the %d above the watermark", kept, total-watermark)
	}
}
