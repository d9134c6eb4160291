package httpapi

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
)

var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// NewID returns prefix + 16 random base32 characters (80 bits): the
// identifiers the control plane mints (runs, nodes, calls, attempts).
func NewID(prefix string) string {
	var b [10]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // the kernel's random source failing is not recoverable
	}
	return prefix + idEncoding.EncodeToString(b[:])
}

// DerivedID is an ID of NewID's form derived from parts (SHA-256 of them,
// each ended by a zero byte): the same parts always give the same ID, so
// a retried request can name what its first attempt created.
func DerivedID(prefix string, parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return prefix + idEncoding.EncodeToString(h.Sum(nil)[:10])
}

// RandomToken returns 256 random bits in base32: the secret part of every
// credential the control plane mints (callers add the kind's prefix).
func RandomToken() string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return idEncoding.EncodeToString(b[:])
}

// HashToken is how every credential is stored: a leaked database holds no
// usable token.
func HashToken(tok string) string {
	h := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(h[:])
}
