// Package phaseprofile profiles a process's CPU in phases: one profile
// after another, each of a window worth reading alone, and their samples
// summed by goroutine label as if they were one. The fleet simulator
// profiles a hold this way, so that a killed leader's takeover or a
// reconnect storm, seconds long, is not diluted in minutes of steady
// work. Only package fleetsim imports it.
package phaseprofile

import (
	"bytes"
	"errors"
	"os"
	"runtime/pprof"
	"time"

	"github.com/mercator/mercator/internal/cpuprofile"
)

// Profile is a CPU profile in phases. Go runs one CPU profile at a time,
// so a phase ends as the next begins. Its zero value is ready; it is not
// safe for concurrent use.
type Profile struct {
	phases []profilePhase
	on     bool // a phase is being profiled
}

type profilePhase struct {
	name string // "" for the phase written to the path itself
	buf  *bytes.Buffer
}

// Begin ends the phase being profiled and starts the phase name. It
// reports false when the profiler could not start (another profile runs,
// as under `go test -cpuprofile`); that phase is then missing.
func (p *Profile) Begin(name string) bool {
	p.End()
	buf := &bytes.Buffer{}
	if pprof.StartCPUProfile(buf) != nil {
		return false
	}
	p.phases, p.on = append(p.phases, profilePhase{name: name, buf: buf}), true
	return true
}

// End ends the phase being profiled, if any.
func (p *Profile) End() {
	if p.on {
		pprof.StopCPUProfile()
		p.on = false
	}
}

// Profiled reports whether any phase was profiled.
func (p *Profile) Profiled() bool { return len(p.phases) > 0 }

// ByLabel sums every phase's samples by the goroutine label key
// (cpuprofile.ByLabel).
func (p *Profile) ByLabel(key string) (map[string]time.Duration, error) {
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

// Write writes each phase to a file: the phase named "" to path, the
// others to path + "." + their name (path.takeover, path.after).
// `go tool pprof path path.takeover path.after` reads them as the one
// profile of the whole hold.
func (p *Profile) Write(path string) error {
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
