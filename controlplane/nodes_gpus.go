package controlplane

// GPU health at the control plane (docs/gpus.md): a GPU a node reports
// sick is quarantined (factcheck.Apply), the attempts on it end as
// gpu_failed and are retried elsewhere, and an operator lists, cordons and
// uncordons a node's GPUs.

import (
	"net/http"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/factcheck"
	"github.com/mercator/mercator/lifecycle"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// applyGPUReport applies to the attempts on nodeID what a facts report
// found about their GPUs (factcheck.Outcome): an attempt holding a GPU the
// report quarantined ends as gpu_failed, its container is stopped and its
// run goes back to the queue (lifecycle.GPUFailed); an application Xid is
// filed against the attempt holding its GPU (lifecycle.RecordXids). It
// returns the terminal status a run reached, if one did: only a run whose
// cancel was pending ends here, and the caller counts one such status per
// event (a second in the same report goes uncounted in the metric; the run
// itself is right).
func (s *Server) applyGPUReport(tx store.Tx, nodeID string, o factcheck.Outcome) (string, error) {
	if len(o.Quarantined) == 0 && len(o.AppXids) == 0 {
		return "", nil
	}
	runs, err := tx.ListRuns(store.ListRunsOptions{NodeID: nodeID, Statuses: []string{api.RunPlaced, api.RunPreparing, api.RunRunning}})
	if err != nil {
		return "", err
	}
	ended := ""
	for _, listed := range runs {
		run, err := tx.GetRun(listed.ID) // through the batch's memo: an earlier event may have moved it
		if err != nil {
			return "", err
		}
		was, filed := run.Status, lifecycle.RecordXids(&run.Run, nodeID, o.AppXids)
		if a := lifecycle.GPUFailed(&run.Run, nodeID, o.Quarantined, s.now()); a != nil {
			if err := s.issue(tx, nodeID, nodeproto.Command{Kind: nodeproto.KindStopWorkload, StopWorkload: &nodeproto.StopWorkloadCommand{
				WorkloadKey: nodeproto.WorkloadKey{RunID: run.ID, Attempt: a.Number}, Reason: api.AttemptFailureGPU, GracePeriod: 10 * time.Second}}); err != nil {
				return "", err
			}
			if _, err := s.stopStrays(tx, &run.Run, nodeID); err != nil { // a gang's other members
				return "", err
			}
			s.log.Warn("attempt ended: its GPU went bad", "run", run.ID, "attempt", a.Number, "node", nodeID, "gpu", a.Failure.GPU, "reason", a.Failure.Reason)
			if e := endedStatus(was, run.Status); e != "" {
				ended = e
			}
			filed = true
		}
		if filed {
			if err := tx.PutRun(run); err != nil {
				return "", err
			}
		}
	}
	return ended, nil
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
