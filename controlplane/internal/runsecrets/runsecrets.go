// Package runsecrets keeps a Run's secrets (api.RunSpec.Secrets) sealed
// at rest with the machinery that seals functions' secret configuration
// and registry passwords (package controlplane/internal/sealing, under the
// server's key), and opens them only to send a launch.
//
// A secret is sealed as the run is admitted (Seal), bound to the run's ID
// and the secret's name, and stored only so (store.Run.SealedSecrets; the
// store refuses a run carrying one in the clear). Every read shows the
// names, each with api.SecretRedacted, because the store reads them back
// so. A launch is stored with the names only (Names, into
// nodeproto.LaunchWorkloadCommand.SecretNames); the values are opened each
// time the launch is sent down the node's session (Attach), so they exist
// in the clear only in the control plane's memory on the way to the one
// node that runs the attempt, and are sent again with a launch redelivered
// after that node's agent restarted. Nothing here logs a value.
//
// Only package controlplane imports it.
package runsecrets

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"

	"github.com/mercator/mercator/controlplane/internal/sealing"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// Sealer seals and opens values under the server's key, as
// sealing.Seal and sealing.Unseal do.
type Sealer interface {
	Seal(ad []byte, plain string) ([]byte, error)
	Unseal(ad, sealed []byte) (string, error)
}

// sealingData binds a sealed run secret to its run and its name, so a
// sealed value copied into another run, or under another name, does not
// open. Its prefix tells it apart from function secrets' data.
func sealingData(runID, name string) []byte {
	return []byte("mercator run secret\x00" + runID + "\x00" + name)
}

// Seal seals run.Secrets, which hold the values as submitted, into
// run.SealedSecrets and leaves Secrets as every read shows them. It fails
// with the sealer's error (failure.ErrUnavailable when the server has no
// key); run is then unusable.
func Seal(key Sealer, run *store.Run) error {
	if len(run.Secrets) == 0 {
		return nil
	}
	sealed := make(map[string][]byte, len(run.Secrets))
	for name, v := range run.Secrets {
		b, err := key.Seal(sealingData(run.ID, name), v)
		if err != nil {
			return err
		}
		sealed[name] = b
	}
	run.SealedSecrets = sealed
	run.Secrets = store.RedactedSecrets(sealed)
	return nil
}

// Names is what a launch of run carries in place of its secrets: their
// names, sorted, so the stored command says the same on every attempt; nil
// when it has none.
func Names(run store.Run) []string {
	if len(run.SealedSecrets) == 0 {
		return nil
	}
	return slices.Sorted(maps.Keys(run.SealedSecrets))
}

// Open returns the values of the secrets names, opened from run's sealed
// secrets. An error names the run and the secret, never a value, and says
// what to do.
func Open(key Sealer, run store.Run, names []string) (map[string]string, error) {
	out := make(map[string]string, len(names))
	for _, name := range names {
		sealed, ok := run.SealedSecrets[name]
		if !ok {
			return nil, fmt.Errorf("run %s has no secret %s (its record holds %v)", run.ID, name, Names(run))
		}
		v, err := key.Unseal(sealingData(run.ID, name), sealed)
		if errors.Is(err, sealing.ErrUnsealable) {
			return nil, fmt.Errorf("the secret %s of run %s %w: submit the run again with it", name, run.ID, err)
		}
		if err != nil {
			return nil, fmt.Errorf("the secret %s of run %s: %w", name, run.ID, err)
		}
		out[name] = v
	}
	return out, nil
}

// Attach puts the values of l's secrets into l as it is sent, from run
// (l's run, which the caller read). One that cannot be opened is logged
// and the launch left without values: the agent then refuses it, naming
// the secrets it lacks (nodeproto.LaunchWorkloadCommand.MissingSecrets),
// and the attempt fails with that reason rather than run without them.
func Attach(key Sealer, log *slog.Logger, run store.Run, l *nodeproto.LaunchWorkloadCommand) {
	if len(l.SecretNames) == 0 {
		return
	}
	var err error
	if l.Secrets, err = Open(key, run, l.SecretNames); err != nil {
		log.Error("launch sent without its secrets; the node will refuse it", "run", l.RunID, "attempt", l.Attempt, "err", err)
	}
}
