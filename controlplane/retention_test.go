package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/controlplane/internal/retention"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// putRun stores a run with one attempt on nodeID, finished at finished
// when status is terminal, and a log of size bytes for that attempt.
func putRun(t *testing.T, st store.Store, id, nodeID, status string, created time.Time, finished *time.Time, size int) {
	t.Helper()
	r := store.Run{Run: api.Run{ID: id, RunSpec: api.RunSpec{Image: "x@sha256:00", Command: []string{"/x"}},
		Status: status, CreatedAt: created, UpdatedAt: created, FinishedAt: finished,
		Attempts: []api.Attempt{{Number: 1, NodeID: nodeID, Status: api.AttemptRunning, PlacedAt: created}}}}
	err := st.Update(context.Background(), func(tx store.Tx) error {
		if err := tx.CreateRun(r); err != nil {
			return err
		}
		_, err := tx.AppendLog(nodeproto.WorkloadKey{RunID: id, Attempt: 1}, 0, bytes.Repeat([]byte("x"), size))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestRetentionSweep: with the clock moved past the window, one sweep
// deletes finished runs older than --retain with their logs, expired
// sessions and spent invitations past the audit window, and keeps newer
// finished runs and every run that is not terminal, however old.
func TestRetentionSweep(t *testing.T) {
	f := newProtoFixture(t)
	start := f.clock.Now()
	e := f.enroll(t, "n1", f.invite(t, "n1")) // a spent invitation, a session expiring in an hour
	putRun(t, f.st, "r-old", "n1", api.RunSucceeded, start, ptrTime(start.Add(time.Hour)), 1<<20)
	putRun(t, f.st, "r-running", "n1", api.RunRunning, start, nil, 1000)
	putRun(t, f.st, "r-queued", "n1", api.RunQueued, start, nil, 0)
	f.clock.Advance(20 * 24 * time.Hour)
	putRun(t, f.st, "r-recent", "n1", api.RunFailed, f.clock.Now(), ptrTime(f.clock.Now()), 1000)

	// At 20 days the session (expired for 20 days) and the invitation
	// (spent 20 days ago) are past their 7 days; no run is past its 30.
	if got := f.srv.sweeper().Sweep(t.Context()); got["runs"] != 0 || got["sessions"] != 1 || got["invitations"] != 1 {
		t.Fatalf("sweep at 20 days deleted %v; want no run, 1 session, 1 invitation", got)
	}
	f.clock.Advance(11 * 24 * time.Hour) // r-old finished 31 days ago, r-recent 11
	if got := f.srv.sweeper().Sweep(t.Context()); got["runs"] != 1 {
		t.Fatalf("sweep at 31 days deleted %v; want 1 run", got)
	}
	err := f.st.View(t.Context(), func(tx store.Tx) error {
		if _, err := tx.GetRun("r-old"); !errors.Is(err, failure.ErrNotFound) {
			t.Errorf("r-old after the sweep: %v, want deleted", err)
		}
		if _, size, _ := tx.ReadLog(nodeproto.WorkloadKey{RunID: "r-old", Attempt: 1}, 0, 0); size != 0 {
			t.Errorf("r-old's log holds %d bytes after the sweep", size)
		}
		for _, id := range []string{"r-running", "r-queued", "r-recent"} {
			if _, err := tx.GetRun(id); err != nil {
				t.Errorf("%s after the sweep: %v, want kept", id, err)
			}
		}
		if _, err := tx.GetSession(httpapi.HashToken(e.SessionToken)); !errors.Is(err, failure.ErrNotFound) {
			t.Errorf("a session expired a month ago: %v, want deleted", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func ptrTime(t time.Time) *time.Time { return &t }

// TestEventDedupSurvivesPruning: an event the node declared below its
// watermark is recognised when delivered again after its row was pruned,
// and not applied twice. The redelivery carries different facts, so a
// second application would show.
func TestEventDedupSurvivesPruning(t *testing.T) {
	f := newProtoFixture(t)
	e := f.enroll(t, "n1", f.invite(t, "n1"))
	ctx := t.Context()
	ids := make([]string, 5)
	events := make([]nodeproto.Event, 5)
	for i := range events {
		ids[i] = nodeproto.FormatEventID("inc", uint64(i))
		events[i] = nodeproto.Event{ID: ids[i], Kind: nodeproto.EventFacts, At: f.clock.Now(), Facts: &nodeproto.NodeFacts{CPUs: float64(i + 1)}}
	}
	if _, err := f.tr.SendEventsThrough(ctx, "n1", e.SessionToken, events, ""); err != nil {
		t.Fatal(err)
	}
	// The agent declares every one of them acknowledged.
	if _, err := f.tr.SendEventsThrough(ctx, "n1", e.SessionToken, []nodeproto.Event{{ID: nodeproto.FormatEventID("inc", 5), Kind: "from-the-future"}}, ids[4]); err != nil {
		t.Fatal(err)
	}
	if got := f.srv.sweeper().Sweep(ctx); got["events"] != 5 {
		t.Fatalf("sweep pruned %d event rows, want the 5 at or below the watermark", got["events"])
	}
	again := events[2]
	again.Facts = &nodeproto.NodeFacts{CPUs: 99}
	acked, err := f.tr.SendEventsThrough(ctx, "n1", e.SessionToken, []nodeproto.Event{again}, "")
	if err != nil || len(acked) != 1 {
		t.Fatalf("redelivery: acked %v, %v", acked, err)
	}
	err = f.st.View(ctx, func(tx store.Tx) error {
		n, err := tx.GetNode("n1")
		if err == nil && n.Facts.CPUs != 5 {
			t.Errorf("node facts say %v CPUs after the redelivery, want 5: a pruned event was applied twice", n.Facts.CPUs)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestLogCap: an attempt's log keeps its run's log_limit_bytes and then
// one line saying it was truncated, and the agent is told to stop.
func TestLogCap(t *testing.T) {
	f := newProtoFixture(t)
	e := f.enroll(t, "n1", f.invite(t, "n1"))
	putRun(t, f.st, "r-chatty", "n1", api.RunRunning, f.clock.Now(), nil, 0)
	const limit = 100 << 10
	err := f.st.Update(t.Context(), func(tx store.Tx) error {
		r, err := tx.GetRun("r-chatty")
		r.LogLimitBytes = limit
		if err == nil {
			err = tx.PutRun(r)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	key := nodeproto.WorkloadKey{RunID: "r-chatty", Attempt: 1}
	chunk := bytes.Repeat([]byte("0123456789abcdef"), 4<<10) // 64 KiB
	var ack nodeproto.LogAck
	var offset int64
	for offset = 0; offset < 1<<20 && !ack.Truncated; offset += int64(len(chunk)) {
		if ack, err = f.tr.SendLogs(t.Context(), "n1", e.SessionToken, nodeproto.LogChunk{WorkloadKey: key, Offset: offset, Data: chunk}); err != nil {
			t.Fatal(err)
		}
	}
	line := retention.TruncationLine(limit)
	if !ack.Truncated || ack.Size != limit+int64(len(line)) || offset != 2*int64(len(chunk)) {
		t.Fatalf("after %d bytes: ack %+v; want truncated at %d bytes plus the line", offset, ack, limit)
	}
	// Later output, redelivered or new, is dropped.
	if ack, err = f.tr.SendLogs(t.Context(), "n1", e.SessionToken, nodeproto.LogChunk{WorkloadKey: key, Offset: offset, Data: chunk}); err != nil || ack.Size != limit+int64(len(line)) {
		t.Fatalf("a chunk past the cap: ack %+v, %v", ack, err)
	}
	err = f.st.View(t.Context(), func(tx store.Tx) error {
		data, _, err := tx.ReadLog(key, 0, 1<<30)
		if err == nil && (!bytes.HasSuffix(data, []byte(line)) || !bytes.Equal(data[:limit], bytes.Repeat(chunk, 2)[:limit])) {
			t.Errorf("log of %d bytes does not hold the first %d bytes and then %q", len(data), limit, line)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// A run may not ask for more than the server keeps.
	if err := f.srv.cfg.Retention.CheckLogLimit(api.RunSpec{LogLimitBytes: f.srv.cfg.Retention.MaxLogLimit + 1}); !errors.Is(err, failure.ErrInvalid) || !strings.Contains(err.Error(), "max-log-limit") {
		t.Errorf("a log limit above the maximum: %v", err)
	}
}

// TestUploadLimits: a declared size above the maximum is refused with 413
// before anything is staged, and an upload's expiry is fixed when it
// starts: writing to it does not extend it, and the sweep removes it.
func TestUploadLimits(t *testing.T) {
	f := newArtifactFixture(t)
	code, body := f.call(t, "POST", "/v1/artifacts/big/uploads", strings.NewReader(`{"size":9223372036854775807}`))
	if code != 413 || !strings.Contains(string(body), "max-upload-size") {
		t.Fatalf("declaring 2^63-1 bytes: %d %s; want 413 naming --max-upload-size", code, body)
	}
	if entries, err := os.ReadDir(f.dataDir + "/uploads"); err == nil && len(entries) > 0 {
		t.Fatalf("a refused upload left %d entries in the upload directory", len(entries))
	}
	code, body = f.call(t, "POST", "/v1/artifacts/small/uploads", strings.NewReader(`{"size":10}`))
	if code != 201 {
		t.Fatalf("start: %d %s", code, body)
	}
	up := decodeUpload(t, body)
	f.clock.Advance(23 * time.Hour)
	if code, body := f.call(t, "PUT", "/v1/uploads/"+up.ID+"?offset=0", strings.NewReader("01234")); code != 200 || decodeUpload(t, body).ExpiresAt != up.ExpiresAt {
		t.Fatalf("PUT: %d %s; want 200 and the expiry unchanged (%s)", code, body, up.ExpiresAt)
	}
	f.clock.Advance(2 * time.Hour)
	if got := f.srv.sweeper().Sweep(t.Context()); got["uploads"] != 1 {
		t.Fatalf("sweep removed %d uploads, want the expired one", got["uploads"])
	}
	if code, _ := f.call(t, "GET", "/v1/uploads/"+up.ID, nil); code != 404 {
		t.Fatalf("the swept upload: %d, want 404", code)
	}
}

func decodeUpload(t *testing.T, body []byte) api.Upload {
	t.Helper()
	var up api.Upload
	if err := json.Unmarshal(body, &up); err != nil || up.ID == "" {
		t.Fatalf("not an upload: %s (%v)", body, err)
	}
	return up
}
