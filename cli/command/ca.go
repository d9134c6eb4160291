package command

import (
	"github.com/mercator/mercator/internal/termtext"
	"github.com/mercator/mercator/pki"
)

// PrintCA prints where the CA certificate is and its fingerprint, the two
// things a client needs to trust the server.
func PrintCA(inv *Invocation, caFile string) {
	certs, err := pki.ReadCertsFile(caFile)
	if err != nil {
		termtext.Fprintf(inv.Stderr, "CA certificate: %v\n", err)
		return
	}
	termtext.Fprintf(inv.Stderr, "CA certificate in %s\nCA fingerprint sha256:%s\n", caFile, pki.Fingerprint(certs[0]))
}
