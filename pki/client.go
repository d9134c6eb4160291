package pki

import (
	"context"
	"crypto/ecdsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// MismatchError is a server whose certificate chain does not lead to the
// CA the client trusts, or does not name the server's host. It names both
// sides, so an operator can tell a man in the middle (or a mistyped
// address) from a CA that changed.
type MismatchError struct {
	Server    string   // host:port
	Expected  string   // the pinned CA's fingerprint, or "" for several CAs
	Presented []string // fingerprints of the chain the server presented, leaf first
	Reason    error
}

func (e *MismatchError) Error() string {
	want := "the trusted CAs"
	if e.Expected != "" {
		want = "CA sha256:" + e.Expected
	}
	return fmt.Sprintf("refusing %s: its certificate is not one %s issued for it (presented, leaf first: sha256:%s): %v; no credential was sent",
		e.Server, want, strings.Join(e.Presented, ", sha256:"), e.Reason)
}

func (e *MismatchError) Unwrap() error { return e.Reason }

// ClientTLSConfig verifies a server against exactly roots (with its host
// name, as Go's TLS client does), not the system's CAs, and resumes TLS
// sessions so reconnects cost an abbreviated handshake. A refused server
// fails the handshake, before any request is written. With no roots it
// returns nil: the system's CAs, for an operator's public certificate.
// Wrap the transport with Explaining for errors naming the fingerprints.
func ClientTLSConfig(roots []*x509.Certificate) *tls.Config {
	if len(roots) == 0 {
		return nil
	}
	return clientConfig(x509.NewCertPool(), roots)
}

// ClientTLSConfigWithSystem is ClientTLSConfig trusting the system's CAs
// besides roots: for content an agent may read from the control plane or
// from an object store with a public certificate.
func ClientTLSConfigWithSystem(roots []*x509.Certificate) *tls.Config {
	if len(roots) == 0 {
		return nil
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	return clientConfig(pool, roots)
}

func clientConfig(pool *x509.CertPool, roots []*x509.Certificate) *tls.Config {
	for _, c := range roots {
		pool.AddCert(c)
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: pool, ClientSessionCache: tls.NewLRUClientSessionCache(64)}
}

// Explaining wraps rt so that a server refused by certificate verification
// fails with a *MismatchError naming the fingerprint expected (that of the
// only root, if roots has one) and those presented.
func Explaining(rt http.RoundTripper, roots []*x509.Certificate) http.RoundTripper {
	e := &explaining{rt: rt}
	if len(roots) == 1 {
		e.expected = Fingerprint(roots[0])
	}
	return e
}

type explaining struct {
	rt       http.RoundTripper
	expected string
}

func (e *explaining) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := e.rt.RoundTrip(req)
	var cve *tls.CertificateVerificationError
	if err != nil && errors.As(err, &cve) {
		err = &MismatchError{Server: req.URL.Host, Expected: e.expected, Presented: fingerprints(cve.UnverifiedCertificates), Reason: cve.Err}
	}
	return resp, err
}

// CloseIdleConnections closes the wrapped transport's idle connections.
func (e *explaining) CloseIdleConnections() {
	if c, ok := e.rt.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// verifyChain checks the presented chain against roots for host.
func verifyChain(cs tls.ConnectionState, roots *x509.CertPool, expected, server, host string) error {
	if len(cs.PeerCertificates) == 0 {
		return &MismatchError{Server: server, Expected: expected, Reason: errors.New("no certificate")}
	}
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, DNSName: host})
	if err != nil {
		return &MismatchError{Server: server, Expected: expected, Presented: fingerprints(cs.PeerCertificates), Reason: err}
	}
	return nil
}

func fingerprints(certs []*x509.Certificate) []string {
	out := make([]string, len(certs))
	for i, c := range certs {
		out[i] = Fingerprint(c)
	}
	return out
}

// FetchCA connects to the server at baseURL (https://HOST:PORT), finds the
// certificate of its chain whose fingerprint is fingerprint, and checks
// that the server's certificate is valid for HOST under it. Only a TLS
// handshake happens: no request, so no credential, reaches a server that
// fails. This is how an agent holding an invitation, or `mercator context
// add --ca-fingerprint`, comes to trust exactly its control plane.
func FetchCA(ctx context.Context, baseURL, fingerprint string) (*x509.Certificate, error) {
	fp, err := NormalizeFingerprint(fingerprint)
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(baseURL)
	if err != nil || u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("%q: the CA is fetched over https://HOST:PORT", baseURL)
	}
	host, addr := u.Hostname(), u.Host
	if u.Port() == "" {
		addr = net.JoinHostPort(host, "443")
	}
	var found *x509.Certificate
	d := tls.Dialer{Config: &tls.Config{
		ServerName:         host,
		InsecureSkipVerify: true, // checked below against the fingerprint
		VerifyConnection: func(cs tls.ConnectionState) error {
			for _, c := range cs.PeerCertificates {
				if Fingerprint(c) == fp {
					found = c
				}
			}
			if found == nil {
				return &MismatchError{Server: addr, Expected: fp, Presented: fingerprints(cs.PeerCertificates),
					Reason: errors.New("no certificate of the chain has the fingerprint the invitation pins")}
			}
			pool := x509.NewCertPool()
			pool.AddCert(found)
			return verifyChain(cs, pool, fp, addr, host)
		},
	}}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		var me *MismatchError
		if errors.As(err, &me) {
			return nil, me
		}
		return nil, fmt.Errorf("fetch the CA from %s: %w", addr, err)
	}
	conn.Close()
	return found, nil
}

// IsLoopback reports whether host (a name or an address, without a port)
// is this machine: "localhost" or a loopback address. Plain HTTP is
// allowed only there.
func IsLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// CheckPlaintext refuses an http:// URL whose host is not loopback: over
// the network, plaintext would carry credentials and secrets in clear.
func CheckPlaintext(rawURL string) error {
	u, err := url.Parse(rawURL)
	if err != nil {
		return err
	}
	if u.Scheme == "http" && !IsLoopback(u.Hostname()) {
		return fmt.Errorf("refusing plain http:// to %s: it is not loopback, and plaintext would carry credentials in clear; use https://", u.Host)
	}
	return nil
}

func ecKeyPEM(k *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

// joinPrefix starts an invitation that pins its control plane's CA:
// "mi1.<CA fingerprint>.<secret>", as k3s join tokens carry their CA's hash,
// so an agent given only the invitation trusts exactly that control plane.
const joinPrefix = "mi1."

// JoinToken is the invitation secret with the CA's fingerprint in front of
// it; with no fingerprint (a plain-HTTP server on loopback) it is the
// secret alone. The whole string is the credential the server hashes.
func JoinToken(fingerprint, secret string) string {
	if fingerprint == "" {
		return secret
	}
	return joinPrefix + fingerprint + "." + secret
}

// JoinFingerprint is the CA fingerprint an invitation pins, or "" for a
// plain one.
func JoinFingerprint(token string) (string, error) {
	if !strings.HasPrefix(token, joinPrefix) {
		return "", nil
	}
	fp, _, ok := strings.Cut(strings.TrimPrefix(token, joinPrefix), ".")
	if !ok {
		return "", errors.New("malformed invitation: want mi1.<CA fingerprint>.<secret>")
	}
	return NormalizeFingerprint(fp)
}
