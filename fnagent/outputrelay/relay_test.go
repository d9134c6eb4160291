package outputrelay

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/internal/logbuffer"
)

// TestMain makes the test binary the relay when started as one, as the
// mercator binary is.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == Arg {
		os.Exit(Relay(os.Args[2:]))
	}
	os.Exit(m.Run())
}

// relay runs script under sh through the relay (this test binary), with
// its pipes in dir, and returns what reached the process's own stdout and
// stderr (the container runtime's, in a container) and its exit code.
func relay(t *testing.T, dir string, command ...string) (stdout, stderr string, code int) {
	t.Helper()
	args := Entrypoint(dir, command)[1:]
	cmd := exec.Command(os.Args[0], args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return out.String(), errOut.String(), code
}

func makePipes(t *testing.T) (string, *Pipes, *logbuffer.Buffer, *logbuffer.Buffer) {
	t.Helper()
	dir := t.TempDir()
	p, err := Make(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out, errOut logbuffer.Buffer
	p.Copy([2]io.Writer{&out, &errOut})
	return dir, p, &out, &errOut
}

func TestRelayCarriesEachStreamToItsPipe(t *testing.T) {
	dir, p, out, errOut := makePipes(t)
	for _, name := range Names {
		info, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if info.Mode()&os.ModeNamedPipe == 0 || info.Mode().Perm() != 0o622 {
			t.Fatalf("%s: mode %v, want a named pipe writable by all", name, info.Mode())
		}
	}
	// Written directly, through /dev/stdout reopened (as images that log
	// to /dev/stdout do), by a child, and past a pipe's buffer.
	script := `echo one; echo two >&2; echo three >/dev/stdout; echo four >/dev/stderr; sh -c 'echo five'; head -c 200000 /dev/zero | tr '\0' x; echo`
	stdout, stderr, code := relay(t, dir, "sh", "-c", script)
	if code != 0 || stdout != "" || stderr != "" {
		t.Fatalf("exit %d, the runtime's stdout %q, stderr %q: want 0 and nothing past the relay", code, stdout, stderr)
	}
	p.Close(5 * time.Second)
	want := "one\nthree\nfive\n" + strings.Repeat("x", 200000) + "\n"
	if got := out.String(); got != want {
		t.Fatalf("stdout's pipe carried %d bytes (%.40q…), want %d", len(got), got, len(want))
	}
	if got := errOut.String(); got != "two\nfour\n" {
		t.Fatalf("stderr's pipe carried %q, want \"two\\nfour\\n\"", got)
	}
	if n, want := p.Carried(), int64(len(out.String())+len(errOut.String())); n != want {
		t.Fatalf("Carried %d, want the %d bytes the writers got", n, want)
	}
}

func TestRelayPassesArgumentsEnvironmentAndExitCode(t *testing.T) {
	dir, p, out, _ := makePipes(t)
	t.Setenv("RELAY_TEST_VALUE", "kept")
	_, _, code := relay(t, dir, "sh", "-c", `printf '%s|%s|%s\n' "$0" "$1" "$RELAY_TEST_VALUE"; exit 7`, "zero", "a b")
	p.Close(5 * time.Second)
	if code != 7 {
		t.Fatalf("exit %d, want the command's 7", code)
	}
	if got := out.String(); got != "zero|a b|kept\n" {
		t.Fatalf("got %q", got)
	}
}

func TestRelayCommandNotFound(t *testing.T) {
	dir, p, _, errOut := makePipes(t)
	_, _, code := relay(t, dir, "no-such-command-here")
	p.Close(5 * time.Second)
	if code != 127 {
		t.Fatalf("exit %d, want 127", code)
	}
	if got := errOut.String(); !strings.Contains(got, "no-such-command-here") {
		t.Fatalf("stderr's pipe carried %q, want the command named", got)
	}
}

func TestRelayWithoutTheAgentKeepsTheRuntimesStreams(t *testing.T) {
	dir := t.TempDir() // no pipes: the agent is gone
	stdout, stderr, code := relay(t, dir, "sh", "-c", "echo out; echo err >&2")
	if code != 0 || stdout != "out\n" || !strings.HasSuffix(stderr, "err\n") || !strings.Contains(stderr, "left to the container runtime") {
		t.Fatalf("exit %d, stdout %q, stderr %q: want the output on the runtime's streams and the reason said", code, stdout, stderr)
	}
	// A pipe nobody reads is no reader either.
	p, err := Make(dir)
	if err != nil {
		t.Fatal(err)
	}
	p.Copy([2]io.Writer{io.Discard, io.Discard})
	p.Close(time.Second)
	if _, _, code := relay(t, dir, "true"); code != 0 {
		t.Fatalf("exit %d with the pipes closed, want 0", code)
	}
}

func TestRelayMisuse(t *testing.T) {
	if _, stderr, code := relay(t, t.TempDir()); code != 2 || !strings.Contains(stderr, "COMMAND") {
		t.Fatalf("exit %d, stderr %q: want 2 and the usage", code, stderr)
	}
}

func TestCloseWithNoWriterEndsAtOnce(t *testing.T) {
	_, p, _, _ := makePipes(t)
	done := make(chan struct{})
	go func() { p.Close(time.Minute); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("Close waited although no container ever opened the pipes")
	}
}

func TestCloseWithoutCopy(t *testing.T) {
	p, err := Make(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p.Close(time.Minute) // no copy to wait for: returns at once
	var none *Pipes
	none.Close(time.Minute)
}

func TestCloseBoundsAWriterLeftOpen(t *testing.T) {
	dir, p, out, _ := makePipes(t)
	w, err := os.OpenFile(filepath.Join(dir, Names[0]), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if _, err := w.WriteString("before\n"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	p.Close(200 * time.Millisecond)
	if waited := time.Since(start); waited < 200*time.Millisecond {
		t.Fatalf("Close returned after %v with a writer open, want the grace waited", waited)
	}
	if got := out.String(); got != "before\n" {
		t.Fatalf("got %q, want what was written before the close", got)
	}
}

func TestMakeFailsCleanly(t *testing.T) {
	if _, err := Make(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Fatal("Make in a missing directory succeeded")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, Names[1]), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Make(dir); err == nil || !strings.Contains(err.Error(), Names[1]) {
		t.Fatalf("Make over an existing file: %v, want an error naming it", err)
	}
}
