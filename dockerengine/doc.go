// Package dockerengine is Mercator's one adapter to the Docker Engine API:
// how a client is built and its API version settled, the subset of the
// client Mercator calls (API), one pull shared among the callers that want
// the same image (Pulls, Pull), the labels that mark a container as
// Mercator's, and the containment every workload container gets
// (Containment: capabilities dropped, no-new-privileges, process and log
// limits, default CPU and memory).
//
// It exists so the node agent's Docker runtime and the function engine talk
// to the daemon the same way and agree on what a label means: before it,
// each had its own client, its own pull single-flight and its own copy of
// the node label.
//
// Imported by nodeagent/dockerruntime, fnagent and the composition root
// (package daemon), and by their tests. Domain packages (nodeagent, the
// control plane) never import it: they see the daemon only through
// nodeagent.Runtime.
package dockerengine
