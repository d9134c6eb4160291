package dockerruntime

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	"github.com/mercator/mercator/dockerengine"
	"github.com/mercator/mercator/nodeproto"
)

// Observe reports every Mercator container this daemon knows about, running
// or exited, and when each of them really started. It is the node's own
// authority: the control plane learns that a process began and ended here,
// whatever the application did or did not report.
//
// The start moment is a second read, because `docker ps` does not carry it
// in any format: the daemon reports State.StartedAt only on inspect. The
// node-agent design asks for one inspect for the whole list rather than one per
// container. The Engine API has no batch inspect (the CLI's `docker inspect
// a b c` is one request per name too), so the intent is kept the way it can
// be: one list, then the inspects for all of it at once, at most eight in
// flight, so a machine with many exited attempts costs one round trip's
// latency, not one per container.
//
// What each observation says:
//
//   - Phase: "created", "running" (also paused or restarting: the process
//     exists), "exited" (also "removing": it ran and ended), or "failed" for
//     a container that was created but could not start (the daemon states
//     an error and it never ran) and for one the daemon marked "dead",
//     whose end the daemon could not complete; Error then says why.
//   - ExitCode only when exited; OOMKilled as the daemon states it.
//   - StartedAt and FinishedAt are the daemon's moments, nil where the daemon
//     states none (its zero time); FinishedAt only once the container is no
//     longer running. An exited container never has FinishedAt before
//     StartedAt: older daemons stamp the start late, and where that puts it
//     after the exit, the exit moment is reported as the start too.
//   - Timeout and Image from the container's own labels.
//
// A container that vanished between the list and its inspect is skipped:
// it is gone, and the agent reports what it last told the control plane
// about it as missing. A container whose Mercator labels do not parse was
// not made by Mercator and is skipped too.
//
// A moment the daemon does state and this runtime cannot read fails the
// whole read instead, which is the same answer the Docker adapter gives to
// the same daemon: reporting it absent would publish no start for any
// container on this machine and degrade every start-latency row on the only
// reusable lane there is, with nothing anywhere saying that is what
// happened. Any other failed inspect fails the read too, because only the
// inspect carries the exit code: the next observation asks again and loses
// nothing, while a partial one would report an exit with no code.
//
// The result is sorted by run and attempt; the caller owns it.
func (docker *Runtime) Observe(ctx context.Context) ([]nodeproto.WorkloadObservation, error) {
	filter := filters.NewArgs()
	if docker.nodeID != "" {
		filter.Add("label", dockerengine.LabelNode+"="+docker.nodeID)
	} else {
		filter.Add("label", dockerengine.LabelRun)
	}
	list, err := docker.api.ContainerList(ctx, container.ListOptions{All: true, Filters: filter})
	if err != nil {
		return nil, daemonError(err, "list containers")
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		observation nodeproto.WorkloadObservation
		ok          bool
		err         error
	}
	results := make([]result, len(list))
	limit := make(chan struct{}, observeConcurrency)
	var wg sync.WaitGroup
	for i, summary := range list {
		if _, ok := workloadKey(summary.Labels); !ok {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case limit <- struct{}{}:
			case <-ctx.Done():
				results[i].err = ctx.Err()
				return
			}
			defer func() { <-limit }()
			info, err := docker.api.ContainerInspect(ctx, summary.ID)
			if cerrdefs.IsNotFound(err) {
				return
			}
			if err != nil {
				results[i].err = daemonError(err, "inspect container %s", summary.ID)
				cancel()
				return
			}
			observation, ok, err := docker.observation(info)
			if err != nil {
				cancel()
			}
			results[i] = result{observation: observation, ok: ok, err: err}
		}()
	}
	wg.Wait()

	observations := make([]nodeproto.WorkloadObservation, 0, len(list))
	var firstErr error
	for _, r := range results {
		if r.err != nil && (firstErr == nil || errors.Is(firstErr, context.Canceled)) {
			// A sibling's cancellation is noise; the error that caused it
			// is the one worth returning.
			firstErr = r.err
		}
		if r.ok {
			observations = append(observations, r.observation)
		}
	}
	if firstErr != nil {
		return nil, firstErr
	}
	sort.Slice(observations, func(i, j int) bool {
		a, b := observations[i].WorkloadKey, observations[j].WorkloadKey
		if a.RunID != b.RunID {
			return a.RunID < b.RunID
		}
		return a.Attempt < b.Attempt
	})
	docker.withGPUUsage(observations) // gpus.go
	return observations, nil
}

// workloadKey reads the attempt a container belongs to from its labels.
func workloadKey(labels map[string]string) (nodeproto.WorkloadKey, bool) {
	run, ok := labels[dockerengine.LabelRun]
	if !ok || run == "" {
		return nodeproto.WorkloadKey{}, false
	}
	attempt, err := strconv.Atoi(labels[dockerengine.LabelAttempt])
	if err != nil {
		return nodeproto.WorkloadKey{}, false
	}
	return nodeproto.WorkloadKey{RunID: run, Attempt: attempt}, true
}

// observation maps one inspected container. ok is false for a container
// that is not Mercator's after all (its labels do not parse, or it belongs
// to another node).
func (docker *Runtime) observation(info container.InspectResponse) (nodeproto.WorkloadObservation, bool, error) {
	labels := containerLabels(info)
	key, ok := workloadKey(labels)
	if !ok || info.ContainerJSONBase == nil || info.State == nil || labels[dockerengine.LabelNode] != docker.nodeID && docker.nodeID != "" {
		return nodeproto.WorkloadObservation{}, false, nil
	}
	var timeout time.Duration
	if raw, ok := labels[dockerengine.LabelTimeout]; ok {
		ns, err := strconv.ParseInt(raw, 10, 64)
		if err != nil || ns < 0 {
			return nodeproto.WorkloadObservation{}, false, nil
		}
		timeout = time.Duration(ns)
	}
	name := strings.TrimPrefix(info.Name, "/")
	startedAt, err := daemonTime(info.State.StartedAt)
	if err != nil {
		return nodeproto.WorkloadObservation{}, false, fmt.Errorf("container %s: the daemon's StartedAt %q: %w", name, info.State.StartedAt, err)
	}
	finishedAt, err := daemonTime(info.State.FinishedAt)
	if err != nil {
		return nodeproto.WorkloadObservation{}, false, fmt.Errorf("container %s: the daemon's FinishedAt %q: %w", name, info.State.FinishedAt, err)
	}
	image := labels[dockerengine.LabelImage]
	if image == "" && info.Config != nil {
		image = info.Config.Image
	}
	o := nodeproto.WorkloadObservation{
		WorkloadKey: key,
		ContainerID: info.ID,
		Image:       image,
		OOMKilled:   info.State.OOMKilled,
		StartedAt:   startedAt,
		Timeout:     timeout,
	}
	if info.HostConfig != nil {
		for _, d := range info.HostConfig.DeviceRequests {
			o.GPUs = append(o.GPUs, d.DeviceIDs...)
		}
	}
	state := info.State
	switch state.Status {
	case container.StateRunning, container.StatePaused, container.StateRestarting:
		o.Phase = nodeproto.PhaseRunning
	case container.StateExited, container.StateRemoving:
		o.Phase = nodeproto.PhaseExited
		code := state.ExitCode
		o.ExitCode = &code
		o.FinishedAt = finishedAt
		if startedAt != nil && finishedAt != nil && finishedAt.Before(*startedAt) {
			// Docker before 25 stamps StartedAt only after the start
			// call returns, so a process that exits at once can show a
			// StartedAt after its FinishedAt (moby/moby#45445, fixed by
			// moby/moby#47003). The exit moment is the accurate one and the
			// process cannot have started after it, so the daemon's own
			// FinishedAt is the tightest start moment it states.
			clamped := *finishedAt
			o.StartedAt = &clamped
		}
	case container.StateCreated:
		o.Phase = nodeproto.PhaseCreated
		if state.Error != "" {
			// A start that failed leaves the container "created" with the
			// runtime's error; it will never run unless started again.
			o.Phase = nodeproto.PhaseFailed
			o.Error = state.Error
			o.FinishedAt = finishedAt
		}
	case container.StateDead:
		o.Phase = nodeproto.PhaseFailed
		o.Error = "the daemon marked the container dead"
		if state.Error != "" {
			o.Error += ": " + state.Error
		}
		o.FinishedAt = finishedAt
	default:
		o.Phase = nodeproto.PhaseFailed
		o.Error = fmt.Sprintf("the daemon reports an unknown state %q", state.Status)
	}
	return o, true, nil
}

// daemonTime reads one of the daemon's moments. The daemon writes
// RFC 3339 with nanoseconds, and its zero time ("0001-01-01T00:00:00Z") for
// a moment that has not happened, which is reported as nil.
func daemonTime(s string) (*time.Time, error) {
	if s == "" {
		return nil, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return nil, err
	}
	if t.IsZero() {
		return nil, nil
	}
	return &t, nil
}
