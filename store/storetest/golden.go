package storetest

import (
	"embed"
	"encoding/json"
	"path"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/internal/record"
)

// Golden documents: every record kind a Store keeps as a JSON document, as
// the control plane wrote it at sqlstore schema version 3, under
// testdata/v3/KIND.json, with every field set. Every later version must
// still read them: renaming or retyping a stored field silently turns
// stored data into a migration, and this check is what makes that loud.
// (The records that embed api types are stored through documents of their
// own, store/internal/record, so the public API can change without
// changing them.) When the stored format changes on
// purpose, add the new format's documents beside these (testdata/v4/...)
// with the migration that reads the old ones; never edit a committed one.
// testdata/v5 is schema version 5's: the run's log_limit_bytes added.
// testdata/v8 is schema version 8's (issue 17): projects, and the run's
// project, priority, grace period, constraints and preemptions, a token's
// projects, a node's labels. A kind that did not exist yet has no document
// in the older directories (goldenKind.since).
// testdata/v9 is schema version 9's (issue 20): agent releases and rollouts.
// testdata/v10 is schema version 10's (issue 17): an Artifact version's
// project, and a registry credential's (keyed by project and host).
//
//go:embed testdata
var goldenFS embed.FS

// DocumentWriter replaces the stored document of a record the suite has
// just written with doc, byte for byte, bypassing the Store's encoder, so
// that the golden check reads it through the Store's own decoding path.
// kind is the golden document's name (node, run, app, ...); key is the
// record's key as its Get takes it (one element, or name and version for
// an artifact).
type DocumentWriter func(t *testing.T, s store.Store, kind string, key []string, doc []byte)

// goldenKind is how the check stores and reads one kind of record.
type goldenKind struct {
	name string
	// since is the schema version that first stored the kind (0: every
	// version with golden documents).
	since int
	// check decodes the golden document doc and checks it as checkGolden
	// says.
	check func(t *testing.T, s store.Store, w DocumentWriter, doc []byte)
}

// goldenKinds lists every record kind stored as a JSON document.
var goldenKinds = []goldenKind{
	golden("node", func(r store.Node) []string { return []string{r.ID} }, nil,
		store.Tx.PutNode, func(tx store.Tx, k []string) (store.Node, error) { return tx.GetNode(k[0]) }),
	golden("invitation", func(r store.Invitation) []string { return []string{r.TokenHash} }, nil,
		store.Tx.CreateInvitation, func(tx store.Tx, k []string) (store.Invitation, error) { return tx.GetInvitation(k[0]) }),
	golden("session", func(r store.Session) []string { return []string{r.TokenHash} }, nil,
		store.Tx.PutSession, func(tx store.Tx, k []string) (store.Session, error) { return tx.GetSession(k[0]) }),
	golden("run", func(r store.Run) []string { return []string{r.ID} }, nil,
		store.Tx.CreateRun, func(tx store.Tx, k []string) (store.Run, error) { return tx.GetRun(k[0]) }),
	golden("operation", func(r store.Operation) []string { return []string{r.ID} }, nil,
		store.Tx.PutOperation, func(tx store.Tx, k []string) (store.Operation, error) { return tx.GetOperation(k[0]) }),
	golden("token", func(r store.Token) []string { return []string{r.Hash} }, nil,
		store.Tx.CreateToken, func(tx store.Tx, k []string) (store.Token, error) { return tx.GetToken(k[0]) }),
	golden("artifact", func(r store.Artifact) []string { return []string{r.Name, r.Version} }, nil,
		store.Tx.CreateArtifact, func(tx store.Tx, k []string) (store.Artifact, error) { return tx.GetArtifact(k[0], k[1]) }),
	golden("registry_credential", func(r store.RegistryCredential) []string { return []string{api.ProjectOf(r.Project), r.Host} }, nil,
		store.Tx.PutRegistryCredential, func(tx store.Tx, k []string) (store.RegistryCredential, error) {
			return tx.GetRegistryCredential(k[0], k[1])
		}),
	// Apps and functions of earlier versions held secrets in the clear
	// (SecretConfig), which a Store still reads but no longer writes.
	golden("app", func(r store.App) []string { return []string{r.ID} }, func(r *store.App) { r.SecretConfig = nil },
		store.Tx.CreateApp, func(tx store.Tx, k []string) (store.App, error) { return tx.GetApp(k[0]) }),
	golden("fn", func(r store.Fn) []string { return []string{r.ID} }, func(r *store.Fn) { r.SecretConfig = nil },
		store.Tx.CreateFn, func(tx store.Tx, k []string) (store.Fn, error) { return tx.GetFn(k[0]) }),
	golden("trigger", func(r store.Trigger) []string { return []string{r.ID} }, nil,
		store.Tx.CreateTrigger, func(tx store.Tx, k []string) (store.Trigger, error) { return tx.GetTrigger(k[0]) }),
	golden("call", func(r store.Call) []string { return []string{r.ID} }, nil,
		store.Tx.CreateCall, func(tx store.Tx, k []string) (store.Call, error) { return tx.GetCall(k[0]) }),
	since(8, golden("project", func(r store.Project) []string { return []string{r.Name} }, nil,
		store.Tx.CreateProject, func(tx store.Tx, k []string) (store.Project, error) { return tx.GetProject(k[0]) })),
	// Agent releases and rollouts: schema version 9 (testdata/v9).
	since(9, golden("agent_release", func(r store.AgentRelease) []string { return []string{r.Version, r.Platform} }, nil,
		store.Tx.CreateAgentRelease, func(tx store.Tx, k []string) (store.AgentRelease, error) { return tx.GetAgentRelease(k[0], k[1]) })),
	since(9, golden("rollout", func(r store.Rollout) []string { return []string{r.ID} }, nil,
		store.Tx.PutRollout, func(tx store.Tx, k []string) (store.Rollout, error) { return tx.GetRollout(k[0]) })),
}

// since marks a kind as first stored at schema version v.
func since(v int, k goldenKind) goldenKind {
	k.since = v
	return k
}

// golden makes the check of one record kind T: key is the record's key,
// writable (when set) removes what a Store refuses to write but must still
// read, put stores a record and get reads it back by key.
func golden[T any](name string, key func(T) []string, writable func(*T),
	put func(store.Tx, T) error, get func(store.Tx, []string) (T, error)) goldenKind {
	return goldenKind{name: name, check: func(t *testing.T, s store.Store, w DocumentWriter, doc []byte) {
		want := decodeGolden[T](t, doc)
		stored := want
		if writable != nil {
			writable(&stored)
		}
		update(t, s, func(tx store.Tx) error { return put(tx, stored) })
		if w != nil {
			w(t, s, name, key(want), doc)
		} else {
			want = stored
		}
		var got T
		view(t, s, func(tx store.Tx) (err error) { got, err = get(tx, key(want)); return err })
		same(t, name+" read back from its golden document", got, want)
	}}
}

// decodeGolden reads a golden document as a Store does (record.Decode)
// and checks that writing the result as a Store does (record.Encode) gives
// the document back: every field it holds is still read, under the same
// name, with the same meaning. Fields added since may appear in the
// encoding only with their zero value.
func decodeGolden[T any](t *testing.T, doc []byte) T {
	t.Helper()
	v, err := record.Decode[T](doc)
	if err != nil {
		t.Fatalf("a document stored by an earlier version no longer decodes: %v; keep the field's stored name and type, or add a migration", err)
	}
	again, err := record.Encode(v)
	if err != nil {
		t.Fatal(err)
	}
	var was, now any
	if err := json.Unmarshal(doc, &was); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(again, &now); err != nil {
		t.Fatal(err)
	}
	if now = dropNewZeros(now, was); !reflect.DeepEqual(now, was) {
		t.Fatalf("a document stored by an earlier version does not read back as it was written (a field lost, renamed or retyped):\n got %s\nwant %s", again, doc)
	}
	return v
}

// dropNewZeros removes from now the object members that was lacks and
// whose value is zero (null, "", 0, false, or empty): fields added since
// the golden document was written.
func dropNewZeros(now, was any) any {
	switch n := now.(type) {
	case map[string]any:
		w, _ := was.(map[string]any)
		for k, v := range n {
			if wv, ok := w[k]; ok {
				n[k] = dropNewZeros(v, wv)
			} else if jsonZero(v) {
				delete(n, k)
			}
		}
	case []any:
		w, _ := was.([]any)
		for i := range n {
			if i < len(w) {
				n[i] = dropNewZeros(n[i], w[i])
			}
		}
	}
	return now
}

func jsonZero(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case string:
		return x == ""
	case float64:
		return x == 0
	case bool:
		return !x
	case map[string]any:
		return len(x) == 0
	case []any:
		return len(x) == 0
	}
	return false
}

// testGoldenDocuments reads every golden document through the Store:
// each kind is stored, its stored document replaced by the golden one
// (with a DocumentWriter), and read back. The kinds of one version share a
// store (each is its own table and key): a fresh PostgreSQL schema a
// document made this test take 50 s.
func (h *harness) testGoldenDocuments(t *testing.T) {
	dirs, err := goldenFS.ReadDir("testdata")
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range dirs {
		version, _ := strconv.Atoi(strings.TrimPrefix(dir.Name(), "v"))
		t.Run(dir.Name(), func(t *testing.T) {
			s, _ := h.start(t)
			for _, k := range goldenKinds {
				if version < k.since {
					continue
				}
				t.Run(k.name, func(t *testing.T) {
					doc, err := goldenFS.ReadFile(path.Join("testdata", dir.Name(), k.name+".json"))
					if err != nil {
						t.Fatalf("no golden document for %s: %v", k.name, err)
					}
					k.check(t, s, h.opts.WriteDocument, doc)
				})
			}
		})
	}
}
