package nodeagent

import "maps"

// WithLabels gives the node labels it reports with its facts
// (`mercator agent --label KEY=VALUE`), which runs' constraints and
// projects' pools select on (docs/teams.md). The map is copied.
func WithLabels(labels map[string]string) Option {
	return func(a *Agent) { a.labels = maps.Clone(labels) }
}
