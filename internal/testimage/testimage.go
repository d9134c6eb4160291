// Package testimage builds the small container images Mercator's tests run,
// and pushes them to a registry so a test can pull them back by manifest
// digest, the only way Mercator ever names an image.
//
// There is no internet where these tests run, so nothing is pulled from
// Docker Hub: every image is FROM scratch with one static Go binary compiled
// here from source the repository holds (testdata/images/workload, and the
// examples). Building shells out to the go and docker CLIs, which is fine
// for a test helper and keeps this package free of a build-context
// implementation.
//
// Importers: tests only (the node agent's and the end-to-end suite). It
// needs a Docker daemon; it never skips when there is none, because a test
// that silently skips on a machine without Docker is a test CI never runs.
package testimage

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/distribution/reference"
)

// Workload is the directory of the test workload image, relative to the
// module root: one binary whose first argument picks a behaviour (echo,
// exit N, sleep SECONDS, env NAME, lines N, ignore-term SECONDS); see its
// main.go. Its ENTRYPOINT is the binary, so a launch's command is the
// behaviour and its arguments.
const Workload = "testdata/images/workload"

// Hello is the directory of the example workload the README uses; it has
// no ENTRYPOINT, so a launch's command starts with "/hello".
const Hello = "examples/hello"

// Root returns the module root: the nearest directory at or above the
// current one that holds a go.mod. Tests run in their package's directory,
// so this is how a test anywhere in the tree finds the image sources.
func Root() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("testimage: no go.mod at or above the current directory")
		}
		dir = parent
	}
}

// builds remembers which tags this process already built, so each image is
// compiled and built once per test binary however many tests ask for it.
var builds = struct {
	sync.Mutex
	byTag map[string]*tagBuild
}{byTag: map[string]*tagBuild{}}

type tagBuild struct {
	sync.Mutex
	done bool
	id   string // the image ID docker build answered
}

// Build compiles the Go program in dir (a directory holding main.go and a
// Dockerfile; relative paths are taken from the module root) into a fresh
// build context as a static linux binary named after the directory
// ("workload" for testdata/images/workload), copies the Dockerfile beside
// it, and runs `docker build -t tag` on that context.
//
// A tag built successfully once in this process is not built again: the
// first call's image stands for the rest of the process, whatever dir a
// later call names. A failed build is not remembered, so a later call tries
// again. Concurrent calls for one tag wait for a single build. The error
// carries the tools' own output.
func Build(ctx context.Context, dir, tag string) error {
	_, err := buildID(ctx, dir, tag)
	return err
}

// buildID is Build, answering the ID of the image this process built.
// The ID, unlike the tag, is this process's own: another test process
// building the same tag from another tree (a second worktree) moves the
// tag, not the ID.
func buildID(ctx context.Context, dir, tag string) (string, error) {
	builds.Lock()
	b := builds.byTag[tag]
	if b == nil {
		b = &tagBuild{}
		builds.byTag[tag] = b
	}
	builds.Unlock()

	b.Lock()
	defer b.Unlock()
	if b.done {
		return b.id, nil
	}
	id, err := build(ctx, dir, tag)
	if err != nil {
		return "", err
	}
	b.done, b.id = true, id
	return id, nil
}

// reproducibleTime is the modification time given to every compiled binary.
// The binary's bytes are reproducible (-trimpath, no VCS stamp), and with a
// fixed time the daemon's build cache recognises the COPY layer, so every
// test process builds the same image ID instead of leaving one dangling
// image per run.
var reproducibleTime = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

func build(ctx context.Context, dir, tag string) (string, error) {
	if !filepath.IsAbs(dir) {
		root, err := Root()
		if err != nil {
			return "", err
		}
		dir = filepath.Join(root, dir)
	}
	dockerfile, err := os.ReadFile(filepath.Join(dir, "Dockerfile"))
	if err != nil {
		return "", fmt.Errorf("testimage: %w", err)
	}
	buildContext, err := os.MkdirTemp("", "mercator-testimage-")
	if err != nil {
		return "", fmt.Errorf("testimage: %w", err)
	}
	defer os.RemoveAll(buildContext)
	if err := os.WriteFile(filepath.Join(buildContext, "Dockerfile"), dockerfile, 0o644); err != nil {
		return "", fmt.Errorf("testimage: %w", err)
	}
	binary := filepath.Join(buildContext, filepath.Base(dir))

	goCmd := exec.CommandContext(ctx, goTool(), "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w", "-o", binary, ".")
	goCmd.Dir = dir
	goCmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	if out, err := goCmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("testimage: go build %s: %w\n%s", dir, err, out)
	}
	if err := os.Chtimes(binary, reproducibleTime, reproducibleTime); err != nil {
		return "", fmt.Errorf("testimage: %w", err)
	}
	out, err := docker(ctx, "build", "-q", "-t", tag, buildContext)
	if err != nil {
		return "", fmt.Errorf("testimage: docker build -t %s (%s): %w\n%s", tag, dir, err, out)
	}
	// The ID is the last line; the legacy builder warns on stderr first.
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	id := strings.TrimSpace(lines[len(lines)-1])
	if !strings.HasPrefix(id, "sha256:") {
		return "", fmt.Errorf("testimage: docker build -q -t %s answered %q, which ends in no image ID", tag, out)
	}
	return id, nil
}

// goTool is the go command found on PATH. `go test` puts its own
// toolchain's bin directory first on the PATH of the test binary, so on a
// machine with several toolchains this is the one running the tests.
func goTool() string { return "go" }

// pushDigest is the line `docker push` ends with: "TAG: digest: sha256:… size: N".
var pushDigest = regexp.MustCompile(`digest: (sha256:[0-9a-f]{64})`)

// Push pushes tag (which must name its registry, "127.0.0.1:PORT/name:tag")
// and returns the reference that pins what was pushed,
// "127.0.0.1:PORT/name@sha256:…". The digest is the one the registry
// acknowledged, read from the push's own output, or, if that output ever
// stops carrying it, from the image's RepoDigests for that repository; an
// image pushed to several registries has a RepoDigest per repository, so
// the repository is matched, never the first entry taken.
func Push(ctx context.Context, tag string) (string, error) {
	named, err := reference.ParseNormalizedNamed(tag)
	if err != nil {
		return "", fmt.Errorf("testimage: push %q: %w", tag, err)
	}
	repo := reference.FamiliarName(named)
	out, err := docker(ctx, "push", tag)
	if err != nil {
		return "", fmt.Errorf("testimage: docker push %s: %w\n%s", tag, err, out)
	}
	if m := pushDigest.FindSubmatch(out); m != nil {
		return repo + "@" + string(m[1]), nil
	}
	inspected, err := docker(ctx, "image", "inspect", "--format", "{{json .RepoDigests}}", tag)
	if err != nil {
		return "", fmt.Errorf("testimage: inspect %s after push: %w\n%s", tag, err, inspected)
	}
	var digests []string
	if err := json.Unmarshal(bytes.TrimSpace(inspected), &digests); err != nil {
		return "", fmt.Errorf("testimage: inspect %s after push: %w", tag, err)
	}
	for _, d := range digests {
		if strings.HasPrefix(d, repo+"@sha256:") {
			return d, nil
		}
	}
	return "", fmt.Errorf("testimage: pushed %s but neither the push output nor RepoDigests %v name its digest", tag, digests)
}

// Publish builds dir (once per process, as Build) under a local tag, tags
// it into the registry at registryHost as "<registryHost>/<base of dir>:test",
// pushes it there and returns the pinned reference. It is the one call a
// test needs: registrytest.Start, then Publish, then launch by the result.
//
// Before it returns it removes the registry tag and the digest reference the
// push recorded from the daemon (the image itself stays, under its local
// build tag). So the daemon does not hold the returned reference: the first
// pull by digest is a real pull from the registry, and the short-lived
// port-numbered names of loopback registries do not pile up in `docker
// images` run after run.
func Publish(ctx context.Context, dir, registryHost string) (string, error) {
	name := filepath.Base(dir)
	local := "mercator-testimage/" + name + ":latest"
	id, err := buildID(ctx, dir, local)
	if err != nil {
		return "", err
	}
	remote := registryHost + "/" + name + ":test"
	if out, err := docker(ctx, "tag", id, remote); err != nil {
		return "", fmt.Errorf("testimage: docker tag %s %s: %w\n%s", id, remote, err, out)
	}
	pinned, err := Push(ctx, remote)
	if err != nil {
		return "", err
	}
	if err := Untag(ctx, remote, pinned); err != nil {
		return "", err
	}
	return pinned, nil
}

// Untag removes references (tags or digest references) from the daemon.
// An image that keeps another reference stays; one left with none is
// deleted. A reference the daemon does not hold is not an error, so it
// suits a t.Cleanup after a test pulled by digest.
func Untag(ctx context.Context, refs ...string) error {
	for _, ref := range refs {
		out, err := docker(ctx, "image", "rm", "--force", ref)
		if err != nil && !bytes.Contains(bytes.ToLower(out), []byte("no such image")) {
			return fmt.Errorf("testimage: docker image rm %s: %w\n%s", ref, err, out)
		}
	}
	return nil
}

// docker runs the docker CLI and returns its combined output.
func docker(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "docker", args...)
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	return out.Bytes(), err
}
