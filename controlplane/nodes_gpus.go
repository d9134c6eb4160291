package controlplane

// GPU health at the control plane (docs/gpus.md): a GPU a node reports
// sick is quarantined (factcheck.Apply), the attempts on it end as
// gpu_failed and are retried elsewhere (nodereport.Applier.GPUReport), and an operator lists, cordons and
// uncordons a node's GPUs.

import (
	"net/http"

	"github.com/mercator/mercator/controlplane/internal/factcheck"
	"github.com/mercator/mercator/store"
)

// cordonGPU withholds one GPU from placement (factcheck.Cordon).
func (s *Server) cordonGPU(w http.ResponseWriter, r *http.Request) {
	s.updateNode(w, r, func(n *store.Node) error { return factcheck.Cordon(n, r.PathValue("uuid"), s.now()) })
}

// uncordonGPU returns one GPU to service after an operator's look or a
// reset (factcheck.Uncordon).
func (s *Server) uncordonGPU(w http.ResponseWriter, r *http.Request) {
	s.updateNode(w, r, func(n *store.Node) error { return factcheck.Uncordon(n, r.PathValue("uuid"), s.now()) })
}
