package fault

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/docker/docker/api/types/container"
	dockerclient "github.com/docker/docker/client"

	"github.com/mercator/mercator/api"
)

// dockerd is a private Docker daemon: its own socket, data root and exec
// root, its own bridge interface and no iptables rules, so restarting it
// disturbs neither the machine's daemon nor any other test using it. It runs
// the same dockerd binary as the machine's daemon, without live-restore, so
// its containers die with it exactly as they would with the real one.
//
// Never start it with --bridge=none: a daemon without a bridge deletes the
// host's docker0 interface at start (moby's removeDefaultBridgeInterface),
// which breaks every container the machine's daemon starts afterwards. The
// private daemon gets a bridge of its own, created here and deleted at
// cleanup, and the test checks docker0 is still there when it is done.
type dockerd struct {
	dir    string
	host   string // unix://…
	log    string
	bridge string
	cmd    *exec.Cmd
	done   chan struct{}
}

func startPrivateDockerd(t *testing.T) *dockerd {
	t.Helper()
	if _, err := exec.LookPath("dockerd"); err != nil {
		t.Fatalf("dockerd is not installed (scripts/ensure-docker.sh installs it): %v", err)
	}
	// Short: unix socket paths are limited to 108 bytes.
	dir, err := os.MkdirTemp("", "mfd")
	if err != nil {
		t.Fatal(err)
	}
	d := &dockerd{dir: dir, host: "unix://" + filepath.Join(dir, "d.sock"), log: filepath.Join(dir, "dockerd.log")}
	hadDocker0 := linkExists("docker0")
	t.Cleanup(func() {
		d.remove(t)
		if hadDocker0 && !linkExists("docker0") {
			t.Errorf("the host's docker0 interface is gone after the private dockerd ran: the machine's daemon cannot start containers until it is restarted")
		}
	})
	// A bridge of its own, on a subnet of its own (10.213.N.0/24).
	n := 1 + rand.IntN(250)
	d.bridge = fmt.Sprintf("mfd%d", os.Getpid()%100000)
	exec.Command("ip", "link", "del", d.bridge).Run() // left by a killed run, if any
	for _, args := range [][]string{
		{"link", "add", d.bridge, "type", "bridge"},
		{"addr", "add", fmt.Sprintf("10.213.%d.1/24", n), "dev", d.bridge},
		{"link", "set", d.bridge, "up"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	d.start(t)
	return d
}

func linkExists(name string) bool {
	_, err := os.Stat("/sys/class/net/" + name)
	return err == nil
}

func (d *dockerd) start(t *testing.T) {
	t.Helper()
	f, err := os.OpenFile(d.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	d.cmd = exec.Command("dockerd", "--host", d.host, "--data-root", filepath.Join(d.dir, "root"),
		"--exec-root", filepath.Join(d.dir, "exec"), "--pidfile", filepath.Join(d.dir, "d.pid"),
		"--bridge", d.bridge, "--iptables=false", "--ip-masq=false", "--ip-forward=false")
	d.cmd.Stdout, d.cmd.Stderr = f, f
	if err := d.cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start a private dockerd: %v", err)
	}
	done := make(chan struct{})
	d.done = done
	go func() { d.cmd.Wait(); f.Close(); close(done) }()
	cli, err := dockerclient.NewClientWithOpts(dockerclient.WithHost(d.host), dockerclient.WithAPIVersionNegotiation())
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := withTimeout(2 * time.Second)
		_, err := cli.Ping(ctx)
		cancel()
		if err == nil {
			return
		}
		select {
		case <-done:
			t.Fatalf("the private dockerd exited at start:\n%s", tail(d.log, 30))
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the private dockerd did not answer within 60s: %v\n%s", err, tail(d.log, 30))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop sends SIGTERM, as a service manager does, and waits for the daemon
// to exit; without live-restore it stops its containers on the way out.
func (d *dockerd) stop(t *testing.T) {
	t.Helper()
	select {
	case <-d.done:
		return
	default:
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.done:
	case <-time.After(90 * time.Second):
		d.cmd.Process.Kill()
		<-d.done
		t.Fatalf("the private dockerd did not stop within 90s of SIGTERM")
	}
}

// restart stops the daemon and starts it again on the same directories.
func (d *dockerd) restart(t *testing.T) {
	t.Helper()
	d.stop(t)
	d.start(t)
}

// remove stops the daemon after removing its containers, unmounts what it
// may have left mounted, and deletes its directories.
func (d *dockerd) remove(t *testing.T) {
	select {
	case <-d.done:
	default:
		if cli, err := dockerclient.NewClientWithOpts(dockerclient.WithHost(d.host), dockerclient.WithAPIVersionNegotiation()); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			if list, err := cli.ContainerList(ctx, container.ListOptions{All: true}); err == nil {
				for _, ct := range list {
					cli.ContainerRemove(ctx, ct.ID, container.RemoveOptions{Force: true})
				}
			}
			cancel()
			cli.Close()
		}
		d.stop(t)
	}
	if t.Failed() {
		t.Logf("----- last lines of the private dockerd's log:\n%s", tail(d.log, 30))
	}
	for _, m := range mountsUnder(d.dir) {
		syscall.Unmount(m, syscall.MNT_DETACH)
	}
	if d.bridge != "" {
		exec.Command("ip", "link", "del", d.bridge).Run()
	}
	if len(mountsUnder(d.dir)) == 0 {
		os.RemoveAll(d.dir)
	} else {
		t.Logf("left %s in place: it still has mounts", d.dir)
	}
}

// mountsUnder lists mount points under dir, deepest first.
func mountsUnder(dir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
			out = append(out, fields[4])
		}
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

// TestDockerDaemonRestart restarts the Docker daemon the agent drives
// while its containers run. The daemon is a private one (see dockerd), so
// this is safe in the short mode: one trial there, more in the long mode.
// Without live-restore the containers die with the daemon.
//
// What it proves (docs/design.md, promise 2, for the harshest observation):
// the agent rides out the daemon's absence, and after it returns every
// container's end is reported with the daemon's own exit code and moments,
// never inferred; and the agent launches new work on the restarted daemon.
func TestDockerDaemonRestart(t *testing.T) {
	d := startPrivateDockerd(t)
	c := newCluster(t, clusterOptions{dockerHost: d.host})
	c.addAgent("n")
	for range trials(1, 3) {
		ended := c.mustSubmit(api.RunSpec{Command: []string{"exit", "3"}})
		c.waitRun(ended.ID, 90*time.Second)
		var running []api.Run
		for range 2 {
			running = append(running, c.mustSubmit(api.RunSpec{Command: []string{"sleep", "60"}}))
		}
		running = append(running, c.mustSubmit(api.RunSpec{Command: []string{"ignore-term", "60"}}))
		for _, r := range running {
			c.waitFor("run "+r.ID+" running", 90*time.Second, func() bool {
				got, err := c.client.GetRun(context.Background(), r.ID)
				return err == nil && got.Status == api.RunRunning
			})
		}
		start := time.Now()
		d.restart(t)
		c.sum.fault(fmt.Sprintf("docker daemon restart (SIGTERM, no live-restore) with %d containers running", len(running)), 1)
		c.sum.note("the private daemon took %.1fs to stop and start", time.Since(start).Seconds())
		for _, r := range running {
			c.waitRun(r.ID, 2*time.Minute)
		}
		after := c.mustSubmit(api.RunSpec{Command: []string{"echo", "after the restart"}})
		if got := c.waitRun(after.ID, 2*time.Minute); got.Status != api.RunSucceeded {
			t.Errorf("a run submitted after the daemon restart ended %s: %s", got.Status, got.Reason)
		}
	}
	c.finish()
}

// waitRun waits until a run is terminal and returns it.
func (c *cluster) waitRun(id string, d time.Duration) api.Run {
	c.t.Helper()
	var run api.Run
	c.waitFor("run "+id+" to end", d, func() bool {
		got, err := c.client.GetRun(context.Background(), id)
		run = got
		return err == nil && api.Terminal(got.Status)
	})
	return run
}
