package daemon

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/mercator/mercator/pki"
)

// TLSOptions is where the server's certificate comes from (see
// pki.ServerOptions): the operator's certificate, a CA the operator gives
// (the same files to every replica), or, with neither, the server's own CA
// in the data directory.
type TLSOptions struct {
	CertFile, KeyFile     string
	CACertFile, CAKeyFile string
	// Validity and CheckEvery override the issued certificate's life and
	// how often renewal is considered (tests make them short).
	Validity, CheckEvery time.Duration
}

// CAFile is where a server started on dataDir writes the CA certificate
// clients pin.
func CAFile(dataDir string) string { return filepath.Join(dataDir, pki.CAFileName) }

// errNoSharedCA refuses a server on PostgreSQL (one of several replicas)
// that was given neither the deployment's CA nor its certificate: replicas
// each creating their own CA would hand out invitations that pin one
// replica's CA only, and agents would refuse the others.
var errNoSharedCA = errors.New("replicas sharing PostgreSQL must share one CA: give every replica the same --tls-ca-cert and --tls-ca-key " +
	"(create them once with `mercator ca create DIR`), or the same --tls-cert and --tls-key")

// serverTLS sets up the certificate a server with options o serves on l,
// covering loopback, the listen address, the public and replica URLs' hosts
// and, when listening on every interface, this machine's name and
// addresses.
func serverTLS(o ServerOptions, l net.Listener) (*pki.Server, error) {
	t := o.TLS
	return pki.OpenServer(pki.ServerOptions{
		DataDir: o.DataDir, CertFile: t.CertFile, KeyFile: t.KeyFile, CACertFile: t.CACertFile, CAKeyFile: t.CAKeyFile,
		Hosts: certHosts(l.Addr(), o.PublicURL, o.Config.ReplicaURL), Validity: t.Validity, CheckEvery: t.CheckEvery,
		Now: o.Config.Now, Logger: o.Logger.With("component", "tls"),
	})
}

// tlsConfig is what the server serves with: certs' configuration, handed
// to TuneTLS first when set.
func (o ServerOptions) tlsConfig(certs *pki.Server) *tls.Config {
	c := certs.TLSConfig()
	if o.TuneTLS != nil {
		o.TuneTLS(c)
	}
	return c
}

// certHosts are the names a server certificate covers.
func certHosts(addr net.Addr, urls ...string) []string {
	hosts := []string{"localhost", "127.0.0.1", "::1"}
	seen := map[string]bool{}
	add := func(h string) {
		if ip := net.ParseIP(h); ip != nil {
			h = ip.String()
		}
		if h != "" && !seen[h] {
			seen[h] = true
			hosts = append(hosts, h)
		}
	}
	for _, h := range hosts {
		seen[h] = true
	}
	host, _, _ := net.SplitHostPort(addr.String())
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		if name, err := os.Hostname(); err == nil {
			add(name)
		}
		if addrs, err := net.InterfaceAddrs(); err == nil {
			for _, a := range addrs {
				if n, ok := a.(*net.IPNet); ok && !n.IP.IsLinkLocalUnicast() {
					add(n.IP.String())
				}
			}
		}
	} else {
		add(host)
	}
	for _, raw := range urls {
		if u, err := url.Parse(raw); err == nil {
			add(u.Hostname())
		}
	}
	return hosts
}

// checkInsecureListen refuses plain HTTP on an address other machines can
// reach.
func checkInsecureListen(addr net.Addr) error {
	host, _, err := net.SplitHostPort(addr.String())
	if err != nil {
		return err
	}
	if !pki.IsLoopback(host) {
		return fmt.Errorf("--insecure-http serves plaintext, so it is allowed on loopback only, not on %s: "+
			"remove --insecure-http to serve HTTPS (the server makes its own certificate)", addr)
	}
	return nil
}

// agentCAFileName is where an agent keeps the CA it pinned, in its state
// directory, so restarts keep trusting exactly that control plane.
const agentCAFileName = "control-plane-ca.pem"

// agentTrust is the CA an agent verifies its control plane against, found
// in this order: --ca-file; the CA kept in the state directory, unless the
// invitation pins another (a re-invitation after the CA changed); the CA
// the invitation's fingerprint pins, fetched from the server and kept. An
// https:// URL with none of them trusts the system's CAs. An http:// URL
// is refused unless its host is loopback. A nil config means plain HTTP or
// the system's CAs.
func agentTrust(ctx context.Context, o AgentOptions) ([]*x509.Certificate, error) {
	if err := pki.CheckPlaintext(o.ControlPlaneURL); err != nil {
		return nil, err
	}
	u, err := url.Parse(o.ControlPlaneURL)
	if err != nil {
		return nil, fmt.Errorf("--control-plane: %w", err)
	}
	if u.Scheme != "https" {
		return nil, nil
	}
	if o.CAFile != "" {
		return pki.ReadCertsFile(o.CAFile)
	}
	pinned, err := pki.JoinFingerprint(o.Invitation)
	if err != nil {
		return nil, err
	}
	kept := filepath.Join(o.StateDir, agentCAFileName)
	if certs, err := pki.ReadCertsFile(kept); err == nil && (pinned == "" || pki.Fingerprint(certs[0]) == pinned) {
		return certs[:1], nil
	}
	if pinned == "" {
		o.Logger.Warn("no CA pinned (no --ca-file, none kept, and the invitation pins none): trusting the system's CAs")
		return nil, nil
	}
	ca, err := fetchCA(ctx, o, pinned)
	if err != nil {
		return nil, err
	}
	if err := pki.WriteFileAtomic(kept, pki.CertPEM(ca), 0o644); err != nil {
		return nil, fmt.Errorf("keep the control plane's CA: %w", err)
	}
	o.Logger.Info("pinned the control plane's CA", "sha256", pinned, "file", kept)
	return []*x509.Certificate{ca}, nil
}

// fetchCA fetches the CA the invitation pins, retrying while the server
// cannot be reached (it may start after the agent) and failing at once on
// a server whose chain does not match.
func fetchCA(ctx context.Context, o AgentOptions, fingerprint string) (*x509.Certificate, error) {
	for {
		ca, err := pki.FetchCA(ctx, o.ControlPlaneURL, fingerprint)
		var mismatch *pki.MismatchError
		if err == nil || errors.As(err, &mismatch) {
			return ca, err
		}
		o.Logger.Warn("fetch the control plane's CA; retrying", "err", err)
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}

// AgentHTTPClient is the client of an agent's node-protocol calls (the
// session stream, events, logs, renewals): every connection is verified
// against roots, kept alive between calls, and a reconnect resumes the TLS
// session rather than doing a full handshake. Over TLS it speaks HTTP/2
// where the server offers it (ALPN; a proxy that speaks only HTTP/1.1 still
// works), so the session stream and every call share one connection: a
// fleet reconnecting after a cut costs one handshake a node, not one for
// the stream and more for the calls beside it. HTTP/2 pings a connection
// that fell silent, so a cut the kernel has not noticed ends it within
// agentPingAfter plus agentPingTimeout. Without roots the agent speaks
// plain HTTP/1.1 (loopback only). A nil dial is the default dialer; the
// fleet simulator passes its router.
func AgentHTTPClient(roots []*x509.Certificate, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *http.Client {
	if dial == nil {
		dial = (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	}
	tr := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         dial,
		TLSClientConfig:     pki.ClientTLSConfig(roots),
		TLSHandshakeTimeout: 10 * time.Second,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
	}
	if tr.TLSClientConfig != nil {
		// A custom TLS configuration turns Go's automatic HTTP/2 off;
		// ask for it explicitly, HTTP/1.1 remaining the fallback.
		tr.Protocols = new(http.Protocols)
		tr.Protocols.SetHTTP1(true)
		tr.Protocols.SetHTTP2(true)
		tr.HTTP2 = &http.HTTP2Config{SendPingTimeout: agentPingAfter, PingTimeout: agentPingTimeout}
	}
	return &http.Client{Transport: pki.Explaining(tr, roots)}
}

// agentPingAfter is how long an agent's HTTP/2 connection may stay silent
// before the agent pings it, and agentPingTimeout how long the answer may
// take. The control plane sends a keep-alive on every session every few
// seconds, so a connection silent for agentPingAfter is suspect.
const (
	agentPingAfter   = 15 * time.Second
	agentPingTimeout = 10 * time.Second
)

// logTLS logs where the CA clients pin is and its fingerprint.
func logTLS(log *slog.Logger, s *pki.Server) {
	log.Info("serving HTTPS", "ca_file", s.CAFile(), "ca_sha256", s.Fingerprint(), "not_after", s.Leaf().NotAfter)
}

// contentClient reads Artifact content: from the control plane's signed
// URLs (its CA in roots) or an object store's (the system's CAs). Nil
// leaves the Artifact cache's default client.
func contentClient(roots []*x509.Certificate) *http.Client {
	if len(roots) == 0 {
		return nil
	}
	return &http.Client{Transport: pki.Explaining(&http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSClientConfig:       pki.ClientTLSConfigWithSystem(roots),
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 30 * time.Second,
		MaxIdleConns:          100,
		IdleConnTimeout:       90 * time.Second,
	}, roots)}
}
