package client

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/mercator/mercator/pki"
)

// Context is one control plane the CLI knows: where it is, the file of the
// credential to call it with, and the CA its certificate must lead to. It
// names the token's file rather than holding the token, so the secret stays
// in one file whose lifetime its owner decides. Relative paths are relative
// to the context file's directory.
type Context struct {
	Addr      string `json:"addr"`
	TokenFile string `json:"token_file"`
	CAFile    string `json:"ca_file,omitempty"`
	// Project is the context's default project (EnvProject beats it).
	Project string `json:"project,omitempty"`
}

// ContextFile is the JSON file of the CLI's contexts (`mercator context
// add/use/ls`, and the "dev" context `mercator dev` writes), so that client
// commands find a control plane without flags.
//
// The form written before named contexts existed, {"addr", "token_file"} at
// the top level, is still read: it is the current context when Contexts is
// empty.
type ContextFile struct {
	Current  string             `json:"current,omitempty"`
	Contexts map[string]Context `json:"contexts,omitempty"`
	// Addr and TokenFile are the single-context form.
	Addr      string `json:"addr,omitempty"`
	TokenFile string `json:"token_file,omitempty"`
}

// current is the context in use, and its name ("" for the single-context
// form).
func (cf ContextFile) current() (Context, string, error) {
	if len(cf.Contexts) == 0 {
		return Context{Addr: cf.Addr, TokenFile: cf.TokenFile}, "", nil
	}
	c, ok := cf.Contexts[cf.Current]
	if !ok {
		return Context{}, "", fmt.Errorf("the current context %q is not defined; choose one with `mercator context use NAME` (have: %s)", cf.Current, strings.Join(cf.Names(), ", "))
	}
	return c, cf.Current, nil
}

// Names are the contexts' names, sorted.
func (cf ContextFile) Names() []string {
	names := make([]string, 0, len(cf.Contexts))
	for n := range cf.Contexts {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// fillFromContext fills cfg's empty fields from the current context of the
// file at path; a missing file fills nothing.
func fillFromContext(cfg *Config, path string) error {
	cf, found, err := ReadContexts(path)
	if err != nil || !found {
		return err
	}
	c, _, err := cf.current()
	if err != nil {
		return fmt.Errorf("context file %s: %w", path, err)
	}
	rel := func(p string) string {
		if p != "" && !filepath.IsAbs(p) {
			return filepath.Join(filepath.Dir(path), p)
		}
		return p
	}
	if cfg.Addr == "" {
		cfg.Addr = strings.TrimSpace(c.Addr)
	}
	if cfg.CAFile == "" {
		cfg.CAFile = rel(c.CAFile)
	}
	if cfg.Project == "" {
		cfg.Project = c.Project
	}
	if cfg.Token == "" && c.TokenFile != "" {
		tok, err := readToken(rel(c.TokenFile))
		if err != nil {
			return fmt.Errorf("context file %s: %w", path, err)
		}
		cfg.Token = tok
	}
	return nil
}

// ReadContexts reads the context file at path; found is false when it does
// not exist.
func ReadContexts(path string) (cf ContextFile, found bool, err error) {
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return ContextFile{}, false, nil
	}
	if err != nil {
		return ContextFile{}, false, fmt.Errorf("reading context file: %w", err)
	}
	if err := json.Unmarshal(raw, &cf); err != nil {
		return ContextFile{}, false, fmt.Errorf("context file %s is not valid JSON: %w (remove it or run `mercator dev` again)", path, err)
	}
	return cf, true, nil
}

// SaveContext adds or replaces the context name in the file at path (a
// single-context file becomes context "default" beside it) and, with use,
// makes it the current one.
func SaveContext(path, name string, c Context, use bool) error {
	if name == "" {
		return errors.New("a context needs a name")
	}
	cf, _, err := ReadContexts(path)
	if err != nil {
		return err
	}
	if len(cf.Contexts) == 0 {
		cf.Contexts = map[string]Context{}
		if cf.Addr != "" {
			cf.Contexts["default"] = Context{Addr: cf.Addr, TokenFile: cf.TokenFile}
			cf.Current = "default"
		}
	}
	cf.Addr, cf.TokenFile = "", ""
	cf.Contexts[name] = c
	if use || cf.Current == "" {
		cf.Current = name
	}
	return WriteContext(path, cf)
}

// UseContext makes name the current context of the file at path.
func UseContext(path, name string) error {
	cf, _, err := ReadContexts(path)
	if err != nil {
		return err
	}
	if _, ok := cf.Contexts[name]; !ok {
		return fmt.Errorf("no context %q in %s (have: %s)", name, path, strings.Join(cf.Names(), ", "))
	}
	cf.Current = name
	return WriteContext(path, cf)
}

// WriteContext writes cf to path: the directories are created (0700), the
// file is replaced atomically (written to a temporary file in the same
// directory, synced, renamed) so a reader never sees half a file, and its
// mode is 0600 because it points at credentials.
func WriteContext(path string, cf ContextFile) error {
	raw, err := json.MarshalIndent(cf, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding context file: %w", err)
	}
	if err := pki.WriteFileAtomic(path, append(raw, '\n'), 0o600); err != nil {
		return fmt.Errorf("writing context file: %w", err)
	}
	return nil
}
