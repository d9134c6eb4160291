package agentrelease

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"strings"
	"testing"

	"github.com/mercator/mercator/failure"
)

func expect(b []byte) Expect {
	sum := sha256.Sum256(b)
	return Expect{SHA256: hex.EncodeToString(sum[:]), Size: int64(len(b))}
}

// TestReadRefuses: the right bytes pass; a wrong hash, a wrong size, a
// missing or wrong signature when a key is set are each refused as
// invalid, saying which check failed.
func TestReadRefuses(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(nil)
	_, other, _ := ed25519.GenerateKey(nil)
	bin := []byte("\x7fELF the agent binary")
	good := expect(bin)
	signed := good
	signed.Key, signed.Signature = pub, ed25519.Sign(priv, bin)
	for _, ok := range []Expect{good, signed} {
		if got, err := Read(bytes.NewReader(bin), ok); err != nil || !bytes.Equal(got, bin) {
			t.Fatalf("good release refused: %v", err)
		}
	}
	corrupt := append([]byte(nil), bin...)
	corrupt[3] ^= 1
	unsigned := signed
	unsigned.Signature = nil
	wrongKey := signed
	wrongKey.Signature = ed25519.Sign(other, bin)
	for name, c := range map[string]struct {
		body []byte
		want Expect
		msg  string
	}{
		"wrong hash":      {corrupt, good, "hashes to"},
		"longer":          {append(bin, 'x'), good, "not the"},
		"shorter":         {bin[1:], good, "not the"},
		"unsigned":        {bin, unsigned, "carries no signature"},
		"wrong signature": {bin, wrongKey, "does not verify"},
		"signed, altered": {corrupt, func() Expect { e := signed; e.SHA256 = expect(corrupt).SHA256; return e }(), "does not verify"},
	} {
		_, err := Read(bytes.NewReader(c.body), c.want)
		if !errors.Is(err, failure.ErrInvalid) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: %v, want invalid saying %q", name, err, c.msg)
		}
	}
}

// TestParseKeyAndSignature: PEM, raw and base64 keys; raw and base64
// signatures; anything else refused.
func TestParseKeyAndSignature(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(nil)
	der, _ := x509.MarshalPKIXPublicKey(pub)
	for name, b := range map[string][]byte{
		"pem":    pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}),
		"raw":    pub,
		"base64": []byte(base64.StdEncoding.EncodeToString(pub) + "\n"),
	} {
		k, err := ParsePublicKey(b)
		if err != nil || !k.Equal(pub) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := ParsePublicKey([]byte("short")); err == nil {
		t.Error("a short key was accepted")
	}
	sig := ed25519.Sign(priv, []byte("x"))
	for _, b := range [][]byte{sig, []byte(base64.StdEncoding.EncodeToString(sig))} {
		if got, err := ParseSignature(b); err != nil || !bytes.Equal(got, sig) {
			t.Errorf("signature: %v", err)
		}
	}
	if _, err := ParseSignature([]byte("nope")); err == nil {
		t.Error("a bad signature file was accepted")
	}
	if CheckVersion("v1.2.3+e2e") != nil || CheckVersion("../x") == nil || CheckPlatform("linux/amd64") != nil || CheckPlatform("windows/386") == nil {
		t.Error("version or platform check wrong")
	}
}
