// Package nodeagent is the Mercator node agent: the process that runs on a
// reusable machine and executes successive workloads there.
//
// It connects outbound and never listens. It keeps enough local state to
// refuse a command it already applied, which is what stops a redelivered
// launch from starting a second container. It spools the facts it owes the
// control plane while disconnected, so a container that exited during a
// network partition is still reported rather than inferred.
//
// The pieces, after the node-agent design: Agent (the loops: session,
// observe, flush, heartbeat, facts, renewal), State (one bbolt file:
// applied operations with their results, session credential, fencing token,
// event spool and counter, what the control plane was last told), Transport
// and HTTPTransport (the outbound node protocol), Runtime (the container
// runtime behind six methods, plus the optional LogSource and
// ChangeSource), and the serving of function invokes through an engine the
// composition root hands it (WithFunctions).
//
// Where this package differs from the node-agent design, the type's doc says
// so and why: results travel in the event spool rather than a call of their
// own, MarkApplied records the result event in the same transaction.
//
// It knows no container runtime: the Docker one is nodeagent/dockerruntime,
// which only the composition root (package daemon) wires in. Package daemon,
// fleetsim and the end-to-end tests import this package.
package nodeagent
