package fleetsim

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/mercator/mercator/pki"
)

// TLS: by default the replicas serve HTTPS and the agents verify them as a
// real agent does. The simulation makes one CA for the run (package pki)
// and, from it, one server certificate that every replica serves, as a
// deployment gives every replica the same --tls-cert/--tls-key and
// --tls-ca-cert (replicas must share the CA agents pin). The certificate
// names every host an agent is given (cp-K.fleetsim, which the router
// resolves) and loopback, where the simulator's own clients connect; the
// invitations the replicas hand out pin the CA's fingerprint
// (mi1.<fingerprint>.<secret>). An agent trusts the CA file (what
// `mercator agent --ca-file` reads) after checking that its invitation pins
// that very CA; the router's names cannot be dialled by pki.FetchCA, and a
// real agent fetches the CA only once, before its first start, anyway.

// runTLS is the run's CA and the certificate the replicas serve.
type runTLS struct {
	caFile, certFile, keyFile string
	roots                     []*x509.Certificate
	fingerprint               string
}

// makeRunTLS creates the run's CA and the replicas' certificate under dir.
func makeRunTLS(dir string, replicas int) (*runTLS, error) {
	now := time.Now()
	ca, err := pki.NewCA("fleetsim CA", now, 24*time.Hour)
	if err != nil {
		return nil, err
	}
	hosts := []string{"localhost", "127.0.0.1"}
	for k := range replicas {
		hosts = append(hosts, replicaHost(k))
	}
	certPEM, keyPEM, err := ca.Issue(hosts, now, 24*time.Hour)
	if err != nil {
		return nil, err
	}
	t := &runTLS{caFile: filepath.Join(dir, "ca.pem"), certFile: filepath.Join(dir, "server.pem"), keyFile: filepath.Join(dir, "server-key.pem"),
		roots: []*x509.Certificate{ca.Cert}, fingerprint: pki.Fingerprint(ca.Cert)}
	for _, f := range []struct {
		path string
		data []byte
		mode os.FileMode
	}{{t.caFile, pki.CertPEM(ca.Cert), 0o644}, {t.certFile, certPEM, 0o644}, {t.keyFile, keyPEM, 0o600}} {
		if err := pki.WriteFileAtomic(f.path, f.data, f.mode); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// clientTransport is an HTTP transport for the simulator's own clients
// (admin, metrics) that verifies the replicas against the run's CA; nil t
// means plain HTTP.
func (t *runTLS) clientTransport(idle int) *http.Transport {
	tr := &http.Transport{MaxIdleConnsPerHost: idle}
	if t != nil {
		tr.TLSClientConfig = pki.ClientTLSConfig(t.roots)
	}
	return tr
}

// agentTrust is what a shard's agents verify the replicas against: the CA
// in caFile, which every invitation must pin (a real agent refuses a
// control plane whose chain does not lead to the CA its invitation names).
// Its tls.Config is pki.ClientTLSConfig's, the real agent's: verification
// against exactly that CA, with the host name, and a session cache.
func agentTrust(caFile string, tokens []string) ([]*x509.Certificate, error) {
	roots, err := pki.ReadCertsFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("the run's CA: %w", err)
	}
	fp := pki.Fingerprint(roots[0])
	for i, tok := range tokens {
		pinned, err := pki.JoinFingerprint(tok)
		if err != nil {
			return nil, fmt.Errorf("invitation %d: %w", i, err)
		}
		if pinned != fp {
			return nil, fmt.Errorf("invitation %d pins CA sha256:%q, not the run's CA sha256:%s", i, pinned, fp)
		}
	}
	return roots[:1], nil
}

// handshakes counts the TLS handshakes a replica completed, full and
// resumed, and the connections it accepted (TLS or not). The server's
// VerifyConnection runs once per completed handshake, resumed ones
// included, with the connection's state.
type handshakes struct {
	full, resumed, accepted atomic.Int64
}

// tune is daemon.ServerOptions.TuneTLS: it counts without changing what
// is verified (the server asks for no client certificate).
func (h *handshakes) tune(c *tls.Config) {
	c.VerifyConnection = func(cs tls.ConnectionState) error {
		if cs.DidResume {
			h.resumed.Add(1)
		} else {
			h.full.Add(1)
		}
		return nil
	}
}

// connCounts is a snapshot of the replicas' handshake and connection
// counts.
type connCounts struct{ full, resumed, accepted int64 }

func (s *sim) connCounts() connCounts {
	var c connCounts
	for _, r := range s.replicas {
		c.full += r.hs.full.Load()
		c.resumed += r.hs.resumed.Load()
		c.accepted += r.hs.accepted.Load()
	}
	return c
}

func (c connCounts) sub(o connCounts) connCounts {
	return connCounts{full: c.full - o.full, resumed: c.resumed - o.resumed, accepted: c.accepted - o.accepted}
}

// Connections is what the replicas' listeners saw in one phase.
type Connections struct {
	Accepted          int64 `json:"connections_accepted"`
	FullHandshakes    int64 `json:"tls_full_handshakes"`
	ResumedHandshakes int64 `json:"tls_resumed_handshakes"`
}

func (c connCounts) report() Connections {
	return Connections{Accepted: c.accepted, FullHandshakes: c.full, ResumedHandshakes: c.resumed}
}

func (c Connections) String() string {
	return fmt.Sprintf("%d connections accepted, TLS handshakes %d full / %d resumed", c.Accepted, c.FullHandshakes, c.ResumedHandshakes)
}
