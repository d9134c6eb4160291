package nodeagent

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestNodeagentKnowsNoContainerRuntime: the agent drives containers only
// through Runtime, so nothing in this package (tests aside) may import the
// Docker adapter, the Docker runtime or the Docker client modules. The
// composition root (package daemon) wires them in.
func TestNodeagentKnowsNoContainerRuntime(t *testing.T) {
	forbidden := []string{
		"github.com/mercator/mercator/dockerengine",
		"github.com/mercator/mercator/nodeagent/dockerruntime",
		"github.com/docker/",
		"github.com/containerd/",
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				t.Fatal(err)
			}
			for _, bad := range forbidden {
				if strings.HasPrefix(path, bad) {
					t.Errorf("%s imports %s; nodeagent must reach containers only through Runtime", name, path)
				}
			}
		}
	}
}
