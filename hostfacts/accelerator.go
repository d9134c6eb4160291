package hostfacts

// Accelerators: how a node learns which accelerators it can offer: what the
// vendor tool says is installed, whether the kernel module that drives it is
// loaded, and whether the container runtime can hand a device to a container
// at all. All three must hold before a GPU is published, because a fact the
// control plane schedules on is a promise that a launch asking for that UUID
// will get it.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/mercator/mercator/nodeproto"
)

// AcceleratorVendorNVIDIA is the Vendor of every accelerator this node
// reports today. It is the only vendor whose tool the agent knows how to
// ask; a machine with another vendor's cards reports none rather than
// guessing at them.
const AcceleratorVendorNVIDIA = "nvidia"

// DefaultAcceleratorTool is the vendor tool asked when WithAcceleratorTool
// names none, resolved on the agent's PATH.
const DefaultAcceleratorTool = "nvidia-smi"

// AcceleratorToolTimeout bounds one fact cycle's questions to the vendor
// tool, both invocations together. nvidia-smi is known to hang on a card that
// has fallen off the bus or a driver mid-reset, and Facts is on the path of
// the agent's heartbeat: an unbounded wait there would cost the machine its
// lease over a sick GPU. Ten seconds is several times what the tool takes on
// a healthy 8-GPU machine.
const AcceleratorToolTimeout = 10 * time.Second

// NVIDIAContainerHook is the executable whose presence on dockerd's PATH
// makes dockerd register its "nvidia" device driver, the thing that turns a
// DeviceRequest for GPU UUIDs (`docker run --gpus device=…`) into a
// container that sees them. Docker 20.10 (daemon/nvidia_linux.go) looks it up
// once, when the daemon starts; without it every launch that asks for a GPU
// fails with "could not select device driver". The package that provides it
// is nvidia-container-toolkit.
const NVIDIAContainerHook = "nvidia-container-runtime-hook"

// nvidiaQuery is the question asked of nvidia-smi, in its documented CSV
// query mode: one line per GPU, five comma-separated fields, no header, and
// memory in MiB without a unit. The fixtures under testdata/gpu are recorded
// for exactly these arguments, and the fake tool there refuses any others.
var nvidiaQuery = []string{
	"--query-gpu=name,uuid,memory.total,driver_version,pci.bus_id",
	"--format=csv,noheader,nounits",
}

// nvidiaKernelReport is where, under the kernel reports root, a loaded
// NVIDIA kernel module states its version. The file exists exactly while the
// module is loaded, which is why its presence is the test.
var nvidiaKernelReport = filepath.Join("driver", "nvidia", "version")

// standardBinDirs are searched for the container hook besides the agent's own
// PATH. The agent's PATH is not dockerd's: a systemd unit gives dockerd the
// distribution's default PATH whatever the agent was started with, and these
// are the directories that default holds and nvidia-container-toolkit
// installs into.
var standardBinDirs = []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}

// maxToolOutput bounds what is read from the vendor tool. A real answer is a
// few hundred bytes per GPU; anything past this is not an answer.
const maxToolOutput = 1 << 20

// acceleratorProbe reads one machine's accelerators. It holds only
// configuration, so a zero timeout or nil hookDirs mean the defaults, and one
// probe may be used concurrently.
type acceleratorProbe struct {
	// tool is the vendor tool as configured: a path containing a slash is
	// used as it is, a bare name is resolved on PATH, "" means
	// DefaultAcceleratorTool.
	tool string
	// kernelReports is the root the kernel's reports are read under ("" is
	// /proc).
	kernelReports string
	// timeout bounds both invocations of the tool together.
	timeout time.Duration
	// hookDirs are where NVIDIAContainerHook is looked for; nil means the
	// agent's PATH followed by standardBinDirs.
	hookDirs []string
}

// Accelerators reads the GPUs this machine can hand to a container, and a
// Note for each reason it reports fewer than the vendor tool might (see
// acceleratorProbe.read). tool is the vendor tool as configured (a path, a
// name on PATH, or "" for DefaultAcceleratorTool); kernelReports is the
// root of the kernel's reports ("" is /proc). The error is ctx ending and
// nothing else.
func Accelerators(ctx context.Context, tool, kernelReports string) ([]nodeproto.Accelerator, []string, error) {
	return acceleratorProbe{tool: tool, kernelReports: kernelReports}.read(ctx)
}

// ContainerHook is where the NVIDIA container hook is found, where dockerd
// would find it (the agent's PATH, then the standard directories), or ""
// when it is nowhere: then no container here can be given a GPU.
func ContainerHook() string { return acceleratorProbe{}.findHook() }

// read asks the kernel, the vendor tool and the filesystem, in that order,
// and reports GPUs only when all three agree that a container launched here
// can use them. Every way that fails is a Note and no GPUs, never a partial
// or guessed list:
//
//   - neither the module nor the default tool is present: a CPU node, which
//     is not a failure, so nothing is noted;
//   - the module is loaded but the tool is missing, or the tool is present
//     but the module is not loaded (or its report cannot be read);
//   - the tool cannot be started, exits non-zero, outlives the timeout,
//     prints more than maxToolOutput, prints nothing, or prints a line that
//     is not the five fields asked for (the whole answer is then refused,
//     because a tool that garbles one line has not been understood);
//   - GPUs are listed but NVIDIAContainerHook is nowhere dockerd would find
//     it, so no container could be given them.
//
// The CUDA version is taken from the header of a plain `nvidia-smi` ("CUDA
// Version: 12.4"), the only place the tool states it: the CSV query has no
// field for it. Its absence is a Note, not a failure, since the devices are
// no less usable for it. The error is the caller's context ending, and
// nothing else.
func (probe acceleratorProbe) read(ctx context.Context) ([]nodeproto.Accelerator, []string, error) {
	var notes []string
	note := func(format string, args ...any) { notes = append(notes, fmt.Sprintf(format, args...)) }

	root := probe.kernelReports
	if root == "" {
		root = "/proc"
	}
	reportPath := filepath.Join(root, nvidiaKernelReport)
	report, reportErr := os.ReadFile(reportPath)
	moduleLoaded := reportErr == nil

	toolName := probe.tool
	if toolName == "" {
		toolName = DefaultAcceleratorTool
	}
	tool, toolErr := resolveTool(toolName)

	switch {
	case !moduleLoaded && toolErr != nil && probe.tool == "" && errors.Is(reportErr, fs.ErrNotExist):
		// No driver and no tool: an ordinary CPU machine.
		return nil, nil, nil
	case !moduleLoaded && !errors.Is(reportErr, fs.ErrNotExist):
		note("accelerators: none reported, because the NVIDIA kernel module's report %s cannot be read: %v", reportPath, reportErr)
		return nil, notes, nil
	case !moduleLoaded && toolErr != nil:
		note("accelerators: none reported: no NVIDIA kernel module is loaded (%s is absent), and the configured tool %s %v", reportPath, toolName, toolErr)
		return nil, notes, nil
	case !moduleLoaded:
		note("accelerators: none reported: %s is installed but no NVIDIA kernel module is loaded (%s is absent); load the driver (`modprobe nvidia`, or reinstall it for this kernel)", tool, reportPath)
		return nil, notes, nil
	case toolErr != nil:
		note("accelerators: none reported: the NVIDIA kernel module is loaded (%s) but %s %v; install the driver's utilities or point the agent at the tool (--accelerator-tool)", moduleVersion(report), toolName, toolErr)
		return nil, notes, nil
	}

	timeout := probe.timeout
	if timeout <= 0 {
		timeout = AcceleratorToolTimeout
	}
	toolCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	out, err := runTool(toolCtx, tool, nvidiaQuery...)
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		note("accelerators: none reported: %s", toolFailure(tool, timeout, out, err))
		return nil, notes, nil
	}
	gpus, err := parseNVIDIAQuery(out)
	if err != nil {
		note("accelerators: none reported: %s printed an answer that is not the CSV it was asked for: %v", tool, err)
		return nil, notes, nil
	}
	if len(gpus) == 0 {
		note("accelerators: none reported: %s listed no GPUs", tool)
		return nil, notes, nil
	}
	for _, gpu := range gpus {
		if gpu.MemoryBytes == 0 {
			note("accelerators: %s %s does not state its memory; it is reported with none, so no run that asks for GPU memory is placed on it", gpu.Model, gpu.UUID)
		}
	}

	hook := probe.findHook()
	if hook == "" {
		note("accelerators: none reported: %s lists %s, but the container runtime cannot hand a GPU to a container: dockerd registers its NVIDIA device driver only when %s is on its PATH, and it is in none of %s; install nvidia-container-toolkit and restart dockerd",
			tool, describeGPUs(gpus), NVIDIAContainerHook, strings.Join(probe.hookSearchDirs(), ":"))
		return nil, notes, nil
	}

	header, err := runTool(toolCtx, tool)
	if err != nil && ctx.Err() != nil {
		return nil, nil, ctx.Err()
	}
	cuda := ""
	if err == nil {
		cuda = parseCUDAVersion(header)
	}
	switch {
	case err != nil:
		note("accelerators: CUDA version not reported: %s", toolFailure(tool, timeout, header, err))
	case cuda == "":
		note("accelerators: CUDA version not reported: the header of %s states none", tool)
	}
	for i := range gpus {
		gpus[i].CUDAVersion = cuda
	}
	return gpus, notes, nil
}

// hookSearchDirs is where the container hook is looked for, in order.
func (probe acceleratorProbe) hookSearchDirs() []string {
	if probe.hookDirs != nil {
		return probe.hookDirs
	}
	var dirs []string
	seen := map[string]bool{}
	for _, dir := range append(filepath.SplitList(os.Getenv("PATH")), standardBinDirs...) {
		if dir == "" || !filepath.IsAbs(dir) || seen[dir] {
			continue
		}
		seen[dir] = true
		dirs = append(dirs, dir)
	}
	return dirs
}

// findHook returns the path of NVIDIAContainerHook in the first search
// directory that holds it as an executable file, or "" when none does.
//
// This is the agent's view of what dockerd applies, and it is honest about
// two things it cannot see: a daemon started before the toolkit was installed
// has not registered the driver until it is restarted, and a daemon on
// another machine (a tcp:// DOCKER_HOST) is not described by this one's
// files. The daemon itself offers nothing better to ask: its Info lists
// runtimes, not device drivers, and a runtime named "nvidia" is neither
// needed nor enough for --gpus.
func (probe acceleratorProbe) findHook() string {
	for _, dir := range probe.hookSearchDirs() {
		path := filepath.Join(dir, NVIDIAContainerHook)
		if isExecutable(path) {
			return path
		}
	}
	return ""
}

// resolveTool finds the tool the way exec does: a name with a slash is a
// path and must be an executable file; a bare name is looked up on PATH. The
// error is a predicate to follow the name in a Note ("… does not exist").
func resolveTool(name string) (string, error) {
	if strings.ContainsRune(name, '/') {
		info, err := os.Stat(name)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return "", errors.New("does not exist")
		case err != nil:
			return "", fmt.Errorf("cannot be examined (%v)", err)
		case info.IsDir() || info.Mode()&0o111 == 0:
			return "", errors.New("is not an executable file")
		}
		return name, nil
	}
	path, err := exec.LookPath(name)
	if err != nil {
		return "", fmt.Errorf("was not found on PATH")
	}
	return path, nil
}

func isExecutable(path string) bool {
	info, err := os.Stat(path)
	return err == nil && info.Mode().IsRegular() && info.Mode()&0o111 != 0
}

// runTool runs the tool and returns its standard output, or, on failure,
// what it printed on both streams so the failure can be quoted. The tool runs
// in its own process group, and the whole group is killed when ctx ends, so a
// wrapper script's children die with it; WaitDelay stops a grandchild that
// kept the pipes open from holding this call past the deadline.
func runTool(ctx context.Context, tool string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, tool, args...)
	var stdout, stderr cappedBuffer
	stdout.limit, stderr.limit = maxToolOutput, 4096
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	if err == nil && stdout.overflow {
		err = fmt.Errorf("printed more than %d bytes", maxToolOutput)
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return append(stdout.Bytes(), stderr.Bytes()...), err
	}
	return stdout.Bytes(), nil
}

// toolFailure says in one line why the tool gave no answer, quoting the
// first line it printed: nvidia-smi states its own failures on standard
// output ("NVIDIA-SMI has failed because it couldn't communicate with the
// NVIDIA driver"), and that sentence is what an operator needs.
func toolFailure(tool string, timeout time.Duration, printed []byte, err error) string {
	var exit *exec.ExitError
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Sprintf("%s did not answer within %s", tool, timeout)
	case errors.As(err, &exit) && exit.Exited():
		if line := firstLine(printed); line != "" {
			return fmt.Sprintf("%s exited with status %d: %s", tool, exit.ExitCode(), line)
		}
		return fmt.Sprintf("%s exited with status %d and printed nothing", tool, exit.ExitCode())
	default:
		return fmt.Sprintf("%s: %v", tool, err)
	}
}

// firstLine is the first non-blank line of out, trimmed to a length a Note
// can carry and quoted where it holds what is not printable text.
func firstLine(out []byte) string {
	for _, line := range strings.Split(string(out), "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		return quoteIfOdd(line)
	}
	return ""
}

func quoteIfOdd(s string) string {
	s = truncate(s)
	if strconv.CanBackquote(s) && strings.IndexFunc(s, func(r rune) bool { return r < ' ' || r == 0x7f || r == 0xfffd }) < 0 {
		return s
	}
	return strconv.Quote(s)
}

// truncate shortens what a tool printed to what a Note can carry.
func truncate(s string) string {
	const max = 200
	if len(s) > max {
		return s[:max] + "…"
	}
	return s
}

// uuidPattern is what nvidia-smi prints for a whole GPU: "GPU-" and the
// device's UUID. MIG instances ("MIG-…") are not listed by --query-gpu.
var uuidPattern = regexp.MustCompile(`^GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$`)

// pciBusIDPattern is nvidia-smi's bus ID: domain (8 hex digits in current
// drivers, 4 in old ones), bus, device, function.
var pciBusIDPattern = regexp.MustCompile(`^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$`)

var driverVersionPattern = regexp.MustCompile(`^[0-9]+(\.[0-9]+)+$`)

// parseNVIDIAQuery reads the answer to nvidiaQuery: one GPU per line, the
// fields name, uuid, memory.total (MiB), driver_version, pci.bus_id separated
// by ", ". Blank lines are skipped. A field the tool brackets ("[N/A]",
// "[Not Supported]") is a value it does not state: memory and the driver
// version and bus ID are then reported zero/empty, but a GPU without a name
// or UUID cannot be scheduled and refuses the whole answer. Any other line
// that does not hold exactly those fields, or a UUID listed twice, refuses
// the whole answer too: the error names the line.
func parseNVIDIAQuery(out []byte) ([]nodeproto.Accelerator, error) {
	var gpus []nodeproto.Accelerator
	seen := map[string]bool{}
	for i, line := range strings.Split(string(out), "\n") {
		line = strings.TrimRight(line, "\r")
		if strings.TrimSpace(line) == "" {
			continue
		}
		bad := func(format string, args ...any) error {
			return fmt.Errorf("line %d %s: %s", i+1, strconv.Quote(truncate(line)), fmt.Sprintf(format, args...))
		}
		fields := strings.Split(line, ",")
		if len(fields) != len(strings.Split(strings.TrimPrefix(nvidiaQuery[0], "--query-gpu="), ",")) {
			return nil, bad("has %d fields, want name, uuid, memory.total, driver_version, pci.bus_id", len(fields))
		}
		for j := range fields {
			fields[j] = strings.TrimSpace(fields[j])
		}
		name, uuid, memory, driver, bus := fields[0], fields[1], fields[2], fields[3], fields[4]
		gpu := nodeproto.Accelerator{Vendor: AcceleratorVendorNVIDIA, Model: name, UUID: uuid}
		switch {
		case name == "" || unstated(name) || strings.IndexFunc(name, func(r rune) bool { return r < ' ' || r == 0xfffd }) >= 0:
			return nil, bad("no readable GPU name")
		case !uuidPattern.MatchString(uuid):
			return nil, bad("%q is not a GPU UUID", uuid)
		case seen[uuid]:
			return nil, bad("UUID %s is listed twice", uuid)
		}
		seen[uuid] = true
		if !unstated(memory) {
			mib, err := strconv.ParseInt(memory, 10, 64)
			if err != nil || mib <= 0 || mib > 1<<30 {
				return nil, bad("memory.total %q is not a number of MiB", memory)
			}
			gpu.MemoryBytes = mib << 20
		}
		if !unstated(driver) {
			if !driverVersionPattern.MatchString(driver) {
				return nil, bad("driver_version %q is not a version", driver)
			}
			gpu.DriverVersion = driver
		}
		if !unstated(bus) {
			if !pciBusIDPattern.MatchString(bus) {
				return nil, bad("pci.bus_id %q is not a PCI bus ID", bus)
			}
			gpu.PCIBusID = bus
		}
		gpus = append(gpus, gpu)
	}
	return gpus, nil
}

// unstated reports whether a field is one of nvidia-smi's bracketed
// non-answers ("[N/A]", "[Not Supported]", "[Unknown Error]").
func unstated(field string) bool {
	return strings.HasPrefix(field, "[") && strings.HasSuffix(field, "]")
}

var cudaVersionPattern = regexp.MustCompile(`CUDA Version\s*:\s*([0-9]+\.[0-9]+(?:\.[0-9]+)?)`)

// parseCUDAVersion finds the CUDA version the driver supports in nvidia-smi's
// plain header ("CUDA Version: 12.4"); the same words in `nvidia-smi -q`
// ("CUDA Version : 12.4") match too. "" means the output states none, which
// drivers older than 410 do not.
func parseCUDAVersion(out []byte) string {
	if m := cudaVersionPattern.FindSubmatch(out); m != nil {
		return string(m[1])
	}
	return ""
}

var moduleVersionPattern = regexp.MustCompile(`Kernel Module(?: for \S+)?\s+([0-9]+(?:\.[0-9]+)+)`)

// moduleVersion names the loaded module for a Note ("driver 550.54.15"),
// from the first line of its report.
func moduleVersion(report []byte) string {
	if m := moduleVersionPattern.FindSubmatch(report); m != nil {
		return "driver " + string(m[1])
	}
	return "version unstated"
}

// describeGPUs summarises a list for a Note: "8 × NVIDIA H100 80GB HBM3".
func describeGPUs(gpus []nodeproto.Accelerator) string {
	var parts []string
	count := map[string]int{}
	for _, gpu := range gpus {
		if count[gpu.Model] == 0 {
			parts = append(parts, gpu.Model)
		}
		count[gpu.Model]++
	}
	for i, model := range parts {
		parts[i] = fmt.Sprintf("%d × %s", count[model], model)
	}
	return strings.Join(parts, ", ")
}

// cappedBuffer keeps the first limit bytes written to it and remembers
// whether more came, without failing the write: a writer that errors makes
// exec kill nothing and wait on, which is worse than reading on.
type cappedBuffer struct {
	bytes.Buffer
	limit    int
	overflow bool
}

func (b *cappedBuffer) Write(p []byte) (int, error) {
	if room := b.limit - b.Len(); room < len(p) {
		b.overflow = true
		if room > 0 {
			b.Buffer.Write(p[:room])
		}
		return len(p), nil
	}
	return b.Buffer.Write(p)
}
