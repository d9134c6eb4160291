// Package secretflag reads a Run's secrets from the command line of
// `mercator run submit`: --secret NAME=VALUE, --secret NAME (the value of
// $NAME in the command's environment) and --secret-file NAME=PATH (the
// file's exact bytes, at most api.MaxRunSecretBytes, refused rather than
// cut). It checks what only the command line can get wrong (a name given
// twice, a value missing, a file too large or unreadable); the names and
// values themselves are checked by api.RunSpec.Validate. No error it
// returns shows a value.
package secretflag

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/mercator/mercator/api"
)

// Help is run submit's help on secrets.
const Help = `
Secrets: --secret NAME=VALUE, --secret NAME (the value of $NAME in this
command's environment) and --secret-file NAME=PATH (the file's bytes,
exactly, at most 32 KiB) set NAME in the container's environment like
--env, but the control plane seals the value as it accepts the run, sends
it only to the node that runs an attempt, and never shows it: reads list
the names only. --env is stored in the clear and shown by every read; it is
not for secrets. A value on the command line is visible to other users of
this machine (ps) and stays in the shell's history: prefer --secret NAME or
--secret-file.`

// Flags are the secret flags as given, before they are read.
type Flags struct {
	values, files list
}

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(s string) error { *l = append(*l, s); return nil }

// Define adds --secret and --secret-file to fs.
func (f *Flags) Define(fs *flag.FlagSet) {
	fs.Var(&f.values, "secret", "set `NAME=VALUE` (or NAME, taking $NAME from this environment) in the container's environment as a secret: sealed, never shown (repeatable)")
	fs.Var(&f.files, "secret-file", "a secret from a file: `NAME=PATH` sets NAME in the container's environment to the file's bytes (at most 32 KiB), sealed, never shown (repeatable)")
}

// Read returns the secrets the flags give, taking a bare NAME's value from
// env and a file's from the file; nil when none were given. Its errors
// name the flag and the secret.
func (f *Flags) Read(env func(string) string) (map[string]string, error) {
	if len(f.values)+len(f.files) == 0 {
		return nil, nil
	}
	out := map[string]string{}
	add := func(flag, name, value string) error {
		if name == "" {
			return fmt.Errorf("%s: a secret needs a NAME (want NAME=VALUE, or NAME=PATH for --secret-file)", flag)
		}
		if _, dup := out[name]; dup {
			return fmt.Errorf("%s %s: the secret %s is given twice", flag, name, name)
		}
		out[name] = value
		return nil
	}
	for _, kv := range f.values {
		name, value, ok := strings.Cut(kv, "=")
		if !ok {
			if value = env(name); value == "" {
				return nil, fmt.Errorf("--secret %s: $%s is not set (or is empty) in this environment; export it, give --secret %s=VALUE, or use --secret-file", name, name, name)
			}
		}
		if err := add("--secret", name, value); err != nil {
			return nil, err
		}
	}
	for _, kv := range f.files {
		name, path, ok := strings.Cut(kv, "=")
		if !ok || path == "" {
			return nil, fmt.Errorf("--secret-file %q: want NAME=PATH", kv)
		}
		value, err := readFile(path)
		if err != nil {
			return nil, fmt.Errorf("--secret-file %s: %w", name, err)
		}
		if err := add("--secret-file", name, value); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// readFile reads a secret's value from path: at most
// api.MaxRunSecretBytes, refused when larger, without reading more than
// one byte past the limit.
func readFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, api.MaxRunSecretBytes+1))
	if err != nil {
		return "", err
	}
	if len(b) > api.MaxRunSecretBytes {
		return "", fmt.Errorf("%s is larger than %d bytes, the most a secret may hold (put larger material in an Artifact, and its key in a secret)", path, api.MaxRunSecretBytes)
	}
	return string(b), nil
}
