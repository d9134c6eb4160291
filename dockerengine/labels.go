package dockerengine

// Labels Mercator puts on every container it creates. They are how a
// restarted agent recognises its own containers with no memory of creating
// them, and the only thing that makes a container Mercator's: nothing stops,
// inspects for a workload, or reports a container that lacks them.
const (
	// LabelNode is the node the container was launched for, on Runs'
	// containers and functions' alike; absent when the runtime has no node
	// label.
	LabelNode = "mercator.node"

	// LabelRun is a Run's ID, exactly as the control plane sent it. It is
	// what makes a container a Run's attempt rather than a function's.
	LabelRun = "mercator.run"
	// LabelAttempt is the attempt number in decimal.
	LabelAttempt = "mercator.attempt"
	// LabelTimeout is the launch's timeout in decimal nanoseconds, "0" for
	// none, so a restarted agent still enforces it from the daemon's own
	// start moment.
	LabelTimeout = "mercator.timeout"
	// LabelImage is the pinned reference the container was launched from.
	LabelImage = "mercator.image"
	// LabelArtifacts names the digests of the Artifacts mounted into the
	// container, comma-separated, so a restarted agent knows which copies
	// are in use and must not be evicted.
	LabelArtifacts = "mercator.artifacts"

	// LabelFn is what tells a function's container from a Run's: the
	// function's ID. LabelApp is its app and LabelPool the engine's pool
	// (one function configuration) it serves.
	LabelFn   = "mercator.fn"
	LabelApp  = "mercator.app"
	LabelPool = "mercator.fn.pool"

	// LabelHolder marks a container that holds a network namespace for a
	// prepared function container (package fnagent); its value is that
	// container's name. A holder carries it and LabelNode, never LabelFn
	// or LabelRun, so it is neither counted nor adopted as a function's
	// container nor reported as a workload. The function engine removes it
	// with the container that joins it, and at startup every holder a
	// previous agent left.
	LabelHolder = "mercator.fn.holder"
)

// SafeName replaces every character Docker does not allow in a container
// name ([a-zA-Z0-9_.-]) with "-", keeping at most max bytes of the result
// (max <= 0: no bound). safe is false when anything was replaced, so a
// caller that needs distinct names for distinct inputs can add a hash.
func SafeName(s string, max int) (name string, safe bool) {
	safe = true
	b := make([]byte, 0, len(s))
	for _, r := range s {
		if max > 0 && len(b) >= max {
			break
		}
		if r < 0x80 && (r == '_' || r == '.' || r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			b = append(b, byte(r))
			continue
		}
		safe = false
		b = append(b, '-')
	}
	return string(b), safe
}
