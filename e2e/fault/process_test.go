package fault

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// proc is one child process of the harness (a control plane or an agent).
// Its output is appended to a log file that outlives restarts, each start
// marked with a line, so a failure shows the whole history of that role.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error // the exit status, once done is closed
}

// startProc starts mercatorBin with args, its output appended to logPath.
func startProc(t *testing.T, name, logPath string, env []string, args ...string) *proc {
	t.Helper()
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(f, "===== %s start %s: mercator %s\n", name, time.Now().Format(time.RFC3339Nano), strings.Join(args, " "))
	cmd := exec.Command(mercatorBin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p
}

// running reports whether the process has not exited yet.
func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// kill sends SIGKILL (kill -9) and waits for the process to be gone.
func (p *proc) kill(t *testing.T) {
	t.Helper()
	if !p.running() {
		return
	}
	p.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s (pid %d) did not die within 30s of SIGKILL", p.name, p.cmd.Process.Pid)
	}
}

// pause sends SIGSTOP: the process freezes where it is, and a later kill
// finds it there.
func (p *proc) pause() {
	if p.running() {
		p.cmd.Process.Signal(syscall.SIGSTOP)
	}
}

// stop sends SIGTERM, waits up to d, then kills.
func (p *proc) stop(t *testing.T, d time.Duration) {
	t.Helper()
	if !p.running() {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(d):
		t.Logf("%s did not stop within %v of SIGTERM; killing it", p.name, d)
		p.kill(t)
	}
}

// wait waits up to d for the process to exit on its own and returns its
// exit code (-1 when it did not exit).
func (p *proc) wait(d time.Duration) int {
	select {
	case <-p.done:
	case <-time.After(d):
		return -1
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.ExitCode()
	}
	if p.err != nil {
		return -1
	}
	return 0
}

// scanLog reports what in a log file means a process broke in a way no
// fault excuses: a data race (with the first frames of each distinct
// report) or a panic.
func scanLog(path string) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var bad []string
	seen := map[string]bool{}
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 1<<20), 16<<20)
	var report []string // the race report being read, nil outside one
	for s.Scan() {
		line := s.Text()
		switch {
		case strings.Contains(line, "WARNING: DATA RACE"):
			report = []string{line}
		case report != nil:
			if strings.HasPrefix(line, "==================") || len(report) == 24 {
				key := strings.Join(report, "\n")
				if i := strings.Index(key, "Previous"); i > 0 {
					key = key[i:] // addresses differ between reports of one race
				}
				if !seen[key] {
					seen[key] = true
					bad = append(bad, strings.Join(report, "\n"))
				}
				report = nil
				continue
			}
			if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "/") {
				report = append(report, line)
			}
		case strings.HasPrefix(line, "panic: ") || strings.HasPrefix(line, "fatal error: "):
			bad = append(bad, line)
		}
	}
	return bad
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func readFile(path string) (string, error) {
	data, err := os.ReadFile(path)
	return string(data), err
}
