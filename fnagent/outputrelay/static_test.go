package outputrelay

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckStatic(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "main.go")
	if err := os.WriteFile(src, []byte("package main\nfunc main() {}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	static := filepath.Join(dir, "static")
	build := exec.Command("go", "build", "-o", static, src)
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build a static program: %v\n%s", err, out)
	}
	if err := CheckStatic(static); err != nil {
		t.Fatalf("a CGO_ENABLED=0 build: %v", err)
	}
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckStatic(sh); err == nil || !strings.Contains(err.Error(), "CGO_ENABLED=0") || !strings.Contains(err.Error(), "ld-linux") {
		t.Fatalf("%s (dynamically linked on this system): %v, want the loader and the fix named", sh, err)
	}
	if err := CheckStatic(src); err == nil || !strings.Contains(err.Error(), "not an ELF") {
		t.Fatalf("a source file: %v, want not an ELF executable", err)
	}
	if err := CheckStatic(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("a missing file passed")
	}
}
