package cli

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/mercator/mercator/api"
)

// runSecretHelp is run submit's help on secrets.
const runSecretHelp = `
Secrets: --secret NAME=VALUE, --secret NAME (the value of $NAME in this
command's environment) and --secret-file NAME=PATH (the file's bytes,
exactly, at most 32 KiB) set NAME in the container's environment like
--env, but the control plane seals the value as it accepts the run, sends
it only to the node that runs an attempt, and never shows it: reads list
the names only. --env is stored in the clear and shown by every read; it is
not for secrets. A value on the command line is visible to other users of
this machine (ps) and stays in the shell's history: prefer --secret NAME or
--secret-file.`

// secretFlags are run submit's secret flags, before they are read.
type secretFlags struct {
	values, files stringList
}

func (sf *secretFlags) define(fs *flagSet) {
	fs.Var(&sf.values, "secret", "set `NAME=VALUE` (or NAME, taking $NAME from this environment) in the container's environment as a secret: sealed, never shown (repeatable)")
	fs.Var(&sf.files, "secret-file", "set `NAME=PATH` in the container's environment as a secret, the value read from the file, at most 32 KiB (repeatable)")
}

// secrets reads the secrets the flags give, taking a bare NAME's value from
// env and a file's from the file. A name given twice, a missing value and
// a file too large or unreadable are usage errors naming the flag; the
// names and values themselves are checked by api.RunSpec.Validate. No
// error shows a value.
func (sf *secretFlags) secrets(env func(string) string) (map[string]string, error) {
	if len(sf.values)+len(sf.files) == 0 {
		return nil, nil
	}
	out := map[string]string{}
	add := func(flag, name, value string) error {
		if name == "" {
			return usagef("%s: a secret needs a NAME (want NAME=VALUE, or NAME=PATH for --secret-file)", flag)
		}
		if _, dup := out[name]; dup {
			return usagef("%s %s: the secret %s is given twice", flag, name, name)
		}
		out[name] = value
		return nil
	}
	for _, kv := range sf.values {
		name, value, ok := strings.Cut(kv, "=")
		if !ok {
			if value = env(name); value == "" {
				return nil, usagef("--secret %s: $%s is not set (or is empty) in this environment; export it, give --secret %s=VALUE, or use --secret-file", name, name, name)
			}
		}
		if err := add("--secret", name, value); err != nil {
			return nil, err
		}
	}
	for _, kv := range sf.files {
		name, path, ok := strings.Cut(kv, "=")
		if !ok || path == "" {
			return nil, usagef("--secret-file %q: want NAME=PATH", kv)
		}
		value, err := readSecretFile(path)
		if err != nil {
			return nil, usagef("--secret-file %s: %v", name, err)
		}
		if err := add("--secret-file", name, value); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// readSecretFile reads a secret's value from path: at most
// api.MaxRunSecretBytes, refused (not cut) when larger, without reading
// more than one byte past the limit.
func readSecretFile(path string) (string, error) {
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
