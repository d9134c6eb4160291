package fnagent

import (
	"context"
	"errors"
	"fmt"
	"slices"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"

	"github.com/mercator/mercator/dockerengine"
)

// ensureImage makes the daemon hold ref, pulling it if needed within the
// engine's PullTimeout, and returns the image's command (imageCommand).
// Pulls belong to the engine, not to a call (e.pulls keeps them), so none
// is abandoned because the call that started it gave up: the next call
// wants the image too. Errors are KindImagePull or KindImagePullTimeout.
//
// An image the daemon was seen to hold is not asked about again (a
// daemon round trip off a cold start's path): ref is pinned by digest,
// so what it names cannot change, and a launch that finds it removed
// behind the engine's back forgets it and checks again (create).
func (e *Engine) ensureImage(ctx context.Context, ref, auth string) ([]string, error) {
	e.mu.Lock()
	command, known := e.present[ref]
	e.mu.Unlock()
	if known {
		return command, nil
	}
	command, err := e.fetchImage(ctx, ref, auth)
	if err == nil {
		e.mu.Lock()
		if len(e.present) >= maxPresentImages {
			clear(e.present) // a bound, not a cache policy: the next launches ask again
		}
		e.present[ref] = command
		e.mu.Unlock()
	}
	return command, err
}

// maxPresentImages bounds the images ensureImage remembers.
const maxPresentImages = 4096

// forgetImage makes the next ensureImage of ref ask the daemon again.
func (e *Engine) forgetImage(ref string) {
	e.mu.Lock()
	delete(e.present, ref)
	e.mu.Unlock()
}

// fetchImage is ensureImage without its memory: an inspect, and a pull
// when the daemon holds no such image, then an inspect of what it pulled.
func (e *Engine) fetchImage(ctx context.Context, ref, auth string) ([]string, error) {
	if info, err := e.api.ImageInspect(ctx, ref); err == nil {
		return imageCommand(info), nil
	} else if !cerrdefs.IsNotFound(err) {
		return nil, callErr(KindImagePull, err, "inspect image %s: %v", ref, err)
	}
	err := e.pulls.Do(ctx, ref, func(context.Context) error {
		pullCtx, cancel := context.WithTimeout(e.ctx, e.cfg.PullTimeout)
		defer cancel()
		err := dockerengine.Pull(pullCtx, e.api, ref, auth)
		if err != nil && errors.Is(pullCtx.Err(), context.DeadlineExceeded) {
			return callErr(KindImagePullTimeout, err, "pull image %s: not done within %v", ref, e.cfg.PullTimeout)
		} else if err != nil {
			return callErr(KindImagePull, err, "pull image %s: %v", ref, err)
		}
		return nil
	})
	if err != nil && err == ctx.Err() {
		return nil, callErr(KindImagePull, err, "pull image %s: %v", ref, err)
	}
	if err != nil {
		return nil, err
	}
	info, err := e.api.ImageInspect(ctx, ref)
	if err != nil {
		return nil, callErr(KindImagePull, err, "pull image %s: the daemon reported success but does not hold the image: %v", ref, err)
	}
	return imageCommand(info), nil
}

// imageCommand is what a container of an image runs when it states no
// entrypoint or command of its own: the image's entrypoint followed by its
// command, as Docker joins them (the output relay runs it in the relay's
// place, outputrelay). nil for an image that states neither.
func imageCommand(info image.InspectResponse) []string {
	if info.Config == nil {
		return nil
	}
	return append(slices.Clone(info.Config.Entrypoint), info.Config.Cmd...)
}

// containerName is "mercator-fn-<fn ID, made safe, at most 40 bytes>-<random>".
func containerName(fnID, suffix string) string {
	safe, _ := dockerengine.SafeName(fnID, 40)
	return "mercator-fn-" + safe + "-" + suffix
}

// RemoveOrphans removes function containers on this node (by
// dockerengine.LabelNode, or every container with dockerengine.LabelFn
// when NodeID is empty) that this engine did not start: those a previous
// agent left behind. A hot container cannot be adopted, since its socket
// directory and the calls it was serving belong to the process that died.
// The network namespace holders (dockerengine.LabelHolder) that are not
// this engine's go too, and are not counted. The agent calls it once at
// startup. It returns how many function containers it removed.
func (e *Engine) RemoveOrphans(ctx context.Context) (int, error) {
	e.mu.Lock()
	ours := map[string]bool{}
	for c := range e.containers {
		ours[c.id] = true
		if c.holder != "" {
			ours[c.holder] = true
		}
	}
	for _, id := range e.netnsPool {
		ours[id] = true
	}
	e.mu.Unlock()
	removed, err := e.removeLeft(ctx, dockerengine.LabelFn, ours)
	if err != nil {
		return removed, fmt.Errorf("remove orphaned function containers: %w", err)
	}
	holders, err := e.removeLeft(ctx, dockerengine.LabelHolder, ours)
	if err != nil {
		return removed, fmt.Errorf("remove orphaned network namespace holders: %w", err)
	}
	if holders > 0 {
		e.log.Info("removed network namespace holders a previous agent left", "count", holders)
	}
	return removed, nil
}

// removeLeft removes the containers carrying label on this node (by
// dockerengine.LabelNode; with no NodeID, those with no node label) that
// are not among ours, and returns how many it removed. One whose removal
// is under way already (the daemon answers a conflict) is left to it.
func (e *Engine) removeLeft(ctx context.Context, label string, ours map[string]bool) (int, error) {
	args := filters.NewArgs(filters.Arg("label", label))
	if e.cfg.NodeID != "" {
		args.Add("label", dockerengine.LabelNode+"="+e.cfg.NodeID)
	}
	list, err := e.api.ContainerList(ctx, container.ListOptions{All: true, Filters: args})
	if err != nil {
		return 0, fmt.Errorf("list: %w", err)
	}
	removed := 0
	for _, c := range list {
		if ours[c.ID] || e.pooledHolder(c.Labels) || e.cfg.NodeID == "" && c.Labels[dockerengine.LabelNode] != "" {
			continue
		}
		err := e.api.ContainerRemove(ctx, c.ID, container.RemoveOptions{Force: true})
		if cerrdefs.IsConflict(err) {
			continue // "removal already in progress": someone else's removal
		}
		if err != nil && !cerrdefs.IsNotFound(err) {
			return removed, fmt.Errorf("remove %s: %w", c.ID, err)
		}
		removed++
	}
	return removed, nil
}
