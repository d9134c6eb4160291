package project

import (
	"context"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/store"
)

// FunctionUse is what function containers hold, by project: each
// container of a function reserves its CPU and memory in its node's
// function share (as its agent last reported), and counts against the
// project of its function's app (docs/teams.md). Nodes without function
// containers cost nothing; with some, the apps and functions are read once.
type FunctionUse struct {
	CPU         float64
	MemoryBytes int64
}

// FunctionUses reads what FunctionUse says from the nodes' records and st.
func FunctionUses(ctx context.Context, st store.Store, nodes []store.Node) (map[string]FunctionUse, error) {
	counts := map[string]int{} // function ID → containers holding a reservation
	for _, n := range nodes {
		if n.Facts == nil || n.Facts.Functions == nil {
			continue
		}
		for _, c := range n.Facts.Functions.Containers {
			counts[c.FnID] += c.Idle + c.Busy + c.Starting // Idle includes Paused
		}
	}
	if len(counts) == 0 {
		return nil, nil
	}
	out := map[string]FunctionUse{}
	err := st.View(ctx, func(tx store.Tx) error {
		apps, err := tx.ListApps(store.ListFnOptions{})
		if err != nil {
			return err
		}
		projectOf := make(map[string]string, len(apps))
		for _, a := range apps {
			projectOf[a.ID] = api.ProjectOf(a.Project)
		}
		fns, err := tx.ListFns(store.ListFnOptions{})
		if err != nil {
			return err
		}
		for _, fn := range fns {
			n := counts[fn.ID]
			if n == 0 {
				continue
			}
			mem := fn.Memory
			if mem == 0 {
				mem = api.FnDefaultMemoryMB
			}
			u := out[projectOf[fn.AppID]]
			u.CPU += float64(n) * fn.CPU
			u.MemoryBytes += int64(n) * int64(mem) << 20
			out[projectOf[fn.AppID]] = u
		}
		return nil
	})
	return out, err
}
