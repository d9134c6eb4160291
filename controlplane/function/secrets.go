package function

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/sealing"
	"github.com/mercator/mercator/store"
)

// Secret configuration of apps and functions, sealed at rest.
//
// A secret value is sealed (package controlplane/internal/sealing) as it is set, bound to its owner
// (the app or the function, by ID) and its key name, and stored in the
// record's SealedConfig: the store never holds it in the clear (it refuses
// a record that would), and a sealed value copied into another record or
// under another key name does not open. Reads show api.SecretRedacted for
// every key. The one place values are opened is functionEnv, which builds
// the container's environment that the invoke command carries to the node
// (never stored, never logged).
//
// Earlier versions stored secret values in the clear (the record's
// SecretConfig). They keep working, by two means:
//
//   - SealClearSecrets seals them all when the control plane starts, so
//     none stays at rest; and
//   - functionEnv reads both forms, and every update of an app or a
//     function seals the clear values it finds.
//
// Why not a numbered store migration: migrations are SQL that the store
// runs, and the store never holds the key (sealing is the control plane's
// business, and keeping the key out of the store is the point). After it
// sealed anything, the step asks the store to scrub its free space (an
// SQLite file keeps a rewritten record's old bytes until the space is
// reused). Values that were on disk in the clear may survive in backups
// and, with PostgreSQL, in the server's write-ahead log archives: rotating
// them is the only cure, which docs/functions.md says. Why read
// both forms as well: the start step can fail (it is logged, and the
// control plane serves anyway), and during an upgrade a replica of an
// earlier version may still write a clear value after the step ran.

// secretOwner names the record secret values belong to: its kind ("app"
// or "fn") and ID.
type secretOwner struct{ kind, id string }

func appSecretOwner(a store.App) secretOwner { return secretOwner{"app", a.ID} }
func fnSecretOwner(f store.Fn) secretOwner   { return secretOwner{"fn", f.ID} }

// sealingData binds a sealed value to its owner and key name.
func (o secretOwner) sealingData(key string) []byte {
	return []byte("mercator secret config\x00" + o.kind + "\x00" + o.id + "\x00" + key)
}

// mergeSecrets applies a secret configuration patch with mergeConfig's
// rules (an empty value deletes the key, api.SecretRedacted keeps what was
// there, keys must be names one can set in an environment) to o's sealed
// configuration and returns the sealed configuration to store; nil when
// empty. clear is what an earlier version stored in the clear: it is
// sealed too, so the record leaves with none. A value set to what it
// already was keeps its sealed bytes, so an update that changes nothing
// changes nothing. Errors: Fn's invalid-key error, and
// failure.ErrUnavailable when a value must be sealed and the server has no
// key.
func (s *Service) mergeSecrets(o secretOwner, sealed map[string][]byte, clear, patch map[string]string) (map[string][]byte, error) {
	out := make(map[string][]byte, len(sealed)+len(clear)+len(patch))
	maps.Copy(out, sealed)
	for k, v := range clear {
		b, err := s.sealer.Seal(o.sealingData(k), v)
		if err != nil {
			return nil, err
		}
		out[k] = b
	}
	for k, v := range patch {
		if err := checkConfigKey(k); err != nil {
			return nil, err
		}
		switch {
		case v == "":
			delete(out, k)
		case v == api.SecretRedacted:
		default:
			if old, ok := out[k]; ok {
				if was, err := s.sealer.Unseal(o.sealingData(k), old); err == nil && was == v {
					continue
				}
			}
			b, err := s.sealer.Seal(o.sealingData(k), v)
			if err != nil {
				return nil, err
			}
			out[k] = b
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// openSecrets returns o's secret values in the clear: those an earlier
// version stored so, and the sealed ones opened. A value that does not
// open fails the whole, with an error that names it (wrapping
// errUnsealable) and says what to do; nothing half-opened is returned.
func (s *Service) openSecrets(o secretOwner, sealed map[string][]byte, clear map[string]string) (map[string]string, error) {
	if len(sealed)+len(clear) == 0 {
		return nil, nil
	}
	out := make(map[string]string, len(sealed)+len(clear))
	maps.Copy(out, clear)
	for _, k := range slices.Sorted(maps.Keys(sealed)) {
		v, err := s.sealer.Unseal(o.sealingData(k), sealed[k])
		if errors.Is(err, sealing.ErrUnsealable) {
			return nil, fmt.Errorf("the secret configuration %s of %s %s %w: set it again", k, o.kind, o.id, err)
		}
		if err != nil {
			return nil, fmt.Errorf("the secret configuration %s of %s %s: %w", k, o.kind, o.id, err)
		}
		out[k] = v
	}
	return out, nil
}

// functionEnv is the environment of f's containers: the app's
// configuration, then the app's secrets, then the function's
// configuration, then its secrets, each overriding the ones before. It is
// the one place secrets are opened, for the invoke command that carries
// them to a node. A secret that does not open is an error that names it,
// in Fn's shape (500, since the server's key is at fault), and is logged.
func (s *Service) functionEnv(app store.App, f store.Fn) (map[string]string, error) {
	appSecrets, err := s.openSecrets(appSecretOwner(app), app.SealedConfig, app.SecretConfig)
	if err == nil {
		var fnSecrets map[string]string
		if fnSecrets, err = s.openSecrets(fnSecretOwner(f), f.SealedConfig, f.SecretConfig); err == nil {
			env := map[string]string{}
			for _, m := range []map[string]string{app.Config, appSecrets, f.Config, fnSecrets} {
				maps.Copy(env, m)
			}
			return env, nil
		}
	}
	s.log.Warn("function's secret configuration unusable", "fn", f.ID, "app", app.ID, "err", err)
	return nil, fnError(http.StatusInternalServerError, "%s", err.Error())
}

// redactedSecrets is secret configuration as reads show it: every key,
// sealed or not, with api.SecretRedacted for its value.
func redactedSecrets(sealed map[string][]byte, clear map[string]string) map[string]string {
	if len(sealed)+len(clear) == 0 {
		return nil
	}
	out := make(map[string]string, len(sealed)+len(clear))
	for k := range sealed {
		out[k] = api.SecretRedacted
	}
	for k := range clear {
		out[k] = api.SecretRedacted
	}
	return out
}

// SealClearSecrets seals, in one transaction, every secret value an
// earlier version stored in the clear, so that none stays at rest. It
// runs when the control plane starts, before it serves; it is idempotent,
// so replicas starting together do no harm. Without a key it changes
// nothing (and says so when there is something to seal).
func (s *Service) SealClearSecrets(ctx context.Context) error {
	sealed := 0
	err := s.store.Update(ctx, func(tx store.Tx) error {
		sealed = 0
		apps, err := tx.ListApps(store.ListFnOptions{})
		if err != nil {
			return err
		}
		for _, a := range apps {
			if len(a.SecretConfig) == 0 {
				continue
			}
			if a.SealedConfig, err = s.mergeSecrets(appSecretOwner(a), a.SealedConfig, a.SecretConfig, nil); err != nil {
				return fmt.Errorf("app %s: %w", a.ID, err)
			}
			sealed += len(a.SecretConfig)
			a.SecretConfig = nil
			if err := tx.PutApp(a); err != nil {
				return err
			}
		}
		fns, err := tx.ListFns(store.ListFnOptions{})
		if err != nil {
			return err
		}
		for _, f := range fns {
			if len(f.SecretConfig) == 0 {
				continue
			}
			if f.SealedConfig, err = s.mergeSecrets(fnSecretOwner(f), f.SealedConfig, f.SecretConfig, nil); err != nil {
				return fmt.Errorf("function %s: %w", f.ID, err)
			}
			sealed += len(f.SecretConfig)
			f.SecretConfig = nil
			if err := tx.PutFn(f); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("seal secret configuration stored in the clear by an earlier version: %w", err)
	}
	if sealed == 0 {
		return nil
	}
	s.log.Info("sealed secret configuration an earlier version stored in the clear", "values", sealed)
	// The records no longer hold the values, but an SQLite file may still
	// show them in its free space until it is rewritten.
	if sc, ok := s.store.(freeSpaceScrubber); ok {
		if err := sc.ScrubFreeSpace(ctx); err != nil {
			s.log.Warn("the database may still hold the secrets it stored in the clear in its free space", "err", err)
		}
	}
	return nil
}

// freeSpaceScrubber is a store that can rewrite itself so nothing deleted
// lingers in its files (sqlstore.Store.ScrubFreeSpace).
type freeSpaceScrubber interface {
	ScrubFreeSpace(ctx context.Context) error
}
