// Package sealing is how the control plane keeps what it must hold but
// never show: values sealed with AES-256-GCM under the server's key. Each
// value is sealed with associated data naming what it belongs to, so a
// database copied elsewhere holds nothing usable without the key, a sealed
// value moved to another record does not open, and a wrong key fails
// loudly (GCM authenticates) rather than yielding garbage. Its users are
// registry credentials (package controlplane) and the secret configuration
// of apps and functions (package controlplane/function).
//
// The key is the operator's (--registry-key-file or MERCATOR_REGISTRY_KEY;
// the name is older than its second use) or, by default, generated into the
// data directory on first start (mode 0600).
//
// Only package controlplane and its subpackages may import it.
package sealing

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/mercator/mercator/failure"
)

// KeySize is the length of the key that seals registry credentials
// and secret configuration.
const KeySize = 32

// LoadKey returns the key that seals registry credentials and
// secret configuration: provided (64 hex digits, or 44 base64 characters)
// when not empty, else the key in keyFile, generated there with mode 0600
// on first start. A key file others can read is refused.
func LoadKey(provided, keyFile string) ([]byte, error) {
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
	key := make([]byte, KeySize)
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
	if key, err := hex.DecodeString(s); err == nil && len(key) == KeySize {
		return key, nil
	}
	if key, err := base64.StdEncoding.DecodeString(s); err == nil && len(key) == KeySize {
		return key, nil
	}
	return nil, fmt.Errorf("%s is not a %d-byte key in hex or base64 (make one with `openssl rand -hex 32`)", what, KeySize)
}

// ErrUnsealable is what Unseal returns for a value that does not open: it
// was sealed under another key, or for another record, or it is damaged.
// Callers wrap it with what the value is and what to do about it.
var ErrUnsealable = errors.New("cannot be opened with this control plane's key (was the key replaced, or the value copied from another record?)")

func aead(key []byte) (cipher.AEAD, error) {
	if len(key) != KeySize {
		return nil, failure.Unavailable("this control plane has no key to seal secrets with (--registry-key-file), so it cannot hold registry credentials or secret configuration")
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

// Seal returns plain sealed under key and bound to ad: a fresh nonce
// followed by the ciphertext. It fails with failure.ErrUnavailable when
// key is not a key (nil: the server has none).
func Seal(key, ad []byte, plain string) ([]byte, error) {
	a, err := aead(key)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, a.NonceSize(), a.NonceSize()+len(plain)+a.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return a.Seal(nonce, nonce, []byte(plain), ad), nil
}

// Unseal opens what Seal returned for the same key and ad. A value that
// does not open is ErrUnsealable, never a wrong plaintext.
func Unseal(key, ad, sealed []byte) (string, error) {
	a, err := aead(key)
	if err != nil {
		return "", err
	}
	if len(sealed) < a.NonceSize() {
		return "", ErrUnsealable
	}
	plain, err := a.Open(nil, sealed[:a.NonceSize()], sealed[a.NonceSize():], ad)
	if err != nil {
		return "", ErrUnsealable
	}
	return string(plain), nil
}
