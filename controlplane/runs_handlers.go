package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/gang"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/controlplane/internal/nodereport"
	"github.com/mercator/mercator/controlplane/internal/runsecrets"
	"github.com/mercator/mercator/controlplane/internal/submission"
	"github.com/mercator/mercator/controlplane/project"
	"github.com/mercator/mercator/controlplane/registry"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/lifecycle"
	"github.com/mercator/mercator/nodeproto"

	"github.com/mercator/mercator/store"
)

// submitRun validates a spec, pins its image, and stores a queued run. A
// spec that fails validation or pinning creates nothing.
func (s *Server) submitRun(w http.ResponseWriter, r *http.Request) {
	var spec api.RunSpec
	if err := httpapi.Decode(r, httpapi.MaxBody, &spec); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	keyed, err := submission.Of(r, spec)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if err := project.ScopeSubmit(r, &spec); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if keyed.AnswerEarlier(w, r, s.store.View, 1, true, s.render) {
		return
	}
	run, err := s.admitRun(r.Context(), spec, nil, keyed.ID(0))
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	runs, replay, err := keyed.Create(r.Context(), s.batch, s.store.View, []store.Run{run})
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if !replay {
		s.log.Info("run submitted", "run", runs[0].ID, "image", runs[0].PinnedImage)
		s.wakeReconcile()
	}
	submission.Answer(w, runs, replay, true, s.render)
}

// maxBatchBody bounds the body of POST /v1/runs/batch. It is not
// api.MaxRunBatch times httpapi.MaxBody: that would let one request make the
// server hold a gigabyte while it decodes. A sweep's specs are alike and
// small (well under 1 KiB each), so 64 KiB a run on average leaves ample
// room; a batch of larger specs is refused and must be split.
const maxBatchBody = api.MaxRunBatch * (64 << 10)

// submitRuns creates a batch of runs (POST /v1/runs/batch), all or none:
// every spec is admitted as submitRun admits one, in order, and the first
// that fails refuses the whole batch with its error, its field prefixed
// with runs[i]. The runs are created in one transaction and the reconcile
// loop is woken once. The answer lists the runs in the order of the specs.
func (s *Server) submitRuns(w http.ResponseWriter, r *http.Request) {
	var req api.RunBatch
	if err := httpapi.Decode(r, maxBatchBody, &req); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	switch n := len(req.Runs); {
	case n == 0:
		httpapi.WriteError(w, failure.Invalid("runs", "is empty; send at least one run spec"))
		return
	case n > api.MaxRunBatch:
		httpapi.WriteError(w, failure.Invalid("runs", "has %d run specs; a batch takes at most %d, so split it into calls of at most %d", n, api.MaxRunBatch, api.MaxRunBatch))
		return
	}
	keyed, err := submission.Of(r, req)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if keyed.AnswerEarlier(w, r, s.store.View, len(req.Runs), false, s.render) {
		return
	}
	runs := make([]store.Run, len(req.Runs))
	shared := &admission{pins: map[string]string{}, projects: map[string]bool{}}
	for i, spec := range req.Runs {
		if err := project.ScopeSubmit(r, &spec); err != nil {
			httpapi.WriteError(w, atBatchIndex(i, err))
			return
		}
		run, err := s.admitRun(r.Context(), spec, shared, keyed.ID(i))
		if err != nil {
			httpapi.WriteError(w, atBatchIndex(i, err))
			return
		}
		runs[i] = run
	}
	runs, replay, err := keyed.Create(r.Context(), s.batch, s.store.View, runs)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if !replay {
		s.log.Info("runs submitted", "count", len(runs), "first", runs[0].ID, "last", runs[len(runs)-1].ID)
		s.wakeReconcile()
	}
	submission.Answer(w, runs, replay, false, s.render)
}

// admitRun is what a submission asks of one spec before anything is
// stored: it validates the spec (ValidateRunSpec), resolves its Artifacts
// to exact versions, pins its image to a digest and seals its secrets, and
// returns the queued run to create, with the ID id (a keyed submission's,
// submission.Key.ID) or, when id is "", a new one. It stores nothing; an
// error (of the kind validation or resolution gave) means the spec is
// refused.
//
// shared, when not nil, is what the specs of one submission share (see
// admission) and is added to; nil checks and pins everything afresh
// (pinCache still spares a digest reference the registry).
func (s *Server) admitRun(ctx context.Context, spec api.RunSpec, shared *admission, id string) (store.Run, error) {
	if err := ValidateRunSpec(&spec); err != nil {
		return store.Run{}, err
	}
	if err := s.cfg.Retention.CheckLogLimit(spec); err != nil {
		return store.Run{}, err
	}
	if time.Duration(spec.GraceSeconds)*time.Second > s.cfg.MaxGrace {
		return store.Run{}, failure.Invalid("grace_seconds", "%d s is more than this control plane's maximum grace period, %s", spec.GraceSeconds, s.cfg.MaxGrace)
	}
	spec.Project = api.ProjectOf(spec.Project)
	if shared == nil || !shared.projects[spec.Project] {
		if err := s.store.View(ctx, func(tx store.Tx) error { return project.Exists(tx, "project", spec.Project) }); err != nil {
			return store.Run{}, err
		}
		if shared != nil {
			shared.projects[spec.Project] = true
		}
	}
	ctx, cancel := context.WithTimeout(registry.WithProject(ctx, spec.Project), 30*time.Second) // its tag resolved with its project's credential
	defer cancel()
	if err := s.resolveArtifacts(ctx, &spec); err != nil {
		return store.Run{}, err
	}
	var pinned string
	if shared != nil {
		pinned = shared.pins[spec.Image]
	}
	if pinned == "" {
		var err error
		if pinned, err = s.pins.resolve(ctx, s.resolver, spec.Image, s.now()); err != nil {
			return store.Run{}, err
		}
		if shared != nil {
			shared.pins[spec.Image] = pinned
		}
	}
	if id == "" {
		id = httpapi.NewID("r-")
	}
	now := s.now()
	run := store.Run{Run: api.Run{ID: id, RunSpec: spec, PinnedImage: pinned, Status: api.RunQueued,
		Reason: "waiting for the scheduler", Attempts: []api.Attempt{}, CreatedAt: now, UpdatedAt: now}}
	if err := runsecrets.Seal(serverKey{s}, &run); err != nil {
		return store.Run{}, err
	}
	return run, nil
}

// admission is what the specs of one submission share, filled as they are
// admitted: the digests already pinned, by reference (a batch of a
// thousand runs of one tag asks the registry once, and every run of the
// batch gets the same digest even if the tag moves meanwhile), and the
// projects already found to exist (a batch of a hundred runs of one
// project reads it once: a read each was a transaction each, three round
// trips on PostgreSQL).
type admission struct {
	pins     map[string]string
	projects map[string]bool
}

// atBatchIndex names spec i of a batch in err: a *failure.Error's field
// becomes runs[i].field (runs[i] when it named none), keeping its kind and
// message, so the client sees the same error shape a single submission
// gets, with the index in it. Any other error is wrapped with the index.
func atBatchIndex(i int, err error) error {
	field := fmt.Sprintf("runs[%d]", i)
	var fe *failure.Error
	if !errors.As(err, &fe) {
		return fmt.Errorf("%s: %w", field, err)
	}
	if fe.Field != "" {
		field += "." + fe.Field
	}
	return &failure.Error{Kind: fe.Kind, Field: field, Message: fe.Message}
}

// render is view for a run just submitted.
func (s *Server) render(run store.Run) api.Run { return s.view(run, nil) }

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
	if pos, ok := s.queue.Position(run.ID); ok && run.Status == api.RunQueued {
		out.Queue = &pos
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
		httpapi.WriteError(w, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, run)
}

var runStatuses = map[string]bool{api.RunQueued: true, api.RunPlaced: true, api.RunPreparing: true, api.RunRunning: true, api.RunSucceeded: true, api.RunFailed: true, api.RunCancelled: true}

func (s *Server) listRuns(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	opts := store.ListRunsOptions{Before: q.Get("before"), Limit: 100}
	if v := q.Get("status"); v != "" {
		for _, st := range strings.Split(v, ",") {
			if !runStatuses[st] {
				httpapi.WriteError(w, failure.Invalid("status", "unknown status %q; use queued, placed, preparing, running, succeeded, failed or cancelled", st))
				return
			}
			opts.Statuses = append(opts.Statuses, st)
		}
	}
	if v := q.Get("project"); v != "" {
		if err := api.ValidateProjectName("project", v); err != nil {
			httpapi.WriteError(w, err)
			return
		}
		opts.Project = v
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			httpapi.WriteError(w, failure.Invalid("limit", "must be an integer from 1 to 1000"))
			return
		}
		opts.Limit = n
	}
	if err := project.ScopeList(r, &opts); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if v := q.Get("queue"); v != "" {
		s.listQueue(w, r, opts)
		return
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
		httpapi.WriteError(w, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
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
			if err := s.issue(tx, a.NodeID, nodeproto.Command{Kind: nodeproto.KindStopWorkload, StopWorkload: &nodeproto.StopWorkloadCommand{
				WorkloadKey: nodeproto.WorkloadKey{RunID: run.ID, Attempt: a.Number}, Reason: "cancelled", GracePeriod: nodereport.GraceOf(run)}}); err != nil {
				return err
			}
			if _, err := s.stopStrays(tx, &run.Run, a.NodeID); err != nil { // a gang's other members
				return err
			}
		}
		out = run
		return tx.PutRun(run)
	})
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if nodeID != "" {
		s.nodeChanged(nodeID)
	}
	s.runsChanged()
	httpapi.WriteJSON(w, http.StatusOK, s.view(out, nil))
}

// waitRun answers when the run is terminal or the timeout (default 30s, at
// most 5m) passed, whichever is first.
func (s *Server) waitRun(w http.ResponseWriter, r *http.Request) {
	timeout := 30 * time.Second
	if v := r.URL.Query().Get("timeout"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || d > 5*time.Minute {
			httpapi.WriteError(w, failure.Invalid("timeout", "must be a duration from 0s to 5m, such as 30s"))
			return
		}
		timeout = d
	}
	// changed_since: answer at the run's next change too (a client
	// showing progress), not only at its end.
	var since *time.Time
	if v := r.URL.Query().Get("changed_since"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			httpapi.WriteError(w, failure.Invalid("changed_since", "must be an RFC 3339 time, such as a run's updated_at, got %q", v))
			return
		}
		since = &t
	}
	ctx, cancel := context.WithTimeout(r.Context(), timeout)
	defer cancel()
	id := r.PathValue("id")
	for {
		changed := s.runs.Wait()
		run, err := s.readRun(r.Context(), id)
		if err != nil {
			httpapi.WriteError(w, err)
			return
		}
		if api.Terminal(run.Status) || (since != nil && run.UpdatedAt.After(*since)) {
			httpapi.WriteJSON(w, http.StatusOK, run)
			return
		}
		select {
		case <-ctx.Done():
			httpapi.WriteJSON(w, http.StatusOK, run)
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
			httpapi.WriteError(w, failure.Invalid("offset", "must be a non-negative integer"))
			return
		}
		offset = n
	}
	id := r.PathValue("id")
	run, err := s.readRun(r.Context(), id)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	attempt, err := gang.LogAttempt(run, q.Get("attempt"), q.Get("rank"))
	if err != nil {
		httpapi.WriteError(w, err)
		return
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
			attempt, _ = gang.LogAttempt(run, q.Get("attempt"), q.Get("rank"))
		}
		var data []byte
		if attempt > 0 {
			err := s.store.View(ctx, func(tx store.Tx) error {
				var err error
				data, _, err = tx.ReadLog(nodeproto.WorkloadKey{RunID: id, Attempt: attempt}, offset, 1<<20)
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
		if api.Terminal(run.Status) && (attempt == len(run.Attempts) || lifecycle.Gang(&run)) {
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
