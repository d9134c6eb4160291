package hostfacts

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mercator/mercator/nodeproto"
)

func readFixture(t testing.TB, name string) []byte {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", "testdata", "gpu"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseHealthQueryFixtures(t *testing.T) {
	for _, tc := range []struct {
		fixture  string
		readings int
		lost     string
		check    func(t *testing.T, rs []GPUReading)
	}{
		{fixture: "health/h100-x8-healthy.csv", readings: 8, check: func(t *testing.T, rs []GPUReading) {
			for _, r := range rs {
				if r.ECCUncorrected != 0 || r.RetirementPend || r.Throttled || r.PowerWatts <= 0 || r.UtilizationPct < 0 {
					t.Errorf("healthy reading %+v", r)
				}
			}
		}},
		{fixture: "health/h100-x8-lost.csv", readings: 7, lost: "00000000:3A:00.0"},
		{fixture: "health/h100-x8-missing.csv", readings: 7},
		{fixture: "health/lost-message.txt", readings: 0, lost: "00000000:3A:00.0"},
		{fixture: "health/h100-x8-ecc.csv", readings: 8, check: func(t *testing.T, rs []GPUReading) {
			if rs[1].ECCUncorrected != 2 {
				t.Errorf("GPU 1 ECC = %d, want 2", rs[1].ECCUncorrected)
			}
		}},
		{fixture: "health/h100-x8-throttle.csv", readings: 8, check: func(t *testing.T, rs []GPUReading) {
			if !rs[4].Throttled || strings.Join(rs[4].ThrottleReasons, ",") != "hw_slowdown,hw_thermal_slowdown" {
				t.Errorf("GPU 4 = %+v, want throttled by hw_slowdown and hw_thermal_slowdown", rs[4])
			}
		}},
		{fixture: "health/a100-x4-retirement.csv", readings: 4, check: func(t *testing.T, rs []GPUReading) {
			if !rs[3].RetirementPend || rs[0].RetirementPend {
				t.Errorf("retirement pending = %v %v, want only GPU 3", rs[0].RetirementPend, rs[3].RetirementPend)
			}
		}},
	} {
		t.Run(tc.fixture, func(t *testing.T) {
			rs, lost, err := parseHealthQuery(readFixture(t, tc.fixture))
			if err != nil {
				t.Fatal(err)
			}
			if len(rs) != tc.readings {
				t.Fatalf("%d readings, want %d", len(rs), tc.readings)
			}
			if tc.lost != "" && (len(lost) != 1 || lost[0].PCIBusID != tc.lost || !strings.Contains(lost[0].Message, "GPU is lost")) {
				t.Fatalf("lost = %+v, want %s with the tool's message", lost, tc.lost)
			}
			if tc.check != nil {
				tc.check(t, rs)
			}
		})
	}
}

func TestParseHealthQueryRefusesGarbage(t *testing.T) {
	for _, bad := range []string{
		"GPU-1c291010-2f97-ba70-bddc-db08fb3b76c9, 00000000:18:00.0, 63\n",
		"not-a-uuid, 00000000:18:00.0, 63, 1, 1, 0, No, Not Active, Not Active, Not Active\n",
	} {
		if _, _, err := parseHealthQuery([]byte(bad)); err == nil {
			t.Errorf("%q was accepted", bad)
		}
	}
}

func TestParseDetailXML(t *testing.T) {
	states, err := parseDetailXML(readFixture(t, "health/h100-x8-remap.xml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(states) != 8 {
		t.Fatalf("%d GPUs, want 8", len(states))
	}
	pending := states["GPU-aa0e7de6-592b-d8bb-cf60-c684d2c47ce4"]
	failed := states["GPU-a826e5d1-a4c6-7133-3005-b30af147905f"]
	healthy := states["GPU-1c291010-2f97-ba70-bddc-db08fb3b76c9"]
	if !pending.pending || pending.failed || !failed.failed || healthy.pending || healthy.failed {
		t.Fatalf("pending %+v, failed %+v, healthy %+v", pending, failed, healthy)
	}
	if _, err := parseDetailXML([]byte("No devices were found")); err == nil {
		t.Fatal("a non-XML answer was accepted")
	}
}

func TestParseXidsAndClassify(t *testing.T) {
	xids := parseXids(readFixture(t, "health/kmsg-xids.txt"))
	var got []string
	for _, x := range xids {
		got = append(got, x.PCIBusID+"="+ClassifyXid(x.Xid))
	}
	want := "00000000:2A:00.0=application 00000000:2A:00.0=application 00000000:5D:00.0=application 00000000:AB:00.0=fatal 00000000:AB:00.0=fatal 00000000:9A:00.0=other 00000000:BA:00.0=application"
	if strings.Join(got, " ") != want {
		t.Fatalf("Xids read as\n%s\nwant\n%s", strings.Join(got, " "), want)
	}
	dmesg := parseXids(readFixture(t, "health/dmesg-xid79.txt"))
	if len(dmesg) != 1 || dmesg[0].Xid != 79 || dmesg[0].PCIBusID != "00000000:3A:00.0" {
		t.Fatalf("dmesg Xids = %+v", dmesg)
	}
	for xid, class := range map[int]string{48: XidFatal, 63: XidFatal, 64: XidFatal, 74: XidFatal, 79: XidFatal, 94: XidFatal, 95: XidFatal,
		119: XidFatal, 120: XidFatal, 13: XidApplication, 31: XidApplication, 43: XidApplication, 109: XidOther, 999: XidOther} {
		if got := ClassifyXid(xid); got != class {
			t.Errorf("Xid %d is %s, want %s", xid, got, class)
		}
	}
}

// standIn is a stand-in machine for the sampler: a copy of the fake tool in
// a directory of its own, whose answers a test switches by writing files.
type standIn struct {
	t        testing.TB
	dir, log string
}

func newStandIn(t testing.TB, machine string) *standIn {
	t.Helper()
	dir := t.TempDir()
	m := &standIn{t: t, dir: dir, log: filepath.Join(dir, "kmsg")}
	m.write("nvidia-smi", readFixture(t, "fake-nvidia-smi"), 0o755)
	for _, f := range []string{"query.csv", "header.txt", "health.csv", "query.xml"} {
		if b, err := os.ReadFile(filepath.Join("..", "testdata", "gpu", machine, f)); err == nil {
			m.write(f, b, 0o644)
		}
	}
	m.write("kmsg", nil, 0o644)
	return m
}

func (m *standIn) write(name string, b []byte, mode os.FileMode) {
	m.t.Helper()
	if err := os.WriteFile(filepath.Join(m.dir, name), b, mode); err != nil {
		m.t.Fatal(err)
	}
}

func (m *standIn) appendLog(b []byte) {
	m.t.Helper()
	f, err := os.OpenFile(m.log, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		m.t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(b); err != nil {
		m.t.Fatal(err)
	}
}

// enrolled returns a sampler on the stand-in with its GPUs enrolled from
// the facts query, and a clock the test moves.
func (m *standIn) enrolled(machine string) (*GPUSampler, *time.Time) {
	m.t.Helper()
	clock := time.Date(2026, 12, 1, 20, 0, 0, 0, time.UTC)
	s := NewGPUSampler(filepath.Join(m.dir, "nvidia-smi"), m.log, time.Minute, func() time.Time { return clock })
	gpus, err := parseNVIDIAQuery(readFixture(m.t, filepath.Join(machine, "query.csv")))
	if err != nil {
		m.t.Fatal(err)
	}
	s.Enroll(gpus)
	return s, &clock
}

func sampleOnce(t testing.TB, s *GPUSampler) []nodeproto.GPUHealth {
	t.Helper()
	if err := s.Sample(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s.Health()
}

// sick lists "index=reason" for each sick GPU.
func sick(hs []nodeproto.GPUHealth) string {
	var out []string
	for i, h := range hs {
		if h.State != nodeproto.GPUHealthy {
			out = append(out, string(rune('0'+i))+"="+h.Reason)
		}
	}
	return strings.Join(out, " ")
}

// TestSamplerSignals: each signal, in the tool's and the kernel's own
// formats, quarantines exactly the card it names with its own reason.
func TestSamplerSignals(t *testing.T) {
	const h100 = "h100-80gb-hbm3-x8"
	for _, tc := range []struct {
		name    string
		machine string
		health  string
		exit    string
		xml     string
		log     string
		want    string
	}{
		{name: "healthy", machine: h100, want: ""},
		{name: "lost, with the tool's message and exit status 15", machine: h100, health: "health/h100-x8-lost.csv", exit: "15", want: "2=gpu_lost"},
		{name: "missing against enrollment", machine: h100, health: "health/h100-x8-missing.csv", want: "5=gpu_missing"},
		{name: "uncorrectable ECC", machine: h100, health: "health/h100-x8-ecc.csv", want: "1=ecc_uncorrectable"},
		{name: "pending page retirement", machine: "a100-40gb-x4", health: "health/a100-x4-retirement.csv", want: "3=retirement_pending"},
		{name: "row remap pending and failed", machine: h100, xml: "health/h100-x8-remap.xml", want: "6=remap_pending 7=remap_failed"},
		{name: "fatal Xids quarantine, application Xids do not", machine: h100, log: "health/kmsg-xids.txt", want: "5=xid_fatal"},
		{name: "Xid 79 is a lost GPU", machine: h100, log: "health/dmesg-xid79.txt", want: "2=gpu_lost"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newStandIn(t, tc.machine)
			s, _ := m.enrolled(tc.machine)
			if got := sick(sampleOnce(t, s)); got != "" {
				t.Fatalf("before the fault: sick %q", got)
			}
			if tc.health != "" {
				m.write("health.csv", readFixture(t, tc.health), 0o644)
			}
			if tc.exit != "" {
				m.write("exit-code", []byte(tc.exit), 0o644)
			}
			if tc.xml != "" {
				m.write("query.xml", readFixture(t, tc.xml), 0o644)
			}
			if tc.log != "" {
				m.appendLog(readFixture(t, tc.log))
			}
			var hs []nodeproto.GPUHealth
			for range detailEvery { // the full report is read once in detailEvery samples
				hs = sampleOnce(t, s)
			}
			if got := sick(hs); got != tc.want {
				t.Fatalf("sick %q, want %q (notes %q)", got, tc.want, s.Notes())
			}
			for _, h := range hs {
				if h.State == nodeproto.GPUSick && h.Detail == "" {
					t.Errorf("%s is sick with no detail", h.UUID)
				}
			}
		})
	}
}

// TestSamplerApplicationXidsRecorded: an application Xid is kept with the
// card's health (for the attempt that held it), and the card stays healthy.
func TestSamplerApplicationXidsRecorded(t *testing.T) {
	m := newStandIn(t, "h100-80gb-hbm3-x8")
	s, _ := m.enrolled("h100-80gb-hbm3-x8")
	m.appendLog(readFixture(t, "health/kmsg-xids.txt"))
	hs := sampleOnce(t, s)
	if hs[1].State != nodeproto.GPUHealthy || len(hs[1].XIDs) != 2 || hs[1].XIDs[0].Xid != 13 || hs[1].XIDs[0].Class != XidApplication {
		t.Fatalf("GPU 1 = %+v, want healthy with two Xid 13", hs[1])
	}
	if hs[4].State != nodeproto.GPUHealthy || len(hs[4].XIDs) != 1 || hs[4].XIDs[0].Class != XidOther {
		t.Fatalf("GPU 4 = %+v, want healthy with Xid 109 recorded as other", hs[4])
	}
}

// TestSamplerThrottleSustained: throttling is a sickness only once it has
// held for the sustain period, and its Since is when it began.
func TestSamplerThrottleSustained(t *testing.T) {
	m := newStandIn(t, "h100-80gb-hbm3-x8")
	s, clock := m.enrolled("h100-80gb-hbm3-x8")
	m.write("health.csv", readFixture(t, "health/h100-x8-throttle.csv"), 0o644)
	if got := sick(sampleOnce(t, s)); got != "" {
		t.Fatalf("throttled a moment: sick %q", got)
	}
	*clock = clock.Add(59 * time.Second)
	if got := sick(sampleOnce(t, s)); got != "" {
		t.Fatalf("throttled 59 s of a 1 min sustain: sick %q", got)
	}
	*clock = clock.Add(time.Second)
	hs := sampleOnce(t, s)
	if got := sick(hs); got != "4=throttled" {
		t.Fatalf("throttled for the sustain period: sick %q", got)
	}
	first := hs[4].Since
	*clock = clock.Add(time.Minute)
	if again := sampleOnce(t, s); !again[4].Since.Equal(first) {
		t.Fatalf("the same sickness moved its Since from %s to %s", first, again[4].Since)
	}
}

// TestSamplerMissingLogIsANote: a kernel log that cannot be read is said,
// and the tool's signals still count.
func TestSamplerMissingLogIsANote(t *testing.T) {
	m := newStandIn(t, "h100-80gb-hbm3-x8")
	m.log = filepath.Join(m.dir, "absent")
	s, _ := m.enrolled("h100-80gb-hbm3-x8")
	m.write("health.csv", readFixture(t, "health/h100-x8-ecc.csv"), 0o644)
	if got := sick(sampleOnce(t, s)); got != "1=ecc_uncorrectable" {
		t.Fatalf("sick %q", got)
	}
	if notes := s.Notes(); len(notes) != 1 || !strings.Contains(notes[0], "cannot be read") {
		t.Fatalf("notes %q", notes)
	}
}

// TestEnrollKeepsVanishedGPUs: the inventory is every GPU listed since the
// agent started, so a card the tool stops listing stays (as sick).
func TestEnrollKeepsVanishedGPUs(t *testing.T) {
	s := NewGPUSampler("", "", 0, nil)
	gpus, err := parseNVIDIAQuery(readFixture(t, "h100-80gb-hbm3-x8/query.csv"))
	if err != nil {
		t.Fatal(err)
	}
	s.Enroll(gpus)
	if inv := s.Enroll(gpus[:3]); len(inv) != 8 {
		t.Fatalf("inventory shrank to %d", len(inv))
	}
}

// BenchmarkGPUSample is the sampler's cost on the agent per sample period
// at eight GPUs (one CSV query, a kernel log read; the full report one
// sample in six), beside the same number of bare process starts of the
// fake tool's shell as the baseline: the tool's own cost is nvidia-smi's,
// so what is Mercator's is the difference. It reports CPU seconds per
// sample (this process and its children).
func BenchmarkGPUSample(b *testing.B) {
	m := newStandIn(b, "h100-80gb-hbm3-x8")
	s, _ := m.enrolled("h100-80gb-hbm3-x8")
	b.Run("baseline-exec", func(b *testing.B) {
		cpu := cpuTime(b)
		for range b.N {
			if _, err := runTool(context.Background(), "/bin/sh", "-c", "cat "+filepath.Join(m.dir, "health.csv")); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(cpuTime(b)-cpu)/float64(b.N)/1e6, "cpu-ms/op")
	})
	b.Run("sample-8gpu", func(b *testing.B) {
		cpu := cpuTime(b)
		for range b.N {
			if err := s.Sample(context.Background()); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(cpuTime(b)-cpu)/float64(b.N)/1e6, "cpu-ms/op")
	})
	b.Run("parse-and-judge-8gpu", func(b *testing.B) {
		out := readFixture(b, "health/h100-x8-healthy.csv")
		for range b.N {
			in := sample{}
			in.readings, in.lost, _ = parseHealthQuery(out)
			s.mu.Lock()
			s.observe(in, time.Now())
			s.mu.Unlock()
		}
	})
}

// cpuTime is the CPU this process and its waited-for children have used,
// in nanoseconds.
func cpuTime(tb testing.TB) int64 {
	tb.Helper()
	var total int64
	for _, who := range []int{syscall.RUSAGE_SELF, syscall.RUSAGE_CHILDREN} {
		var ru syscall.Rusage
		if err := syscall.Getrusage(who, &ru); err != nil {
			tb.Fatal(err)
		}
		total += ru.Utime.Nano() + ru.Stime.Nano()
	}
	return total
}

// TestSamplerMissingOnceIsNotMissing: a card the tool skips in one answer
// is not missing yet (a driver hiccup would quarantine it for good); in two
// answers in a row it is, and back in the list before that it never was.
func TestSamplerMissingOnceIsNotMissing(t *testing.T) {
	m := newStandIn(t, "h100-80gb-hbm3-x8")
	s, _ := m.enrolled("h100-80gb-hbm3-x8")
	m.write("health.csv", readFixture(t, "health/h100-x8-missing.csv"), 0o644)
	if got := sick(sampleOnce(t, s)); got != "" {
		t.Fatalf("skipped once: sick %q", got)
	}
	m.write("health.csv", readFixture(t, "health/h100-x8-healthy.csv"), 0o644)
	sampleOnce(t, s)
	m.write("health.csv", readFixture(t, "health/h100-x8-missing.csv"), 0o644)
	if got := sick(sampleOnce(t, s)); got != "" {
		t.Fatalf("skipped once more, not in a row: sick %q", got)
	}
	if got := sick(sampleOnce(t, s)); got != "5=gpu_missing" {
		t.Fatalf("skipped twice in a row: sick %q", got)
	}
}
