package controlplane

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/internal/logbuffer"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// setCapability makes node id's facts say its agent speaks version v.
func (f *runsFixture) setCapability(id string, v int) {
	f.t.Helper()
	err := f.srv.update(context.Background(), func(tx store.Tx) error {
		n, err := tx.GetNode(id)
		if err != nil {
			return err
		}
		n.Facts.CapabilityVersion = v
		return tx.PutNode(n)
	})
	if err != nil {
		f.t.Fatal(err)
	}
}

// pendingLaunch is the one stored launch operation for node, as stored.
func (f *runsFixture) pendingLaunch(node string) nodeproto.Command {
	f.t.Helper()
	var ops []store.Operation
	err := f.st.View(context.Background(), func(tx store.Tx) error {
		var err error
		ops, err = tx.PendingOperations(node)
		return err
	})
	if err != nil || len(ops) != 1 || ops[0].Command.LaunchWorkload == nil {
		f.t.Fatalf("pending operations of %s: %+v, %v; want one launch", node, ops, err)
	}
	return ops[0].Command
}

// TestRunSecretsSealedAndSentOnlyInTheLaunch: a run's secret is sealed as
// it is submitted; no read shows it (each name shows redacted); the store
// holds it only sealed; a launch with secrets waits for an agent of
// capability version 5; the stored launch names the secret and the one
// sent carries its value; a sealed value copied to another run does not
// open, and that launch goes out without it; and the server's log never
// holds it.
func TestRunSecretsSealedAndSentOnlyInTheLaunch(t *testing.T) {
	const secret = "s3cret-run-value-9f2c"
	key := make([]byte, RegistryKeySize)
	rand.Read(key)
	logs := &logbuffer.Buffer{}
	f := newRunsFixtureWith(t, Config{Lease: time.Minute, RegistryKey: key, Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	f.addNodes(1)
	ctx := context.Background()
	noSecret := func(what string, b []byte) {
		t.Helper()
		if bytes.Contains(b, []byte(secret)) {
			t.Errorf("%s holds the secret: %s", what, b)
		}
	}

	spec := specAt(0, "reg/app:1")
	spec.Secrets = map[string]string{"TOKEN": secret}
	status, _, body := f.do("POST", "/v1/runs", spec)
	var run api.Run
	if status != http.StatusCreated || json.Unmarshal(body, &run) != nil {
		t.Fatalf("submit = %d %s", status, body)
	}
	noSecret("the submission's answer", body)
	if run.Secrets["TOKEN"] != api.SecretRedacted || len(run.Secrets) != 1 {
		t.Errorf("submitted run shows secrets %v, want TOKEN redacted", run.Secrets)
	}
	for _, path := range []string{"/v1/runs/" + run.ID, "/v1/runs"} {
		status, _, body := f.do("GET", path, nil)
		noSecret("GET "+path, body)
		var read struct {
			api.Run
			Runs []api.Run `json:"runs"`
		}
		if err := json.Unmarshal(body, &read); err != nil || status != http.StatusOK {
			t.Fatalf("GET %s = %d %s", path, status, body)
		}
		if len(read.Runs) == 1 {
			read.Run = read.Runs[0]
		}
		if read.Secrets["TOKEN"] != api.SecretRedacted || len(read.Secrets) != 1 {
			t.Errorf("GET %s shows secrets %v, want the name TOKEN, redacted", path, read.Secrets)
		}
	}
	var stored store.Run
	if err := f.st.View(ctx, func(tx store.Tx) error { var err error; stored, err = tx.GetRun(run.ID); return err }); err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(stored)
	noSecret("the stored run", raw)
	if len(stored.SealedSecrets["TOKEN"]) == 0 {
		t.Fatalf("stored run has no sealed TOKEN: %s", raw)
	}

	// An agent too old to carry secrets is never sent the launch.
	f.setCapability("n0", nodeproto.VersionCallLogs)
	if err := f.srv.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	f.want(http.StatusOK, &run, "GET", "/v1/runs/"+run.ID, nil)
	if run.Status != api.RunQueued || !strings.Contains(run.Reason, "need capability version 5 or later") {
		t.Errorf("on a version-4 agent the run is %s (%q), want queued waiting for version 5", run.Status, run.Reason)
	}
	f.setCapability("n0", nodeproto.VersionHardening)
	if err := f.srv.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	launch := f.pendingLaunch("n0")
	raw, _ = json.Marshal(launch)
	noSecret("the stored launch", raw)
	if l := launch.LaunchWorkload; len(l.SecretNames) != 1 || l.SecretNames[0] != "TOKEN" || l.Secrets != nil {
		t.Errorf("stored launch names %v with values %v, want TOKEN and no value", l.SecretNames, l.Secrets)
	}
	sent := f.srv.outbound(ctx, "", launch)
	if sent.LaunchWorkload.Secrets["TOKEN"] != secret || sent.LaunchWorkload.Env["MERCATOR_RUN_INDEX"] != "0" {
		t.Errorf("sent launch: secrets %d, env %v; want TOKEN's value beside the env", len(sent.LaunchWorkload.Secrets), sent.LaunchWorkload.Env)
	}
	if launch.LaunchWorkload.Secrets != nil {
		t.Error("outbound wrote the secret into the stored launch")
	}

	// A sealed value copied into another run's record does not open.
	other := stored
	other.ID, other.Attempts = "r-other", []api.Attempt{}
	if err := f.st.Update(ctx, func(tx store.Tx) error { return tx.CreateRun(other) }); err != nil {
		t.Fatal(err)
	}
	moved := nodeproto.LaunchWorkloadCommand{WorkloadKey: nodeproto.WorkloadKey{RunID: "r-other", Attempt: 1}, SecretNames: []string{"TOKEN"}}
	out := f.srv.outbound(ctx, "", nodeproto.Command{Kind: nodeproto.KindLaunchWorkload, LaunchWorkload: &moved})
	if out.LaunchWorkload.Secrets != nil || len(out.LaunchWorkload.MissingSecrets()) != 1 {
		t.Errorf("a moved sealed secret opened: %d values", len(out.LaunchWorkload.Secrets))
	}
	if log := logs.String(); !strings.Contains(log, "secret TOKEN of run r-other cannot be opened") {
		t.Errorf("the log does not say which secret did not open:\n%s", log)
	}
	noSecret("the server's log", []byte(logs.String()))
}

// TestRunSecretsRefused: a secret named also in env, and a batch spec
// with one, are refused naming the secret; a server with no key refuses a
// run with secrets (it cannot seal them) and accepts one without.
func TestRunSecretsRefused(t *testing.T) {
	key := make([]byte, RegistryKeySize)
	f := newRunsFixtureWith(t, Config{Lease: time.Minute, RegistryKey: key})
	spec := specAt(0, "reg/app:1")
	spec.Secrets = map[string]string{"MERCATOR_RUN_INDEX": "x"}
	f.refused(api.RunBatch{Runs: []api.RunSpec{specAt(1, "reg/app:1"), spec}}, "runs[1].secrets.MERCATOR_RUN_INDEX", "also set in env")

	// Each run of a batch seals its own copy, bound to its own ID.
	spec.Secrets = map[string]string{"TOKEN": "v"}
	two := api.RunBatch{Runs: []api.RunSpec{spec, spec}}
	var got api.RunList
	f.want(http.StatusCreated, &got, "POST", "/v1/runs/batch", two)
	var sealed [][]byte
	for _, r := range got.Runs {
		if err := f.st.View(context.Background(), func(tx store.Tx) error {
			s, err := tx.GetRun(r.ID)
			sealed = append(sealed, s.SealedSecrets["TOKEN"])
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	if len(sealed) != 2 || len(sealed[0]) == 0 || bytes.Equal(sealed[0], sealed[1]) {
		t.Errorf("sealed copies of a batch: %x", sealed)
	}

	keyless := newRunsFixture(t)
	if status, _, body := keyless.do("POST", "/v1/runs", spec); status != http.StatusServiceUnavailable || !strings.Contains(string(body), "no key to seal secrets with") {
		t.Errorf("a run with secrets on a server with no key = %d %s, want 503 saying why", status, body)
	}
	spec.Secrets = nil
	keyless.want(http.StatusCreated, nil, "POST", "/v1/runs", spec)
}
