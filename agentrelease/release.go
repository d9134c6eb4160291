// Package agentrelease is what both ends of a self-upgrade check of an agent
// release: its size, its SHA-256 and, when a release key is configured, its
// Ed25519 signature. The control plane checks a release as it is pushed and
// the agent checks it again before it runs it, with the same code, so a
// release the one accepted is never one the other would refuse for another
// reason.
//
// It is pure (no I/O but the reader it is given). The control plane
// (package controlplane), the agent's upgrader (package agentupgrade) and
// the command line import it.
package agentrelease

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"regexp"

	"github.com/mercator/mercator/failure"
)

// MaxSize bounds a release binary (the agent is tens of MiB; a quarter of a
// GiB leaves room without letting a push fill the content store's disk).
const MaxSize = 256 << 20

// Platforms a release may be built for.
var Platforms = []string{"linux/amd64", "linux/arm64"}

var versionPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+-]{0,63}$`)

// CheckVersion refuses a version that is not 1 to 64 letters, digits and
// ". _ + -", starting with a letter or digit: it travels in paths, unit
// files and logs.
func CheckVersion(v string) error {
	if !versionPattern.MatchString(v) {
		return failure.Invalid("version", "%q is not a release version: want 1 to 64 letters, digits, '.', '_', '+' or '-', starting with a letter or digit", v)
	}
	return nil
}

// CheckPlatform refuses a platform not in Platforms.
func CheckPlatform(p string) error {
	for _, ok := range Platforms {
		if p == ok {
			return nil
		}
	}
	return failure.Invalid("platform", "%q is not a platform releases are built for: want one of %v", p, Platforms)
}

// Expect is what a release must be.
type Expect struct {
	SHA256 string
	Size   int64
	// Signature is checked against Key when Key is set; a release without
	// one is then refused. Without Key, Signature is not checked.
	Signature []byte
	Key       ed25519.PublicKey
}

// Read reads the whole release from r, at most want.Size bytes (one more
// is an error), and checks it against want. It returns the bytes, which
// the caller owns. Errors are failure.ErrInvalid and say which check
// failed and by how much.
func Read(r io.Reader, want Expect) ([]byte, error) {
	if want.Size <= 0 || want.Size > MaxSize {
		return nil, failure.Invalid("size", "a release of %d bytes is outside 1..%d", want.Size, MaxSize)
	}
	var buf bytes.Buffer
	n, err := io.Copy(&buf, io.LimitReader(r, want.Size+1))
	if err != nil {
		return nil, fmt.Errorf("read the release: %w", err)
	}
	if n != want.Size {
		return nil, failure.Invalid("size", "the release is %d bytes, not the %d it was stored with", n, want.Size)
	}
	return buf.Bytes(), Check(buf.Bytes(), want)
}

// Check checks b against want's digest and signature (its size too).
func Check(b []byte, want Expect) error {
	if int64(len(b)) != want.Size {
		return failure.Invalid("size", "the release is %d bytes, not %d", len(b), want.Size)
	}
	sum := sha256.Sum256(b)
	if got := hex.EncodeToString(sum[:]); got != want.SHA256 {
		return failure.Invalid("sha256", "the release hashes to %s, not %s: it is not the binary that was stored (corrupted or replaced)", got, want.SHA256)
	}
	return CheckSignature(b, want.Signature, want.Key)
}

// CheckSignature checks sig over b against key; nil key checks nothing.
func CheckSignature(b, sig []byte, key ed25519.PublicKey) error {
	if key == nil {
		return nil
	}
	if len(sig) == 0 {
		return failure.Invalid("signature", "the release carries no signature, and a release key is configured: sign the binary with the release key's private half (an Ed25519 signature of its bytes) and push it with --signature FILE")
	}
	if len(sig) != ed25519.SignatureSize || !ed25519.Verify(key, b, sig) {
		return failure.Invalid("signature", "the release's signature does not verify with the configured release key: it was signed with another key, or the binary changed after signing")
	}
	return nil
}

// ParsePublicKey reads an Ed25519 public key: PEM "PUBLIC KEY" (PKIX, as
// `openssl pkey -pubout` writes it), or the 32 raw bytes, in base64 or not.
func ParsePublicKey(b []byte) (ed25519.PublicKey, error) {
	if blk, _ := pem.Decode(b); blk != nil {
		k, err := x509.ParsePKIXPublicKey(blk.Bytes)
		if err != nil {
			return nil, failure.Invalid("release key", "the PEM block is not a public key: %v", err)
		}
		ek, ok := k.(ed25519.PublicKey)
		if !ok {
			return nil, failure.Invalid("release key", "the key is a %T, not Ed25519", k)
		}
		return ek, nil
	}
	raw := decodeMaybeBase64(b)
	if len(raw) != ed25519.PublicKeySize {
		return nil, failure.Invalid("release key", "want a PEM PUBLIC KEY or %d raw bytes (base64 or not), got %d bytes", ed25519.PublicKeySize, len(raw))
	}
	return ed25519.PublicKey(raw), nil
}

// ParseSignature reads a signature file: the 64 raw bytes (as `openssl
// pkeyutl -sign -rawin` writes them), or their base64.
func ParseSignature(b []byte) ([]byte, error) {
	raw := decodeMaybeBase64(b)
	if len(raw) != ed25519.SignatureSize {
		return nil, failure.Invalid("signature", "want an Ed25519 signature of %d bytes (raw or base64), got %d bytes", ed25519.SignatureSize, len(raw))
	}
	return raw, nil
}

func decodeMaybeBase64(b []byte) []byte {
	if d, err := base64.StdEncoding.DecodeString(string(bytes.TrimSpace(b))); err == nil {
		return d
	}
	return b
}
