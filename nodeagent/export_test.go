package nodeagent

// NewMemRuntime hands the in-memory runtime the agent's tests lean on to
// the conformance test, which lives in package nodeagent_test because
// runtimetest imports nodeagent.
func NewMemRuntime() Runtime { return newMemRuntime() }
