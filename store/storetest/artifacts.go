package storetest

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
)

func sampleArtifact(name string, seq int) store.Artifact {
	return store.Artifact{Seq: seq, ArtifactVersion: api.ArtifactVersion{
		Name: name, Version: fmt.Sprintf("v%d", seq), SHA256: strings.Repeat(fmt.Sprintf("%x", seq%16), 64),
		Size: int64(1000 * seq), Format: api.ArtifactFile, CreatedAt: at(time.Duration(seq) * time.Minute),
	}}
}

func sampleRegistryCredential(host string) store.RegistryCredential {
	return store.RegistryCredential{Host: host, Username: "user-" + host, Sealed: []byte{0, 1, 2, 0xff, byte(len(host))},
		CreatedAt: at(0), UpdatedAt: at(time.Minute)}
}

func artifactRefs(as []store.Artifact) []string {
	return ids(as, func(a store.Artifact) string { return a.Name + "@" + a.Version })
}

// testArtifacts: versions are created once, never replaced, and listed by
// name and then by Seq (numerically, so v10 follows v9).
func testArtifacts(t *testing.T, s store.Store) {
	view(t, s, func(tx store.Tx) error {
		_, err := tx.GetArtifact("data", "v1")
		wantKind(t, err, failure.ErrNotFound, "data@v1")
		wantIDs(t, "ListArtifacts on an empty store", artifactRefs(must1[[]store.Artifact](t)(tx.ListArtifacts(""))), []string{})
		return nil
	})
	update(t, s, func(tx store.Tx) error {
		for _, seq := range []int{10, 2, 1, 9} {
			must(t, tx.CreateArtifact(sampleArtifact("data", seq)))
		}
		must(t, tx.CreateArtifact(sampleArtifact("weights", 1)))
		must(t, tx.CreateArtifact(sampleArtifact("audio", 3)))
		dup := sampleArtifact("data", 2)
		dup.SHA256 = strings.Repeat("e", 64)
		wantKind(t, tx.CreateArtifact(dup), failure.ErrConflict, "data@v2")
		return nil
	})
	view(t, s, func(tx store.Tx) error {
		same(t, "GetArtifact", must1[store.Artifact](t)(tx.GetArtifact("data", "v2")), sampleArtifact("data", 2))
		wantIDs(t, "ListArtifacts(data)", artifactRefs(must1[[]store.Artifact](t)(tx.ListArtifacts("data"))),
			[]string{"data@v1", "data@v2", "data@v9", "data@v10"})
		wantIDs(t, "ListArtifacts()", artifactRefs(must1[[]store.Artifact](t)(tx.ListArtifacts(""))),
			[]string{"audio@v3", "data@v1", "data@v2", "data@v9", "data@v10", "weights@v1"})
		wantIDs(t, "ListArtifacts(missing)", artifactRefs(must1[[]store.Artifact](t)(tx.ListArtifacts("missing"))), []string{})
		_, err := tx.GetArtifact("weights", "v2")
		wantKind(t, err, failure.ErrNotFound, "weights@v2")
		return nil
	})
	// A failed transaction creates nothing.
	_ = s.Update(t.Context(), func(tx store.Tx) error {
		must(t, tx.CreateArtifact(sampleArtifact("rolled-back", 1)))
		return errBoom
	})
	view(t, s, func(tx store.Tx) error {
		_, err := tx.GetArtifact("rolled-back", "v1")
		wantKind(t, err, failure.ErrNotFound, "rolled-back@v1")
		return nil
	})
	update(t, s, func(tx store.Tx) error {
		invalid := func(what string, err error) {
			t.Helper()
			if !errors.Is(err, failure.ErrInvalid) {
				t.Errorf("%s: error = %v, want ErrInvalid", what, err)
			}
		}
		invalid("CreateArtifact without name", tx.CreateArtifact(sampleArtifact("", 1)))
		noVersion := sampleArtifact("x", 1)
		noVersion.Version = ""
		invalid("CreateArtifact without version", tx.CreateArtifact(noVersion))
		invalid("PutRegistryCredential without host", tx.PutRegistryCredential(sampleRegistryCredential("")))
		return nil
	})
}

// testRegistryCredentials: upsert by project and host, list by project
// and then host, delete once; the sealed bytes come back exactly. A
// project's credential for a host is its own: another project's for the
// same host is another record, and "" is the default project.
func testRegistryCredentials(t *testing.T, s store.Store) {
	inProject := func(project, host string) store.RegistryCredential {
		c := sampleRegistryCredential(host)
		c.Project, c.Username = project, "user-"+project
		return c
	}
	keys := func(cs []store.RegistryCredential) []string {
		return ids(cs, func(c store.RegistryCredential) string { return api.ProjectOf(c.Project) + "/" + c.Host })
	}
	update(t, s, func(tx store.Tx) error {
		_, err := tx.GetRegistryCredential("", "ghcr.io")
		wantKind(t, err, failure.ErrNotFound, "ghcr.io")
		wantKind(t, tx.DeleteRegistryCredential("", "ghcr.io"), failure.ErrNotFound, "ghcr.io")
		for _, h := range []string{"ghcr.io", "127.0.0.1:5000", "docker.io"} {
			must(t, tx.PutRegistryCredential(sampleRegistryCredential(h)))
		}
		must(t, tx.PutRegistryCredential(inProject("vision", "ghcr.io")))
		must(t, tx.PutRegistryCredential(inProject("audio", "ghcr.io")))
		return nil
	})
	replaced := sampleRegistryCredential("ghcr.io")
	replaced.Username, replaced.Sealed = "other", []byte("resealed")
	update(t, s, func(tx store.Tx) error { return tx.PutRegistryCredential(replaced) })
	view(t, s, func(tx store.Tx) error {
		same(t, "GetRegistryCredential", must1[store.RegistryCredential](t)(tx.GetRegistryCredential("", "ghcr.io")), replaced)
		same(t, "GetRegistryCredential(default)", must1[store.RegistryCredential](t)(tx.GetRegistryCredential(api.DefaultProject, "ghcr.io")), replaced)
		same(t, "GetRegistryCredential(vision)", must1[store.RegistryCredential](t)(tx.GetRegistryCredential("vision", "ghcr.io")), inProject("vision", "ghcr.io"))
		_, err := tx.GetRegistryCredential("vision", "docker.io")
		wantKind(t, err, failure.ErrNotFound, "docker.io")
		got := must1[[]store.RegistryCredential](t)(tx.ListRegistryCredentials())
		wantIDs(t, "ListRegistryCredentials", keys(got),
			[]string{"audio/ghcr.io", "default/127.0.0.1:5000", "default/docker.io", "default/ghcr.io", "vision/ghcr.io"})
		same(t, "listed docker.io", got[2], sampleRegistryCredential("docker.io"))
		return nil
	})
	update(t, s, func(tx store.Tx) error {
		wantKind(t, tx.DeleteRegistryCredential("vision", "docker.io"), failure.ErrNotFound, "docker.io")
		must(t, tx.DeleteRegistryCredential("", "docker.io"))
		must(t, tx.DeleteRegistryCredential("vision", "ghcr.io"))
		_, err := tx.GetRegistryCredential("", "docker.io")
		wantKind(t, err, failure.ErrNotFound, "docker.io")
		return nil
	})
	view(t, s, func(tx store.Tx) error {
		got := must1[[]store.RegistryCredential](t)(tx.ListRegistryCredentials())
		wantIDs(t, "after delete", keys(got), []string{"audio/ghcr.io", "default/127.0.0.1:5000", "default/ghcr.io"})
		return nil
	})
}
