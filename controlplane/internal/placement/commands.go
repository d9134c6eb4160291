package placement

import (
	"fmt"
	"time"

	"github.com/mercator/mercator/controlplane/internal/runsecrets"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// Launch is the launch of one attempt of run on the given GPUs, before its
// Artifacts are added (PrepareArtifacts). A gang member's launch carries
// the gang's size (which lets a node give it the host's network; its rank
// variables are package gang's).
func Launch(run store.Run, attempt int, gpus []string) nodeproto.Command {
	gangSize := 0
	if run.Nodes > 1 {
		gangSize = run.Nodes
	}
	return nodeproto.Command{Kind: nodeproto.KindLaunchWorkload, LaunchWorkload: &nodeproto.LaunchWorkloadCommand{
		WorkloadKey: nodeproto.WorkloadKey{RunID: run.ID, Attempt: attempt},
		Image:       run.PinnedImage, Command: run.Command, Env: run.Env,
		CPU: run.CPU, MemoryBytes: run.MemoryBytes, GPUs: gpus,
		Timeout:     time.Duration(run.TimeoutSeconds) * time.Second,
		SecretNames: runsecrets.Names(run), // the values are attached as it is sent
		User:        run.User, ReadOnlyRootfs: run.ReadOnlyRootfs, Network: run.Network, PidsLimit: run.PidsLimit,
		ReportProgress: true, // shown on the run (api.Attempt.Progress); older agents ignore it
		GangSize:       gangSize,
	}}
}

// AgentVersion is the capability version a node's agent needs to run
// run: its launch's and, with Artifacts, that of the prepare_artifact
// commands sent ahead of it (nodeproto.RequiredVersion). The scheduler
// places the run only on such nodes (scheduler.Run.MinAgentVersion), and
// TooOld checks the commands themselves again as they are issued.
func AgentVersion(run store.Run) int {
	need := nodeproto.RequiredVersion(Launch(run, 0, nil))
	if len(run.Artifacts) > 0 {
		need = max(need, nodeproto.RequiredVersion(nodeproto.Command{Kind: nodeproto.KindPrepareArtifact}))
	}
	return need
}

// TooOld is why a node whose agent speaks capability version have
// cannot take cmds (nodeproto.RequiredVersion), or "" when it can. Every
// agent speaks what version 1 defined, whatever its facts say.
func TooOld(nodeID string, have int, cmds []nodeproto.Command) string {
	need := 1
	for _, c := range cmds {
		need = max(need, nodeproto.RequiredVersion(c))
	}
	if need <= 1 || have >= need {
		return ""
	}
	return fmt.Sprintf("waiting: node %s runs an agent of capability version %d; this run needs %d or later (upgrade the agent)", nodeID, have, need)
}

// PrepareArtifacts adds a run's Artifacts to its launch and returns a
// prepare_artifact for every one the node does not report holding, for
// the caller to issue ahead of the launch, so the copies begin as soon as
// the node hears of them. The launch waits for them on the node either
// way. It reads the node and the Artifacts in tx.
func PrepareArtifacts(tx store.Tx, nodeID string, run store.Run, launch *nodeproto.LaunchWorkloadCommand) ([]nodeproto.Command, error) {
	if len(run.Artifacts) == 0 {
		return nil, nil
	}
	held := map[string]bool{}
	if n, err := tx.GetNode(nodeID); err == nil && n.Facts != nil {
		for _, a := range n.Facts.Artifacts {
			held[a.SHA256] = true
		}
	}
	var prepares []nodeproto.Command
	issued := map[string]bool{}
	for _, m := range run.Artifacts {
		v, err := tx.GetArtifact(m.Name, m.Version)
		if err != nil {
			return nil, fmt.Errorf("run %s: %w", run.ID, err)
		}
		prep := nodeproto.PrepareArtifactCommand{Name: v.Name, Version: v.Version, SHA256: v.SHA256, Size: v.Size, Format: v.Format}
		launch.Artifacts = append(launch.Artifacts, nodeproto.ArtifactMount{PrepareArtifactCommand: prep, MountPath: m.MountPath})
		if held[v.SHA256] || issued[v.SHA256] {
			continue
		}
		issued[v.SHA256] = true
		p := prep
		prepares = append(prepares, nodeproto.Command{Kind: nodeproto.KindPrepareArtifact, PrepareArtifact: &p})
	}
	return prepares, nil
}

// WithdrawLaunch settles, in tx, a still-pending launch of the attempt so
// it is not delivered when the node returns. A launch already delivered is
// not affected: the node reports the attempt and it is stopped as a stray.
func WithdrawLaunch(tx store.Tx, nodeID, runID string, attempt int, now time.Time) error {
	ops, err := tx.PendingOperations(nodeID)
	if err != nil {
		return err
	}
	for _, op := range ops {
		l := op.Command.LaunchWorkload
		if l == nil || l.RunID != runID || l.Attempt != attempt {
			continue
		}
		op.Result = &nodeproto.Result{OperationID: op.ID, Kind: op.Command.Kind, Outcome: nodeproto.OutcomeRefused, At: now,
			Error: "withdrawn by the control plane: the attempt was replaced while its node was unreachable"}
		if err := tx.PutOperation(op); err != nil {
			return err
		}
	}
	return nil
}
