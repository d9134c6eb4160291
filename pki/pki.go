// Package pki is Mercator's small public-key infrastructure: the control
// plane's own certificate authority (ECDSA P-256, long-lived), the server
// certificates it issues for itself and renews without a restart, the
// SHA-256 fingerprints that name a CA in invitations and CLI contexts, and
// the client side of trust: pinning a CA by fingerprint and verifying a
// server against exactly that CA, with errors that name what was expected
// and what was presented.
//
// It imports only the standard library, so the daemon (the server side),
// the node agent's wiring and the public Go client (package client) may all
// import it.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// CA is a certificate authority: its certificate and, when this process may
// issue, its private key.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey // nil for a CA this process only trusts
}

// CAValidity is the life of a CA this package creates: ten years, because
// every agent and CLI context pins it, and replacing it means re-inviting
// the fleet.
const CAValidity = 10 * 365 * 24 * time.Hour

// NewCA creates a self-signed CA named name, valid from now for validity.
func NewCA(name string, now time.Time, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name, Organization: []string{"Mercator"}},
		NotBefore:             now.Add(-time.Hour), // tolerate clocks a little behind
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key}, nil
}

// Write saves the CA: its key (mode 0600) first, then its certificate,
// each atomically. Key first, because a certificate without its key would
// be a CA nobody can issue from, and the next start would make another.
func (ca *CA) Write(certPath, keyPath string) error {
	keyPEM, err := ecKeyPEM(ca.Key)
	if err != nil {
		return err
	}
	if err := WriteFileAtomic(keyPath, keyPEM, 0o600); err != nil {
		return err
	}
	return WriteFileAtomic(certPath, CertPEM(ca.Cert), 0o644)
}

// Issue signs a server certificate for hosts (DNS names or IP addresses)
// with a fresh P-256 key, valid from now for validity (never past the CA's
// own end). It returns the certificate chain (leaf, then the CA) and the
// key, PEM-encoded.
func (ca *CA) Issue(hosts []string, now time.Time, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	if ca.Key == nil {
		return nil, nil, errors.New("this CA has no private key here: it cannot issue")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, nil, err
	}
	notAfter := now.Add(validity)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: firstOr(hosts, "mercator"), Organization: []string{"Mercator"}},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, nil, err
	}
	if keyPEM, err = ecKeyPEM(key); err != nil {
		return nil, nil, err
	}
	certPEM = append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), CertPEM(ca.Cert)...)
	return certPEM, keyPEM, nil
}

// Fingerprint is the SHA-256 of a certificate's DER encoding, in lower-case
// hex: the name invitations and CLI contexts pin a CA by (as
// `openssl x509 -fingerprint -sha256` prints it, without the colons).
func Fingerprint(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.Raw)
	return hex.EncodeToString(sum[:])
}

// NormalizeFingerprint accepts a fingerprint as people copy it (upper or
// lower case, with or without colons, with or without a "sha256:" prefix)
// and returns the form Fingerprint produces, or an error.
func NormalizeFingerprint(s string) (string, error) {
	s = strings.TrimPrefix(strings.ToLower(strings.TrimSpace(s)), "sha256:")
	s = strings.ReplaceAll(s, ":", "")
	if b, err := hex.DecodeString(s); err != nil || len(b) != sha256.Size {
		return "", fmt.Errorf("a SHA-256 fingerprint is 64 hex digits, not %q", s)
	}
	return s, nil
}

// CertPEM is cert PEM-encoded.
func CertPEM(cert *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})
}

// ParseCerts reads every CERTIFICATE block of data, in order; it is an
// error when there is none.
func ParseCerts(data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, err
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, errors.New("no PEM CERTIFICATE block")
	}
	return certs, nil
}

// ReadCertsFile is ParseCerts of a file, naming the file in its error.
func ReadCertsFile(path string) ([]*x509.Certificate, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	certs, err := ParseCerts(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return certs, nil
}

// LoadCA reads a CA's certificate and private key from PEM files.
func LoadCA(certFile, keyFile string) (*CA, error) {
	certs, err := ReadCertsFile(certFile)
	if err != nil {
		return nil, err
	}
	keyData, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, err
	}
	key, err := parseECKey(keyData)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", keyFile, err)
	}
	if !certs[0].IsCA {
		return nil, fmt.Errorf("%s: not a CA certificate", certFile)
	}
	if pub, ok := certs[0].PublicKey.(*ecdsa.PublicKey); !ok || !pub.Equal(&key.PublicKey) {
		return nil, fmt.Errorf("%s does not hold the key of the certificate in %s", keyFile, certFile)
	}
	return &CA{Cert: certs[0], Key: key}, nil
}

// parseECKey reads an EC private key in SEC 1 or PKCS #8 form.
func parseECKey(data []byte) (*ecdsa.PrivateKey, error) {
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return nil, errors.New("no PEM private key block")
		}
		switch b.Type {
		case "EC PRIVATE KEY":
			return x509.ParseECPrivateKey(b.Bytes)
		case "PRIVATE KEY":
			k, err := x509.ParsePKCS8PrivateKey(b.Bytes)
			if err != nil {
				return nil, err
			}
			ec, ok := k.(*ecdsa.PrivateKey)
			if !ok {
				return nil, fmt.Errorf("want an ECDSA key, got %T", k)
			}
			return ec, nil
		}
	}
}

// WriteFileAtomic writes data to path so that a reader sees the old file or
// the new one, never half of one: a temporary file in the same directory,
// synced, then renamed. The directory is created (0700) when missing.
func WriteFileAtomic(path string, data []byte, mode os.FileMode) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+"-*.tmp")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // a no-op once renamed
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func randomSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

func firstOr(s []string, def string) string {
	if len(s) > 0 && s[0] != "" {
		return s[0]
	}
	return def
}

// sameHosts reports whether cert names exactly hosts (in any order).
func sameHosts(cert *x509.Certificate, hosts []string) bool {
	var have []string
	have = append(have, cert.DNSNames...)
	for _, ip := range cert.IPAddresses {
		have = append(have, ip.String())
	}
	want := map[string]bool{}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			h = ip.String()
		}
		if h != "" {
			want[h] = true
		}
	}
	if len(have) != len(want) {
		return false
	}
	for _, h := range have {
		if !want[h] {
			return false
		}
	}
	return true
}
