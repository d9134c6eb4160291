// Package runtimesim is what a simulated nodeagent.Runtime needs to behave
// as the Docker runtime does: the rule on which image references a node
// accepts, and what the test workload image (testdata/images/workload)
// does with a command. The agent tests' in-memory runtime and the fleet
// simulator's runtime use it, so both pass the conformance suite
// (nodeagent/runtimetest) the Docker runtime passes, instead of accepting
// what Docker refuses. It imports only imageref, nodeproto and failure, so
// any package may import it; nothing in the control plane or the agent does.
package runtimesim

import (
	"strconv"
	"strings"
	"time"

	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/imageref"
	"github.com/mercator/mercator/nodeproto"
)

// CheckPinned refuses, with failure.ErrInvalid, an image reference the
// Docker runtime refuses: anything but repo@sha256:<64 hex> alone (a tag
// beside the digest too, which the daemon would ignore).
func CheckPinned(image string) error {
	ref, err := imageref.Parse(image)
	if err != nil {
		return err
	}
	if !ref.Pinned() || ref.Tag() != "" {
		return failure.Invalid("image", "%q is not pinned by a manifest digest alone; want repo@sha256:<64 hex digits>", image)
	}
	return nil
}

// CheckContainment refuses, with failure.ErrInvalid naming the field, the
// containment a launch may not ask of any node, as the Docker runtime
// refuses it: a network other than the default and nodeproto.NetworkNone,
// a User that is not nodeproto.ValidUser, a negative PidsLimit. (A limit
// above a node's own maximum is that node's configuration, which a
// simulated node does not have.)
func CheckContainment(c nodeproto.LaunchWorkloadCommand) error {
	switch {
	case !c.NetworkAllowed():
		return failure.Invalid("network", "%q is not a network a node gives a run: only %q, the default, or %q for a gang's member", c.Network, nodeproto.NetworkNone, nodeproto.NetworkHost)
	case c.User != "" && !nodeproto.ValidUser(c.User):
		return failure.Invalid("user", "%q is not a user name or uid[:gid]", c.User)
	case c.PidsLimit < 0:
		return failure.Invalid("pids_limit", "%d processes is negative", c.PidsLimit)
	}
	return nil
}

// Program is how a container running a command behaves.
type Program struct {
	// Known is false for a command the test workload does not have; the
	// runtime then applies its own default (Output, Exit and the rest are
	// zero).
	Known bool
	// Output is what it prints.
	Output string
	// Exit is its code when it ends by itself, after RunFor.
	Exit int
	// RunFor is how long it runs; Forever: until it is stopped.
	RunFor time.Duration
	// IgnoresTerm: a stop waits out the grace period and kills it (137).
	// Otherwise it exits at SIGTERM with TermExit.
	IgnoresTerm bool
	TermExit    int
}

// Forever is Program.RunFor for a program that runs until stopped.
const Forever time.Duration = -1

// KilledExit is the exit code of a container killed by SIGKILL.
const KilledExit = 137

// Parse says how the test workload behaves when run with command and env,
// as its main.go does for the verbs a simulated runtime can honour (echo,
// exit, sleep, env, ignore-term); a malformed argument exits 2, as
// the program does.
func Parse(command []string, env map[string]string) Program {
	if len(command) == 0 {
		return Program{}
	}
	verb, args := command[0], command[1:]
	bad := Program{Known: true, Exit: 2}
	seconds := func() (time.Duration, bool) {
		if len(args) != 1 {
			return 0, false
		}
		s, err := strconv.ParseFloat(args[0], 64)
		return time.Duration(s * float64(time.Second)), err == nil && s >= 0
	}
	switch verb {
	case "echo":
		return Program{Known: true, Output: strings.Join(args, " ") + "\n"}
	case "exit":
		if len(args) != 1 {
			return bad
		}
		code, err := strconv.Atoi(args[0])
		if err != nil {
			return bad
		}
		return Program{Known: true, Output: "exiting " + args[0] + "\n", Exit: code}
	case "sleep":
		d, ok := seconds()
		if !ok {
			return bad
		}
		return Program{Known: true, Output: "sleeping\n", RunFor: d}
	case "ignore-term":
		d, ok := seconds()
		if !ok {
			return bad
		}
		return Program{Known: true, Output: "ignoring SIGTERM\n", RunFor: d, IgnoresTerm: true}
	case "env":
		if len(args) != 1 {
			return bad
		}
		return Program{Known: true, Output: env[args[0]] + "\n"}
	}
	return Program{}
}

// Container is one simulated container's life: started at Started, it
// runs its Program until the program ends or a stop ends it. Not safe
// for concurrent use: the runtime holding it guards it.
type Container struct {
	Program Program
	Started time.Time
	ended   time.Time // when a stop ended it; zero until then
	code    int
}

// State reports whether the container has exited by now, when, and with
// which code.
func (c *Container) State(now time.Time) (exited bool, finished time.Time, code int) {
	if !c.ended.IsZero() {
		return true, c.ended, c.code
	}
	if c.Program.RunFor == Forever {
		return false, time.Time{}, 0
	}
	if end := c.Started.Add(c.Program.RunFor); !now.Before(end) {
		return true, end, c.Program.Exit
	}
	return false, time.Time{}, 0
}

// Term delivers SIGTERM at now: a program that handles it exits with
// TermExit, and Term reports true; one that ignores it runs on, and the
// caller kills it (Kill) once the grace period has passed.
func (c *Container) Term(now time.Time) bool {
	if exited, _, _ := c.State(now); exited {
		return true
	}
	if c.Program.IgnoresTerm {
		return false
	}
	c.ended, c.code = now, c.Program.TermExit
	return true
}

// Kill delivers SIGKILL at now; a container that already exited keeps its
// exit.
func (c *Container) Kill(now time.Time) {
	if exited, _, _ := c.State(now); !exited {
		c.ended, c.code = now, KilledExit
	}
}
