package controlplane

// GPU health at the control plane (docs/gpus.md): a GPU a node reports
// sick is quarantined (factcheck.Apply), the attempts on it end as
// gpu_failed and are retried elsewhere, and an operator lists, cordons and
// uncordons a node's GPUs.

import (
	"net/http"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/factcheck"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/lifecycle"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// failGPUAttempts ends, as gpu_failed, every active attempt on nodeID that
// holds a GPU the report quarantined, stops its container and puts its run
// back in the queue (lifecycle.GPUFailed). It returns the terminal status a
// run reached, if one did: only a run whose cancel was pending ends here,
// and the caller counts one such status per event (a second in the same
// report goes uncounted in the metric; the run itself is right).
func (s *Server) failGPUAttempts(tx store.Tx, nodeID string, sick []factcheck.SickGPU) (string, error) {
	if len(sick) == 0 {
		return "", nil
	}
	runs, err := tx.ListRuns(store.ListRunsOptions{NodeID: nodeID, Statuses: []string{api.RunPlaced, api.RunPreparing, api.RunRunning}})
	if err != nil {
		return "", err
	}
	ended := ""
	now := s.now()
	for _, listed := range runs {
		run, err := tx.GetRun(listed.ID) // through the batch's memo: an earlier event may have moved it
		if err != nil {
			return "", err
		}
		a := lifecycle.Current(&run.Run)
		if a == nil || a.NodeID != nodeID || !lifecycle.Active(*a) {
			continue
		}
		i := slices.IndexFunc(sick, func(g factcheck.SickGPU) bool { return slices.Contains(a.GPUs, g.UUID) })
		if i < 0 {
			continue
		}
		was, number := run.Status, a.Number
		if !lifecycle.GPUFailed(&run.Run, nodeID, number, sick[i].UUID, sick[i].Reason, sick[i].Detail, now) {
			continue
		}
		if err := s.issue(tx, nodeID, nodeproto.Command{Kind: nodeproto.KindStopWorkload, StopWorkload: &nodeproto.StopWorkloadCommand{
			WorkloadKey: nodeproto.WorkloadKey{RunID: run.ID, Attempt: number}, Reason: api.AttemptFailureGPU, GracePeriod: 10 * time.Second}}); err != nil {
			return "", err
		}
		lifecycle.Find(&run.Run, number).StopRequested = true
		if err := tx.PutRun(run); err != nil {
			return "", err
		}
		if end := endedStatus(was, run.Status); end != "" {
			ended = end
		}
		s.log.Warn("attempt ended: its GPU went bad", "run", run.ID, "attempt", number, "node", nodeID, "gpu", sick[i].UUID, "reason", sick[i].Reason)
	}
	return ended, nil
}

// listNodeGPUs answers GET /v1/nodes/{id}/gpus: each GPU the node lists
// with its health.
func (s *Server) listNodeGPUs(w http.ResponseWriter, r *http.Request) {
	var out api.NodeGPUList
	err := s.store.View(r.Context(), func(tx store.Tx) error {
		n, err := tx.GetNode(r.PathValue("id"))
		out.GPUs = factcheck.GPUs(n)
		return err
	})
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if out.GPUs == nil {
		out.GPUs = []api.NodeGPU{}
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// cordonGPU withholds one GPU from placement (factcheck.Cordon).
func (s *Server) cordonGPU(w http.ResponseWriter, r *http.Request) {
	s.updateNode(w, r, func(n *store.Node) error { return factcheck.Cordon(n, r.PathValue("uuid"), s.now()) })
}

// uncordonGPU returns one GPU to service after an operator's look or a
// reset (factcheck.Uncordon).
func (s *Server) uncordonGPU(w http.ResponseWriter, r *http.Request) {
	s.updateNode(w, r, func(n *store.Node) error { return factcheck.Uncordon(n, r.PathValue("uuid"), s.now()) })
}

// countGPUStates sets the GPU gauge: how many GPUs of enrolled nodes are in
// each state (api.GPUState…).
func (s *Server) countGPUStates(nodes []store.Node) {
	counts := map[string]int{api.GPUStateHealthy: 0, api.GPUStateSick: 0, api.GPUStateCordoned: 0, api.GPUStateDisputed: 0}
	for _, n := range nodes {
		if n.RemovedAt != nil || n.Facts == nil || len(n.Facts.Accelerators) == 0 {
			continue
		}
		for _, g := range factcheck.GPUs(n) {
			counts[g.State]++
		}
	}
	for state, c := range counts {
		s.metrics.GPUs.WithLabelValues(state).Set(float64(c))
	}
}

// recordGPUUsage sets the per-GPU gauges from the usage summaries a batch
// of a node's events carries, and drops a GPU's series when its attempt
// ended.
func (s *Server) recordGPUUsage(nodeID string, batch nodeproto.EventBatch) {
	for _, ev := range batch.Events {
		o := ev.Workload
		if ev.Kind != nodeproto.EventWorkload || o == nil {
			continue
		}
		for _, u := range o.GPUUsage {
			if o.Phase != nodeproto.PhaseRunning {
				s.metrics.GPUUtilization.DeleteLabelValues(nodeID, u.UUID)
				s.metrics.GPUMemoryUsed.DeleteLabelValues(nodeID, u.UUID)
				s.metrics.GPUPower.DeleteLabelValues(nodeID, u.UUID)
				continue
			}
			for _, g := range []struct {
				vec   *prometheus.GaugeVec
				value float64
			}{{s.metrics.GPUUtilization, u.UtilLast}, {s.metrics.GPUMemoryUsed, u.MemoryLastMiB * (1 << 20)}, {s.metrics.GPUPower, u.PowerLastW}} {
				if g.value >= 0 { // -1: the tool did not state it
					g.vec.WithLabelValues(nodeID, u.UUID).Set(g.value)
				}
			}
		}
	}
}
