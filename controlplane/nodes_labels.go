package controlplane

import (
	"maps"
	"net/http"
	"slices"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/scheduler"
	"github.com/mercator/mercator/store"
)

// labelNode sets and removes a node's labels: POST
// /v1/nodes/{id}/labels. Runs' constraints and projects' pools select on
// them (docs/teams.md).
func (s *Server) labelNode(w http.ResponseWriter, r *http.Request) {
	var req api.NodeLabelsRequest
	if err := httpapi.Decode(r, httpapi.MaxBody, &req); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if err := api.ValidateLabels("set", req.Set); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if len(req.Set) == 0 && len(req.Remove) == 0 {
		httpapi.WriteError(w, failure.Invalid("set", "nothing to change: give labels to set (KEY=VALUE) or keys to remove (KEY-)"))
		return
	}
	s.updateNode(w, r, func(n *store.Node) error {
		labels := maps.Clone(n.Labels)
		if labels == nil {
			labels = map[string]string{}
		}
		maps.Copy(labels, req.Set)
		for _, k := range req.Remove {
			delete(labels, k)
		}
		if err := api.ValidateLabels("set", labels); err != nil {
			return err
		}
		n.Labels = labels
		if len(labels) == 0 {
			n.Labels = nil
		}
		return nil
	})
}

// constraintsOf is a run's constraints as the scheduler reads them, with
// its project's pools (when it is restricted to some) as the values its
// node's "pool" label may have: a run asking for a pool outside them
// accepts none, and waits saying so.
func constraintsOf(spec api.RunSpec, pools []string) map[string][]string {
	if len(spec.Constraints) == 0 && len(pools) == 0 {
		return nil
	}
	out := make(map[string][]string, len(spec.Constraints)+1)
	for k, v := range spec.Constraints {
		out[k] = []string{v}
	}
	if len(pools) > 0 {
		want, asked := spec.Constraints[poolLabel]
		switch {
		case !asked:
			out[poolLabel] = pools
		case !slices.Contains(pools, want):
			out[poolLabel] = []string{want + " (outside the project's pools)"}
		}
	}
	return out
}

// poolLabel is the label a project's pools name.
const poolLabel = "pool"

// withPools restricts the pending runs of projects limited to pools.
func withPools(snap *scheduler.Snapshot, pools map[string][]string, specs map[string]store.Run) {
	for i := range snap.Pending {
		sr := &snap.Pending[i]
		if p := pools[sr.Project]; len(p) > 0 {
			sr.Constraints = constraintsOf(specs[sr.ID].RunSpec, p)
		}
	}
}

// nodeLabels is a node's labels: its agent's (`agent --label`), with its
// operator's (`node label`) over them.
func nodeLabels(n store.Node) map[string]string {
	if n.Facts == nil || len(n.Facts.Labels) == 0 {
		return n.Labels
	}
	out := maps.Clone(n.Facts.Labels)
	maps.Copy(out, n.Labels)
	return out
}
