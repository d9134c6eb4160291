package pki

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
)

// ServerOptions says where a server's certificate comes from. Exactly one
// of three sources applies:
//
//   - CertFile and KeyFile: the operator's certificate (its chain in
//     CertFile), re-read when the files change, so an outside renewal
//     (certbot, cert-manager) needs no restart. CACertFile, if set, is the
//     CA clients should pin; else the last certificate of CertFile's chain.
//   - CACertFile and CAKeyFile: a CA the operator gives (the same files to
//     every replica of a deployment); the server issues and renews its own
//     certificate from it.
//   - neither: the server's own CA, created on first start in DataDir.
type ServerOptions struct {
	// DataDir holds ca.pem (always written: what clients pin), the CA's key
	// when the server created its CA, and the issued certificate under tls/.
	DataDir               string
	CertFile, KeyFile     string
	CACertFile, CAKeyFile string
	// Hosts are the names and addresses the issued certificate covers.
	Hosts []string
	// Validity is an issued certificate's life (default 90 days), and
	// RenewBefore how long before its end it is replaced (default a third
	// of Validity).
	Validity, RenewBefore time.Duration
	// CheckEvery is how often Run looks at the certificate (default an
	// hour, and never more than a tenth of RenewBefore).
	CheckEvery time.Duration
	Now        func() time.Time
	Logger     *slog.Logger
}

// Server is a TLS server's certificate, kept current: GetCertificate always
// answers with the latest one, and Run replaces it before it expires, so
// connections made after a renewal get the new certificate while the old
// ones carry on.
type Server struct {
	o      ServerOptions
	ca     *CA // Key is nil unless this server issues
	caFile string
	cur    atomic.Pointer[tls.Certificate]
	mu     sync.Mutex // serializes renewals
	// operator files' modification times, to notice an outside renewal
	certMod, keyMod time.Time
}

// File names under ServerOptions.DataDir.
const (
	CAFileName   = "ca.pem"
	caKeyName    = "ca-key.pem"
	certFileName = "tls/server.pem"
	keyFileName  = "tls/server-key.pem"
)

// OpenServer sets up the certificate the options describe, creating the CA
// and issuing a certificate when needed, and writes DataDir/ca.pem. Every
// key is written (mode 0600, atomically) before it is used.
func OpenServer(o ServerOptions) (*Server, error) {
	if o.Validity <= 0 {
		o.Validity = 90 * 24 * time.Hour
	}
	if o.RenewBefore <= 0 {
		o.RenewBefore = o.Validity / 3
	}
	if o.CheckEvery <= 0 {
		o.CheckEvery = min(time.Hour, o.RenewBefore/10)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.DataDir == "" {
		return nil, errors.New("pki: a data directory is required")
	}
	s := &Server{o: o, caFile: filepath.Join(o.DataDir, CAFileName)}
	var err error
	switch {
	case (o.CertFile == "") != (o.KeyFile == ""):
		return nil, errors.New("--tls-cert and --tls-key go together")
	case (o.CACertFile == "") != (o.CAKeyFile == "") && o.CertFile == "":
		return nil, errors.New("--tls-ca-cert and --tls-ca-key go together")
	case o.CertFile != "" && o.CAKeyFile != "":
		return nil, errors.New("give either the server's certificate (--tls-cert, --tls-key) or a CA to issue it (--tls-ca-cert, --tls-ca-key), not both")
	case o.CertFile != "":
		err = s.loadOperatorCert()
	case o.CACertFile != "":
		if s.ca, err = LoadCA(o.CACertFile, o.CAKeyFile); err == nil {
			err = s.renew(false)
		}
	default:
		if s.ca, err = s.ownCA(); err == nil {
			err = s.renew(false)
		}
	}
	if err != nil {
		return nil, err
	}
	if err := WriteFileAtomic(s.caFile, CertPEM(s.ca.Cert), 0o644); err != nil {
		return nil, fmt.Errorf("write %s: %w", s.caFile, err)
	}
	return s, nil
}

// ownCA loads the CA in DataDir, creating it on first start.
func (s *Server) ownCA() (*CA, error) {
	certPath, keyPath := filepath.Join(s.o.DataDir, CAFileName), filepath.Join(s.o.DataDir, caKeyName)
	if _, err := os.Stat(keyPath); err == nil {
		return LoadCA(certPath, keyPath)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	ca, err := NewCA("Mercator control plane CA", s.o.Now(), CAValidity)
	if err != nil {
		return nil, err
	}
	if err := ca.Write(certPath, keyPath); err != nil {
		return nil, err
	}
	s.o.Logger.Info("created the control plane's CA", "file", certPath, "sha256", Fingerprint(ca.Cert))
	return ca, nil
}

// CAFile is the path of the CA certificate clients pin (DataDir/ca.pem).
func (s *Server) CAFile() string { return s.caFile }

// CA is the certificate clients pin.
func (s *Server) CA() *x509.Certificate { return s.ca.Cert }

// Fingerprint is the pinned CA's SHA-256 fingerprint.
func (s *Server) Fingerprint() string { return Fingerprint(s.ca.Cert) }

// Leaf is the certificate served now.
func (s *Server) Leaf() *x509.Certificate { return s.cur.Load().Leaf }

// TLSConfig serves the current certificate, TLS 1.2 at least, HTTP/2 and
// HTTP/1.1.
func (s *Server) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2", "http/1.1"},
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			return s.cur.Load(), nil
		},
	}
}

// Run checks the certificate every CheckEvery until ctx ends, renewing it
// (or, for the operator's files, reloading them) when due. A failed check is
// logged and tried again at the next tick: the current certificate stays
// in use meanwhile.
func (s *Server) Run(ctx context.Context) {
	t := time.NewTicker(s.o.CheckEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := s.Check(); err != nil {
				s.o.Logger.Error("TLS certificate check", "err", err)
			}
		}
	}
}

// Check renews the certificate if it ends within RenewBefore, or reloads
// the operator's files if they changed.
func (s *Server) Check() error {
	if s.o.CertFile != "" {
		return s.loadOperatorCert()
	}
	return s.renew(true)
}

// renew issues a certificate for Hosts when the one on disk is missing,
// names other hosts, or is due (checked against RenewBefore); else it
// serves the one on disk. onlyIfDue skips reading the disk when the
// certificate in memory is not due.
func (s *Server) renew(onlyIfDue bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.o.Now()
	due := func(c *x509.Certificate) bool { return !now.Add(s.o.RenewBefore).Before(c.NotAfter) }
	if cur := s.cur.Load(); onlyIfDue && cur != nil && !due(cur.Leaf) {
		return nil
	}
	certPath, keyPath := filepath.Join(s.o.DataDir, certFileName), filepath.Join(s.o.DataDir, keyFileName)
	if cert, err := tls.LoadX509KeyPair(certPath, keyPath); err == nil && !due(cert.Leaf) &&
		sameHosts(cert.Leaf, s.o.Hosts) && cert.Leaf.CheckSignatureFrom(s.ca.Cert) == nil {
		s.cur.Store(&cert)
		return nil
	}
	certPEM, keyPEM, err := s.ca.Issue(s.o.Hosts, now, s.o.Validity)
	if err != nil {
		return err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return err
	}
	if err := WriteFileAtomic(keyPath, keyPEM, 0o600); err != nil {
		return err
	}
	if err := WriteFileAtomic(certPath, certPEM, 0o644); err != nil {
		return err
	}
	s.cur.Store(&cert)
	s.o.Logger.Info("issued the server's TLS certificate", "hosts", s.o.Hosts, "not_after", cert.Leaf.NotAfter)
	return nil
}

// loadOperatorCert (re)loads the operator's certificate and key when their
// files changed since the last load.
func (s *Server) loadOperatorCert() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	cm, km := modTime(s.o.CertFile), modTime(s.o.KeyFile)
	if s.cur.Load() != nil && cm.Equal(s.certMod) && km.Equal(s.keyMod) {
		return nil
	}
	cert, err := tls.LoadX509KeyPair(s.o.CertFile, s.o.KeyFile)
	if err != nil {
		return fmt.Errorf("--tls-cert/--tls-key: %w", err)
	}
	if s.ca == nil {
		anchor := cert.Leaf
		if len(cert.Certificate) > 1 {
			if anchor, err = x509.ParseCertificate(cert.Certificate[len(cert.Certificate)-1]); err != nil {
				return err
			}
		}
		if s.o.CACertFile != "" {
			certs, err := ReadCertsFile(s.o.CACertFile)
			if err != nil {
				return fmt.Errorf("--tls-ca-cert: %w", err)
			}
			anchor = certs[0]
		}
		s.ca = &CA{Cert: anchor}
	}
	s.cur.Store(&cert)
	s.certMod, s.keyMod = cm, km
	return nil
}

func modTime(path string) time.Time {
	fi, err := os.Stat(path)
	if err != nil {
		return time.Time{}
	}
	return fi.ModTime()
}
