// Package mercator is the root of the Mercator module: a control plane
// and a node agent for containerized work (Runs, and Fn-compatible
// Functions) on Docker. It holds no code; this comment is a map of the
// repository, and arch_test.go holds the rules that keep the map true.
// docs/design.md states the promises the code keeps and the conventions
// it follows; the README has the same map as a table.
//
// The domain, which decides and imports no adapter:
//
//   - api: the public HTTP API's wire types and routes, run-spec
//     validation (api.RunSpec.Validate), and the one translation between
//     failure kinds and HTTP status codes.
//   - failure: the error kinds every package uses.
//   - lifecycle: the run state machine.
//   - scheduler: where pending runs go (snapshot in, plan out).
//   - store: the control plane's durable state, as an interface
//     (store.Store) with its records; storetest is its conformance suite.
//   - controlplane and its subpackages, one per resource: runs, nodes and
//     the reconcile loop in controlplane itself; the Artifact catalog in
//     controlplane/artifact; registry credentials in controlplane/registry;
//     named API credentials, the audit log and invitations in
//     controlplane/access; the Functions API in controlplane/function; over
//     the HTTP plumbing in controlplane/internal/httpapi (which also checks
//     every route's role).
//   - nodeproto: the node protocol, the contract between the control plane
//     and the node agent.
//   - nodeagent: the node agent's logic, prestart steps over a narrow
//     Runtime.
//
// The adapters, which the domain never imports:
//
//   - store/sqlstore (SQLite and PostgreSQL) and store/memstore (the fake).
//   - replica: replicas sharing one PostgreSQL database.
//   - content: where Artifact bytes live (a directory or S3).
//   - dockerengine: the one Docker adapter, for the agent and fnagent;
//     nodeagent/dockerruntime is the agent's Runtime on it, and
//     nodeagent/runtimetest the conformance suite every Runtime passes,
//     fakes included (nodeagent/runtimesim is what the fakes share).
//   - artifactcache, hostfacts: a node's Artifact copies; its GPUs,
//     capacity and cgroup limits.
//   - fnagent: the node-side Functions engine.
//
// The composition root, daemon, wires stores, replicas, content stores,
// the control plane, the agent and the function engine from
// configuration; cli (the one `mercator` binary, cmd/mercator), devenv
// (`mercator dev`) and fleetsim (the fleet simulator) call it. client is
// the Go client of the public API. pki is TLS: the server's own CA, its
// certificate renewed without a restart, fingerprints, and pinning a server
// by its CA (daemon, client and the agent's wiring use it). imageref parses and pins image
// references; devregistry is `mercator dev`'s registry; internal/... are
// small helpers with one job each (bytesize, cputime, directio,
// faultproxy, hashcopy, pgtest, registrytest, testimage). e2e and e2e/fault are
// the end-to-end and fault-injection tests; examples holds the sample
// workload and function.
//
// Nothing imports this package.
package mercator
