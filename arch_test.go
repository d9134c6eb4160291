package mercator

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// module is this module's path, as go.mod names it.
const module = "github.com/mercator/mercator"

// domain lists the packages that decide (docs/design.md, "Architecture"):
// a package listed with a trailing "/..." includes every package under it.
var domain = []string{
	"api",
	"failure",
	"lifecycle",
	"scheduler",
	"store", // the interface, not its drivers under it
	"controlplane",
	"controlplane/...",
	"nodeagent",
	"nodeproto",
}

// adapters lists what no domain package may import: the store drivers,
// replica, the composition root, the Docker runtime, the Docker adapter and the Docker and Moby modules themselves.
// The domain is tested against fakes and wired to these by the
// composition root, so that a rule lives once and not once per database or
// container engine.
var adapters = []string{
	module + "/store/sqlstore",
	module + "/store/memstore",
	module + "/replica",
	module + "/daemon",
	module + "/nodeagent/dockerruntime",
	module + "/dockerengine",
	module + "/dockerengine/...",
	"github.com/docker/...",
	"github.com/moby/...",
}

// matches reports whether path is pattern, or lies under it when pattern
// ends in "/...".
func matches(pattern, path string) bool {
	if prefix, ok := strings.CutSuffix(pattern, "/..."); ok {
		return strings.HasPrefix(path, prefix+"/")
	}
	return path == pattern
}

// goPackage is one directory's Go files, as far as the checks read them.
type goPackage struct {
	dir     string              // relative to the module root, "." for the root
	imports map[string][]string // of non-test files, with the files
	// docs and testDocs count the non-test and test files with a package
	// doc comment; files counts the non-test files.
	docs, testDocs, files int
}

// documented reports whether the package has a doc comment: in a non-test
// file, or in a test file in a directory of tests only (e2e).
func (p *goPackage) documented() bool {
	return p.docs > 0 || p.files == 0 && p.testDocs > 0
}

// parsePackages reads the package clause, doc comment and imports of every
// .go file in the module, skipping testdata and hidden directories.
func parsePackages(t *testing.T) map[string]*goPackage {
	t.Helper()
	pkgs := map[string]*goPackage{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != "." && (name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly|parser.ParseComments)
		if err != nil {
			return err
		}
		dir := filepath.ToSlash(filepath.Dir(path))
		p := pkgs[dir]
		if p == nil {
			p = &goPackage{dir: dir, imports: map[string][]string{}}
			pkgs[dir] = p
		}
		hasDoc := 0
		if f.Doc != nil {
			hasDoc = 1
		}
		if strings.HasSuffix(name, "_test.go") {
			p.testDocs += hasDoc
			return nil
		}
		p.files++
		p.docs += hasDoc
		recordImports(p, filepath.ToSlash(path), f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pkgs
}

func recordImports(p *goPackage, file string, f *ast.File) {
	for _, spec := range f.Imports {
		path, err := strconv.Unquote(spec.Path.Value)
		if err == nil {
			p.imports[path] = append(p.imports[path], file)
		}
	}
}

// importPath is the import path of the package in dir.
func importPath(dir string) string {
	if dir == "." {
		return module
	}
	return module + "/" + dir
}

// TestDomainImportsNoAdapter fails when a domain package imports a store
// driver, replica or a Docker adapter. Test files are not read: a domain
// package's tests may use memstore as their fake.
func TestDomainImportsNoAdapter(t *testing.T) {
	pkgs := parsePackages(t)
	dirs := sortedDirs(pkgs)
	for _, dir := range dirs {
		p := pkgs[dir]
		if !slices.ContainsFunc(domain, func(pat string) bool { return matches(module+"/"+pat, importPath(dir)) }) {
			continue
		}
		for _, imp := range sortedKeys(p.imports) {
			if slices.ContainsFunc(adapters, func(pat string) bool { return matches(pat, imp) }) {
				t.Errorf("%s imports %s (%s): a domain package imports no store driver, replica or Docker adapter; take it as an interface and let the composition root wire it", importPath(dir), imp, strings.Join(p.imports[imp], ", "))
			}
		}
	}
}

// TestPackagesHaveDocs fails when a package has no package doc comment: a
// reader should find in one place what each package is for and who may
// import it.
func TestPackagesHaveDocs(t *testing.T) {
	pkgs := parsePackages(t)
	for _, dir := range sortedDirs(pkgs) {
		if !pkgs[dir].documented() {
			t.Errorf("%s has no package doc comment: say what it is for and who may import it", importPath(dir))
		}
	}
}

// TestDomainListExists fails when a package named in domain is not in the
// module, so that a rename does not quietly take a package out of the
// rule.
func TestDomainListExists(t *testing.T) {
	if _, err := os.Stat("go.mod"); err != nil {
		t.Fatalf("arch_test.go must run at the module root: %v", err)
	}
	dirs := sortedDirs(parsePackages(t))
	for _, pat := range domain {
		if strings.HasSuffix(pat, "/...") {
			continue
		}
		if !slices.Contains(dirs, pat) {
			t.Errorf("domain package %s is not in the module; update the list in arch_test.go", pat)
		}
	}
}

func sortedDirs(pkgs map[string]*goPackage) []string {
	return sortedKeys(pkgs)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// TestReadmeNamesEveryPackage fails when a package is missing from the
// README's ownership table, so that the map a new engineer reads first
// cannot fall behind the tree (it once left out five packages).
func TestReadmeNamesEveryPackage(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range sortedDirs(parsePackages(t)) {
		name := dir
		if dir == "." {
			name = "mercator"
		}
		if !strings.Contains(string(readme), "`"+name+"`") {
			t.Errorf("README.md's package table does not name `%s`: add a line saying what it owns", name)
		}
	}
}
