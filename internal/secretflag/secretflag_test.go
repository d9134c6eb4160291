package secretflag

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mercator/mercator/api"
)

// TestReadFileLimit: a file of exactly api.MaxRunSecretBytes is read
// whole, newline and all; one byte more is refused, not cut.
func TestReadFileLimit(t *testing.T) {
	dir := t.TempDir()
	exact := strings.Repeat("k", api.MaxRunSecretBytes-1) + "\n"
	for name, content := range map[string]string{"exact": exact, "over": exact + "x"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := readFile(filepath.Join(dir, "exact")); err != nil || got != exact {
		t.Errorf("a file of the limit: %d bytes, %v", len(got), err)
	}
	if _, err := readFile(filepath.Join(dir, "over")); err == nil || !strings.Contains(err.Error(), "larger than 32768 bytes") {
		t.Errorf("a file over the limit: %v", err)
	}
}
