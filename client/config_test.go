package client

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mercator/mercator/failure"
)

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// devContext writes a context file and its token file as `mercator dev`
// would, and returns the context file's path.
func devContext(t *testing.T, dir, addr, token string) string {
	t.Helper()
	tf := filepath.Join(dir, "admin-token")
	if err := os.WriteFile(tf, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "mercator", "context.json")
	if err := WriteContext(p, ContextFile{Addr: addr, TokenFile: tf}); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestContextPath(t *testing.T) {
	cases := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"MERCATOR_CONFIG": "/c.json", "XDG_CONFIG_HOME": "/x", "HOME": "/h"}, "/c.json"},
		{map[string]string{"XDG_CONFIG_HOME": "/x", "HOME": "/h"}, "/x/mercator/context.json"},
		{map[string]string{"HOME": "/h"}, "/h/.config/mercator/context.json"},
		{map[string]string{}, ""},
	}
	for _, tc := range cases {
		if got := ContextPath(envOf(tc.env)); got != tc.want {
			t.Errorf("ContextPath(%v) = %q, want %q", tc.env, got, tc.want)
		}
	}
}

func TestLoadConfigPrecedence(t *testing.T) {
	dir := t.TempDir()
	devContext(t, dir, "http://127.0.0.1:7171", "ctx-token")
	flagToken := filepath.Join(dir, "flag-token")
	if err := os.WriteFile(flagToken, []byte("  flag-token \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := map[string]string{"XDG_CONFIG_HOME": dir}

	t.Run("context file", func(t *testing.T) {
		cfg, err := LoadConfig(envOf(base))
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Addr != "http://127.0.0.1:7171" || cfg.Token != "ctx-token" {
			t.Errorf("cfg = %+v", cfg)
		}
	})
	t.Run("env beats context", func(t *testing.T) {
		env := map[string]string{"XDG_CONFIG_HOME": dir, "MERCATOR_ADDR": "https://cp.example:443", "MERCATOR_TOKEN": "env-token"}
		cfg, err := LoadConfig(envOf(env))
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Addr != "https://cp.example:443" || cfg.Token != "env-token" {
			t.Errorf("cfg = %+v", cfg)
		}
	})
	t.Run("each field separately", func(t *testing.T) {
		env := map[string]string{"XDG_CONFIG_HOME": dir, "MERCATOR_TOKEN": "env-token"}
		cfg, err := LoadConfig(envOf(env))
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Addr != "http://127.0.0.1:7171" || cfg.Token != "env-token" {
			t.Errorf("cfg = %+v", cfg)
		}
	})
	t.Run("overrides beat env", func(t *testing.T) {
		env := map[string]string{"XDG_CONFIG_HOME": dir, "MERCATOR_ADDR": "http://env:1", "MERCATOR_TOKEN": "env-token"}
		cfg, err := LoadConfigOverrides(envOf(env), Overrides{Addr: "flag:2", TokenFile: flagToken})
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Addr != "http://flag:2" || cfg.Token != "flag-token" {
			t.Errorf("cfg = %+v", cfg)
		}
	})
	t.Run("MERCATOR_CONFIG beats XDG", func(t *testing.T) {
		other := t.TempDir()
		p := devContext(t, other, "http://other:9", "other-token")
		cfg, err := LoadConfig(envOf(map[string]string{"XDG_CONFIG_HOME": dir, "MERCATOR_CONFIG": p}))
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Addr != "http://other:9" || cfg.Token != "other-token" {
			t.Errorf("cfg = %+v", cfg)
		}
	})
	t.Run("token only defaults the address", func(t *testing.T) {
		cfg, err := LoadConfig(envOf(map[string]string{"MERCATOR_TOKEN": "t"}))
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Addr != DefaultAddr {
			t.Errorf("addr = %q", cfg.Addr)
		}
	})
}

func TestLoadConfigRelativeTokenFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tok"), []byte("rel"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "context.json")
	if err := WriteContext(p, ContextFile{Addr: "http://a:1", TokenFile: "tok"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(envOf(map[string]string{"MERCATOR_CONFIG": p}))
	if err != nil || cfg.Token != "rel" {
		t.Fatalf("cfg = %+v, err = %v", cfg, err)
	}
}

func TestLoadConfigMissingCredential(t *testing.T) {
	_, err := LoadConfig(envOf(map[string]string{"HOME": t.TempDir()}))
	if !errors.Is(err, failure.ErrUnauthorized) {
		t.Fatalf("err = %v, want unauthorized", err)
	}
	for _, hint := range []string{"mercator dev", "MERCATOR_TOKEN", "--token-file"} {
		if !strings.Contains(err.Error(), hint) {
			t.Errorf("message %q does not mention %q", err, hint)
		}
	}
}

func TestLoadConfigBadFiles(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadConfig(envOf(map[string]string{"MERCATOR_CONFIG": bad})); err == nil || !strings.Contains(err.Error(), bad) {
		t.Errorf("malformed context file: err = %v", err)
	}
	p := filepath.Join(dir, "ctx.json")
	if err := WriteContext(p, ContextFile{Addr: "http://a:1", TokenFile: filepath.Join(dir, "missing")}); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadConfig(envOf(map[string]string{"MERCATOR_CONFIG": p})); err == nil || !strings.Contains(err.Error(), "missing") {
		t.Errorf("missing token file: err = %v", err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadConfigOverrides(envOf(nil), Overrides{TokenFile: empty}); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("empty token file: err = %v", err)
	}
}

func TestWriteContext(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "a", "b", "context.json")
	if err := WriteContext(p, ContextFile{Addr: "http://x:1", TokenFile: "/t"}); err != nil {
		t.Fatal(err)
	}
	if err := WriteContext(p, ContextFile{Addr: "http://y:2", TokenFile: "/t"}); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode = %v, want 0600", fi.Mode().Perm())
	}
	raw, _ := os.ReadFile(p)
	if !strings.Contains(string(raw), `"addr": "http://y:2"`) || !strings.Contains(string(raw), `"token_file": "/t"`) {
		t.Errorf("content = %s", raw)
	}
	entries, _ := os.ReadDir(filepath.Dir(p))
	if len(entries) != 1 {
		t.Errorf("leftover files: %v", entries)
	}
}

func TestNamedContexts(t *testing.T) {
	dir := t.TempDir()
	p := devContext(t, dir, "http://127.0.0.1:7171", "legacy-token") // the single-context form
	prodToken := filepath.Join(dir, "prod-token")
	if err := os.WriteFile(prodToken, []byte("prod-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := SaveContext(p, "prod", Context{Addr: "https://cp.example:7443", TokenFile: prodToken, CAFile: "prod-ca.pem"}, true); err != nil {
		t.Fatal(err)
	}
	env := envOf(map[string]string{"MERCATOR_CONFIG": p})
	cfg, err := LoadConfig(env)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Addr != "https://cp.example:7443" || cfg.Token != "prod-token" || cfg.CAFile != filepath.Join(dir, "mercator", "prod-ca.pem") {
		t.Fatalf("current context prod: got %+v", cfg)
	}
	if err := UseContext(p, "default"); err != nil {
		t.Fatal(err)
	}
	if cfg, err = LoadConfig(env); err != nil || cfg.Addr != "http://127.0.0.1:7171" || cfg.Token != "legacy-token" || cfg.CAFile != "" {
		t.Fatalf("the single-context form kept as context default: got %+v, %v", cfg, err)
	}
	if err := UseContext(p, "nope"); err == nil || !strings.Contains(err.Error(), "default, prod") {
		t.Fatalf("use of an unknown context: %v", err)
	}
	// MERCATOR_CA_FILE beats the context's CA.
	if err := UseContext(p, "prod"); err != nil {
		t.Fatal(err)
	}
	cfg, err = LoadConfig(envOf(map[string]string{"MERCATOR_CONFIG": p, "MERCATOR_CA_FILE": "/env-ca.pem"}))
	if err != nil || cfg.CAFile != "/env-ca.pem" {
		t.Fatalf("MERCATOR_CA_FILE: got %+v, %v", cfg, err)
	}
}

func TestNewFromConfigRefusesPlaintextOffLoopback(t *testing.T) {
	if _, err := NewFromConfig(Config{Addr: "http://cp.example:7070", Token: "t"}); err == nil || !strings.Contains(err.Error(), "refusing plain http://") {
		t.Fatalf("want plaintext to another host refused, got %v", err)
	}
	if _, err := NewFromConfig(Config{Addr: "http://127.0.0.1:7070", Token: "t"}); err != nil {
		t.Fatalf("loopback: %v", err)
	}
	if _, err := NewFromConfig(Config{Addr: "https://cp.example", Token: "t", CAFile: filepath.Join(t.TempDir(), "missing.pem")}); err == nil {
		t.Fatal("a missing CA file was accepted")
	}
}
