package hostfacts

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/mercator/mercator/nodeproto"
)

// TestParseDiagFixtures reads each format dcgmi prints (testdata/gpu/dcgm):
// DCGM 4's and 3's JSON tell a failure (GPU 3: row remaps pending, severity
// RESET) from a warning (GPU 5: persistence mode off, severity CONFIG)
// though both say "Fail"; the text tables carry no severity, so DCGM 4's
// GPU 5 row reads as failed there (why -j is asked first).
func TestParseDiagFixtures(t *testing.T) {
	for _, tc := range []struct {
		fixture string
		want    string // "gpu=status test" for each finding that is not a pass
		passes  int
	}{
		{fixture: "dcgm4-r1-pass.json", want: "", passes: 8},
		{fixture: "dcgm4-r1-fail.json", want: "3=fail software|5=warn software", passes: 6},
		{fixture: "dcgm3-r1-fail.json", want: "3=fail Page Retirement/Row Remap|5=warn Persistence Mode", passes: 7},
		{fixture: "dcgm4-r1-fail.txt", want: "3=fail software|5=fail software", passes: 6},
		{fixture: "dcgm3-r1-fail.txt", want: "3=fail Page Retirement/Row Remap", passes: 0},
	} {
		t.Run(tc.fixture, func(t *testing.T) {
			findings, err := ParseDiag(readFixture(t, filepath.Join("dcgm", tc.fixture)))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			passes := 0
			for _, f := range findings {
				if f.Status == DiagPass {
					passes++
					continue
				}
				got = append(got, fmt.Sprintf("%d=%s %s", f.GPU, f.Status, f.Test))
				if !strings.Contains(f.Message, fmt.Sprintf("GPU %d", f.GPU)) {
					t.Errorf("finding %+v: the message is not DCGM's (cut rows not joined?)", f)
				}
			}
			slices.Sort(got)
			if strings.Join(got, "|") != tc.want || passes != tc.passes {
				t.Fatalf("findings %q with %d passes, want %q with %d", got, passes, tc.want, tc.passes)
			}
			for _, f := range findings {
				if f.GPU == 3 && f.Status != DiagPass && f.Message != "GPU 3 had memory errors and row remappings are pending" {
					t.Errorf("GPU 3's message %q, want DCGM's sentence whole (its cut rows joined)", f.Message)
				}
			}
		})
	}
}

func TestParseDiagRefuses(t *testing.T) {
	for _, tc := range []struct{ name, out, want string }{
		{"runtime error", string(readFixture(t, "dcgm/runtime-error.json")), "did not run: Error: Diagnostic could not be run while DCGM is paused"},
		{"host engine down", string(readFixture(t, "dcgm/hostengine-down.txt")), "not the table"},
		{"other JSON", `{"x": 1}`, `no "DCGM Diagnostic"`},
		{"broken JSON", `{"DCGM Diagnostic": {`, "not the JSON"},
		{"empty", "", "not the table"},
	} {
		if _, err := ParseDiag([]byte(tc.out)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want %q", tc.name, err, tc.want)
		}
	}
}

// diagStandIn adds a stand-in dcgmi (testdata/gpu/fake-dcgmi) to a stand-in
// machine, answering with a fixture and an exit status.
func (m *standIn) dcgmi(fixture string, status int) string {
	m.t.Helper()
	m.write("dcgmi", readFixture(m.t, "fake-dcgmi"), 0o755)
	m.write("diag.out", readFixture(m.t, filepath.Join("dcgm", fixture)), 0o644)
	m.write("diag.status", []byte(fmt.Sprint(status)), 0o644)
	return filepath.Join(m.dir, "dcgmi")
}

func diagnose(t *testing.T, s *GPUSampler, tool string) {
	t.Helper()
	if err := s.Sample(context.Background()); err != nil {
		t.Fatal(err)
	}
	done, err := s.Diagnose(context.Background(), tool)
	if err != nil || !done {
		t.Fatalf("Diagnose = %v, %v", done, err)
	}
}

// TestDiagnoseQuarantinesTheFailedGPU: a diagnostic that fails GPU 3 (and
// warns of GPU 5) makes GPU 3, and only it, sick with diag_failed, the
// warning a note; a later failing run is a new sickness (a later Since); a
// run that passes clears it at the next sample.
func TestDiagnoseQuarantinesTheFailedGPU(t *testing.T) {
	m := newStandIn(t, "h100-80gb-hbm3-x8")
	s, clock := m.enrolled("h100-80gb-hbm3-x8")
	// dcgmi exits with DCGM_ST_NVVS_ISOLATE_ERROR (-51) when a test failed.
	tool := m.dcgmi("dcgm4-r1-fail.json", 205)
	diagnose(t, s, tool)
	hs := s.Health()
	if got := sick(hs); got != "3="+nodeproto.GPUReasonDiag {
		t.Fatalf("sick = %q, want GPU 3 diag_failed", got)
	}
	if !strings.Contains(hs[3].Detail, "software: GPU 3 had memory errors and row remappings are pending") {
		t.Errorf("detail %q", hs[3].Detail)
	}
	notes := strings.Join(s.Notes(), "\n")
	if !strings.Contains(notes, hs[5].UUID) || !strings.Contains(notes, "Persistence mode") {
		t.Errorf("notes %q, want GPU 5's warning", notes)
	}
	if calls := string(readFile(t, filepath.Join(m.dir, "calls.log"))); strings.TrimSpace(calls) != "diag -r 1 -j" {
		t.Errorf("dcgmi called with %q, want diag -r 1 -j once", calls)
	}
	first := hs[3].Since

	*clock = clock.Add(24 * 3600e9)
	if sampleOnce(t, s)[3].Since != first {
		t.Fatal("a sample moved the diag failure's Since")
	}
	diagnose(t, s, tool)
	if again := s.Health()[3]; again.Reason != nodeproto.GPUReasonDiag || !again.Since.After(first) {
		t.Fatalf("a second failing run: %+v, want diag_failed with a later Since than %s", again, first)
	}

	m.write("diag.out", readFixture(t, "dcgm/dcgm4-r1-pass.json"), 0o644)
	m.write("diag.status", []byte("0"), 0o644)
	diagnose(t, s, tool)
	if got := sick(sampleOnce(t, s)); got != "" {
		t.Fatalf("after a passing run, sick = %q", got)
	}
}

// TestDiagnoseTextFallback: a dcgmi that refuses -j is asked again without
// it, and its table is read.
func TestDiagnoseTextFallback(t *testing.T) {
	m := newStandIn(t, "h100-80gb-hbm3-x8")
	s, _ := m.enrolled("h100-80gb-hbm3-x8")
	tool := m.dcgmi("dcgm3-r1-fail.txt", 226)
	m.write("no-json", nil, 0o644)
	diagnose(t, s, tool)
	if got := sick(s.Health()); got != "3="+nodeproto.GPUReasonDiag {
		t.Fatalf("sick = %q, want GPU 3; notes %q", got, s.Notes())
	}
	if calls := string(readFile(t, filepath.Join(m.dir, "calls.log"))); calls != "diag -r 1 -j\ndiag -r 1\n" {
		t.Errorf("calls %q, want -j refused and the table asked for", calls)
	}
}

// TestDiagnoseFailuresAreNotes: no dcgmi, a host engine that is not
// running, a diagnostic that could not run: each is a note, and no card is
// sick.
func TestDiagnoseFailuresAreNotes(t *testing.T) {
	m := newStandIn(t, "h100-80gb-hbm3-x8")
	s, _ := m.enrolled("h100-80gb-hbm3-x8")
	sampleOnce(t, s)
	path := os.Getenv("PATH")
	t.Setenv("PATH", t.TempDir())
	if done, err := s.Diagnose(context.Background(), DefaultDCGMI); !done || err != nil {
		t.Fatalf("Diagnose without dcgmi = %v, %v", done, err)
	}
	t.Setenv("PATH", path)
	if notes := strings.Join(s.Notes(), "\n"); !strings.Contains(notes, "dcgmi is not on PATH") {
		t.Errorf("notes %q", notes)
	}
	for _, tc := range []struct {
		fixture string
		status  int
		want    string
	}{
		{"hostengine-down.txt", 235, "exited with status 235: Error: unable to establish a connection"},
		{"runtime-error.json", 226, "paused"},
	} {
		diagnose(t, s, m.dcgmi(tc.fixture, tc.status))
		if got := sick(s.Health()); got != "" {
			t.Errorf("%s: sick = %q", tc.fixture, got)
		}
		if notes := strings.Join(s.Notes(), "\n"); !strings.Contains(notes, tc.want) || !strings.Contains(notes, "no GPU's health was changed") {
			t.Errorf("%s: notes %q, want %q", tc.fixture, notes, tc.want)
		}
	}
}

// TestDiagnoseWaitsForAListing: before a facts reading listed the GPUs,
// there is nothing to map DCGM's GPU IDs onto, and the tool is not run.
func TestDiagnoseWaitsForAListing(t *testing.T) {
	m := newStandIn(t, "h100-80gb-hbm3-x8")
	s := NewGPUSampler(filepath.Join(m.dir, "nvidia-smi"), m.log, 0, nil)
	if done, err := s.Diagnose(context.Background(), m.dcgmi("dcgm4-r1-fail.json", 205)); done || err != nil {
		t.Fatalf("Diagnose before any listing = %v, %v", done, err)
	}
	if _, err := os.Stat(filepath.Join(m.dir, "calls.log")); err == nil {
		t.Fatal("dcgmi ran with nothing listed")
	}
}

// TestRestoredInventoryVanishedCard: a card listed before a restart and not
// listed now is missing after two answers, as it would have been had the
// agent not restarted.
func TestRestoredInventoryVanishedCard(t *testing.T) {
	m := newStandIn(t, "h100-80gb-hbm3-x8")
	gpus, err := parseNVIDIAQuery(readFixture(t, "h100-80gb-hbm3-x8/query.csv"))
	if err != nil {
		t.Fatal(err)
	}
	gone := gpus[2]
	s := NewGPUSampler(filepath.Join(m.dir, "nvidia-smi"), m.log, 0, nil)
	s.Restore(gpus)
	inv := s.Enroll(append(gpus[:2:2], gpus[3:]...))
	if len(inv) != 8 || inv[2].UUID != gone.UUID {
		t.Fatalf("inventory %d GPUs, third %s; want all 8 with the vanished one kept", len(inv), inv[2].UUID)
	}
	m.write("health.csv", removeLine(t, readFixture(t, "health/h100-x8-healthy.csv"), gone.UUID), 0o644)
	sampleOnce(t, s)
	if got := sick(sampleOnce(t, s)); got != "2="+nodeproto.GPUReasonMissing {
		t.Fatalf("sick = %q, want the vanished card missing", got)
	}
}

func removeLine(t *testing.T, b []byte, containing string) []byte {
	t.Helper()
	var keep []string
	for _, l := range strings.SplitAfter(string(b), "\n") {
		if !strings.Contains(l, containing) {
			keep = append(keep, l)
		}
	}
	if len(keep) == len(strings.SplitAfter(string(b), "\n")) {
		t.Fatalf("no line holds %s", containing)
	}
	return []byte(strings.Join(keep, ""))
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDiagNotesBounded: a diagnostic warning of more GPUs than a note list
// should carry leaves maxDiagNotes notes and a count of the rest.
func TestDiagNotesBounded(t *testing.T) {
	s := NewGPUSampler("", "", 0, nil)
	var findings []DiagFinding
	for i := range 40 {
		findings = append(findings, DiagFinding{GPU: i, Test: "software", Status: DiagWarn, Message: "persistence mode"})
	}
	s.mu.Lock()
	s.applyDiag(findings, s.now())
	s.mu.Unlock()
	if notes := s.Notes(); len(notes) != maxDiagNotes+1 || notes[maxDiagNotes] != "gpu diag: and 24 more" {
		t.Fatalf("%d notes, last %q", len(notes), notes[len(notes)-1])
	}
}
