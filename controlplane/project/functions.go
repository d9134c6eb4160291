package project

import (
	"context"
	"slices"
	"strings"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/nodeproto"
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
			counts[c.FnID] += holding(c)
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
			cpu, mem := held(fn)
			u := out[projectOf[fn.AppID]]
			u.CPU += float64(n) * cpu
			u.MemoryBytes += int64(n) * mem
			out[projectOf[fn.AppID]] = u
		}
		return nil
	})
	return out, err
}

// held is what one container of fn reserves.
func held(fn store.Fn) (cpu float64, memoryBytes int64) {
	mem := fn.Memory
	if mem == 0 {
		mem = api.FnDefaultMemoryMB
	}
	return fn.CPU, int64(mem) << 20
}

// holding is how many of a node's containers of one function hold a
// reservation.
func holding(c nodeproto.FunctionContainers) int {
	return c.Idle + c.Busy + c.Starting // Idle includes Paused
}

// Reservations is project's function reservation by node, ordered by
// node: what FunctionUse sums, node by node (GET /v1/projects/{name}). It
// walks nodes once (a field test per node without function containers)
// and reads only the project's apps and their functions, so its cost is
// the fleet's length plus the project's functions, not the fleet's
// containers times the store.
func Reservations(tx store.Tx, project string, nodes []store.Node) ([]api.FunctionReservation, error) {
	any := slices.ContainsFunc(nodes, func(n store.Node) bool {
		return n.Facts != nil && n.Facts.Functions != nil && len(n.Facts.Functions.Containers) > 0
	})
	if !any {
		return nil, nil
	}
	apps, err := tx.ListApps(store.ListFnOptions{})
	if err != nil {
		return nil, err
	}
	type hold struct {
		cpu float64
		mem int64
	}
	fns := map[string]hold{}
	for _, a := range apps {
		if api.ProjectOf(a.Project) != project {
			continue
		}
		fs, err := tx.ListFns(store.ListFnOptions{AppID: a.ID})
		if err != nil {
			return nil, err
		}
		for _, fn := range fs {
			cpu, mem := held(fn)
			fns[fn.ID] = hold{cpu, mem}
		}
	}
	var out []api.FunctionReservation
	for _, n := range nodes {
		if len(fns) == 0 || n.Facts == nil || n.Facts.Functions == nil {
			continue
		}
		r := api.FunctionReservation{Node: n.ID}
		for _, c := range n.Facts.Functions.Containers {
			if h, ok := fns[c.FnID]; ok {
				k := holding(c)
				r.Containers += k
				r.CPU += float64(k) * h.cpu
				r.MemoryBytes += int64(k) * h.mem
			}
		}
		if r.Containers > 0 {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b api.FunctionReservation) int { return strings.Compare(a.Node, b.Node) })
	return out, nil
}
