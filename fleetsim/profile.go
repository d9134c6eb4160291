package fleetsim

import (
	"bytes"
	"errors"
	"os"
	"runtime/pprof"
	"time"

	"github.com/mercator/mercator/internal/cpuprofile"
)

// holdProfile is this process's CPU profile of the hold, in phases: the
// hold's own, and apart from it the windows worth reading alone (a killed
// leader's takeover, a reconnect storm), whose seconds a profile of the
// whole hold dilutes in minutes of steady work. Go runs one CPU profile at
// a time, so a phase ends as the next begins. The report's CPU split sums
// every phase; each is written to a file of its own (write).
type holdProfile struct {
	phases []profilePhase
	on     bool // a phase is being profiled
}

type profilePhase struct {
	name string // "" for the hold's own, before any window
	buf  *bytes.Buffer
}

// begin ends the phase being profiled and starts the phase name. It
// reports false when the profiler could not start (another profile runs,
// as under `go test -cpuprofile`); that phase is then missing.
func (p *holdProfile) begin(name string) bool {
	p.end()
	buf := &bytes.Buffer{}
	if pprof.StartCPUProfile(buf) != nil {
		return false
	}
	p.phases, p.on = append(p.phases, profilePhase{name: name, buf: buf}), true
	return true
}

// end ends the phase being profiled, if any.
func (p *holdProfile) end() {
	if p.on {
		pprof.StopCPUProfile()
		p.on = false
	}
}

// profiled reports whether any phase was profiled.
func (p *holdProfile) profiled() bool { return len(p.phases) > 0 }

// byLabel sums every phase's samples by the goroutine label key
// (cpuprofile.ByLabel).
func (p *holdProfile) byLabel(key string) (map[string]time.Duration, error) {
	sum := map[string]time.Duration{}
	for _, ph := range p.phases {
		split, err := cpuprofile.ByLabel(ph.buf.Bytes(), key)
		if err != nil {
			return nil, err
		}
		for k, d := range split {
			sum[k] += d
		}
	}
	return sum, nil
}

// write writes each phase to a file: the hold's own to path, a window
// and what followed it to path + "." + its name (path.takeover,
// path.after). `go tool pprof path path.takeover path.after` reads them
// as the one profile of the whole hold.
func (p *holdProfile) write(path string) error {
	var errs []error
	for _, ph := range p.phases {
		file := path
		if ph.name != "" {
			file += "." + ph.name
		}
		errs = append(errs, os.WriteFile(file, ph.buf.Bytes(), 0o644))
	}
	return errors.Join(errs...)
}
