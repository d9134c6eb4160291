package fleetsim

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/mercator/mercator/internal/cputime"
	"github.com/mercator/mercator/nodeproto"
)

// Shards: a process may hold only so many open files (here the hard limit
// is fixed), and every simulated agent holds its state file and a
// connection, whose other end the control plane holds. So beyond a few
// thousand nodes the agents run in child processes, each with a share of
// the fleet, and the control plane stays alone in the parent, which also
// makes its CPU time and memory the parent's own. A shard reads its
// fleetSpec as one JSON line on stdin, runs its agents, and writes what
// they observe to stdout as JSON lines (shardRecord), which the parent
// feeds to its recorder; timestamps are wall-clock nanoseconds, which both
// processes read from the same kernel clock. Closing the shard's stdin
// stops it; its last line is the "end" record.

// shardRecord is one line from a shard.
type shardRecord struct {
	K     string   `json:"k"`
	N     int      `json:"n"`
	T     int64    `json:"t,omitempty"`
	R     int      `json:"r"`
	Op    string   `json:"op,omitempty"`
	C     int64    `json:"c,omitempty"`
	Run   string   `json:"run,omitempty"`
	A     int      `json:"a,omitempty"`
	Count int      `json:"count,omitempty"`
	Err   string   `json:"err,omitempty"`
	Warn  int      `json:"warn,omitempty"`
	Errs  int      `json:"errs,omitempty"`
	Logs  []string `json:"logs,omitempty"`
}

// RunShard runs one shard of a simulated fleet in this process: the child
// side of Config.ShardCommand (`mercator bench fleet-shard`). It returns
// when in is closed or ctx ends.
func RunShard(ctx context.Context, in io.Reader, out io.Writer) error {
	br := bufio.NewReader(in)
	line, err := br.ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("fleet shard: read the spec: %w", err)
	}
	var spec fleetSpec
	if err := json.Unmarshal(line, &spec); err != nil {
		return fmt.Errorf("fleet shard: spec: %w", err)
	}
	if _, err := raiseOpenFileLimit(uint64(len(spec.IDs))*3 + 1024); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		_, _ = io.Copy(io.Discard, br) // EOF: the parent says stop
		cancel()
	}()
	ls := newLineSink(out)
	defer ls.close()
	log := newCountingHandler(slog.LevelWarn)
	if spec.CPUProfile != "" {
		f, err := os.Create(spec.CPUProfile)
		if err != nil {
			return fmt.Errorf("fleet shard: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("fleet shard: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	pprof.Do(ctx, pprof.Labels("component", "agents"), func(ctx context.Context) {
		err = runAgents(ctx, spec, ls, log)
	})
	warn, errs, samples := log.counts()
	ls.write(shardRecord{K: "end", Warn: warn, Errs: errs, Logs: samples, Err: errString(err)})
	return err
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// lineSink is the sink of a shard: it writes each observation as a JSON
// line, buffered and flushed every 20ms.
type lineSink struct {
	mu   sync.Mutex
	w    *bufio.Writer
	enc  *json.Encoder
	stop chan struct{}
	done chan struct{}
}

func newLineSink(out io.Writer) *lineSink {
	w := bufio.NewWriterSize(out, 256<<10)
	s := &lineSink{w: w, enc: json.NewEncoder(w), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
				s.mu.Lock()
				s.w.Flush()
				s.mu.Unlock()
			}
		}
	}()
	return s
}

func (s *lineSink) write(r shardRecord) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_ = s.enc.Encode(r)
}

func (s *lineSink) close() {
	close(s.stop)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	s.w.Flush()
}

func (s *lineSink) enrolled(n int, at time.Time) {
	s.write(shardRecord{K: "enr", N: n, T: at.UnixNano()})
}
func (s *lineSink) sessionOpened(n, replica int, at time.Time) {
	s.write(shardRecord{K: "ses", N: n, R: replica, T: at.UnixNano()})
}
func (s *lineSink) heartbeat(n int, at time.Time) {
	s.write(shardRecord{K: "hb", N: n, T: at.UnixNano()})
}
func (s *lineSink) heartbeatFailed(n int) { s.write(shardRecord{K: "hbf", N: n}) }
func (s *lineSink) command(n int, op string, created time.Time, runID string, at time.Time) {
	c := int64(0)
	if !created.IsZero() {
		c = created.UnixNano()
	}
	s.write(shardRecord{K: "cmd", N: n, Op: op, C: c, Run: runID, T: at.UnixNano()})
}
func (s *lineSink) eventsHeld(n, count int) { s.write(shardRecord{K: "ev", N: n, Count: count}) }
func (s *lineSink) running(n int, runID string, at time.Time) {
	s.write(shardRecord{K: "run", N: n, Run: runID, T: at.UnixNano()})
}
func (s *lineSink) launched(n int, key nodeproto.WorkloadKey, at time.Time) {
	s.write(shardRecord{K: "lau", N: n, Run: key.RunID, A: key.Attempt, T: at.UnixNano()})
}
func (s *lineSink) agentStopped(n int, err error) {
	s.write(shardRecord{K: "stop", N: n, Err: errString(err)})
}

// shardProc is the parent's handle on one shard process.
type shardProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{} // closed when its output ended
	end   shardRecord
	err   error
}

// startShard starts command with spec and feeds its records to rec. The
// shard's stderr goes to progress (nil: discarded).
func startShard(command []string, spec fleetSpec, rec *recorder, progress io.Writer) (*shardProc, error) {
	cmd := exec.Command(command[0], command[1:]...)
	// A shard must not outlive the simulation, however it ends.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if progress != nil {
		cmd.Stderr = progress
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start a fleet shard (%s): %w", strings.Join(command, " "), err)
	}
	p := &shardProc{cmd: cmd, stdin: stdin, done: make(chan struct{})}
	data, _ := json.Marshal(spec)
	if _, err := stdin.Write(append(data, '\n')); err != nil {
		cmd.Process.Kill()
		return nil, fmt.Errorf("start a fleet shard: send its spec: %w", err)
	}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			var r shardRecord
			if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
				p.err = fmt.Errorf("fleet shard: malformed line: %w", err)
				continue
			}
			p.dispatch(r, rec)
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	return p, nil
}

func (p *shardProc) dispatch(r shardRecord, rec *recorder) {
	at := time.Unix(0, r.T)
	switch r.K {
	case "enr":
		rec.enrolled(r.N, at)
	case "ses":
		rec.sessionOpened(r.N, r.R, at)
	case "hb":
		rec.heartbeat(r.N, at)
	case "hbf":
		rec.heartbeatFailed(r.N)
	case "cmd":
		var created time.Time
		if r.C != 0 {
			created = time.Unix(0, r.C)
		}
		rec.command(r.N, r.Op, created, r.Run, at)
	case "ev":
		rec.eventsHeld(r.N, r.Count)
	case "run":
		rec.running(r.N, r.Run, at)
	case "lau":
		rec.launched(r.N, nodeproto.WorkloadKey{RunID: r.Run, Attempt: r.A}, at)
	case "stop":
		rec.agentStopped(r.N, errors.New(r.Err))
	case "end":
		p.end = r
	}
}

// cpu is the shard's CPU time so far (user + system).
func (p *shardProc) cpu() time.Duration { return cputime.Process(p.cmd.Process.Pid) }

// rss is the shard's resident memory now and at its peak, in bytes.
func (p *shardProc) rss() (now, peak int64) {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(p.cmd.Process.Pid), "status"))
	if err != nil {
		return 0, 0
	}
	return statusField(string(data), "VmRSS"), statusField(string(data), "VmHWM")
}

// stop closes the shard's stdin and waits up to d for it to exit, then
// kills it.
func (p *shardProc) stop(d time.Duration) {
	p.stdin.Close()
	select {
	case <-p.done:
	case <-time.After(d):
		p.cmd.Process.Kill()
		<-p.done
	}
	_ = p.cmd.Wait()
}
