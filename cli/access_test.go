package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
)

// TestTokenAuditAndNodeRevocationCommands drives `mercator token …`,
// `mercator audit ls`, `node rm` and `node invitations` against a real
// control plane.
func TestTokenAuditAndNodeRevocationCommands(t *testing.T) {
	dir := t.TempDir()
	env, adminFile := startControlPlane(t, dir)
	as := func(tokenFile string, args ...string) result {
		t.Helper()
		return runCLI(t, env, append(args, "--token-file", tokenFile)...)
	}
	ok := func(tokenFile string, args ...string) string {
		t.Helper()
		res := as(tokenFile, args...)
		if res.code != 0 {
			t.Fatalf("mercator %s: exit %d, %s", strings.Join(args, " "), res.code, res.stderr)
		}
		return res.stdout
	}
	saveToken := func(name, secret string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(secret+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}

	// token create: the secret alone on stdout; -o json: name and token.
	var created map[string]string
	if err := json.Unmarshal([]byte(ok(adminFile, "token", "create", "ci", "--role", "reader", "--expires", "30d", "-o", "json")), &created); err != nil {
		t.Fatal(err)
	}
	if len(created) != 2 || created["name"] != "ci" || !strings.HasPrefix(created["token"], "mca_") {
		t.Fatalf("token create -o json = %v", created)
	}
	ciFile := saveToken("ci", created["token"])
	secret := ok(adminFile, "token", "create", "deployer", "--role", "submitter")
	if strings.Count(secret, "\n") != 1 || !strings.HasPrefix(secret, "mca_") {
		t.Errorf("token create printed %q, want the secret alone", secret)
	}
	if res := as(adminFile, "token", "create", "bot", "--role", "invoker"); res.code == 0 || !strings.Contains(res.stderr, "--app") {
		t.Errorf("an invoker without --app: exit %d, %s", res.code, res.stderr)
	}
	ok(adminFile, "token", "create", "bot", "--role", "invoker", "--app", "shop")

	// A reader reads, and is refused a write with the role it needs.
	ok(ciFile, "run", "ls")
	if res := as(ciFile, "token", "create", "x", "--role", "admin"); res.code == 0 || !strings.Contains(res.stderr, "reader may not POST /v1/tokens; it needs admin") {
		t.Errorf("a reader creating a token: exit %d, %s", res.code, res.stderr)
	}

	// token ls: names, roles, created, last use, expiry; never a secret.
	ls := ok(adminFile, "token", "ls")
	for _, want := range []string{"NAME", "LAST USED", "EXPIRES", "admin", "ci", "reader", "deployer", "submitter", "bot", "invoker", "shop"} {
		if !strings.Contains(ls, want) {
			t.Errorf("token ls lacks %q:\n%s", want, ls)
		}
	}
	if strings.Contains(ls, created["token"]) || strings.Contains(ls, "mca_") {
		t.Errorf("token ls shows a secret:\n%s", ls)
	}

	// token rm: refused at once; the last admin stays.
	ok(adminFile, "token", "rm", "ci")
	if res := as(ciFile, "run", "ls"); res.code == 0 || !strings.Contains(res.stderr, "not valid") {
		t.Errorf("a removed token: exit %d, %s", res.code, res.stderr)
	}
	if res := as(adminFile, "token", "rm", "admin"); res.code == 0 || !strings.Contains(res.stderr, "last admin") {
		t.Errorf("removing the last admin: exit %d, %s", res.code, res.stderr)
	}

	// node invitations, node rm.
	ok(adminFile, "node", "invite", "gpu-1")
	ok(adminFile, "node", "invite", "gpu-1")
	if inv := ok(adminFile, "node", "invitations", "gpu-1"); strings.Count(inv, "unused") != 1 {
		t.Errorf("node invitations after two invites:\n%s", inv)
	}
	if out := ok(adminFile, "node", "rm", "gpu-1"); !strings.Contains(out, "removed") {
		t.Errorf("node rm = %q", out)
	}
	if inv := ok(adminFile, "node", "invitations", "gpu-1"); strings.Contains(inv, "unused") {
		t.Errorf("node rm left an unused invitation:\n%s", inv)
	}
	var node api.Node
	json.Unmarshal([]byte(ok(adminFile, "node", "get", "gpu-1", "-o", "json")), &node)
	if node.RemovedAt == nil || node.Status != api.NodeUnreachable {
		t.Errorf("removed node = %+v", node)
	}

	// audit ls: written asynchronously, so wait for the last call's entry.
	deadline := time.Now().Add(5 * time.Second)
	routes := map[string]int{}
	for routes["DELETE /v1/nodes/{id} admin"] == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		var audit api.AuditList
		json.Unmarshal([]byte(ok(adminFile, "audit", "ls", "--since", "1h", "-o", "json")), &audit)
		clear(routes)
		for _, e := range audit.Entries {
			routes[e.Route+" "+e.Who]++
		}
	}
	for _, want := range []string{"POST /v1/tokens admin", "POST /v1/tokens ci", "DELETE /v1/tokens/{name} admin", "DELETE /v1/nodes/{id} admin", "POST /v1/nodes/{id}/invitations admin", "GET /v1/runs "} {
		if routes[want] == 0 {
			t.Errorf("audit ls lacks %q: %v", want, routes)
		}
	}
	table := ok(adminFile, "audit", "ls", "--who", "ci")
	if !strings.Contains(table, "403") || strings.Contains(table, "DELETE") {
		t.Errorf("audit ls --who ci:\n%s", table)
	}
}
