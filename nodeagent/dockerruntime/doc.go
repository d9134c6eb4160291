// Package dockerruntime is the node agent's Runtime on the Docker daemon:
// it prepares images and Artifacts, launches, stops and observes workload
// containers, reads their logs, and reports the machine's facts, all behind
// nodeagent.Runtime (and its optional LogSource and ChangeSource), so
// nothing in nodeagent knows Docker is underneath.
//
// It talks to the daemon through the Docker adapter (package dockerengine)
// and nothing else.
//
// Imported only by the composition root (package daemon) and by tests that
// need a real runtime; nodeagent itself never imports it.
package dockerruntime
