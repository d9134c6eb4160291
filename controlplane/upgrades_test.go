package controlplane

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/content"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/memstore"
)

type upgradeFixture struct {
	st     store.Store
	clock  *fakeClock
	srv    *Server
	client *client.Client
}

// newUpgradeFixture is a control plane with a local content store and the
// release key pub (nil: none), and an admin client.
func newUpgradeFixture(t *testing.T, pub ed25519.PublicKey) *upgradeFixture {
	f := &upgradeFixture{st: memstore.New(), clock: &fakeClock{now: time.Now().UTC()}}
	token := "mca_" + httpapi.RandomToken()
	if err := f.st.Update(context.Background(), func(tx store.Tx) error {
		return tx.CreateToken(store.Token{Hash: httpapi.HashToken(token), Name: "admin", CreatedAt: f.clock.Now()})
	}); err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	dir := t.TempDir()
	cs, err := content.Open(t.Context(), content.Options{DataDir: dir, PublicURL: ts.URL, Now: f.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	f.srv = New(Config{Now: f.clock.Now, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Content: cs, UploadDir: dir + "/uploads", ReleaseKey: pub}, f.st, nil, nil)
	mux.Handle("/", f.srv.Handler())
	f.client = client.New(ts.URL, token, nil)
	return f
}

func (f *upgradeFixture) push(version string, b, sig []byte) (api.AgentRelease, error) {
	return f.client.PushAgentRelease(context.Background(), version, "linux/amd64", bytes.NewReader(b), int64(len(b)), sig)
}

// addNode stores an enrolled node, seen now, whose facts state capability.
func (f *upgradeFixture) addNode(t *testing.T, id string, capability int) {
	now := f.clock.Now()
	if err := f.st.Update(context.Background(), func(tx store.Tx) error {
		return tx.PutNode(store.Node{ID: id, FencingToken: 1, CreatedAt: now, EnrolledAt: &now, LastSeenAt: &now,
			Facts: &nodeproto.NodeFacts{AgentVersion: "v1", CapabilityVersion: capability}})
	}); err != nil {
		t.Fatal(err)
	}
}

// TestReleaseKeyRefusesUnsignedAndWronglySigned: with --release-key, a push
// without a signature or signed by another key is refused, saying so; a
// rightly signed one is stored and listed as signed.
func TestReleaseKeyRefusesUnsignedAndWronglySigned(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(nil)
	_, other, _ := ed25519.GenerateKey(nil)
	f := newUpgradeFixture(t, pub)
	bin := []byte("\x7fELF agent v2")
	for name, c := range map[string]struct {
		sig []byte
		msg string
	}{
		"unsigned":       {nil, "carries no signature"},
		"wrongly signed": {ed25519.Sign(other, bin), "does not verify"},
	} {
		if _, err := f.push("v2", bin, c.sig); !errors.Is(err, failure.ErrInvalid) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: %v, want invalid saying %q", name, err, c.msg)
		}
	}
	rel, err := f.push("v2", bin, ed25519.Sign(priv, bin))
	if err != nil || !rel.Signed || rel.Size != int64(len(bin)) {
		t.Fatalf("signed push: %+v %v", rel, err)
	}
	list, err := f.client.ListAgentReleases(context.Background())
	if err != nil || len(list.Releases) != 1 || list.Releases[0].SHA256 != rel.SHA256 {
		t.Fatalf("ls: %+v %v", list, err)
	}
	if _, err := f.push("../x", bin, nil); !errors.Is(err, failure.ErrInvalid) {
		t.Errorf("a bad version was accepted: %v", err)
	}
}

// TestRolloutIssuesSignedCommandAndHoldsRelease: a rollout sends the
// canary an upgrade_agent command carrying the release, its signature and
// the key, with a read minted as it is sent; the release cannot be removed
// while the rollout runs; a second rollout is refused meanwhile.
func TestRolloutIssuesSignedCommandAndHoldsRelease(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(nil)
	f := newUpgradeFixture(t, pub)
	ctx := context.Background()
	bin := []byte("\x7fELF agent v2")
	rel, err := f.push("v2", bin, ed25519.Sign(priv, bin))
	if err != nil {
		t.Fatal(err)
	}
	f.addNode(t, "a", nodeproto.VersionUpgrade)
	f.addNode(t, "b", nodeproto.VersionUpgrade)
	ro, err := f.client.StartRollout(ctx, api.RolloutRequest{All: true, MaxParallel: 5})
	if err != nil || ro.Version != "v2" || len(ro.Nodes) != 2 {
		t.Fatalf("start: %+v %v", ro, err)
	}
	if _, err := f.client.StartRollout(ctx, api.RolloutRequest{Nodes: []string{"a"}}); !errors.Is(err, failure.ErrConflict) {
		t.Errorf("second rollout while one runs: %v", err)
	}
	if err := f.srv.upgrades.Advance(ctx); err != nil {
		t.Fatal(err)
	}
	var ops []store.Operation
	f.st.View(ctx, func(tx store.Tx) (err error) {
		ops, err = tx.PendingOperations("a")
		if more, _ := tx.PendingOperations("b"); len(more) != 0 {
			t.Errorf("node b was sent the upgrade before the canary came back")
		}
		return err
	})
	if len(ops) != 1 || ops[0].Command.UpgradeAgent == nil {
		t.Fatalf("canary's operations: %+v", ops)
	}
	c := ops[0].Command.UpgradeAgent
	if c.SHA256 != rel.SHA256 || c.Size != rel.Size || !ed25519.Verify(ed25519.PublicKey(c.PublicKey), bin, c.Signature) || c.URL != "" {
		t.Errorf("stored command: %+v", c)
	}
	out := f.srv.outbound(ctx, "", ops[0].Command)
	if out.UpgradeAgent.URL == "" || out.UpgradeAgent.ExpiresAt.IsZero() {
		t.Errorf("the command was sent without a minted read: %+v", out.UpgradeAgent)
	}
	if nodeproto.RequiredVersion(ops[0].Command) != nodeproto.VersionUpgrade {
		t.Error("upgrade_agent does not require VersionUpgrade")
	}
	if err := f.client.RemoveAgentRelease(ctx, "v2", "linux/amd64"); !errors.Is(err, failure.ErrConflict) {
		t.Errorf("removing a release a running rollout uses: %v", err)
	}
}

// TestRolloutStopsOnAgentTooOld: a node whose agent cannot upgrade itself
// stops the rollout with a reason, and nothing is sent to it.
func TestRolloutStopsOnAgentTooOld(t *testing.T) {
	f := newUpgradeFixture(t, nil)
	ctx := context.Background()
	if _, err := f.push("v2", []byte("bin"), nil); err != nil {
		t.Fatal(err)
	}
	f.addNode(t, "old", nodeproto.VersionUpgrade-1)
	ro, err := f.client.StartRollout(ctx, api.RolloutRequest{Nodes: []string{"old"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.srv.upgrades.Advance(ctx); err != nil {
		t.Fatal(err)
	}
	ro, err = f.client.GetRollout(ctx, ro.ID)
	if err != nil || ro.State != api.RolloutStopped || !strings.Contains(ro.Reason, "by hand") {
		t.Fatalf("rollout: %+v %v", ro, err)
	}
	if err := f.client.RemoveAgentRelease(ctx, "v2", "linux/amd64"); err != nil {
		t.Errorf("remove after the rollout stopped: %v", err)
	}
}

// TestRolloutRetentionKeepsTheNewest: starting a rollout deletes the
// oldest beyond store.KeepRollouts, so the table does not grow without
// bound.
func TestRolloutRetentionKeepsTheNewest(t *testing.T) {
	f := newUpgradeFixture(t, nil)
	ctx := context.Background()
	if _, err := f.push("v2", []byte("bin"), nil); err != nil {
		t.Fatal(err)
	}
	f.addNode(t, "a", nodeproto.VersionUpgrade)
	base := f.clock.Now().Add(-time.Hour)
	if err := f.st.Update(ctx, func(tx store.Tx) error {
		for i := range store.KeepRollouts + 5 {
			at := base.Add(time.Duration(i) * time.Second)
			if err := tx.PutRollout(store.Rollout{ID: fmt.Sprintf("old-%03d", i), Version: "v1", Platform: "linux/amd64",
				State: store.RolloutSucceeded, CreatedAt: at, UpdatedAt: at}); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ro, err := f.client.StartRollout(ctx, api.RolloutRequest{Nodes: []string{"a"}})
	if err != nil {
		t.Fatal(err)
	}
	list, err := f.client.ListRollouts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Rollouts) != store.KeepRollouts || list.Rollouts[0].ID != ro.ID || list.Rollouts[len(list.Rollouts)-1].ID != "old-006" {
		t.Fatalf("%d rollouts kept, newest %s, oldest %s", len(list.Rollouts), list.Rollouts[0].ID, list.Rollouts[len(list.Rollouts)-1].ID)
	}
}

// TestRolloutPassesOverAnAgentInTheServersProcess: a node whose agent runs
// in the control plane's process (NoSelfUpgrade) is left out of a rollout
// of every node, and naming it is refused with the reason.
func TestRolloutPassesOverAnAgentInTheServersProcess(t *testing.T) {
	f := newUpgradeFixture(t, nil)
	ctx := context.Background()
	if _, err := f.push("v2", []byte("bin"), nil); err != nil {
		t.Fatal(err)
	}
	f.addNode(t, "a", nodeproto.VersionUpgrade)
	f.addNode(t, "local", nodeproto.VersionUpgrade)
	if err := f.st.Update(ctx, func(tx store.Tx) error {
		n, err := tx.GetNode("local")
		if err != nil {
			return err
		}
		n.Facts.NoSelfUpgrade = true
		return tx.PutNode(n)
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.client.StartRollout(ctx, api.RolloutRequest{Nodes: []string{"local"}}); !errors.Is(err, failure.ErrInvalid) || !strings.Contains(err.Error(), "upgraded with the server") {
		t.Errorf("a rollout naming the local node: %v", err)
	}
	ro, err := f.client.StartRollout(ctx, api.RolloutRequest{All: true})
	if err != nil || len(ro.Nodes) != 1 || ro.Nodes[0].ID != "a" {
		t.Fatalf("a rollout of every node: %+v, %v", ro.Nodes, err)
	}
}
