package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/mercator/mercator/failure"
)

// Environment variables and defaults LoadConfig reads.
const (
	// EnvAddr overrides the control plane's address.
	EnvAddr = "MERCATOR_ADDR"
	// EnvToken overrides the bearer token (the token itself, not a file).
	EnvToken = "MERCATOR_TOKEN"
	// EnvConfig names the context file, overriding the XDG location.
	EnvConfig = "MERCATOR_CONFIG"
	// DefaultAddr is where `mercator dev` listens; it is the address when a
	// token is configured but no address is.
	DefaultAddr = "http://127.0.0.1:7070"
)

// Config is where the control plane is and the credential to call it with:
// the two arguments of New.
type Config struct {
	// Addr is the base URL, e.g. "http://127.0.0.1:7070".
	Addr string
	// Token is the bearer token, never empty in a Config LoadConfig returns.
	Token string
}

// ContextFile is the JSON file `mercator dev` writes so that client commands
// on the same machine find the control plane it started without flags. It
// names the token's file rather than holding the token, so the secret stays
// in one file whose lifetime the server owns.
type ContextFile struct {
	// Addr is the control plane's base URL.
	Addr string `json:"addr"`
	// TokenFile is the path of a file holding the admin bearer token. A
	// relative path is relative to the context file's directory.
	TokenFile string `json:"token_file"`
}

// Overrides are values a caller was given explicitly (the CLI's --addr and
// --token-file flags). A non-empty field beats every other source.
type Overrides struct {
	Addr      string
	TokenFile string
}

// ContextPath is where the context file is: $MERCATOR_CONFIG if set, else
// $XDG_CONFIG_HOME/mercator/context.json, else
// $HOME/.config/mercator/context.json. It is "" when none of those variables
// is set. env is os.Getenv or a stand-in.
func ContextPath(env func(string) string) string {
	if p := env(EnvConfig); p != "" {
		return p
	}
	if dir := env("XDG_CONFIG_HOME"); dir != "" {
		return filepath.Join(dir, "mercator", "context.json")
	}
	if home := env("HOME"); home != "" {
		return filepath.Join(home, ".config", "mercator", "context.json")
	}
	return ""
}

// LoadConfig resolves the address and token for client commands from the
// environment. Each of the two is taken from the first source that has it:
//
//  1. MERCATOR_ADDR and MERCATOR_TOKEN;
//  2. the context file at ContextPath(env), as `mercator dev` writes it (its
//     token_file is read);
//  3. for the address only, DefaultAddr.
//
// A missing context file is not an error; a malformed one, or a token file
// that cannot be read or is empty, is. No token anywhere is an
// failure.ErrUnauthorized error telling the user how to provide one.
func LoadConfig(env func(string) string) (Config, error) {
	return LoadConfigOverrides(env, Overrides{})
}

// LoadConfigOverrides is LoadConfig with explicit values that beat the
// environment and the context file: o.Addr for the address, the contents of
// o.TokenFile for the token.
func LoadConfigOverrides(env func(string) string, o Overrides) (Config, error) {
	cfg := Config{Addr: o.Addr, Token: ""}
	if o.TokenFile != "" {
		tok, err := readToken(o.TokenFile)
		if err != nil {
			return Config{}, err
		}
		cfg.Token = tok
	}
	if cfg.Addr == "" {
		cfg.Addr = strings.TrimSpace(env(EnvAddr))
	}
	if cfg.Token == "" {
		cfg.Token = strings.TrimSpace(env(EnvToken))
	}
	path := ContextPath(env)
	if (cfg.Addr == "" || cfg.Token == "") && path != "" {
		cf, found, err := readContext(path)
		if err != nil {
			return Config{}, err
		}
		if found {
			if cfg.Addr == "" {
				cfg.Addr = strings.TrimSpace(cf.Addr)
			}
			if cfg.Token == "" && cf.TokenFile != "" {
				tf := cf.TokenFile
				if !filepath.IsAbs(tf) {
					tf = filepath.Join(filepath.Dir(path), tf)
				}
				tok, err := readToken(tf)
				if err != nil {
					return Config{}, fmt.Errorf("context file %s: %w", path, err)
				}
				cfg.Token = tok
			}
		}
	}
	if cfg.Addr == "" {
		cfg.Addr = DefaultAddr
	}
	cfg.Addr = normalizeAddr(cfg.Addr)
	if cfg.Token == "" {
		where := "no context file"
		if path != "" {
			where = "no token in " + path
		}
		return Config{}, &credentialError{where: where}
	}
	return cfg, nil
}

// credentialError is the "no token anywhere" failure; it matches
// failure.ErrUnauthorized and says the three ways out.
type credentialError struct{ where string }

func (e *credentialError) Error() string {
	return "no credential for the control plane (" + e.where + "): run `mercator dev` to start a local one, " +
		"set " + EnvToken + " (and " + EnvAddr + "), or pass --token-file"
}

func (e *credentialError) Unwrap() error { return failure.ErrUnauthorized }

// readContext reads a context file; found is false when it does not exist.
func readContext(path string) (ContextFile, bool, error) {
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return ContextFile{}, false, nil
	}
	if err != nil {
		return ContextFile{}, false, fmt.Errorf("reading context file: %w", err)
	}
	var cf ContextFile
	if err := json.Unmarshal(raw, &cf); err != nil {
		return ContextFile{}, false, fmt.Errorf("context file %s is not valid JSON: %w (remove it or run `mercator dev` again)", path, err)
	}
	return cf, true, nil
}

// readToken reads a token file, trimming surrounding whitespace (files end
// with a newline); an empty file is an error.
func readToken(path string) (string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("reading token file: %w", err)
	}
	tok := strings.TrimSpace(string(raw))
	if tok == "" {
		return "", fmt.Errorf("token file %s is empty", path)
	}
	return tok, nil
}

// WriteContext writes ctx to path as `mercator dev` does: the directories
// are created (0700), the file is replaced atomically (written to a
// temporary file in the same directory, synced, renamed) so a reader never
// sees half a file, and its mode is 0600 because it points at a credential.
func WriteContext(path string, ctx ContextFile) error {
	raw, err := json.MarshalIndent(ctx, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding context file: %w", err)
	}
	raw = append(raw, '\n')
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("writing context file: %w", err)
	}
	f, err := os.CreateTemp(dir, ".context-*.tmp")
	if err != nil {
		return fmt.Errorf("writing context file: %w", err)
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			_ = f.Close()
			_ = os.Remove(tmp)
		}
	}()
	if err := f.Chmod(0o600); err != nil {
		return fmt.Errorf("writing context file: %w", err)
	}
	if _, err := f.Write(raw); err != nil {
		return fmt.Errorf("writing context file: %w", err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("writing context file: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing context file: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("writing context file: %w", err)
	}
	ok = true
	return nil
}
