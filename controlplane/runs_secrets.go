package controlplane

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/mercator/mercator/controlplane/internal/sealing"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// Run secrets (api.RunSpec.Secrets), sealed at rest with the machinery
// that seals functions' secret configuration (package
// controlplane/internal/sealing, under the server's key: serverKey).
//
// A secret is sealed as the run is admitted, bound to the run's ID and the
// secret's name, and stored only so (store.Run.SealedSecrets; the store
// refuses a run carrying one in the clear). Every read shows the names,
// each with api.SecretRedacted, because the store reads them back so. A
// launch is stored with the names only (LaunchWorkloadCommand.SecretNames);
// the values are opened each time the launch is sent down the node's
// session (outbound), so they exist in the clear only in this process's
// memory on the way to the one node that runs the attempt, and are sent
// again with a launch redelivered after that node's agent restarted. None
// of this logs a value.

// runSecretData binds a sealed run secret to its run and its name, so a
// sealed value copied into another run, or under another name, does not
// open. Distinct from function secrets' associated data by its prefix.
func runSecretData(runID, name string) []byte {
	return []byte("mercator run secret\x00" + runID + "\x00" + name)
}

// sealRunSecrets seals run.Secrets, which hold the values as submitted,
// into run.SealedSecrets and leaves Secrets as every read shows them. It
// fails with failure.ErrUnavailable when the server has no key to seal
// with; run is then unusable.
func (s *Server) sealRunSecrets(run *store.Run) error {
	if len(run.Secrets) == 0 {
		return nil
	}
	key := serverKey{s}
	sealed := make(map[string][]byte, len(run.Secrets))
	for name, v := range run.Secrets {
		b, err := key.Seal(runSecretData(run.ID, name), v)
		if err != nil {
			return err
		}
		sealed[name] = b
	}
	run.SealedSecrets = sealed
	run.Secrets = store.RedactedSecrets(sealed)
	return nil
}

// runSecretNames is what a launch of run carries in place of its secrets:
// their names, sorted, so the stored command says the same on every
// attempt; nil when it has none.
func runSecretNames(run store.Run) []string {
	if len(run.SealedSecrets) == 0 {
		return nil
	}
	return slices.Sorted(maps.Keys(run.SealedSecrets))
}

// openLaunchSecrets returns the values of the secrets l names, opened from
// its run's sealed secrets. An error names the run and the secret, never a
// value, and says what to do.
func (s *Server) openLaunchSecrets(ctx context.Context, l nodeproto.LaunchWorkloadCommand) (map[string]string, error) {
	var run store.Run
	err := s.store.View(ctx, func(tx store.Tx) error {
		var err error
		run, err = tx.GetRun(l.RunID)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("run %s: read its sealed secrets: %w", l.RunID, err)
	}
	key := serverKey{s}
	out := make(map[string]string, len(l.SecretNames))
	for _, name := range l.SecretNames {
		sealed, ok := run.SealedSecrets[name]
		if !ok {
			return nil, fmt.Errorf("run %s has no secret %s (its record holds %v)", l.RunID, name, runSecretNames(run))
		}
		v, err := key.Unseal(runSecretData(run.ID, name), sealed)
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

// attachSecrets puts the values of l's secrets into l as it is sent. One
// that cannot be opened is logged and the launch sent without values: the
// agent then refuses it, naming the secrets it lacks
// (LaunchWorkloadCommand.MissingSecrets), and the attempt fails with that
// reason rather than run without them.
func (s *Server) attachSecrets(ctx context.Context, l *nodeproto.LaunchWorkloadCommand) {
	if len(l.SecretNames) == 0 {
		return
	}
	secrets, err := s.openLaunchSecrets(ctx, *l)
	if err != nil {
		s.log.Error("launch sent without its secrets; the node will refuse it", "run", l.RunID, "attempt", l.Attempt, "err", err)
		return
	}
	l.Secrets = secrets
}
