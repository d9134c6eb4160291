package client

import (
	"fmt"
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
	// EnvCAFile names a file of the CA certificate(s) the server's chain
	// must lead to, overriding the context's.
	EnvCAFile = "MERCATOR_CA_FILE"
	// EnvProject names the project commands submit to and list by
	// default, overriding the context's.
	EnvProject = "MERCATOR_PROJECT"
	// DefaultAddr is where `mercator dev` listens; it is the address when a
	// token is configured but no address is.
	DefaultAddr = "https://127.0.0.1:7070"
)

// Config is where the control plane is and the credential to call it with:
// the two arguments of New.
type Config struct {
	// Addr is the base URL, e.g. "http://127.0.0.1:7070".
	Addr string
	// Token is the bearer token, never empty in a Config LoadConfig returns.
	Token string
	// CAFile, when set, holds the CA certificate(s) the server's chain must
	// lead to (see NewFromConfig); empty means the system's CAs.
	CAFile string
	// Project is the project commands use when they are given none
	// ($MERCATOR_PROJECT, then the context's); "" leaves it to the server
	// (api.DefaultProject).
	Project string
}

// Overrides are values a caller was given explicitly (the CLI's --addr,
// --token-file and --ca-file flags). A non-empty field beats every other
// source.
type Overrides struct {
	Addr      string
	TokenFile string
	CAFile    string
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

// LoadConfig resolves the address, token and CA for client commands from
// the environment. Each is taken from the first source that has it:
//
//  1. MERCATOR_ADDR, MERCATOR_TOKEN and MERCATOR_CA_FILE;
//  2. the current context of the context file at ContextPath(env), as
//     `mercator dev` and `mercator context add` write it (its token_file is
//     read);
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
// o.TokenFile for the token, o.CAFile for the CA.
func LoadConfigOverrides(env func(string) string, o Overrides) (Config, error) {
	cfg := Config{Addr: o.Addr, Token: "", CAFile: o.CAFile}
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
	if cfg.CAFile == "" {
		cfg.CAFile = strings.TrimSpace(env(EnvCAFile))
	}
	cfg.Project = strings.TrimSpace(env(EnvProject))
	path := ContextPath(env)
	if (cfg.Addr == "" || cfg.Token == "" || cfg.CAFile == "") && path != "" {
		if err := fillFromContext(&cfg, path); err != nil {
			return Config{}, err
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
