package daemon

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/mercator/mercator/pki"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// tlsServer is a TLS listener on loopback with a CA of its own; it accepts
// handshakes and nothing more.
func tlsServer(t *testing.T) (url string, s *pki.Server) {
	t.Helper()
	s, err := pki.OpenServer(pki.ServerOptions{DataDir: t.TempDir(), Hosts: []string{"127.0.0.1"}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tl := tls.NewListener(l, s.TLSConfig())
	go func() {
		for {
			c, err := tl.Accept()
			if err != nil {
				return
			}
			go func() { c.(*tls.Conn).Handshake(); c.Close() }()
		}
	}()
	t.Cleanup(func() { l.Close() })
	return "https://" + l.Addr().String(), s
}

func TestAgentTrustPinsKeepsAndFollowsANewInvitation(t *testing.T) {
	url, s := tlsServer(t)
	o := AgentOptions{ControlPlaneURL: url, StateDir: t.TempDir(), Invitation: pki.JoinToken(s.Fingerprint(), "mci_x"), Logger: quiet}
	roots, err := agentTrust(context.Background(), o)
	if err != nil || len(roots) != 1 || pki.Fingerprint(roots[0]) != s.Fingerprint() {
		t.Fatalf("pin by invitation: %v %v", roots, err)
	}
	// A restart without the invitation trusts the kept CA, with no server.
	o.Invitation, o.ControlPlaneURL = "", "https://127.0.0.1:1"
	if roots, err = agentTrust(context.Background(), o); err != nil || pki.Fingerprint(roots[0]) != s.Fingerprint() {
		t.Fatalf("kept CA: %v %v", roots, err)
	}
	// A new invitation pinning another CA (the server's CA was replaced)
	// replaces the kept one.
	url2, s2 := tlsServer(t)
	o.ControlPlaneURL, o.Invitation = url2, pki.JoinToken(s2.Fingerprint(), "mci_y")
	if roots, err = agentTrust(context.Background(), o); err != nil || pki.Fingerprint(roots[0]) != s2.Fingerprint() {
		t.Fatalf("re-invited: %v %v", roots, err)
	}
	kept, err := pki.ReadCertsFile(filepath.Join(o.StateDir, agentCAFileName))
	if err != nil || pki.Fingerprint(kept[0]) != s2.Fingerprint() {
		t.Fatalf("the new CA was not kept: %v", err)
	}
	// --ca-file beats everything.
	o.CAFile = s.CAFile()
	if roots, err = agentTrust(context.Background(), o); err != nil || pki.Fingerprint(roots[0]) != s.Fingerprint() {
		t.Fatalf("--ca-file: %v %v", roots, err)
	}
	// Plain HTTP: loopback only.
	if _, err := agentTrust(context.Background(), AgentOptions{ControlPlaneURL: "http://10.1.2.3:7070", Logger: quiet}); err == nil {
		t.Fatal("plain http to another host was accepted")
	}
	if roots, err := agentTrust(context.Background(), AgentOptions{ControlPlaneURL: "http://127.0.0.1:7070", Logger: quiet}); err != nil || roots != nil {
		t.Fatalf("plain http on loopback: %v %v", roots, err)
	}
}

func TestCertHostsAndInsecureListen(t *testing.T) {
	hosts := certHosts(&net.TCPAddr{IP: net.ParseIP("10.0.0.5"), Port: 7443}, "https://cp.example:7443", "https://r1.example:7443", "")
	for _, want := range []string{"localhost", "127.0.0.1", "::1", "10.0.0.5", "cp.example", "r1.example"} {
		if !slices.Contains(hosts, want) {
			t.Errorf("certificate hosts %v lack %s", hosts, want)
		}
	}
	if name, err := os.Hostname(); err == nil {
		if all := certHosts(&net.TCPAddr{IP: net.IPv4zero, Port: 7443}); !slices.Contains(all, name) {
			t.Errorf("listening on every interface, the hosts %v lack the machine's name %s", all, name)
		}
	}
	if err := checkInsecureListen(&net.TCPAddr{IP: net.IPv4zero, Port: 1}); err == nil {
		t.Fatal("plaintext on every interface was allowed")
	}
	if err := checkInsecureListen(&net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 1}); err != nil {
		t.Fatal(err)
	}
}
