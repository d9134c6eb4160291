package dockerruntime

import (
	"context"
	"time"

	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"

	"github.com/mercator/mercator/dockerengine"
)

// Changes implements ChangeSource from the daemon's event stream, filtered
// to this node's containers and to the lifecycle actions that change what
// Observe reports. When the stream breaks (the daemon restarted) it is
// reopened after a second, and a signal is sent on reopening, because events
// during the gap were missed.
func (docker *Runtime) Changes(ctx context.Context) <-chan struct{} {
	out := make(chan struct{}, 1)
	signal := func() {
		select {
		case out <- struct{}{}:
		default:
		}
	}
	go func() {
		defer close(out)
		for ctx.Err() == nil {
			// dockerengine.LabelRun always, so function containers pausing and
			// unpausing never wake Observe.
			f := filters.NewArgs(filters.Arg("type", "container"), filters.Arg("label", dockerengine.LabelRun))
			if docker.nodeID != "" {
				f.Add("label", dockerengine.LabelNode+"="+docker.nodeID)
			}
			for _, action := range []string{"create", "start", "die", "oom", "destroy", "pause", "unpause"} {
				f.Add("event", action)
			}
			streamCtx, cancel := context.WithCancel(ctx)
			msgs, errs := docker.api.Events(streamCtx, events.ListOptions{Filters: f})
			signal()
		read:
			for {
				select {
				case <-ctx.Done():
					cancel()
					return
				case _, ok := <-msgs:
					if !ok {
						break read
					}
					signal()
				case <-errs:
					break read
				}
			}
			cancel()
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
		}
	}()
	return out
}
