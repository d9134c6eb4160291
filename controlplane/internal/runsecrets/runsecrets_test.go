package runsecrets

import (
	"bytes"
	"crypto/rand"
	"errors"
	"strings"
	"testing"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/sealing"
	"github.com/mercator/mercator/store"
)

type key []byte

func (k key) Seal(ad []byte, plain string) ([]byte, error) { return sealing.Seal(k, ad, plain) }
func (k key) Unseal(ad, sealed []byte) (string, error)     { return sealing.Unseal(k, ad, sealed) }

func newKey() key {
	k := make(key, sealing.KeySize)
	rand.Read(k)
	return k
}

// TestSealOpen: sealed, a run's secrets show only redacted names; they
// open under the same key for the same run and name, and under no other
// key, run or name, with an error that names the secret and not its value.
func TestSealOpen(t *testing.T) {
	k := newKey()
	run := store.Run{Run: api.Run{ID: "r-1", RunSpec: api.RunSpec{Secrets: map[string]string{"B": "bee-value", "A": "ay-value"}}}}
	if err := Seal(k, &run); err != nil {
		t.Fatal(err)
	}
	if run.Secrets["A"] != api.SecretRedacted || len(run.Secrets) != 2 || bytes.Contains(run.SealedSecrets["A"], []byte("ay-value")) {
		t.Fatalf("sealed run: secrets %v, sealed %x", run.Secrets, run.SealedSecrets)
	}
	if names := Names(run); strings.Join(names, ",") != "A,B" {
		t.Errorf("Names = %v, want A,B sorted", names)
	}
	got, err := Open(k, run, []string{"A", "B"})
	if err != nil || got["A"] != "ay-value" || got["B"] != "bee-value" {
		t.Fatalf("Open = %v, %v", got, err)
	}
	moved := run
	moved.ID = "r-2"
	swapped := run
	swapped.SealedSecrets = map[string][]byte{"A": run.SealedSecrets["B"], "B": run.SealedSecrets["A"]}
	for what, tc := range map[string]struct {
		k   key
		run store.Run
	}{"another key": {newKey(), run}, "another run": {k, moved}, "another name": {k, swapped}} {
		_, err := Open(tc.k, tc.run, []string{"A"})
		if !errors.Is(err, sealing.ErrUnsealable) || !strings.Contains(err.Error(), "secret A of run "+tc.run.ID) || strings.Contains(err.Error(), "ay-value") {
			t.Errorf("%s: Open = %v, want unsealable naming secret A", what, err)
		}
	}
	if _, err := Open(k, run, []string{"C"}); err == nil || !strings.Contains(err.Error(), "no secret C") {
		t.Errorf("Open of a name the run lacks = %v", err)
	}
	if err := Seal(key(nil), &store.Run{Run: api.Run{ID: "r-3", RunSpec: api.RunSpec{Secrets: map[string]string{"A": "x"}}}}); err == nil {
		t.Error("Seal without a key succeeded")
	}
}
