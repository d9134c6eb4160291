// Package gang turns the scheduler's plan for a gang run (issue 18,
// docs/gpus.md "Gang runs") into what the control plane commits: the
// plan's placements grouped into units that commit whole (Units, Chunks: a
// gang's members are never split across transactions), the rendezvous
// address (MasterAddr) and each member's launch with its rank variables
// (Env, Launch), and which member's log a request for a gang's logs asks
// for (LogAttempt). The run's state across its attempt sets is package
// lifecycle's (gang.go); this package decides nothing about it and does no
// I/O. Only package controlplane imports it.
package gang

import (
	"maps"
	"strconv"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/placement"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/scheduler"
	"github.com/mercator/mercator/store"
)

// Units splits a plan's placements into what commits together: a single
// run's placement alone, a gang's members (the scheduler appends them one
// after another, in rank order) together.
func Units(placements []scheduler.Placement) [][]scheduler.Placement {
	var out [][]scheduler.Placement
	for i := 0; i < len(placements); {
		j := i + 1
		for j < len(placements) && placements[j].RunID == placements[i].RunID && placements[j].Rank > 0 {
			j++
		}
		out = append(out, placements[i:j])
		i = j
	}
	return out
}

// Chunks groups the placements into chunks of about size placements each,
// never splitting a gang: a chunk holding part of a gang would commit some
// members and leave the others to a transaction that may fail.
func Chunks(placements []scheduler.Placement, size int) [][]scheduler.Placement {
	var out [][]scheduler.Placement
	start, n := 0, 0
	for _, u := range Units(placements) {
		if n += len(u); n >= size {
			out = append(out, placements[start:start+n:start+n])
			start, n = start+n, 0
		}
	}
	if n > 0 {
		out = append(out, placements[start:start+n:start+n])
	}
	return out
}

// MasterAddr is where the other members reach rank 0: the host name its
// node reported in its facts (the machine's own name, which members on
// the hosts' network resolve), or the node's ID when it reported none.
func MasterAddr(n store.Node) string {
	if n.Facts != nil && n.Facts.Hostname != "" {
		return n.Facts.Hostname
	}
	return n.ID
}

// Port is the gang's rendezvous port: the run's, or api.DefaultMasterPort.
func Port(run store.Run) int {
	if run.MasterPort > 0 {
		return run.MasterPort
	}
	return api.DefaultMasterPort
}

// Env is member rank's environment: the run's Env with the rank variables
// over it, Mercator's names and those PyTorch's launcher reads
// (torch.distributed's env:// rendezvous). LOCAL_WORLD_SIZE is the
// member's GPUs (one process per GPU on its node; 1 without GPUs), and
// LOCAL_RANK is left to the program's own launcher (torchrun sets it).
func Env(run store.Run, rank int, master string) map[string]string {
	env := make(map[string]string, len(run.Env)+9)
	maps.Copy(env, run.Env)
	size, port := strconv.Itoa(run.Nodes), strconv.Itoa(Port(run))
	local := strconv.Itoa(max(run.GPUs, 1))
	for _, kv := range [][2]string{
		{"MERCATOR_RANK", strconv.Itoa(rank)}, {"MERCATOR_WORLD_SIZE", size},
		{"MERCATOR_MASTER_ADDR", master}, {"MERCATOR_MASTER_PORT", port},
		{"RANK", strconv.Itoa(rank)}, {"WORLD_SIZE", size}, {"MASTER_ADDR", master}, {"MASTER_PORT", port},
		{"LOCAL_WORLD_SIZE", local},
	} {
		env[kv[0]] = kv[1]
	}
	return env
}

// Launch is member rank's launch as attempt number attempt on gpus:
// placement.Launch (which carries the gang's size) with the rank
// variables.
func Launch(run store.Run, attempt, rank int, gpus []string, master string) nodeproto.Command {
	cmd := placement.Launch(run, attempt, gpus)
	cmd.LaunchWorkload.Env = Env(run, rank, master)
	return cmd
}
