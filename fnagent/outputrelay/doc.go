// Package outputrelay carries a function container's stdout and stderr to
// the node agent through two named pipes in the container's socket
// directory, past the container runtime and the Docker daemon.
//
// Why: a hot function's FDK writes a frame line to stdout and to stderr at
// every call (so that each call's output is attributed to it exactly), and
// through Docker each line is copied by the container's shim and by the
// daemon before the agent's attach stream reads it: measured at 158–174 µs
// of the daemons' CPU a call, about a third of a hot call's whole cost on
// the node. Through a pipe the agent reads what the function wrote with one
// copy in the kernel.
//
// How: the agent makes the two pipes (Make) before the container is
// created, and sets the container's entrypoint to the relay (Entrypoint): a
// static executable bind-mounted read-only into the container, which opens
// the pipes' write ends, moves them onto its descriptors 1 and 2, and
// executes the image's own command in its place. The function is then the
// container's first process exactly as without the relay (same arguments,
// environment, user, working directory and signals), and its descriptors 1
// and 2 are pipes, as under Docker, so a function that reopens /dev/stdout
// still can. The relay is the mercator binary itself, run with Arg as its
// first argument (Relay), so an agent needs nothing installed beside it;
// it must be statically linked (Static) to run in an image with no C
// library, which CGO_ENABLED=0 gives.
//
// What stays as it was: the agent still attaches to the container, which
// carries anything written before the relay's redirection (its own error,
// should it fail to open a pipe) and tells the agent when the process has
// exited. Pipes.Close then ends the copying once the pipes are drained.
package outputrelay
