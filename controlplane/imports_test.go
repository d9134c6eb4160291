package controlplane

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestNoAdapterImports keeps the control plane a domain package: none of
// its files (tests aside) imports a store driver, the replica coordinator
// or a Docker client. The composition root (package daemon) opens those
// and passes them in as interfaces.
func TestNoAdapterImports(t *testing.T) {
	forbidden := []string{
		"github.com/mercator/mercator/store/sqlstore",
		"github.com/mercator/mercator/store/memstore",
		"github.com/mercator/mercator/replica",
		"github.com/mercator/mercator/daemon",
		"github.com/docker/",
	}
	fset := token.NewFileSet()
	files := 0
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		files++
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			p, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				t.Fatal(err)
			}
			for _, bad := range forbidden {
				if p == bad || strings.HasPrefix(p, bad+"/") || (strings.HasSuffix(bad, "/") && strings.HasPrefix(p, bad)) {
					t.Errorf("%s imports %s: the control plane must not import adapters (wire them in package daemon)", path, p)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 20 {
		t.Fatalf("checked %d files; the walk missed the package", files)
	}
}
