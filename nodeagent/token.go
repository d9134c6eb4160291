package nodeagent

import (
	"fmt"
	"os"
	"strings"
)

// Version is the agent's version string, reported in its facts.
var Version = "0.1.0-dev"

// ReadTokenFile reads an invitation from a file, refusing one readable by
// others: an invitation is a credential.
func ReadTokenFile(path string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("token file %s is readable by others (mode %o); run `chmod 600 %s`", path, fi.Mode().Perm(), path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	return strings.TrimSpace(string(data)), nil
}
