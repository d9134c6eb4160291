package controlplane

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/capability"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/lifecycle"
	"github.com/mercator/mercator/node"
	"github.com/mercator/mercator/store"
)

// submitRun validates a spec, pins its image, and stores a queued run. A
// spec that fails validation or pinning creates nothing.
func (s *Server) submitRun(w http.ResponseWriter, r *http.Request) {
	var spec api.RunSpec
	if err := decode(r, maxBody, &spec); err != nil {
		writeError(w, err)
		return
	}
	if err := ValidateRunSpec(&spec); err != nil {
		writeError(w, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	if err := s.resolveArtifacts(ctx, &spec); err != nil {
		writeError(w, err)
		return
	}
	pinned, err := s.pins.resolve(ctx, s.resolver, spec.Image, s.now())
	if err != nil {
		writeError(w, err)
		return
	}
	now := s.now()
	run := store.Run{Run: api.Run{ID: newID("r-"), RunSpec: spec, PinnedImage: pinned, Status: api.RunQueued,
		Reason: "waiting for the scheduler", Attempts: []api.Attempt{}, CreatedAt: now, UpdatedAt: now}}
	if err := s.batch(r.Context(), func(tx store.Tx) error { return tx.CreateRun(run) }); err != nil {
		writeError(w, err)
		return
	}
	s.log.Info("run submitted", "run", run.ID, "image", pinned)
	s.wakeReconcile()
	writeJSON(w, http.StatusCreated, s.view(run, nil))
}

// view is the API's picture of a run: attempts on unreachable nodes show as
// unknown rather than as what was last heard.
func (s *Server) view(run store.Run, unreachable map[string]bool) api.Run {
	out := run.Run
	// A copy the caller owns, never nil: a queued run shows "attempts": [].
	out.Attempts = append([]api.Attempt{}, out.Attempts...)
	for i, a := range out.Attempts {
		if unreachable[a.NodeID] && lifecycle.Active(a) {
			out.Attempts[i].Status = api.AttemptUnknown
		}
	}
	return out
}

// unreachableNodes reports which nodes holding an active attempt of runs
// are not ready. It reads only those nodes: reading every node for every
// run shown cost a run view as much as the fleet is large.
func (s *Server) unreachableNodes(tx store.Tx, runs ...store.Run) (map[string]bool, error) {
	out := map[string]bool{}
	checked := map[string]bool{}
	for _, r := range runs {
		for _, a := range r.Attempts {
			if !lifecycle.Active(a) || checked[a.NodeID] {
				continue
			}
			checked[a.NodeID] = true
			n, err := tx.GetNode(a.NodeID)
			if errors.Is(err, failure.ErrNotFound) {
				out[a.NodeID] = true
				continue
			}
			if err != nil {
				return nil, err
			}
			if s.nodeStatus(n) != api.NodeReady {
				out[n.ID] = true
			}
		}
	}
	return out, nil
}

func (s *Server) readRun(ctx context.Context, id string) (api.Run, error) {
	var out api.Run
	err := s.store.View(ctx, func(tx store.Tx) error {
		run, err := tx.GetRun(id)
		if err != nil {
			return err
		}
		down, err := s.unreachableNodes(tx, run)
		out = s.view(run, down)
		return err
	})
	return out, err
}

func (s *Server) getRun(w http.ResponseWriter, r *http.Request) {
	run, err := s.readRun(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, run)
}

var runStatuses = map[string]bool{api.RunQueued: true, api.RunPlaced: true, api.RunPreparing: true, api.RunRunning: true, api.RunSucceeded: true, api.RunFailed: true, api.RunCancelled: true}

func (s *Server) listRuns(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	opts := store.ListRunsOptions{Before: q.Get("before"), Limit: 100}
	if v := q.Get("status"); v != "" {
		for _, st := range strings.Split(v, ",") {
			if !runStatuses[st] {
				writeError(w, failure.Invalid("status", "unknown status %q; use queued, placed, preparing, running, succeeded, failed or cancelled", st))
				return
			}
			opts.Statuses = append(opts.Statuses, st)
		}
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			writeError(w, failure.Invalid("limit", "must be an integer from 1 to 1000"))
			return
		}
		opts.Limit = n
	}
	out := api.RunList{Runs: []api.Run{}}
	err := s.store.View(r.Context(), func(tx store.Tx) error {
		runs, err := tx.ListRuns(opts)
		if err != nil {
			return err
		}
		down, err := s.unreachableNodes(tx, runs...)
		for _, run := range runs {
			out.Runs = append(out.Runs, s.view(run, down))
		}
		return err
	})
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// cancelRun requests cancellation: a queued run ends at once; a placed or
// running one gets a stop operation and ends when its node reports the exit.
func (s *Server) cancelRun(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var out store.Run
	var nodeID string
	err := s.update(r.Context(), func(tx store.Tx) error {
		run, err := tx.GetRun(id)
		if err != nil {
			return err
		}
		nodeID = ""
		if a := lifecycle.Cancel(&run.Run, s.now()); a != nil {
			nodeID = a.NodeID
			a.StopRequested = true
			if err := s.issue(tx, a.NodeID, node.Command{Kind: node.KindStopWorkload, StopWorkload: &capability.StopWorkloadCommand{
				WorkloadKey: capability.WorkloadKey{RunID: run.ID, Attempt: a.Number}, Reason: "cancelled", GracePeriod: 10 * time.Second}}); err != nil {
				return err
			}
		}
		out = run
		return tx.PutRun(run)
	})
	if err != nil {
		writeError(w, err)
		return
	}
	if nodeID != "" {
		s.nodeChanged(nodeID)
	}
	s.runsChanged()
	writeJSON(w, http.StatusOK, s.view(out, nil))
}

// waitRun answers when the run is terminal or the timeout (default 30s, at
// most 5m) passed, whichever is first.
func (s *Server) waitRun(w http.ResponseWriter, r *http.Request) {
	timeout := 30 * time.Second
	if v := r.URL.Query().Get("timeout"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || d > 5*time.Minute {
			writeError(w, failure.Invalid("timeout", "must be a duration from 0s to 5m, such as 30s"))
			return
		}
		timeout = d
	}
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	id := r.PathValue("id")
	for {
		changed := s.runs.Wait()
		run, err := s.readRun(r.Context(), id)
		if err != nil {
			writeError(w, err)
			return
		}
		if api.Terminal(run.Status) {
			writeJSON(w, http.StatusOK, run)
			return
		}
		select {
		case <-ctx.Done():
			writeJSON(w, http.StatusOK, run)
			return
		case <-changed:
		}
	}
}

// runLogs streams the latest attempt's output (or ?attempt=N's). With
// follow, it keeps streaming until the run is terminal and its node has
// delivered everything it read.
func (s *Server) runLogs(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	follow := q.Get("follow") == "true" || q.Get("follow") == "1"
	var offset int64
	if v := q.Get("offset"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			writeError(w, failure.Invalid("offset", "must be a non-negative integer"))
			return
		}
		offset = n
	}
	id := r.PathValue("id")
	run, err := s.readRun(r.Context(), id)
	if err != nil {
		writeError(w, err)
		return
	}
	attempt := len(run.Attempts)
	if v := q.Get("attempt"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > len(run.Attempts) {
			writeError(w, failure.Invalid("attempt", "run %s has attempts 1 to %d", id, len(run.Attempts)))
			return
		}
		attempt = n
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	ctx := r.Context()
	quiet := 0
	for {
		grown := s.logs.Wait()
		changed := s.runs.Wait()
		if attempt == 0 { // not placed yet: wait for the first attempt
			if run, err = s.readRun(ctx, id); err != nil {
				return
			}
			attempt = len(run.Attempts)
		}
		var data []byte
		if attempt > 0 {
			err := s.store.View(ctx, func(tx store.Tx) error {
				var err error
				data, _, err = tx.ReadLog(capability.WorkloadKey{RunID: id, Attempt: attempt}, offset, 1<<20)
				return err
			})
			if err != nil {
				return
			}
		}
		if len(data) > 0 {
			if _, err := w.Write(data); err != nil {
				return
			}
			offset += int64(len(data))
			if flusher != nil {
				flusher.Flush()
			}
			quiet = 0
			continue
		}
		if !follow {
			return
		}
		run, err = s.readRun(ctx, id)
		if err != nil {
			return
		}
		if api.Terminal(run.Status) && (attempt == len(run.Attempts)) {
			// The exit is reported after the output the node had read, so a
			// short grace covers only output still in flight.
			if quiet++; quiet > 2 {
				return
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-grown:
		case <-changed:
		case <-time.After(250 * time.Millisecond):
		}
	}
}
