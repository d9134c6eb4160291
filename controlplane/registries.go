package controlplane

// This file holds registry credentials: stored sealed, never returned, and
// handed to a node only inside the one command that pulls with them.
//
// The password is sealed with AES-256-GCM under Config.RegistryKey, with the
// registry host as additional data, so a database copied elsewhere holds
// nothing usable and a sealed password cannot be moved to another host's
// record. The key is the operator's (--registry-key-file or
// MERCATOR_REGISTRY_KEY) or, by default, generated into the data directory
// on first start (mode 0600).
//
// A stored operation never carries the credential: the launch is stored
// with an empty RegistryAuth, and the session stream attaches the
// credential for the image's registry as it sends the command (outbound).
// The node passes it to the daemon as the X-Registry-Auth header of one pull
// and keeps it nowhere. Tag resolution at submit uses the same credential
// (refResolver).

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/imageref"
	"github.com/mercator/mercator/store"
)

// RegistryKeySize is the length of the key that seals registry credentials.
const RegistryKeySize = 32

// LoadRegistryKey returns the key that seals registry credentials: provided
// (64 hex digits, or 44 base64 characters) when not empty, else the key in
// keyFile, generated there with mode 0600 on first start. A key file others
// can read is refused.
func LoadRegistryKey(provided, keyFile string) ([]byte, error) {
	if provided = strings.TrimSpace(provided); provided != "" {
		return parseKey(provided, "the registry key given")
	}
	if fi, err := os.Stat(keyFile); err == nil {
		if fi.Mode().Perm()&0o077 != 0 {
			return nil, fmt.Errorf("registry key %s is readable by others (mode %o); run `chmod 600 %s`", keyFile, fi.Mode().Perm(), keyFile)
		}
		raw, err := os.ReadFile(keyFile)
		if err != nil {
			return nil, fmt.Errorf("registry key: %w", err)
		}
		return parseKey(strings.TrimSpace(string(raw)), "registry key "+keyFile)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("registry key: %w", err)
	}
	key := make([]byte, RegistryKeySize)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(keyFile), 0o700); err != nil {
		return nil, err
	}
	tmp := keyFile + ".tmp"
	if err := os.WriteFile(tmp, []byte(hex.EncodeToString(key)+"\n"), 0o600); err != nil {
		return nil, fmt.Errorf("registry key: %w", err)
	}
	return key, os.Rename(tmp, keyFile)
}

func parseKey(s, what string) ([]byte, error) {
	if key, err := hex.DecodeString(s); err == nil && len(key) == RegistryKeySize {
		return key, nil
	}
	if key, err := base64.StdEncoding.DecodeString(s); err == nil && len(key) == RegistryKeySize {
		return key, nil
	}
	return nil, fmt.Errorf("%s is not a %d-byte key in hex or base64 (make one with `openssl rand -hex 32`)", what, RegistryKeySize)
}

func (s *Server) aead() (cipher.AEAD, error) {
	if len(s.cfg.RegistryKey) != RegistryKeySize {
		return nil, failure.Unavailable("this control plane has no registry key configured, so it cannot hold registry credentials")
	}
	block, err := aes.NewCipher(s.cfg.RegistryKey)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

func sealingData(host string) []byte { return []byte("mercator registry credential\x00" + host) }

func (s *Server) seal(host, password string) ([]byte, error) {
	a, err := s.aead()
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, a.NonceSize(), a.NonceSize()+len(password)+a.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return a.Seal(nonce, nonce, []byte(password), sealingData(host)), nil
}

func (s *Server) unseal(host string, sealed []byte) (string, error) {
	a, err := s.aead()
	if err != nil {
		return "", err
	}
	if len(sealed) < a.NonceSize() {
		return "", fmt.Errorf("the stored credential for %s is damaged", host)
	}
	plain, err := a.Open(nil, sealed[:a.NonceSize()], sealed[a.NonceSize():], sealingData(host))
	if err != nil {
		return "", fmt.Errorf("the stored credential for %s cannot be opened with this control plane's registry key (was the key replaced?): add it again", host)
	}
	return string(plain), nil
}

// normalizeRegistryHost is the registry as image references name it: a
// host[:port], lower case, with Docker Hub's aliases folded into docker.io.
func normalizeRegistryHost(h string) (string, error) {
	h = strings.ToLower(strings.TrimSpace(h))
	if strings.Contains(h, "://") || strings.ContainsAny(h, "/@ \t") || h == "" {
		return "", failure.Invalid("host", "%q is not a registry host: write the host[:port] image references start with, such as ghcr.io or 127.0.0.1:5000", h)
	}
	if host, port, err := net.SplitHostPort(h); err == nil && (host == "" || port == "") {
		return "", failure.Invalid("host", "%q is not a registry host[:port]", h)
	}
	switch h {
	case "index.docker.io", "registry-1.docker.io", "registry.hub.docker.com":
		h = "docker.io"
	}
	return h, nil
}

func registryView(c store.RegistryCredential) api.Registry {
	return api.Registry{Host: c.Host, Username: c.Username, CreatedAt: c.CreatedAt, UpdatedAt: c.UpdatedAt}
}

// putRegistry stores (or replaces) the credential of a registry host:
// POST /v1/registries. The answer never holds the password.
func (s *Server) putRegistry(w http.ResponseWriter, r *http.Request) {
	var req api.RegistryCredentialRequest
	if err := decode(r, maxBody, &req); err != nil {
		writeError(w, err)
		return
	}
	host, err := normalizeRegistryHost(req.Host)
	if err != nil {
		writeError(w, err)
		return
	}
	if req.Username == "" || req.Password == "" {
		writeError(w, failure.Invalid("password", "a username and a password (or token) are both required"))
		return
	}
	sealed, err := s.seal(host, req.Password)
	if err != nil {
		writeError(w, err)
		return
	}
	now := s.now()
	var out store.RegistryCredential
	status := http.StatusCreated
	err = s.store.Update(r.Context(), func(tx store.Tx) error {
		out = store.RegistryCredential{Host: host, Username: req.Username, Sealed: sealed, CreatedAt: now, UpdatedAt: now}
		status = http.StatusCreated
		if old, err := tx.GetRegistryCredential(host); err == nil {
			out.CreatedAt, status = old.CreatedAt, http.StatusOK
		} else if !errors.Is(err, failure.ErrNotFound) {
			return err
		}
		return tx.PutRegistryCredential(out)
	})
	if err != nil {
		writeError(w, err)
		return
	}
	s.creds.forget(host)
	s.log.Info("registry credential stored", "host", host, "username", req.Username)
	writeJSON(w, status, registryView(out))
}

func (s *Server) listRegistries(w http.ResponseWriter, r *http.Request) {
	out := api.RegistryList{Registries: []api.Registry{}}
	err := s.store.View(r.Context(), func(tx store.Tx) error {
		cs, err := tx.ListRegistryCredentials()
		out.Registries = out.Registries[:0]
		for _, c := range cs {
			out.Registries = append(out.Registries, registryView(c))
		}
		return err
	})
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// deleteRegistry removes a host's credential: DELETE /v1/registries/{host}.
// It answers with what was removed (without the password).
func (s *Server) deleteRegistry(w http.ResponseWriter, r *http.Request) {
	host, err := normalizeRegistryHost(r.PathValue("host"))
	if err != nil {
		writeError(w, err)
		return
	}
	var out store.RegistryCredential
	err = s.store.Update(r.Context(), func(tx store.Tx) error {
		var err error
		if out, err = tx.GetRegistryCredential(host); err != nil {
			return err
		}
		return tx.DeleteRegistryCredential(host)
	})
	if err != nil {
		writeError(w, err)
		return
	}
	s.creds.forget(host)
	s.log.Info("registry credential removed", "host", host)
	writeJSON(w, http.StatusOK, registryView(out))
}

// registryCredential returns the username and password stored for host;
// ok is false when none is (or it cannot be opened, which is logged).
func (s *Server) registryCredential(ctx context.Context, host string) (user, password string, ok bool) {
	host, err := normalizeRegistryHost(host)
	if err != nil {
		return "", "", false
	}
	now := time.Now()
	c, found, fresh, gen := s.creds.get(host, now)
	if !fresh {
		err = s.store.View(ctx, func(tx store.Tx) error {
			var err error
			c, err = tx.GetRegistryCredential(host)
			return err
		})
		if err != nil && !errors.Is(err, failure.ErrNotFound) {
			s.log.Warn("reading registry credential", "host", host, "err", err)
			return "", "", false
		}
		found = err == nil
		s.creds.put(host, c, found, gen, now)
	}
	if !found {
		return "", "", false
	}
	password, err = s.unseal(host, c.Sealed)
	if err != nil {
		s.log.Warn("registry credential unusable", "host", host, "err", err)
		return "", "", false
	}
	return c.Username, password, true
}

// registryAuth is the Engine API's X-Registry-Auth value for pulling image,
// or "" when no credential is stored for its registry.
func (s *Server) registryAuth(ctx context.Context, image string) string {
	ref, err := imageref.Parse(image)
	if err != nil {
		return ""
	}
	user, password, ok := s.registryCredential(ctx, ref.Registry())
	if !ok {
		return ""
	}
	raw, _ := json.Marshal(struct {
		Username      string `json:"username"`
		Password      string `json:"password"`
		ServerAddress string `json:"serveraddress"`
	}{user, password, ref.Registry()})
	return base64.URLEncoding.EncodeToString(raw)
}

// RegistryCredentials is what tag resolution at submit asks for a
// registry's credential (imageref.Resolver.Credentials, with a context).
func (s *Server) RegistryCredentials(ctx context.Context, host string) (user, password string, ok bool) {
	return s.registryCredential(ctx, host)
}
