package decoder

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/nodeproto"
)

// samples are the hot paths' values, as their JSON: an events body with
// facts, workload observations and results (a heartbeat carries the
// first), a command off the session stream, and a run as a store and the
// API hold it.
func samples() map[string][]byte {
	now := time.Date(2026, 12, 1, 23, 0, 0, 123456789, time.UTC)
	exit := 3
	facts := nodeproto.NodeFacts{Hostname: "gpu-17", OS: "linux", Arch: "amd64", CPUs: 96, MemoryBytes: 1 << 40,
		DiskFreeBytes: 1 << 42, RuntimeName: "docker", RuntimeVersion: "26.1.5", RuntimeAPIVersion: "1.45",
		AgentVersion: "v0.9.0", CapabilityVersion: nodeproto.Version,
		Images: []string{"sha256:" + fmt.Sprintf("%064d", 1), "sha256:" + fmt.Sprintf("%064d", 2)}}
	for i := range 8 {
		facts.Accelerators = append(facts.Accelerators, nodeproto.Accelerator{Vendor: "nvidia", Model: "H100", UUID: fmt.Sprintf("GPU-%d", i), MemoryBytes: 80 << 30})
	}
	batch := nodeproto.EventBatch{Through: "inc-40", Events: []nodeproto.Event{{ID: "inc-41", Kind: nodeproto.EventFacts, At: now, Facts: &facts}}}
	for i := range 3 {
		batch.Events = append(batch.Events,
			nodeproto.Event{ID: fmt.Sprintf("inc-%d", 50+i), Kind: nodeproto.EventWorkload, At: now, Workload: &nodeproto.WorkloadObservation{
				ContainerID: fmt.Sprintf("%064x", i), Image: "127.0.0.1:5000/x@sha256:" + fmt.Sprintf("%064d", 1), Phase: "exited",
				ExitCode: &exit, StartedAt: &now, FinishedAt: &now, Timeout: time.Minute}},
			nodeproto.Event{ID: fmt.Sprintf("inc-%d", 60+i), Kind: nodeproto.EventResult, At: now, Result: &nodeproto.Result{
				OperationID: fmt.Sprintf("op-%d", i), FencingToken: 7, Kind: "launch_workload", Outcome: "succeeded", At: now}})
	}
	cmd := nodeproto.Command{OperationID: "op-1", FencingToken: 9, Kind: "launch_workload", CreatedAt: now,
		LaunchWorkload: &nodeproto.LaunchWorkloadCommand{Image: "127.0.0.1:5000/x@sha256:" + fmt.Sprintf("%064d", 1),
			Command: []string{"python", "train.py"}, Env: map[string]string{"A": "1", "RANK": "0"}, GPUs: []string{"GPU-1", "GPU-2"}}}
	run := api.Run{ID: "r-0123456789abcdef", RunSpec: api.RunSpec{Image: "127.0.0.1:5000/train:v1",
		Command: []string{"python", "train.py"}, Env: map[string]string{"A": "1"}, CPU: 4, MemoryBytes: 8 << 30, GPUs: 8,
		GPUModel: "H100", Retries: 2, Project: "vision", Constraints: map[string]string{"pool": "secure"}},
		PinnedImage: "127.0.0.1:5000/train@sha256:" + fmt.Sprintf("%064d", 1), Status: "failed", ExitCode: &exit,
		CreatedAt: now, UpdatedAt: now, FinishedAt: &now}
	for i := range 2 {
		run.Attempts = append(run.Attempts, api.Attempt{Number: i + 1, NodeID: "n-1", GPUs: []string{"GPU-1"}, Status: "exited",
			ContainerID: fmt.Sprintf("%064x", i), ExitCode: &exit, PlacedAt: now, StartedAt: &now, FinishedAt: &now})
	}
	out := map[string][]byte{}
	for name, v := range map[string]any{"events": batch, "command": cmd, "run": run} {
		data, err := json.Marshal(v)
		if err != nil {
			panic(err)
		}
		out[name] = data
	}
	return out
}

// targets make a fresh value of each sample's type.
var targets = map[string]func() any{
	"events":  func() any { return new(nodeproto.EventBatch) },
	"command": func() any { return new(nodeproto.Command) },
	"run":     func() any { return new(api.Run) },
}

// agree checks Unmarshal and Strict against encoding/json on data decoded
// into fresh values of one type: the same success or failure, the same
// value on success, and encoding/json's error on failure.
func agree(t *testing.T, data []byte, fresh func() any) {
	t.Helper()
	want, got := fresh(), fresh()
	wantErr := json.Unmarshal(data, want)
	gotErr := Unmarshal(data, got)
	check(t, "Unmarshal", data, want, got, wantErr, gotErr)

	want, got = fresh(), fresh()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	wantErr = dec.Decode(want)
	if wantErr == nil && dec.More() {
		wantErr = ErrTrailing
	}
	gotErr = Strict(data, got)
	check(t, "Strict", data, want, got, wantErr, gotErr)
}

func check(t *testing.T, what string, data []byte, want, got any, wantErr, gotErr error) {
	t.Helper()
	switch {
	case (wantErr == nil) != (gotErr == nil):
		t.Fatalf("%s(%q): error %v, encoding/json's %v", what, data, gotErr, wantErr)
	case wantErr != nil && wantErr.Error() != gotErr.Error() && !errors.Is(gotErr, ErrTrailing):
		t.Fatalf("%s(%q): error %q, encoding/json's %q", what, data, gotErr, wantErr)
	case wantErr == nil && !reflect.DeepEqual(want, got):
		t.Fatalf("%s(%q): decoded %+v, encoding/json %+v", what, data, got, want)
	}
}

func TestAgreesWithStdOnSamples(t *testing.T) {
	for name, data := range samples() {
		t.Run(name, func(t *testing.T) {
			agree(t, data, targets[name])
			// Each way such a body goes wrong: cut short, a wrong type, an
			// unknown field, trailing data, invalid UTF-8 in a string.
			agree(t, data[:len(data)/2], targets[name])
			agree(t, append([]byte(`{"kind":7,`), data[1:]...), targets[name])
			agree(t, append([]byte(`{"unknown_field":1,`), data[1:]...), targets[name])
			agree(t, append(append([]byte{}, data...), " {}"...), targets[name])
			agree(t, append([]byte("{\"id\":\"\xff\",\"kind\":\"\xfe\","), data[1:]...), targets[name])
		})
	}
}

// FuzzAgreesWithStd is the contract: on any input, each hot type decodes
// as encoding/json decodes it.
func FuzzAgreesWithStd(f *testing.F) {
	for _, data := range samples() {
		f.Add(data)
	}
	f.Add([]byte(`{"events":[{"id":"a","kind":"facts","at":"2026-12-01T00:00:00Z","facts":{"cpus":"x"}}]}`))
	f.Add([]byte(`{"EVENTS":null,"Through":"x"}`))
	f.Add([]byte(`{"exit_code":1e400}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, name := range []string{"events", "command", "run"} {
			agree(t, data, targets[name])
		}
	})
}

// BenchmarkDecode decodes each hot sample as its path does (an events body
// with Strict, as the control plane's events route; a command and a stored
// run with Unmarshal, as the agent's session and the stores) and, in the
// same loop, with encoding/json as the path did before, and reports both
// and their ratio.
func BenchmarkDecode(b *testing.B) {
	strictStd := func(data []byte, v any) error {
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		return dec.Decode(v)
	}
	for _, path := range []struct {
		name      string
		fast, std func([]byte, any) error
	}{{"events", Strict, strictStd}, {"command", Unmarshal, json.Unmarshal}, {"run", Unmarshal, json.Unmarshal}} {
		data := samples()[path.name]
		b.Run(path.name, func(b *testing.B) {
			var fast, std time.Duration
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				start := time.Now()
				if err := path.fast(data, targets[path.name]()); err != nil {
					b.Fatal(err)
				}
				mid := time.Now()
				if err := path.std(data, targets[path.name]()); err != nil {
					b.Fatal(err)
				}
				fast, std = fast+mid.Sub(start), std+time.Since(mid)
			}
			n := float64(b.N)
			b.ReportMetric(float64(fast.Nanoseconds())/n, "ns/decode")
			b.ReportMetric(float64(std.Nanoseconds())/n, "std-ns/decode")
			b.ReportMetric(float64(fast)/float64(std), "ratio")
		})
	}
}
