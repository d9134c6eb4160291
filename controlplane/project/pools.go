package project

import (
	"slices"

	"github.com/mercator/mercator/api"
)

// PoolLabel is the node label a project's pools name.
const PoolLabel = "pool"

// Constraints is a run's constraints as the scheduler reads them
// (scheduler.Run.Constraints), with its project's pools, when it is
// restricted to some, as the values its node's pool label may have: a run
// asking for a pool outside them accepts none, and waits saying so. nil
// is no constraint.
func Constraints(spec api.RunSpec, pools []string) map[string][]string {
	if len(spec.Constraints) == 0 && len(pools) == 0 {
		return nil
	}
	out := make(map[string][]string, len(spec.Constraints)+1)
	for k, v := range spec.Constraints {
		out[k] = []string{v}
	}
	if len(pools) > 0 {
		want, asked := spec.Constraints[PoolLabel]
		switch {
		case !asked:
			out[PoolLabel] = pools
		case !slices.Contains(pools, want):
			out[PoolLabel] = []string{want + " (outside the project's pools)"}
		}
	}
	return out
}
