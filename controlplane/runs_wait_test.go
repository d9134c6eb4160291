package controlplane

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
)

// TestWaitChangedSince: with changed_since, the long poll answers at once
// when the run changed after it (a client showing progress); a bad value
// is refused naming the parameter.
func TestWaitChangedSince(t *testing.T) {
	f := newRunsFixture(t)
	var run api.Run
	f.want(http.StatusCreated, &run, "POST", "/v1/runs", api.RunSpec{Image: "reg/app:1", Command: []string{"true"}})
	before := url.QueryEscape(run.UpdatedAt.Add(-time.Nanosecond).Format(time.RFC3339Nano))
	var got api.Run
	// A 5-minute poll answered now: the run changed after changed_since.
	f.want(http.StatusOK, &got, "GET", "/v1/runs/"+run.ID+"/wait?timeout=5m&changed_since="+before, nil)
	if got.ID != run.ID || got.Status != api.RunQueued {
		t.Fatalf("wait answered %+v", got)
	}
	status, _, data := f.do("GET", "/v1/runs/"+run.ID+"/wait?changed_since=yesterday", nil)
	var e api.Error
	if err := json.Unmarshal(data, &e); err != nil || status != http.StatusBadRequest || e.Error.Field != "changed_since" || !strings.Contains(e.Error.Message, "RFC 3339") {
		t.Fatalf("a bad changed_since: %d %s", status, data)
	}
}
