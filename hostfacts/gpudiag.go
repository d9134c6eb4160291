package hostfacts

// DCGM's active diagnostic, run by the sampler: `dcgmi diag -r 1` at the
// agent's start and on a schedule. A GPU the diagnostic fails is sick with
// reason diag_failed through the same health the sampler's signals set (so
// it is quarantined like any sick card); a warning is a note in the facts;
// a dcgmi that is absent or cannot reach DCGM's host engine is a note, never
// a sick card.

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/mercator/mercator/nodeproto"
)

// DefaultDCGMI is the DCGM command-line tool the agent looks for on PATH.
const DefaultDCGMI = "dcgmi"

// DiagTimeout bounds one run of the diagnostic. Level 1 takes seconds (it
// checks the deployment: libraries, permissions, persistence mode, pending
// page retirements and row remaps, inforom, graphics processes); a run that
// takes minutes is a host engine in trouble, and says nothing about a card.
const DiagTimeout = 2 * time.Minute

// dcgmiDiag is the diagnostic asked for: level 1 ("quick"), in JSON (which
// carries each error's severity; the text table does not). Level 1 is the
// only one the agent runs, because it is the one that is not intrusive: it
// reads state through NVML and runs no kernel, allocates no GPU memory and
// holds no lock a workload needs, so it runs beside the work on the cards.
// Levels 2 and up load the cards (memory, PCIe, stress) and are for an
// operator on a drained node.
var dcgmiDiag = []string{"diag", "-r", "1", "-j"}

// maxDiagNotes bounds the notes one diagnostic leaves in the facts (which
// carry at most nodeproto.MaxFactNotes): a warning on every GPU of a large
// machine is said, the rest counted.
const maxDiagNotes = 16

// diagFailure is the latched result of the last diagnostic that failed a GPU.
type diagFailure struct {
	detail string
	at     time.Time
}

// Diagnose runs DCGM's quick diagnostic once through tool (a path or a name
// on PATH) and applies what it found. done is false when there is nothing to
// diagnose yet (no facts reading has listed the GPUs the diagnostic's GPU
// IDs are mapped onto), so the caller tries again after the next sample;
// otherwise the run is over, whatever it found. A tool that is not there,
// fails to run, does not finish within DiagTimeout or prints what is not a
// diagnostic's answer is a Note, and no GPU's health changes. The error is
// ctx ending.
func (s *GPUSampler) Diagnose(ctx context.Context, tool string) (done bool, err error) {
	s.mu.Lock()
	ready := len(s.listed) > 0
	s.mu.Unlock()
	if !ready {
		return false, nil
	}
	findings, note := s.runDiag(ctx, tool)
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if note != "" {
		s.diagNotes = []string{note}
		return true, nil
	}
	s.applyDiag(findings, s.now().UTC())
	return true, nil
}

// runDiag runs the tool, in JSON and, when the answer is not JSON (a dcgmi
// that does not know -j), once more for the table.
func (s *GPUSampler) runDiag(ctx context.Context, tool string) ([]DiagFinding, string) {
	path, err := exec.LookPath(tool)
	if err != nil {
		if tool == DefaultDCGMI {
			return nil, "gpu diag: dcgmi is not on PATH, so no active diagnostic runs (DCGM's dcgmi and nv-hostengine enable it; --dcgmi \"\" says not to look)"
		}
		return nil, fmt.Sprintf("gpu diag: --dcgmi %s: %v; no active diagnostic runs", tool, err)
	}
	args := dcgmiDiag
	for {
		runCtx, cancel := context.WithTimeout(ctx, DiagTimeout)
		out, err := runTool(runCtx, path, args...)
		cancel()
		if ctx.Err() != nil {
			return nil, ""
		}
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, fmt.Sprintf("gpu diag: %s %s did not finish within %s; no GPU's health was changed", tool, strings.Join(args, " "), DiagTimeout)
		}
		findings, perr := ParseDiag(out)
		var exit *exec.ExitError
		switch {
		case perr == nil:
			// dcgmi exits non-zero when a test failed: the answer says which.
			return findings, ""
		case args[len(args)-1] == "-j" && !isJSON(out) && !strings.Contains(string(out), "host engine"):
			args = args[:len(args)-1]
			continue
		case isJSON(out): // its own account of why it did not run
			return nil, fmt.Sprintf("gpu diag: %s %s: %v; no GPU's health was changed", tool, strings.Join(args, " "), perr)
		case err != nil && errors.As(err, &exit):
			return nil, fmt.Sprintf("gpu diag: %s; no GPU's health was changed", toolFailure(tool+" "+strings.Join(args, " "), DiagTimeout, out, err))
		case err != nil:
			return nil, fmt.Sprintf("gpu diag: %s %s: %v; no GPU's health was changed", tool, strings.Join(args, " "), err)
		default:
			return nil, fmt.Sprintf("gpu diag: %s %s: %v; no GPU's health was changed", tool, strings.Join(args, " "), perr)
		}
	}
}

func isJSON(out []byte) bool {
	t := strings.TrimSpace(string(out))
	return strings.HasPrefix(t, "{")
}

// applyDiag files each finding against the GPU with its DCGM ID (held:
// s.mu). DCGM numbers GPUs in the driver's enumeration order, the order the
// vendor tool lists them in, so an ID is the GPU at that place in the last
// facts reading. A failed test latches diag_failed on the GPU (a new
// failure, a new Since: a failure after an operator's uncordon quarantines
// the card again); a GPU that passed every test it ran is cleared of the
// last failure (the control plane's quarantine stays until an operator
// lifts it); warnings, and failures of the machine rather than a GPU, are
// notes.
func (s *GPUSampler) applyDiag(findings []DiagFinding, now time.Time) {
	var notes []string
	failed := map[string][]string{}
	ran := map[string]bool{}
	for _, f := range findings {
		uuid := ""
		if f.GPU >= 0 && f.GPU < len(s.listed) {
			uuid = s.listed[f.GPU]
		}
		what := f.Test
		if f.Message != "" {
			what += ": " + f.Message
		}
		switch {
		case f.Status == DiagPass && uuid != "":
			ran[uuid] = true
		case f.Status == DiagPass:
		case f.GPU < 0:
			notes = append(notes, fmt.Sprintf("gpu diag: the machine, %s: %s", f.Status, what))
		case uuid == "" || s.tracks[uuid] == nil:
			notes = append(notes, fmt.Sprintf("gpu diag: DCGM GPU %d, which the vendor tool did not list, %s: %s", f.GPU, f.Status, what))
		case f.Status == DiagWarn:
			ran[uuid] = true
			notes = append(notes, fmt.Sprintf("gpu diag: %s (DCGM GPU %d) warning: %s", uuid, f.GPU, what))
		default:
			ran[uuid] = true
			failed[uuid] = append(failed[uuid], what)
		}
	}
	for uuid := range ran {
		t := s.tracks[uuid]
		if t == nil {
			continue
		}
		if msgs := failed[uuid]; len(msgs) > 0 {
			t.diag = &diagFailure{detail: truncate("dcgmi diag -r 1: " + strings.Join(msgs, "; ")), at: now}
		} else {
			t.diag = nil
		}
	}
	slices.Sort(notes)
	if len(notes) > maxDiagNotes {
		notes = append(notes[:maxDiagNotes:maxDiagNotes], fmt.Sprintf("gpu diag: and %d more", len(notes)-maxDiagNotes))
	}
	s.diagNotes = notes
	s.judgeAll(nil, sample{}, now, false)
}

// restoreInventory adds GPUs listed before the agent restarted (held:
// s.mu): they are enrolled as if listed, so one the tool no longer lists is
// missing after two answers, as it would have been without the restart.
func (s *GPUSampler) restoreInventory(known []nodeproto.Accelerator) {
	for _, g := range known {
		if g.UUID == "" || slices.ContainsFunc(s.inventory, func(o nodeproto.Accelerator) bool { return o.UUID == g.UUID }) {
			continue
		}
		s.inventory = append(s.inventory, g)
		s.tracks[g.UUID] = &gpuTrack{health: nodeproto.GPUHealth{UUID: g.UUID, State: nodeproto.GPUHealthy, Since: s.now().UTC()}}
	}
}

// Restore adds to the inventory the GPUs this machine listed before the
// agent restarted (its state file keeps them): a card that vanished while
// the agent was down, or before, is then still listed, and found missing,
// rather than forgotten.
func (s *GPUSampler) Restore(known []nodeproto.Accelerator) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.restoreInventory(known)
}
