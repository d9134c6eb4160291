package hostfacts

// The GPU health sampler: asks the vendor tool about every GPU and reads the
// kernel's Xid reports on each sample, and keeps, between samples, what a
// single sample cannot know: which GPUs were listed at enrollment (so one
// that vanished is missing, not forgotten), since when a GPU has been
// throttled, and the fatal Xids the kernel logged.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/mercator/mercator/nodeproto"
)

// Defaults of the sampler.
const (
	// DefaultKernelLog is where the kernel's messages are read: /dev/kmsg
	// keeps one read position per open file and never consumes a record
	// (unlike /proc/kmsg, which the system's logger owns).
	DefaultKernelLog = "/dev/kmsg"
	// DefaultThrottleSustain is how long hardware slowdown or thermal
	// throttling must hold before the card is found sick: a moment's
	// throttling under a power cap is normal, five minutes of it is a card
	// running its jobs at a fraction of their speed.
	DefaultThrottleSustain = 5 * time.Minute
	// detailEvery is how many samples pass between two full reports
	// (`nvidia-smi -q -x`, which takes far longer than the CSV query).
	detailEvery = 6
	// missingAfter is how many samples in a row must not list a GPU
	// before it is missing: a tool that skips a card once, in a driver
	// hiccup, would otherwise quarantine it (and a quarantine waits for an
	// operator). A card the tool says is lost is sick at once.
	missingAfter = 2
	// maxKernelLogRead bounds what one sample reads from the kernel log.
	maxKernelLogRead = 1 << 20
)

// GPUSampler samples one machine's GPUs. Its methods are safe to call
// concurrently; Sample is meant to be called from one loop.
type GPUSampler struct {
	tool      string
	kernelLog string
	sustain   time.Duration
	now       func() time.Time

	mu        sync.Mutex
	inventory []nodeproto.Accelerator
	tracks    map[string]*gpuTrack
	readings  map[string]GPUReading
	samples   int
	remap     map[string]remapState
	klog      *kernelLog
	notes     []string
	// listed is the UUIDs the last facts reading listed, in the tool's
	// order (DCGM's GPU IDs follow it, gpudiag.go); diagNotes are what the
	// last diagnostic had to say that is not a sick card.
	listed    []string
	diagNotes []string
}

// gpuTrack is what the sampler holds about one enrolled GPU between samples.
type gpuTrack struct {
	health nodeproto.GPUHealth
	// unlisted counts the answers in a row that did not list the GPU.
	unlisted       int
	throttledSince time.Time
	fatal          *XidReport // the first fatal Xid read; latched
	xids           []nodeproto.GPUXid
	diag           *diagFailure // the last diagnostic's failure; latched until one passes
}

// NewGPUSampler returns a sampler asking tool (as for Accelerators: a path,
// a name on PATH, "" for DefaultAcceleratorTool) and reading the kernel log
// at kernelLog ("" for DefaultKernelLog; a regular file is read as it grows,
// which is how tests stand in a kernel). sustain is the throttling
// tolerated (0: DefaultThrottleSustain); now is the clock (nil: time.Now).
func NewGPUSampler(tool, kernelLog string, sustain time.Duration, now func() time.Time) *GPUSampler {
	if tool == "" {
		tool = DefaultAcceleratorTool
	}
	if kernelLog == "" {
		kernelLog = DefaultKernelLog
	}
	if sustain <= 0 {
		sustain = DefaultThrottleSustain
	}
	if now == nil {
		now = time.Now
	}
	return &GPUSampler{tool: tool, kernelLog: kernelLog, sustain: sustain, now: now, tracks: map[string]*gpuTrack{}}
}

// Enroll merges what the facts reading lists (Accelerators) into the GPUs
// this machine is known to hold, and returns that inventory: every GPU ever
// listed since the agent started, in the order first listed. A GPU the tool
// no longer lists stays in it, as sick (missing or lost), so the node keeps
// serving with the others instead of reporting a smaller machine whose
// missing card nobody notices.
func (s *GPUSampler) Enroll(listed []nodeproto.Accelerator) []nodeproto.Accelerator {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.listed = s.listed[:0]
	for _, g := range listed {
		s.listed = append(s.listed, g.UUID)
		i := slices.IndexFunc(s.inventory, func(o nodeproto.Accelerator) bool { return o.UUID == g.UUID })
		if i >= 0 {
			s.inventory[i] = g
			continue
		}
		s.inventory = append(s.inventory, g)
		s.tracks[g.UUID] = &gpuTrack{health: nodeproto.GPUHealth{UUID: g.UUID, State: nodeproto.GPUHealthy, Since: s.now().UTC()}}
	}
	return slices.Clone(s.inventory)
}

// Health is each enrolled GPU's health after the last sample, in inventory
// order, with its recent non-fatal Xids; nil before any GPU was enrolled.
func (s *GPUSampler) Health() []nodeproto.GPUHealth {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []nodeproto.GPUHealth
	for _, g := range s.inventory {
		h := s.tracks[g.UUID].health
		h.XIDs = slices.Clone(s.tracks[g.UUID].xids)
		out = append(out, h)
	}
	return out
}

// Readings is the last sample's figures for each GPU that answered, by UUID.
// The map is the caller's.
func (s *GPUSampler) Readings() map[string]GPUReading {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]GPUReading, len(s.readings))
	for k, v := range s.readings {
		out[k] = v
	}
	return out
}

// Notes are why the last sample could not read what it meant to (the tool
// hung, the kernel log is unreadable); the caller reports them with the
// node's facts.
func (s *GPUSampler) Notes() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append(slices.Clone(s.notes), s.diagNotes...)
}

// sample is what one round of I/O read, before judgement.
type sample struct {
	readings []GPUReading
	lost     []LostGPU
	// failure is the tool's own account when it exited non-zero, and
	// failedLost whether its status was nvidia-smi's "GPU lost".
	failure    string
	failedLost bool
	// hung: the tool did not answer in time; nothing is concluded.
	hung  bool
	remap map[string]remapState // nil when not asked this time
	xids  []XidReport
}

// Sample asks the tool and reads the kernel log once, and updates every
// enrolled GPU's health. The error is ctx ending; a tool or log that cannot
// be read is a Note (Notes), and a tool that does not answer in time
// changes no GPU's health, since a hung tool says nothing about any card.
func (s *GPUSampler) Sample(ctx context.Context) error {
	s.mu.Lock()
	enrolled := len(s.inventory) > 0
	s.samples++
	wantDetail := s.samples%detailEvery == 1
	s.mu.Unlock()
	if !enrolled {
		return nil
	}
	var in sample
	var notes []string
	toolCtx, cancel := context.WithTimeout(ctx, AcceleratorToolTimeout)
	defer cancel()
	out, err := runTool(toolCtx, s.tool, nvidiaHealthQuery...)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var exit *exec.ExitError
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		in.hung = true
		notes = append(notes, fmt.Sprintf("gpu health: %s did not answer within %s; no GPU's health was changed", s.tool, AcceleratorToolTimeout))
	case errors.As(err, &exit) && exit.Exited():
		in.failure = toolFailure(s.tool, AcceleratorToolTimeout, out, err)
		in.failedLost = exit.ExitCode() == nvidiaExitGPULost
		// A lost GPU makes the tool exit non-zero after listing the others.
		in.readings, in.lost, _ = parseHealthQuery(out)
	case err != nil:
		in.hung = true
		notes = append(notes, "gpu health: "+toolFailure(s.tool, AcceleratorToolTimeout, out, err))
	default:
		if in.readings, in.lost, err = parseHealthQuery(out); err != nil {
			in.hung = true
			notes = append(notes, fmt.Sprintf("gpu health: %s printed an answer that is not the CSV it was asked for: %v", s.tool, err))
		}
	}
	if wantDetail && !in.hung && in.failure == "" {
		if xmlOut, err := runTool(toolCtx, s.tool, nvidiaDetailQuery...); err == nil {
			if in.remap, err = parseDetailXML(xmlOut); err != nil {
				notes = append(notes, fmt.Sprintf("gpu health: %s -q -x: %v", s.tool, err))
			}
		} else if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	xids, note := s.readXids()
	in.xids = xids
	if note != "" {
		notes = append(notes, note)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.notes = notes
	s.observe(in, s.now().UTC())
	return nil
}

// readXids reads what the kernel logged since the last sample and returns
// its Xid lines, or a Note when the log cannot be read (a container without
// CAP_SYSLOG, a kernel with dmesg_restrict): then Xids go unseen, and the
// tool's own signals still hold.
func (s *GPUSampler) readXids() ([]XidReport, string) {
	if s.klog == nil {
		klog, err := openKernelLog(s.kernelLog)
		if err != nil {
			return nil, fmt.Sprintf("gpu health: the kernel log %s cannot be read (%v); Xids are not seen", s.kernelLog, err)
		}
		s.klog = klog
	}
	data, err := s.klog.read()
	if err != nil {
		return parseXids(data), fmt.Sprintf("gpu health: reading the kernel log %s: %v", s.kernelLog, err)
	}
	return parseXids(data), ""
}

// observe judges every enrolled GPU from one sample (held: s.mu). It is the
// sampler's whole policy, and pure but for s's state.
func (s *GPUSampler) observe(in sample, now time.Time) {
	if in.hung {
		s.readings = nil // no figures this time: nothing for the usage sums
		s.recordXids(in.xids, now)
		s.judgeAll(nil, in, now, false)
		return
	}
	s.readings = map[string]GPUReading{}
	for _, r := range in.readings {
		s.readings[r.UUID] = r
	}
	if in.remap != nil {
		s.remap = in.remap
	}
	s.recordXids(in.xids, now)
	s.judgeAll(s.readings, in, now, true)
}

// recordXids files each Xid against the GPU at its bus ID: a fatal one is
// latched (the first is kept), any other kept among the GPU's recent ones.
func (s *GPUSampler) recordXids(xids []XidReport, now time.Time) {
	for _, x := range xids {
		t := s.trackAt(x.PCIBusID)
		if t == nil {
			continue
		}
		class := ClassifyXid(x.Xid)
		if class == XidFatal {
			if t.fatal == nil {
				x := x
				t.fatal = &x
			}
			continue
		}
		t.xids = append(t.xids, nodeproto.GPUXid{Xid: x.Xid, Class: class, At: now, Detail: x.Line})
		if len(t.xids) > nodeproto.MaxGPUXids {
			t.xids = t.xids[len(t.xids)-nodeproto.MaxGPUXids:]
		}
	}
}

// trackAt is the track of the enrolled GPU at a bus ID, or nil.
func (s *GPUSampler) trackAt(bus string) *gpuTrack {
	for _, g := range s.inventory {
		if g.PCIBusID != "" && normalizeBusID(g.PCIBusID) == bus {
			return s.tracks[g.UUID]
		}
	}
	return nil
}

// judgeAll sets each enrolled GPU's health. With answered false (the tool
// hung) only the latched signals (fatal Xids) are applied.
func (s *GPUSampler) judgeAll(readings map[string]GPUReading, in sample, now time.Time, answered bool) {
	lostAt := map[string]string{}
	for _, l := range in.lost {
		lostAt[l.PCIBusID] = l.Message
	}
	for _, g := range s.inventory {
		t := s.tracks[g.UUID]
		reason, detail := "", ""
		r, listed := readings[g.UUID]
		switch {
		case answered && !listed:
			t.unlisted++
		case answered:
			t.unlisted = 0
		}
		switch {
		case t.fatal != nil && t.fatal.Xid == 79:
			reason, detail = nodeproto.GPUReasonLost, t.fatal.Line
		case answered && lostAt[normalizeBusID(g.PCIBusID)] != "":
			reason, detail = nodeproto.GPUReasonLost, lostAt[normalizeBusID(g.PCIBusID)]
		case answered && !listed && in.failedLost:
			reason, detail = nodeproto.GPUReasonLost, in.failure
		case answered && !listed && t.unlisted < missingAfter:
			reason, detail = t.health.Reason, t.health.Detail // once may be a hiccup
		case answered && !listed && in.failure != "":
			reason, detail = nodeproto.GPUReasonMissing, "listed at enrollment, not listed now: "+in.failure
		case answered && !listed:
			reason, detail = nodeproto.GPUReasonMissing, fmt.Sprintf("listed at enrollment (bus %s), not listed by %s now", g.PCIBusID, s.tool)
		case t.fatal != nil:
			reason, detail = nodeproto.GPUReasonXid, fmt.Sprintf("Xid %d: %s", t.fatal.Xid, t.fatal.Line)
		case t.diag != nil:
			reason, detail = nodeproto.GPUReasonDiag, t.diag.detail
		case !answered:
			reason, detail = t.health.Reason, t.health.Detail // nothing new is known
		default:
			reason, detail = s.judgeReading(t, r, now)
		}
		state := nodeproto.GPUHealthy
		if reason != "" {
			state = nodeproto.GPUSick
		}
		since := now
		if reason == nodeproto.GPUReasonDiag {
			since = t.health.Since // kept while nothing new is known
			if t.diag != nil {
				since = t.diag.at // each failing run is a new sickness
			}
		}
		if t.health.State != state || t.health.Reason != reason || !t.health.Since.Equal(since) && reason == nodeproto.GPUReasonDiag {
			t.health = nodeproto.GPUHealth{UUID: g.UUID, State: state, Reason: reason, Detail: detail, Since: since}
		}
	}
}

// judgeReading is a listed GPU's sickness from its own figures, "" when it
// is healthy, and keeps its throttling time.
func (s *GPUSampler) judgeReading(t *gpuTrack, r GPUReading, now time.Time) (reason, detail string) {
	remap := s.remap[r.UUID]
	if !r.Throttled {
		t.throttledSince = time.Time{}
	} else if t.throttledSince.IsZero() {
		t.throttledSince = now
	}
	switch {
	case r.ECCUncorrected > 0:
		return nodeproto.GPUReasonECC, fmt.Sprintf("%d uncorrectable ECC errors since the driver loaded", r.ECCUncorrected)
	case remap.failed:
		return nodeproto.GPUReasonRemapFailed, "row remapping failed: no spare rows left"
	case remap.pending:
		return nodeproto.GPUReasonRemapPending, fmt.Sprintf("a row remap is pending a reset (%d uncorrectable remapped rows)", remap.uncorrectable)
	case r.RetirementPend || remap.retirementPending:
		return nodeproto.GPUReasonRetirementPending, "a retired page is pending a reset"
	case r.Throttled && now.Sub(t.throttledSince) >= s.sustain:
		return nodeproto.GPUReasonThrottled, fmt.Sprintf("%s active since %s", strings.Join(r.ThrottleReasons, ", "), t.throttledSince.Format(time.RFC3339))
	}
	return "", ""
}

// kernelLog reads a kernel log from where the last read stopped, without
// blocking: /dev/kmsg (a record per read, EAGAIN at the end, EPIPE when a
// record was overwritten before it was read) or a regular file as it grows.
// It uses the descriptor directly: an *os.File would park a read of
// /dev/kmsg in the runtime's poller until the next message.
type kernelLog struct {
	fd      int
	partial []byte
}

func openKernelLog(path string) (*kernelLog, error) {
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return &kernelLog{fd: fd}, nil
}

// read returns the whole lines logged since the last read (at most
// maxKernelLogRead bytes of them).
func (k *kernelLog) read() ([]byte, error) {
	buf := make([]byte, 8192)
	out := k.partial
	k.partial = nil
	for len(out) < maxKernelLogRead {
		n, err := syscall.Read(k.fd, buf)
		if n > 0 {
			out = append(out, buf[:n]...)
		}
		switch {
		case errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.EAGAIN), err == nil && n == 0:
			return k.whole(out), nil
		case err != nil:
			return k.whole(out), err
		}
	}
	return k.whole(out), nil
}

// whole returns out up to its last newline and keeps the rest for the next
// read: a file being appended to may be read in the middle of a line.
func (k *kernelLog) whole(out []byte) []byte {
	i := bytes.LastIndexByte(out, '\n')
	k.partial = append([]byte(nil), out[i+1:]...)
	return out[:i+1]
}
