package fncmd_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/cli/internal/clirun"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/cli/internal/clitest"
	"github.com/mercator/mercator/controlplane"
	"github.com/mercator/mercator/daemon"
	"github.com/mercator/mercator/store/sqlstore"
)

// TestAppAndFnCommands drives `mercator app …` and `mercator fn …` against
// a real control plane (no nodes: calls are the end-to-end tests').
func TestAppAndFnCommands(t *testing.T) {
	dir := t.TempDir()
	st, err := sqlstore.Open(context.Background(), "sqlite://"+filepath.Join(dir, "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	tokFile, err := daemon.EnsureAdminToken(context.Background(), st, dir, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	key, err := controlplane.LoadRegistryKey("", filepath.Join(dir, "registry-key"))
	if err != nil {
		t.Fatal(err)
	}
	srv := controlplane.New(controlplane.Config{RegistryKey: key}, st, clitest.PinAll{}, nil)
	h := httptest.NewServer(srv.Handler())
	defer h.Close()
	env := map[string]string{"MERCATOR_ADDR": h.URL, "MERCATOR_TOKEN_FILE": tokFile, "HOME": t.TempDir()}
	cli := func(args ...string) clirun.Result {
		t.Helper()
		res := runCLI(t, env, append(args, "--token-file", tokFile)...)
		if res.Code != 0 {
			t.Fatalf("mercator %s: exit %d, %s", strings.Join(args, " "), res.Code, res.Stderr)
		}
		return res
	}

	cli("app", "create", "shop", "--config", "A=1", "--secret", "KEY=s3cret", "--annotation", `team="ml"`)
	if out := cli("app", "ls").Stdout; !strings.Contains(out, "shop") || !strings.Contains(out, "KEY(secret)") {
		t.Errorf("app ls = %q", out)
	}
	var app api.App
	if err := json.Unmarshal([]byte(cli("app", "get", "shop", "-o", "json").Stdout), &app); err != nil {
		t.Fatal(err)
	}
	if app.SecretConfig["KEY"] != api.SecretRedacted || app.Config["A"] != "1" {
		t.Errorf("app = %+v", app)
	}
	if strings.Contains(cli("app", "get", "shop").Stdout, "s3cret") {
		t.Error("a secret was printed")
	}
	// Public invoke: off by default, on and off again by flag, shown in
	// every read.
	if out := cli("app", "get", "shop").Stdout; !strings.Contains(out, "Public invoke:  no") {
		t.Errorf("app get before --public-invoke = %q", out)
	}
	cli("app", "update", "shop", "--public-invoke")
	if out := cli("app", "get", "shop").Stdout; !strings.Contains(out, "Public invoke:  yes") {
		t.Errorf("app get after --public-invoke = %q", out)
	}
	if out := cli("app", "ls").Stdout; !strings.Contains(out, "PUBLIC INVOKE") || !strings.Contains(out, "yes") {
		t.Errorf("app ls after --public-invoke = %q", out)
	}
	cli("app", "update", "shop", "--public-invoke=false")
	if err := json.Unmarshal([]byte(cli("app", "get", "shop", "-o", "json").Stdout), &app); err != nil {
		t.Fatal(err)
	}
	if _, ok := app.Annotations[api.AnnotationPublicInvoke]; ok || string(app.Annotations["team"]) != `"ml"` {
		t.Errorf("annotations after --public-invoke=false = %s", app.Annotations)
	}

	// deploy creates, then updates (pinning again), keeping what is not given.
	id := strings.TrimSpace(cli("fn", "deploy", "--app", "shop", "cart", "--image", "reg.local/cart:1", "--memory", "256", "--timeout", "1m",
		"--cpu", "0.5", "--max-concurrency", "2", "--config", "B=2", "--trigger", "/cart").Stdout)
	if !strings.HasPrefix(id, "fn-") {
		t.Fatalf("deploy printed %q, want the function's ID", id)
	}
	again := strings.TrimSpace(cli("fn", "deploy", "--app", "shop", "cart", "--image", "reg.local/cart:2", "--memory", "512MiB",
		"--min-hot", "2", "--max-hot", "50", "--scale-down", "5m", "--target-concurrency", "3").Stdout)
	if again != id {
		t.Errorf("redeploy made %q, want the same function %q", again, id)
	}
	var fn api.Fn
	if err := json.Unmarshal([]byte(cli("fn", "get", "shop", "cart", "-o", "json").Stdout), &fn); err != nil {
		t.Fatal(err)
	}
	if fn.Image != "reg.local/cart:2" || !strings.HasPrefix(fn.PinnedImage, "reg.local/cart@sha256:") || fn.Memory != 512 ||
		fn.Timeout != 60 || fn.CPU != 0.5 || fn.MaxConcurrency != 2 || fn.Config["B"] != "2" ||
		fn.IdleTimeout != 300 || string(fn.Annotations[api.AnnotationMinHot]) != "2" || string(fn.Annotations[api.AnnotationMaxHot]) != "50" ||
		string(fn.Annotations[api.AnnotationTargetConcurrency]) != "3" {
		t.Errorf("fn after redeploy = %+v", fn)
	}
	if out := cli("fn", "get", "shop", "cart").Stdout; !strings.Contains(out, "none (as the nodes last reported)") {
		t.Errorf("fn get without nodes = %q", out)
	}
	if res := runCLI(t, env, "fn", "deploy", "--app", "shop", "cart", "--scale-down", "1m", "--idle-timeout", "1m", "--token-file", tokFile); res.Code != 2 {
		t.Errorf("--scale-down with --idle-timeout: exit %d, %s", res.Code, res.Stderr)
	}
	if out := cli("fn", "ls", "shop").Stdout; !strings.Contains(out, "cart") || !strings.Contains(out, "512MiB") {
		t.Errorf("fn ls = %q", out)
	}
	// A new function needs an image; an unknown app is an error.
	if res := runCLI(t, env, "fn", "deploy", "--app", "shop", "nope", "--token-file", tokFile); res.Code != 2 {
		t.Errorf("deploy without an image: exit %d, %s", res.Code, res.Stderr)
	}
	if res := runCLI(t, env, "fn", "deploy", "--app", "missing", "x", "--image", "i:1", "--token-file", tokFile); res.Code != 1 {
		t.Errorf("deploy to a missing app: exit %d, %s", res.Code, res.Stderr)
	}
	cli("fn", "deploy", "--app", "new-app", "--create-app", "x", "--image", "i:1")
	cli("fn", "delete", "shop", "cart")
	cli("app", "delete", "shop")
	if res := runCLI(t, env, "app", "get", "shop", "--token-file", tokFile); res.Code != 1 {
		t.Errorf("get a deleted app: exit %d", res.Code)
	}
}

// runCLI runs the whole command line (package clirun).
func runCLI(t *testing.T, env map[string]string, args ...string) clirun.Result {
	return clirun.Run(t, env, args...)
}
