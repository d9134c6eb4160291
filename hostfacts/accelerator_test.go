package hostfacts

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/nodeproto"
)

// gpuFixtures is testdata/gpu at the module root: one directory per fake
// machine, each holding a nvidia-smi (the fake tool), what it prints, and
// for the healthy machines proc/driver/nvidia/version. See its README.
func gpuFixtures(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", "testdata", "gpu"))
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// fakeMachine describes one stand-in machine for a probe.
type fakeMachine struct {
	tool       string // fixture directory whose nvidia-smi is the tool; "" = none configured
	toolPath   string // an explicit tool path, overriding tool
	kernel     string // fixture directory whose proc/ is the kernel reports; "" = an empty root
	noHook     bool   // no container hook anywhere
	timeout    time.Duration
	hookIsFile bool // the hook exists but is not executable
}

func (m fakeMachine) probe(t *testing.T) acceleratorProbe {
	t.Helper()
	fixtures := gpuFixtures(t)
	probe := acceleratorProbe{kernelReports: t.TempDir(), timeout: m.timeout}
	if m.tool != "" {
		probe.tool = filepath.Join(fixtures, m.tool, "nvidia-smi")
	}
	if m.toolPath != "" {
		probe.tool = m.toolPath
	}
	if m.kernel != "" {
		probe.kernelReports = filepath.Join(fixtures, m.kernel, "proc")
	}
	hookDir := t.TempDir()
	probe.hookDirs = []string{filepath.Join(hookDir, "missing"), hookDir}
	if !m.noHook {
		mode := os.FileMode(0o755)
		if m.hookIsFile {
			mode = 0o644
		}
		if err := os.WriteFile(filepath.Join(hookDir, NVIDIAContainerHook), []byte("#!/bin/sh\ncat >/dev/null\n"), mode); err != nil {
			t.Fatal(err)
		}
	}
	return probe
}

func readQueryFixture(t *testing.T, machine string) []nodeproto.Accelerator {
	t.Helper()
	out, err := os.ReadFile(filepath.Join(gpuFixtures(t), machine, "query.csv"))
	if err != nil {
		t.Fatal(err)
	}
	gpus, err := parseNVIDIAQuery(out)
	if err != nil {
		t.Fatalf("%s: %v", machine, err)
	}
	return gpus
}

func TestAcceleratorsFromRecordedMachines(t *testing.T) {
	t.Parallel()
	cases := []struct {
		machine, model, driver, cuda string
		count                        int
		memoryMiB                    int64
		firstBus                     string
	}{
		{"a100-40gb-x4", "NVIDIA A100-SXM4-40GB", "535.104.05", "12.2", 4, 40960, "00000000:07:00.0"},
		{"h100-80gb-hbm3-x8", "NVIDIA H100 80GB HBM3", "550.54.15", "12.4", 8, 81559, "00000000:18:00.0"},
		{"l4-x1", "NVIDIA L4", "535.161.07", "12.2", 1, 23034, "00000000:00:03.0"},
		{"h200-x1", "NVIDIA H200", "560.35.03", "12.6", 1, 143771, "00000000:00:05.0"},
	}
	for _, tc := range cases {
		t.Run(tc.machine, func(t *testing.T) {
			t.Parallel()
			gpus, notes, err := fakeMachine{tool: tc.machine, kernel: tc.machine}.probe(t).read(context.Background())
			if err != nil || len(notes) != 0 {
				t.Fatalf("read = %v, notes %q; want GPUs and nothing to note", err, notes)
			}
			if len(gpus) != tc.count {
				t.Fatalf("%d GPUs, want %d: %+v", len(gpus), tc.count, gpus)
			}
			uuids := map[string]bool{}
			for _, gpu := range gpus {
				if gpu.Vendor != "nvidia" || gpu.Model != tc.model || gpu.MemoryBytes != tc.memoryMiB<<20 ||
					gpu.DriverVersion != tc.driver || gpu.CUDAVersion != tc.cuda || !uuidPattern.MatchString(gpu.UUID) || !pciBusIDPattern.MatchString(gpu.PCIBusID) {
					t.Errorf("GPU = %+v, want nvidia %s, %d MiB, driver %s, CUDA %s, a UUID and a bus ID", gpu, tc.model, tc.memoryMiB, tc.driver, tc.cuda)
				}
				uuids[gpu.UUID] = true
			}
			if len(uuids) != tc.count {
				t.Errorf("UUIDs are not distinct: %+v", gpus)
			}
			if gpus[0].PCIBusID != tc.firstBus {
				t.Errorf("first bus ID %s, want %s (the tool's order is kept)", gpus[0].PCIBusID, tc.firstBus)
			}
		})
	}
}

// TestAcceleratorFailuresAreNotedNeverGuessed stands in every way the
// reading can fail and checks each reports no GPUs and a Note that says why.
func TestAcceleratorFailuresAreNotedNeverGuessed(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		machine fakeMachine
		want    []string // substrings of the one note
	}{
		{"configured tool missing, no module",
			fakeMachine{toolPath: "/nonexistent/nvidia-smi"},
			[]string{"no NVIDIA kernel module is loaded", "driver/nvidia/version is absent", "configured tool /nonexistent/nvidia-smi does not exist"}},
		{"configured tool missing, module loaded",
			fakeMachine{toolPath: "/nonexistent/nvidia-smi", kernel: "h100-80gb-hbm3-x8"},
			[]string{"kernel module is loaded (driver 550.54.15)", "/nonexistent/nvidia-smi does not exist", "--accelerator-tool"}},
		{"configured tool is a directory",
			fakeMachine{toolPath: os.TempDir(), kernel: "h100-80gb-hbm3-x8"},
			[]string{"is not an executable file"}},
		{"tool present, driver not loaded",
			fakeMachine{tool: "h100-80gb-hbm3-x8"},
			[]string{"is installed but no NVIDIA kernel module is loaded", "modprobe nvidia"}},
		{"garbage",
			fakeMachine{tool: "garbage", kernel: "h100-80gb-hbm3-x8"},
			[]string{"not the CSV it was asked for", "line 2", `"\x1b[?25l@@`}},
		{"units and header although noheader,nounits was asked",
			fakeMachine{tool: "units-and-header", kernel: "a100-40gb-x4"},
			[]string{"not the CSV it was asked for", `line 1 "name, uuid, memory.total [MiB]`, `"uuid" is not a GPU UUID`}},
		{"exits non-zero: driver unreachable",
			fakeMachine{tool: "no-communication", kernel: "h100-80gb-hbm3-x8"},
			[]string{"exited with status 9", "couldn't communicate with the NVIDIA driver"}},
		{"exits non-zero: library and module mismatch",
			fakeMachine{tool: "version-mismatch", kernel: "h100-80gb-hbm3-x8"},
			[]string{"exited with status 18", "Driver/library version mismatch"}},
		{"exits non-zero: no devices",
			fakeMachine{tool: "no-devices", kernel: "l4-x1"},
			[]string{"exited with status 6", "No devices were found"}},
		{"exits zero listing nothing",
			fakeMachine{tool: "empty", kernel: "l4-x1"},
			[]string{"listed no GPUs"}},
		{"hangs",
			fakeMachine{tool: "hang", kernel: "h100-80gb-hbm3-x8", timeout: 300 * time.Millisecond},
			[]string{"did not answer within 300ms"}},
		{"GPUs the runtime cannot hand to a container",
			fakeMachine{tool: "h100-80gb-hbm3-x8", kernel: "h100-80gb-hbm3-x8", noHook: true},
			[]string{"8 × NVIDIA H100 80GB HBM3", "nvidia-container-runtime-hook", "install nvidia-container-toolkit and restart dockerd"}},
		{"a hook that is not executable is no hook",
			fakeMachine{tool: "l4-x1", kernel: "l4-x1", hookIsFile: true},
			[]string{"1 × NVIDIA L4", "nvidia-container-runtime-hook"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			gpus, notes, err := tc.machine.probe(t).read(context.Background())
			if err != nil {
				t.Fatalf("read: %v, want a note rather than an error", err)
			}
			if gpus != nil {
				t.Errorf("GPUs = %+v, want none", gpus)
			}
			if len(notes) != 1 {
				t.Fatalf("notes = %q, want exactly one", notes)
			}
			t.Logf("note: %s", notes[0])
			for _, want := range tc.want {
				if !strings.Contains(notes[0], want) {
					t.Errorf("note %q lacks %q", notes[0], want)
				}
			}
			if elapsed := time.Since(start); elapsed > 5*time.Second {
				t.Errorf("took %s; a hung tool must be abandoned at the timeout", elapsed)
			}
		})
	}
}

func TestAcceleratorsOnACPUMachineAreSilent(t *testing.T) {
	t.Parallel()
	probe := fakeMachine{}.probe(t)
	probe.tool = "" // the default, nvidia-smi, which this machine may or may not have
	gpus, notes, err := probe.read(context.Background())
	if err != nil || gpus != nil {
		t.Fatalf("read = %+v, %v; want no GPUs and no error", gpus, err)
	}
	if _, lookErr := resolveTool(DefaultAcceleratorTool); lookErr != nil && len(notes) != 0 {
		t.Errorf("notes = %q; a machine with neither the module nor the tool is a CPU node, nothing to note", notes)
	}
}

func TestAcceleratorsWithoutCUDAVersionAreStillReported(t *testing.T) {
	t.Parallel()
	gpus, notes, err := fakeMachine{tool: "no-header", kernel: "l4-x1"}.probe(t).read(context.Background())
	if err != nil || len(gpus) != 1 || gpus[0].CUDAVersion != "" || gpus[0].Model != "NVIDIA L4" {
		t.Fatalf("read = %+v, %v; want the L4 with no CUDA version", gpus, err)
	}
	if len(notes) != 1 || !strings.Contains(notes[0], "CUDA version not reported") {
		t.Errorf("notes = %q, want one saying the CUDA version is unstated", notes)
	}
}

func TestAcceleratorReadEndsWithTheCallersContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	gpus, notes, err := fakeMachine{tool: "hang", kernel: "h100-80gb-hbm3-x8"}.probe(t).read(ctx)
	if err == nil || gpus != nil || notes != nil {
		t.Fatalf("read = %+v, %q, %v; want the context's error", gpus, notes, err)
	}
	if elapsed := time.Since(start); elapsed > 5*time.Second {
		t.Errorf("took %s after the context ended", elapsed)
	}
}

func TestParseNVIDIAQuery(t *testing.T) {
	t.Parallel()
	const uuid = "GPU-1c291010-2f97-ba70-bddc-db08fb3b76c9"
	good, err := parseNVIDIAQuery([]byte("NVIDIA H100 80GB HBM3, " + uuid + ", 81559, 550.54.15, 00000000:18:00.0\r\n\n"))
	if err != nil || len(good) != 1 {
		t.Fatalf("parse = %+v, %v", good, err)
	}
	want := nodeproto.Accelerator{Vendor: "nvidia", Model: "NVIDIA H100 80GB HBM3", UUID: uuid, MemoryBytes: 81559 << 20, DriverVersion: "550.54.15", PCIBusID: "00000000:18:00.0"}
	if good[0] != want {
		t.Errorf("parse = %+v, want %+v", good[0], want)
	}
	unstated, err := parseNVIDIAQuery([]byte("NVIDIA A100-PCIE-40GB, " + uuid + ", [N/A], [Not Supported], [N/A]\n"))
	if err != nil || unstated[0].MemoryBytes != 0 || unstated[0].DriverVersion != "" || unstated[0].PCIBusID != "" {
		t.Errorf("bracketed fields = %+v, %v; want them reported as unstated", unstated, err)
	}
	for _, bad := range []string{
		"NVIDIA H100, " + uuid + ", 81559, 550.54.15",                                                                                  // four fields
		"NVIDIA H100, " + uuid + ", 81559, 550.54.15, 00000000:18:00.0, x",                                                             // six
		"NVIDIA H100, GPU-1, 81559, 550.54.15, 00000000:18:00.0",                                                                       // not a UUID
		"NVIDIA H100, [N/A], 81559, 550.54.15, 00000000:18:00.0",                                                                       // no UUID
		"[N/A], " + uuid + ", 81559, 550.54.15, 00000000:18:00.0",                                                                      // no name
		"NVIDIA H100, " + uuid + ", 81559 MiB, 550.54.15, 00000000:18:00.0",                                                            // units
		"NVIDIA H100, " + uuid + ", -1, 550.54.15, 00000000:18:00.0",                                                                   // negative memory
		"NVIDIA H100, " + uuid + ", 81559, five, 00000000:18:00.0",                                                                     // driver version
		"NVIDIA H100, " + uuid + ", 81559, 550.54.15, slot 3",                                                                          // bus ID
		"NVIDIA H100, " + uuid + ", 81559, 550.54.15, 00000000:18:00.0\nNVIDIA H100, " + uuid + ", 81559, 550.54.15, 00000000:2A:00.0", // UUID twice
	} {
		if gpus, err := parseNVIDIAQuery([]byte(bad)); err == nil {
			t.Errorf("parse(%q) = %+v, want it refused", bad, gpus)
		}
	}
	if gpus, err := parseNVIDIAQuery(nil); err != nil || gpus != nil {
		t.Errorf("parse(empty) = %+v, %v; want nothing and no error", gpus, err)
	}
}

func TestParseCUDAVersion(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"| NVIDIA-SMI 550.54.15    Driver Version: 550.54.15      CUDA Version: 12.4     |": "12.4",
		"    CUDA Version                          : 12.2\n":                                "12.2",
		"| NVIDIA-SMI 396.44       Driver Version: 396.44          |":                       "",
		"": "",
	} {
		if got := parseCUDAVersion([]byte(in)); got != want {
			t.Errorf("parseCUDAVersion(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestEveryHealthyFixtureParses(t *testing.T) {
	t.Parallel()
	total := 0
	for _, machine := range []string{"a100-40gb-x4", "h100-80gb-hbm3-x8", "l4-x1", "h200-x1"} {
		total += len(readQueryFixture(t, machine))
	}
	if total != 14 {
		t.Errorf("%d GPUs across the fixtures, want 14", total)
	}
}
