// Package fnagent is the node-side Functions engine: it runs Fn Project
// functions in hot Docker containers on one machine and serves calls to
// them. The composition root (package daemon) makes one Engine per node and
// hands it to the node agent; the control plane reaches it through the
// agent, and nothing else should drive it. It reaches the daemon through the
// Docker adapter (package dockerengine, whose client the agent's runtime
// shares) and depends otherwise on packages failure and hostfacts, never on
// the rest of Mercator, so the node agent can import it without a cycle.
//
// # The container contract
//
// A function image is any image built with an Fn FDK (http-stream format),
// and it runs unchanged. For every container the engine creates a socket
// directory on the host, bind-mounts it at /tmp/iofs, and sets
//
//	FN_LISTENER=unix:/tmp/iofs/lsnr.sock   FN_FORMAT=http-stream
//	FN_FN_ID, FN_APP_ID, FN_FN_NAME, FN_APP_NAME, FN_MEMORY (MB), FN_TYPE=sync
//	FN_LOGFRAME_NAME, FN_LOGFRAME_HDR=Fn-Call-Id   (per-call log framing)
//
// plus the function's configuration. The container is ready when a
// connection to lsnr.sock succeeds, within the function's init timeout.
// FDKs listen on a "phony" socket and then rename or symlink it into place;
// both are followed, but only inside the socket directory: the engine runs
// as root on the host, and a symlink a container planted must never make it
// dial the Docker socket (see fdksocket.Dial).
//
// Each call is one HTTP/1.1 POST over the container's one connection to the
// socket (kept between calls; see below), with the caller's headers, Fn-Call-Id and Fn-Deadline (RFC 3339 with
// milliseconds). The status the container answers with is Fn's contract:
// 200 is a response (the user's status in Fn-Http-Status, their headers as
// Fn-Http-H-*, which the engine unwraps before the caller's ResponseWriter
// sees them); 502 is a function error and the container is kept; 504 is a
// timeout; anything else is an invalid response and the container is
// replaced.
//
// # The engine
//
// Containers are pooled per function configuration: every field of
// FunctionConfig except the registry credential is part of the pool's
// identity, so a changed image, memory size or config value is a new pool
// and the old one's containers age out. Within a pool the slotQueue serves
// idle containers last-in first-out, so the most recently used container is
// reused and the rest reach their idle timeout and go; a container is
// launched only when more calls are queued than launches are in flight.
// Waiting calls are served first-in first-out. Idle containers are paused
// after Config.PauseAfter and unpaused on demand, and removed after the
// function's IdleTimeout. A pool also keeps one container created but not
// started, which its next launch starts (prepare.go): while a hold stands,
// and as a spare for Config.SpareFor after its last call, for at most
// Config.MaxSpares pools without a hold. On a bridge or user-defined
// network that container joins the network namespace of a tiny holder
// container started with it (netns.go), so its start makes none.
//
// Before a container starts, the ResourceTracker reserves its memory, CPU
// and GPUs against the machine's capacity as measured (cgroup v1 and v2
// limits, not only /proc/meminfo) less a headroom. When the reservation does
// not fit, idle containers of other functions are evicted, least recently
// used first, and only when evicting them makes it fit.
//
// # How this differs from Fn, and why
//
//   - Every way the platform ends a call is its own typed error (CallError,
//     Kind): busy, image pull failed or timed out, container init failed or
//     timed out, out of memory, timeout, function failed, invalid response,
//     request or response too big, canceled, invalid. Fn folds several of
//     these into one message, which leaves an operator guessing whether a
//     function is broken or the platform is.
//   - The wait for a slot is bounded by the call's deadline and by
//     Config.MaxSlotWait, and a call made with NoWait returns ErrBusy at once
//     when it cannot be served without waiting on another call, so the
//     control plane can place it on another node instead of queueing it here.
//   - Responses are streamed to the caller as the container writes them,
//     never buffered whole; a response that grows past MaxResponseBytes is
//     cut off with ErrResponseTooBig.
//   - A container's connection is kept only while its calls end cleanly (a
//     response read to its end) and for at most a second idle, and never
//     across a pause, so the engine never holds an idle connection the FDK
//     may have closed, and bytes a timed-out call writes late can only reach
//     a connection that is already closed. A container whose call timed out
//     (or whose caller gave up) is also replaced, not reused, because the
//     FDK may still be running the abandoned handler. The call's own
//     goroutine writes the request and reads the response (package
//     callconn): no goroutine of a transport is woken on a hot call.
//   - Function containers run with the "none" log driver: the engine reads
//     their output from the attach stream and keeps each call's, so the
//     daemon stores none of it (an FDK writes two lines per call; see Logs).
//   - Images are pulled by manifest digest only; a tag is refused.
//
// # Departures from Fn's agent API, and why
//
//   - No Agent interface with GetCall, Submit, Enqueue and DataAccess: in
//     Mercator the control plane owns apps, functions, call records and the
//     async queue, and hands the node a complete FunctionConfig with each
//     call. The node's part is one method, Engine.Call.
//   - ResourceTracker is a concrete type whose TryReserve answers at once,
//     where Fn's agent GetResourceToken returns a channel that "may never
//     receive". That channel is how Fn's waits became unbounded; here the
//     engine decides whether to wait (bounded) or evict or answer busy. It
//     also hands out GPUs by ID. There is no separate async reserve: async
//     calls are not this package's yet.
//   - Fn's agent CallListener becomes Metrics: observation only, since
//     nothing on the node should be able to veto a call.
//   - ContainerState has no "wait" state: waiting for resources is a call's
//     state (PoolStats.Waiting), not a container's.
//
// # Concurrency
//
// An Engine is safe for concurrent use. Everything blocking takes a context
// first. The pure parts (slotQueue, ResourceTracker, planEviction, the
// protocol's header rules, log framing) are separate from the Docker I/O and
// tested on their own.
package fnagent
