package outputrelay

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
)

// Arg is the relay's first argument to the mercator binary: a process
// started with it is the relay in a container, not a command.
const Arg = "fn-output-relay"

// InContainer is where the agent mounts the relay's executable in a
// function container.
const InContainer = "/.mercator-output-relay"

// Entrypoint is the container entrypoint that runs command (the image's
// entrypoint followed by its command) through the relay, the pipes being
// in dir (the socket directory as the container sees it). Given as the
// container's entrypoint, it replaces the image's command as well.
func Entrypoint(dir string, command []string) []string {
	return append([]string{InContainer, Arg, dir, "--"}, command...)
}

// Relay is the relay's process in the container, args being what follows
// Arg: the pipes' directory, "--", and the command. It opens the write end
// of each pipe and moves it onto descriptor 1 (stdout's) and 2 (stderr's),
// then executes the command in its own place, found on the container's
// PATH as Docker would find it. It returns only on failure, with the exit
// status a shell gives (127 for a command not found, 126 for one that
// cannot be executed, 2 for a misuse), having said why on stderr.
//
// A pipe that cannot be opened (the agent is gone: a pipe opens for
// writing only while read) leaves that descriptor as Docker gave it, said
// on stderr, so the function still runs and its output still reaches the
// daemon.
func Relay(args []string) int {
	if len(args) < 3 || args[1] != "--" {
		fmt.Fprintf(os.Stderr, "mercator %s: want DIR -- COMMAND [ARG...], got %q\n", Arg, args)
		return 2
	}
	dir, command := args[0], args[2:]
	for i, name := range Names {
		if err := redirect(filepath.Join(dir, name), i+1); err != nil {
			fmt.Fprintf(os.Stderr, "mercator %s: %v; descriptor %d left to the container runtime\n", Arg, err, i+1)
		}
	}
	path, err := exec.LookPath(command[0])
	if errors.Is(err, exec.ErrDot) {
		err = nil // found through "." on PATH, which Docker runs too
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "mercator %s: %v\n", Arg, err)
		return 127
	}
	err = syscall.Exec(path, command, os.Environ())
	fmt.Fprintf(os.Stderr, "mercator %s: exec %s: %v\n", Arg, path, err)
	return 126
}

// redirect opens the pipe at path for writing onto descriptor fd. The open
// does not wait for a reader (none means the agent is gone), and the
// descriptor is then made blocking again, as a program expects of its
// stdout.
func redirect(path string, fd int) error {
	w, err := syscall.Open(path, syscall.O_WRONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer syscall.Close(w)
	if err := syscall.SetNonblock(w, false); err != nil {
		return &os.PathError{Op: "fcntl", Path: path, Err: err}
	}
	if err := syscall.Dup3(w, fd, 0); err != nil {
		return fmt.Errorf("dup %s onto %d: %w", path, fd, err)
	}
	return nil
}
