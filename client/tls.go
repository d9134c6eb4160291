package client

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/mercator/mercator/pki"
)

// NewFromConfig is New for a resolved Config: when cfg.CAFile is set the
// server's certificate chain must lead to the CA(s) in it (and name the
// server's host), else the system's CAs are trusted. A server that fails
// is refused during the TLS handshake, before the token is sent. Plain
// http:// is refused unless the host is loopback, where the token cannot
// be read on the way.
func NewFromConfig(cfg Config) (*Client, error) {
	if err := pki.CheckPlaintext(normalizeAddr(cfg.Addr)); err != nil {
		return nil, err
	}
	hc, err := HTTPClient(cfg.CAFile)
	if err != nil {
		return nil, err
	}
	c := New(cfg.Addr, cfg.Token, hc)
	c.Project = cfg.Project
	return c, nil
}

// HTTPClient is an http.Client trusting the CA certificate(s) in caFile
// (the system's CAs when caFile is ""), speaking HTTP/2 where the server
// does, and resuming TLS sessions.
func HTTPClient(caFile string) (*http.Client, error) {
	tr := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:   true,
		TLSHandshakeTimeout: 10 * time.Second,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
	}
	if caFile == "" {
		return &http.Client{Transport: tr}, nil
	}
	certs, err := pki.ReadCertsFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("CA file: %w", err)
	}
	tr.TLSClientConfig = pki.ClientTLSConfig(certs)
	return &http.Client{Transport: pki.Explaining(tr, certs)}, nil
}

// FetchCA fetches from the server at addr (https://HOST:PORT) the CA
// certificate whose SHA-256 fingerprint is fingerprint, checking that the
// server's certificate is valid under it, and returns it PEM-encoded. Only
// a TLS handshake happens, so no credential is sent. It is how `mercator
// context add --ca-fingerprint` comes to trust a server.
func FetchCA(ctx context.Context, addr, fingerprint string) ([]byte, error) {
	ca, err := pki.FetchCA(ctx, normalizeAddr(addr), fingerprint)
	if err != nil {
		return nil, err
	}
	return pki.CertPEM(ca), nil
}
