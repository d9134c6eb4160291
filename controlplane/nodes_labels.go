package controlplane

import (
	"maps"
	"net/http"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/failure"
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
