package cli

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/mercator/mercator/api"
)

// TestSubmitSecrets: --secret NAME=VALUE, --secret NAME (from the CLI's
// environment) and --secret-file NAME=PATH (the file's exact bytes) reach
// the spec's Secrets, beside --env and apart from it.
func TestSubmitSecrets(t *testing.T) {
	f := newFakeAPI(t)
	file := filepath.Join(t.TempDir(), "key.pem")
	if err := os.WriteFile(file, []byte("-----KEY-----\nabc\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"MERCATOR_ADDR": f.srv.URL, "MERCATOR_TOKEN": testToken, "HOME": t.TempDir(), "GH_TOKEN": "from-env"}
	res := runCLI(t, env, "run", "submit", "--image", "alpine:3", "--env", "A=1",
		"--secret", "TOKEN=x=y", "--secret", "GH_TOKEN", "--secret-file", "KEY="+file, "--", "sh")
	if res.code != 0 {
		t.Fatalf("exit %d, stderr %q", res.code, res.stderr)
	}
	want := map[string]string{"TOKEN": "x=y", "GH_TOKEN": "from-env", "KEY": "-----KEY-----\nabc\n"}
	if got := f.submits[0]; !reflect.DeepEqual(got.Secrets, want) || !reflect.DeepEqual(got.Env, map[string]string{"A": "1"}) {
		t.Errorf("submitted secrets %q, env %q; want secrets %q beside env A", got.Secrets, got.Env, want)
	}
}

// TestSubmitSecretsRefused: each mistake is a usage error (exit 2) naming
// the flag and the secret, sends nothing, and never shows a value.
func TestSubmitSecretsRefused(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, []byte(strings.Repeat("v", api.MaxRunSecretBytes+1)), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		says string
	}{
		{[]string{"--secret", "TOKEN"}, "--secret TOKEN: $TOKEN is not set"},
		{[]string{"--secret", "=hunter2"}, "a secret needs a NAME"},
		{[]string{"--secret", "A-B=hunter2"}, `"A-B" is not a valid variable name`},
		{[]string{"--secret", "T=hunter2", "--secret-file", "T=" + big}, "--secret-file T: " + big + " is larger than 32768 bytes"},
		{[]string{"--secret", "T=hunter2", "--secret", "T=hunter2"}, "the secret T is given twice"},
		{[]string{"--secret", "A=hunter2", "--env", "A=1"}, "secrets.A: is also set in env"},
		{[]string{"--secret", "T=" + api.SecretRedacted}, "secrets.T: is \"<redacted>\""},
		{[]string{"--secret-file", "T"}, `--secret-file "T": want NAME=PATH`},
		{[]string{"--secret-file", "T=" + filepath.Join(dir, "missing")}, "no such file"},
	} {
		f := newFakeAPI(t)
		args := append(append([]string{"run", "submit", "--image", "alpine:3"}, tc.args...), "--", "sh")
		res := f.cli(t, args...)
		if res.code != 2 || !strings.Contains(res.stderr, tc.says) {
			t.Errorf("%q: exit %d, stderr %q; want 2 saying %q", tc.args, res.code, res.stderr, tc.says)
		}
		if strings.Contains(res.stderr, "hunter2") {
			t.Errorf("%q: the error shows the secret: %q", tc.args, res.stderr)
		}
		if len(f.submits) != 0 {
			t.Errorf("%q: a refused submission sent %d specs", tc.args, len(f.submits))
		}
	}
}
