package scheduler

// Node labels and run constraints (docs/teams.md). A run with Constraints
// goes only to nodes whose label of each key is one of the values it
// accepts (a project restricted to pools adds "pool" with its pools). Its
// search runs over the pool of eligible nodes that match, built once per
// call and set of constraints, so the indexed search is as cheap as for
// an unconstrained run; within it the policy is the package doc's, less
// the preference for nodes holding the image or the Artifacts (a
// constrained run's pool is usually small). A node that does not match is
// counted in the waiting reason: "2 nodes have no label pool=secure".

import (
	"slices"
	"strings"
)

// canonicalConstraints writes constraints as one string, the same for the
// same constraints however they are built: keys sorted, each with its
// values sorted and joined by "|", joined by ",". "" is no constraint.
func canonicalConstraints(c map[string][]string) string {
	if len(c) == 0 {
		return ""
	}
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		vals := slices.Clone(c[k])
		slices.Sort(vals)
		parts = append(parts, k+"="+strings.Join(slices.Compact(vals), "|"))
	}
	return strings.Join(parts, ",")
}

// parsedConstraints reads canonicalConstraints' form back.
func parsedConstraints(canon string) map[string][]string {
	out := map[string][]string{}
	for _, part := range strings.Split(canon, ",") {
		k, v, _ := strings.Cut(part, "=")
		out[k] = strings.Split(v, "|")
	}
	return out
}

// labelsMatch reports whether node ni has, for each key of the
// constraints, a label with one of the accepted values.
func (x *index) labelsMatch(ni int32, canon string) bool {
	c, ok := x.constraints[canon]
	if !ok {
		if x.constraints == nil {
			x.constraints = map[string]map[string][]string{}
		}
		c = parsedConstraints(canon)
		x.constraints[canon] = c
	}
	labels := x.nodes[ni].node.Labels
	for k, vals := range c {
		v, has := labels[k]
		if !has || !slices.Contains(vals, v) {
			return false
		}
	}
	return true
}

// placeConstrained is place for a run with constraints: the best node of
// the pool that matches them, or -1 (and the shape remembered as fitting
// nowhere, as place does).
func (x *index) placeConstrained(r *Run, sh shape, key shapeKey) int32 {
	p := x.labelPools[sh.labels]
	if p == nil {
		var members []int32
		for _, ni := range x.eligible {
			if x.labelsMatch(ni, sh.labels) {
				members = append(members, ni)
			}
		}
		p = x.newPool(members)
		if x.labelPools == nil {
			x.labelPools = map[string]*pool{}
		}
		x.labelPools[sh.labels] = p
	}
	if n := x.search(p, &sh); n >= 0 {
		return n
	}
	x.nowhere[key] = x.newWaiting(&sh)
	return -1
}
