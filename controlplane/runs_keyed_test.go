package controlplane

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/runsecrets"
	"github.com/mercator/mercator/store"
)

// TestKeyedSubmissionCreatesOnce: a batch sent again with its idempotency
// key (a retry after a lost answer) is answered with the runs the first
// call created, marked as a replay, without a registry call or a second
// set of runs; the same key with another body, or on the other route, is
// a conflict; another key, or no key, creates anew.
func TestKeyedSubmissionCreatesOnce(t *testing.T) {
	f := newRunsFixture(t)
	batch := api.RunBatch{Runs: []api.RunSpec{specAt(0, "reg/train:1"), specAt(1, "reg/train:1"), specAt(2, "reg/eval:2")}}
	key := []string{api.HeaderIdempotencyKey, "sweep-7f3a"}

	var first, again api.RunList
	status, header, data := f.do("POST", "/v1/runs/batch", batch, key...)
	if status != http.StatusCreated || header.Get(api.HeaderIdempotentReplayed) != "" {
		t.Fatalf("first call: %d, replayed %q: %s; want 201, not a replay", status, header.Get(api.HeaderIdempotentReplayed), data)
	}
	if err := json.Unmarshal(data, &first); err != nil {
		t.Fatal(err)
	}
	pins := f.res.refs["reg/train:1"]
	status, header, data = f.do("POST", "/v1/runs/batch", batch, key...)
	if status != http.StatusCreated || header.Get(api.HeaderIdempotentReplayed) != "true" {
		t.Fatalf("the retry: %d, replayed %q: %s; want 201 marked as a replay", status, header.Get(api.HeaderIdempotentReplayed), data)
	}
	if err := json.Unmarshal(data, &again); err != nil {
		t.Fatal(err)
	}
	for i := range first.Runs {
		if again.Runs[i].ID != first.Runs[i].ID {
			t.Errorf("the retry's runs[%d] is %s, want the first call's %s", i, again.Runs[i].ID, first.Runs[i].ID)
		}
	}
	if f.res.refs["reg/train:1"] != pins {
		t.Error("the retry asked the registry to pin its image again")
	}
	if n := len(f.listRuns()); n != 3 {
		t.Fatalf("%d runs stored after a batch of 3 and its retry, want 3", n)
	}

	// The same key for another body, and on the single route: refused.
	other := api.RunBatch{Runs: []api.RunSpec{specAt(0, "reg/train:1"), specAt(1, "reg/train:1"), specAt(9, "reg/eval:2")}}
	wantConflict(t, f, "/v1/runs/batch", other, key, "was used for another request")
	wantConflict(t, f, "/v1/runs", specAt(0, "reg/train:1"), key, "was used for another request")

	// Another key, and no key, create anew.
	f.want(http.StatusCreated, nil, "POST", "/v1/runs/batch", batch, api.HeaderIdempotencyKey, "sweep-8")
	f.want(http.StatusCreated, nil, "POST", "/v1/runs/batch", batch)
	if n := len(f.listRuns()); n != 9 {
		t.Fatalf("%d runs stored, want 9", n)
	}
}

// TestKeyedSubmissionRace: copies of one keyed submission sent at once
// create its run once, and every copy is answered with that run.
func TestKeyedSubmissionRace(t *testing.T) {
	f := newRunsFixture(t)
	const copies = 8
	ids := make([]string, copies)
	var wg sync.WaitGroup
	for i := range copies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var run api.Run
			f.want(http.StatusCreated, &run, "POST", "/v1/runs", specAt(0, "reg/solo:1"), api.HeaderIdempotencyKey, "once")
			ids[i] = run.ID
		}()
	}
	wg.Wait()
	for i, id := range ids {
		if id != ids[0] {
			t.Errorf("copy %d answered with run %s, copy 0 with %s; want one run", i, id, ids[0])
		}
	}
	if n := len(f.listRuns()); n != 1 {
		t.Fatalf("%d runs stored from %d copies of one keyed submission, want 1", n, copies)
	}
}

// TestIdempotencyKeyChecked: a key too long or with characters outside the
// allowed set is refused, naming the header, and creates nothing.
func TestIdempotencyKeyChecked(t *testing.T) {
	f := newRunsFixture(t)
	for key, says := range map[string]string{
		strings.Repeat("k", api.MaxIdempotencyKey+1): "at most 128",
		"two words":   "letters, digits",
		"é-accent":    "letters, digits",
		"semi;colon":  "letters, digits",
		"slash/ed":    "letters, digits",
		"quote\"mark": "letters, digits",
	} {
		status, _, data := f.do("POST", "/v1/runs", specAt(0, "reg/solo:1"), api.HeaderIdempotencyKey, key)
		var e api.Error
		if err := json.Unmarshal(data, &e); err != nil || status != http.StatusBadRequest || e.Error.Field != api.HeaderIdempotencyKey || !strings.Contains(e.Error.Message, says) {
			t.Errorf("key %q: %d %s; want 400 naming %s and saying %q", key, status, data, api.HeaderIdempotencyKey, says)
		}
	}
	if n := len(f.listRuns()); n != 0 {
		t.Fatalf("refused keys left %d runs, want none", n)
	}
}

// wantConflict posts body to path with header and wants a 409 saying says.
func wantConflict(t *testing.T, f *runsFixture, path string, body any, header []string, says string) {
	t.Helper()
	status, _, data := f.do("POST", path, body, header...)
	var e api.Error
	if err := json.Unmarshal(data, &e); err != nil || status != http.StatusConflict || e.Error.Code != "conflict" || !strings.Contains(e.Error.Message, says) {
		t.Errorf("POST %s: %d %s; want 409 conflict saying %q", path, status, data, says)
	}
}

// TestKeyedSubmissionKeepsItsSecrets: a keyed submission's runs carry
// their secrets sealed under the IDs they are stored with, single and
// batch, so the launch can open them. (Sealed under a new ID and then
// renamed to the key's, they could not be opened, and the launch went out
// without them: found end to end, where the CLI keys every submission.)
func TestKeyedSubmissionKeepsItsSecrets(t *testing.T) {
	const secret = "keyed-s3cret-41c7"
	key := make([]byte, RegistryKeySize)
	rand.Read(key)
	f := newRunsFixtureWith(t, Config{Lease: time.Minute, RegistryKey: key})
	spec := specAt(0, "reg/app:1")
	spec.Secrets = map[string]string{"TOKEN": secret}

	var one api.Run
	f.want(http.StatusCreated, &one, "POST", "/v1/runs", spec, api.HeaderIdempotencyKey, "one-secret")
	var batch api.RunList
	f.want(http.StatusCreated, &batch, "POST", "/v1/runs/batch", api.RunBatch{Runs: []api.RunSpec{spec, spec}}, api.HeaderIdempotencyKey, "two-secrets")
	ids := []string{one.ID}
	for _, r := range batch.Runs {
		ids = append(ids, r.ID)
	}
	for _, id := range ids {
		var stored store.Run
		if err := f.st.View(context.Background(), func(tx store.Tx) error { var err error; stored, err = tx.GetRun(id); return err }); err != nil {
			t.Fatal(err)
		}
		got, err := runsecrets.Open(serverKey{f.srv}, stored, []string{"TOKEN"})
		if err != nil || got["TOKEN"] != secret {
			t.Errorf("run %s: its secret opens as %d bytes, err %v; want the submitted value", id, len(got["TOKEN"]), err)
		}
	}
}
