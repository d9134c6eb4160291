package pki

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// fakeClock is a settable clock for renewal tests.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// serve runs an HTTPS server on loopback with s's certificate and returns
// its URL.
func serve(t *testing.T, s *Server) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }),
		ErrorLog: log.New(io.Discard, "", 0)}
	go hs.Serve(tlsListener(l, s))
	t.Cleanup(func() { hs.Close() })
	return "https://" + l.Addr().String()
}

func tlsListener(l net.Listener, s *Server) net.Listener { return tls.NewListener(l, s.TLSConfig()) }

// get makes one request to url with a fresh connection, trusting roots;
// served, when not nil, is told the leaf certificate the server presented.
func get(t *testing.T, roots []*x509.Certificate, url string, served func(*x509.Certificate)) error {
	t.Helper()
	cfg := ClientTLSConfig(roots)
	if served != nil {
		cfg.VerifyConnection = func(cs tls.ConnectionState) error { served(cs.PeerCertificates[0]); return nil }
	}
	c := &http.Client{Transport: Explaining(&http.Transport{TLSClientConfig: cfg}, roots)}
	defer c.CloseIdleConnections()
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

func TestOwnCAIsKeptAcrossRestartsWithPrivateKeys(t *testing.T) {
	dir := t.TempDir()
	o := ServerOptions{DataDir: dir, Hosts: []string{"127.0.0.1", "localhost"}, Logger: quiet}
	s1, err := OpenServer(o)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := OpenServer(o)
	if err != nil {
		t.Fatal(err)
	}
	if s1.Fingerprint() != s2.Fingerprint() {
		t.Fatalf("a restart made a new CA: %s, then %s", s1.Fingerprint(), s2.Fingerprint())
	}
	if s1.Leaf().SerialNumber.Cmp(s2.Leaf().SerialNumber) != 0 {
		t.Fatal("a restart issued a new server certificate although the one on disk was current")
	}
	for _, name := range []string{caKeyName, keyFileName} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", name, fi.Mode().Perm())
		}
	}
	certs, err := ReadCertsFile(s1.CAFile())
	if err != nil || Fingerprint(certs[0]) != s1.Fingerprint() {
		t.Fatalf("ca.pem does not hold the CA: %v", err)
	}
	// Other hosts: a new certificate from the same CA.
	o.Hosts = append(o.Hosts, "cp.example")
	s3, err := OpenServer(o)
	if err != nil {
		t.Fatal(err)
	}
	if s3.Fingerprint() != s1.Fingerprint() || !sameHosts(s3.Leaf(), o.Hosts) {
		t.Fatalf("hosts changed: want the same CA and a certificate for %v, got %v %v", o.Hosts, s3.Leaf().DNSNames, s3.Leaf().IPAddresses)
	}
}

func TestRenewalWithoutRestart(t *testing.T) {
	// The clock starts in the past, so that once moved into the renewal
	// window it is the real time the client verifies with.
	clock := &fakeClock{t: time.Now().Add(-2*time.Hour - time.Minute)}
	s, err := OpenServer(ServerOptions{DataDir: t.TempDir(), Hosts: []string{"127.0.0.1"}, Validity: 3 * time.Hour, Now: clock.Now, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	url := serve(t, s)
	roots := []*x509.Certificate{s.CA()}
	if err := get(t, roots, url, nil); err != nil {
		t.Fatal(err)
	}
	first := s.Leaf()
	if err := s.Check(); err != nil || s.Leaf() != first {
		t.Fatalf("a certificate far from its end was replaced (err %v)", err)
	}
	clock.Add(2*time.Hour + time.Minute) // within the last third
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
	second := s.Leaf()
	if second.SerialNumber.Cmp(first.SerialNumber) == 0 || !second.NotAfter.After(first.NotAfter) {
		t.Fatalf("not renewed: %v then %v", first.NotAfter, second.NotAfter)
	}
	var served *x509.Certificate
	if err := get(t, roots, url, func(c *x509.Certificate) { served = c }); err != nil {
		t.Fatal(err)
	}
	if served.SerialNumber.Cmp(second.SerialNumber) != 0 {
		t.Fatal("the listener still serves the old certificate after the renewal")
	}
}

func TestRunRenewsOnItsTimer(t *testing.T) {
	clock := &fakeClock{t: time.Now()}
	s, err := OpenServer(ServerOptions{DataDir: t.TempDir(), Hosts: []string{"127.0.0.1"}, Validity: 3 * time.Hour,
		CheckEvery: 10 * time.Millisecond, Now: clock.Now, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	first := s.Leaf()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.Run(ctx)
	clock.Add(2*time.Hour + time.Minute)
	deadline := time.Now().Add(10 * time.Second)
	for s.Leaf() == first {
		if time.Now().After(deadline) {
			t.Fatal("Run did not renew a due certificate")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestSharedCAGivesReplicasOneFingerprint(t *testing.T) {
	ca, err := NewCA("shared", time.Now(), CAValidity)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	keyPEM, _ := ecKeyPEM(ca.Key)
	caCert, caKey := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
	if err := WriteFileAtomic(caCert, CertPEM(ca.Cert), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteFileAtomic(caKey, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		s, err := OpenServer(ServerOptions{DataDir: filepath.Join(dir, string(rune('a'+i))), CACertFile: caCert, CAKeyFile: caKey, Hosts: []string{"127.0.0.1"}, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		if s.Fingerprint() != Fingerprint(ca.Cert) {
			t.Fatalf("replica %d pins %s, want the shared CA %s", i, s.Fingerprint(), Fingerprint(ca.Cert))
		}
	}
	if _, err := OpenServer(ServerOptions{DataDir: dir, CACertFile: caCert, Logger: quiet}); err == nil {
		t.Fatal("a CA certificate without its key was accepted for issuing")
	}
}

func TestOperatorCertificateIsServedAndReloaded(t *testing.T) {
	ca, _ := NewCA("operator", time.Now(), CAValidity)
	dir := t.TempDir()
	write := func(hosts ...string) {
		certPEM, keyPEM, err := ca.Issue(hosts, time.Now(), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if err := WriteFileAtomic(filepath.Join(dir, "c.pem"), certPEM, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := WriteFileAtomic(filepath.Join(dir, "k.pem"), keyPEM, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("127.0.0.1")
	s, err := OpenServer(ServerOptions{DataDir: filepath.Join(dir, "data"), CertFile: filepath.Join(dir, "c.pem"), KeyFile: filepath.Join(dir, "k.pem"), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if s.Fingerprint() != Fingerprint(ca.Cert) {
		t.Fatal("the pinned CA is not the top of the operator's chain")
	}
	first := s.Leaf()
	time.Sleep(10 * time.Millisecond) // a later modification time
	write("127.0.0.1", "cp.example")
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
	if s.Leaf().SerialNumber.Cmp(first.SerialNumber) == 0 {
		t.Fatal("the operator's renewed files were not reloaded")
	}
}

func TestFetchCAPinsByFingerprintAndRefusesAnother(t *testing.T) {
	s, err := OpenServer(ServerOptions{DataDir: t.TempDir(), Hosts: []string{"127.0.0.1"}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	url := serve(t, s)
	ca, err := FetchCA(context.Background(), url, strings.ToUpper(s.Fingerprint()))
	if err != nil {
		t.Fatal(err)
	}
	if Fingerprint(ca) != s.Fingerprint() {
		t.Fatal("fetched another CA")
	}
	other, _ := NewCA("other", time.Now(), CAValidity)
	_, err = FetchCA(context.Background(), url, Fingerprint(other.Cert))
	var me *MismatchError
	if !errors.As(err, &me) || me.Expected != Fingerprint(other.Cert) || len(me.Presented) != 2 || me.Presented[1] != s.Fingerprint() {
		t.Fatalf("want a mismatch naming both fingerprints, got %v", err)
	}
	// A client trusting the other CA refuses the server, naming both.
	err = get(t, []*x509.Certificate{other.Cert}, url, nil)
	if !errors.As(err, &me) || !strings.Contains(err.Error(), Fingerprint(other.Cert)) || !strings.Contains(err.Error(), s.Fingerprint()) {
		t.Fatalf("want a mismatch naming both fingerprints, got %v", err)
	}
	// The right CA, but the wrong name: refused too.
	if err := get(t, []*x509.Certificate{s.CA()}, strings.Replace(url, "127.0.0.1", "localhost", 1), nil); !errors.As(err, &me) {
		t.Fatalf("a certificate not naming the host was accepted: %v", err)
	}
}

func TestJoinTokensAndPlaintext(t *testing.T) {
	fp := strings.Repeat("ab", 32)
	tok := JoinToken(fp, "mci_secret")
	if got, err := JoinFingerprint(tok); err != nil || got != fp {
		t.Fatalf("JoinFingerprint(%q) = %q, %v", tok, got, err)
	}
	if got, err := JoinFingerprint("mci_plain"); err != nil || got != "" {
		t.Fatalf("a plain invitation pins %q, %v", got, err)
	}
	if _, err := JoinFingerprint("mi1.zz.mci_x"); err == nil {
		t.Fatal("a malformed fingerprint was accepted")
	}
	if JoinToken("", "mci_x") != "mci_x" {
		t.Fatal("no fingerprint must leave the token plain")
	}
	for u, ok := range map[string]bool{"http://127.0.0.1:7070": true, "http://localhost:1": true, "http://[::1]:1": true,
		"https://cp.example": true, "http://cp.example:7070": false, "http://10.0.0.1:7070": false} {
		if err := CheckPlaintext(u); (err == nil) != ok {
			t.Errorf("CheckPlaintext(%s) = %v", u, err)
		}
	}
	if _, err := NormalizeFingerprint("sha256:" + strings.ToUpper(strings.Repeat("ab:", 32))); err != nil {
		t.Fatal(err)
	}
}

// TestAnIPAddressIsCheckedToo: the right CA, but a certificate for another
// address, is refused by the client and by FetchCA (Go leaves an IP out of
// the SNI, so the check must not rely on the handshake's server name).
func TestAnIPAddressIsCheckedToo(t *testing.T) {
	s, err := OpenServer(ServerOptions{DataDir: t.TempDir(), Hosts: []string{"10.1.1.1"}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	url := serve(t, s)
	var me *MismatchError
	if err := get(t, []*x509.Certificate{s.CA()}, url, nil); !errors.As(err, &me) {
		t.Fatalf("a certificate for 10.1.1.1 was accepted at 127.0.0.1: %v", err)
	}
	if _, err := FetchCA(context.Background(), url, s.Fingerprint()); !errors.As(err, &me) {
		t.Fatalf("FetchCA accepted a certificate for 10.1.1.1 at 127.0.0.1: %v", err)
	}
}

// TestReconnectsResumeTheSession: a client's second connection resumes the
// first one's TLS session (an abbreviated handshake: no certificate chain
// sent or verified again), which is what keeps a fleet-wide reconnect from
// becoming a storm of full handshakes.
func TestReconnectsResumeTheSession(t *testing.T) {
	s, err := OpenServer(ServerOptions{DataDir: t.TempDir(), Hosts: []string{"127.0.0.1"}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	url := serve(t, s)
	roots := []*x509.Certificate{s.CA()}
	cfg := ClientTLSConfig(roots)
	var resumed []bool
	cfg.VerifyConnection = func(cs tls.ConnectionState) error { resumed = append(resumed, cs.DidResume); return nil }
	c := &http.Client{Transport: Explaining(&http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}, roots)}
	for range 3 {
		resp, err := c.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	if len(resumed) != 3 || resumed[0] || !resumed[1] || !resumed[2] {
		t.Fatalf("want a full handshake, then two resumed sessions; got DidResume %v", resumed)
	}
}
