package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/content"
	"github.com/mercator/mercator/nodeagent/dockerruntime"
	"github.com/mercator/mercator/nodeproto"
)

// benchEnv turns the Artifact copy benchmark on; MERCATOR_ARTIFACT_BENCH_BYTES
// sets its size (default 2 GiB). It is off by default: it writes several
// times the size to disk and never gates CI on a clock.
const benchEnv = "MERCATOR_ARTIFACT_BENCH"

// TestArtifactCopyBenchmark measures, in one run on one machine, the
// upload of an Artifact version and its copy onto a node, against
// baselines measured on the same file, disk and loopback:
//
//   - copy: the node agent's prepare through a minted read (transfer, disk
//     and SHA-256, fsynced and published) and the link reading the node
//     published for it, against `curl URL | tee FILE | sha256sum` on the
//     same read, and against the machine's limit: the lower of SHA-256
//     over the file from the page cache and a direct (O_DIRECT) write of it
//     to the artifact root's disk;
//   - upload: `mercator artifact push` of new content, run as the CLI
//     (one pass: the client computes a CRC-32C as it sends, the server a
//     SHA-256 and a CRC-32C as it writes what it receives, then compares
//     the CRCs and stores the content by its SHA-256), against
//     `curl -T` of the file to a server that only writes it to disk, and
//     against the same limit; and the same push again, which hashes the
//     file first (the name has a version of its size), asks, and sends
//     nothing.
//
// MERCATOR_ARTIFACT_BENCH_PROFILE=DIR writes a CPU profile of the upload
// (DIR/upload.pprof) and of the node's prepare (DIR/prepare.pprof), each
// of that phase alone.
//
// Run: MERCATOR_ARTIFACT_BENCH=1 go test ./e2e -run TestArtifactCopyBenchmark -v -timeout 30m
func TestArtifactCopyBenchmark(t *testing.T) {
	if os.Getenv(benchEnv) == "" {
		t.Skipf("set %s=1 to run the Artifact copy benchmark", benchEnv)
	}
	size := int64(2 << 30)
	if v := os.Getenv(benchEnv + "_BYTES"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		size = n
	}
	c := startArtifactCluster(t, nil, artifactClusterOptions{})
	nodeID := c.startArtifactAgent("bench", 0, nil)
	work := t.TempDir()
	src := filepath.Join(work, "source.bin")
	digest := writeRandom(t, src, size)

	// The machine's limit, on this file and this disk. Every phase starts
	// with no dirty pages (sync), so none pays for another's writeback.
	warm(t, src)
	hashRate := timeRate(size, func() {
		f, _ := os.Open(src)
		defer f.Close()
		h := sha256.New()
		io.Copy(h, f)
	})
	// The CRC-32C both sides of a push compute, at the same (rough) cost
	// of reading the file from the page cache: what the push's CPU has
	// left for it.
	crcRate := timeRate(size, func() {
		f, _ := os.Open(src)
		defer f.Close()
		io.Copy(api.NewCRC32C(), f)
	})
	direct := filepath.Join(c.agentState(nodeID), "artifacts", "direct.bin")
	directRate := timeRate(size, func() {
		run(t, "dd", "if="+src, "of="+direct, "bs=8M", "oflag=direct", "status=none")
	})
	os.Remove(direct)
	limit := min(hashRate, directRate)

	// Upload: Mercator's push, then `curl -T` to a plain disk writer.
	warm(t, src)
	var ref string
	cpu0 := processCPU()
	uploadRate := timeRate(size, profiled(t, "upload", func() { ref = strings.TrimSpace(c.mercator("artifact", "push", "bench", src)) }))
	// The CLI, the client and the control plane all run in this process,
	// so its CPU time is the push's cost, all its checks included.
	uploadCPU := float64((processCPU() - cpu0).Nanoseconds()) / float64(size)
	pushed, err := c.client.GetArtifact(c.ctx, "bench", "")
	if err != nil || ref != pushed.Ref() || pushed.SHA256 != digest {
		t.Fatalf("push printed %q; bench is %+v (%v), want content %s", ref, pushed, err, digest)
	}
	var again string
	againRate := timeRate(size, func() { again = strings.TrimSpace(c.mercator("artifact", "push", "bench", src)) })
	if again != ref {
		t.Fatalf("pushing the same content again printed %q, want %q", again, ref)
	}
	sinkPath := filepath.Join(work, "curl-upload.bin")
	sink := httptestServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f, _ := os.Create(sinkPath)
		io.Copy(f, r.Body)
		f.Sync()
		f.Close()
	}))
	warm(t, src)
	curlUploadRate := timeRate(size, func() { run(t, "curl", "-sS", "-T", src, sink+"/upload") })
	os.Remove(sinkPath)

	// Copy: the node's prepare through a freshly minted read.
	signer, err := content.OpenLocal(filepath.Join(c.dataDir, "content"), filepath.Join(c.dataDir, "content-key"), c.url, nil)
	if err != nil {
		t.Fatal(err)
	}
	mint := func() (string, time.Time) {
		u, exp, err := signer.ReadURL(c.ctx, digest, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return u, exp
	}
	// The control plane's copy is in the page cache after the upload, as
	// it would be for a version pushed and then placed; warm it anyway.
	warm(t, filepath.Join(c.dataDir, "content", "sha256", digest[:2], digest))
	u, _ := mint()
	curlOut := filepath.Join(c.agentState(nodeID), "artifacts", "curl-copy.bin")
	var curlSum string
	curlRate := timeRate(size, func() {
		out := run(t, "bash", "-c", fmt.Sprintf("set -o pipefail; curl -sSf %q | tee %q | sha256sum", u, curlOut))
		curlSum = strings.Fields(out)[0]
	})
	os.Remove(curlOut)
	if curlSum != digest {
		t.Fatalf("curl pipeline hashed %s, want %s", curlSum, digest)
	}

	// Through a run, as a node does it: prepare_artifact and the launch.
	run0 := c.submit(api.RunSpec{Command: []string{"echo", "ok"}, Artifacts: []api.ArtifactMount{{Name: "bench", MountPath: "/bench"}}})
	start := time.Now()
	if done := c.wait(run0.ID); done.Status != api.RunSucceeded {
		t.Fatalf("run = %s %s %s", done.Status, done.Reason, attemptErrors(done))
	}
	runWall := time.Since(start)
	var link *nodeproto.LinkReading
	c.waitFor("the node's link reading", func() bool { link = nodeFacts(t, c, nodeID).Link; return link != nil })

	// And the runtime alone, into a fresh root on the same disk.
	rt, err := dockerruntime.New("", dockerruntime.WithArtifactRoot(filepath.Join(c.agentState(nodeID), "bench-root")))
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	u, exp := mint()
	prepareRate := timeRate(size, profiled(t, "prepare", func() {
		if err := rt.PrepareArtifact(context.Background(), nodeproto.PrepareArtifactCommand{Name: "bench", Version: pushed.Version,
			SHA256: digest, Size: size, URL: u, ExpiresAt: exp}); err != nil {
			t.Fatal(err)
		}
	}))
	os.RemoveAll(filepath.Join(c.agentState(nodeID), "bench-root"))

	mb := func(r float64) string { return fmt.Sprintf("%7.1f MB/s", r/1e6) }
	var b bytes.Buffer
	fmt.Fprintf(&b, "\nArtifact copy benchmark: %d bytes (%.2f GiB), loopback, one machine\n", size, float64(size)/(1<<30))
	fmt.Fprintf(&b, "  machine limit                      %s  = min(SHA-256 from page cache %s, O_DIRECT write %s)\n", mb(limit), mb(hashRate), mb(directRate))
	fmt.Fprintf(&b, "  CRC-32C from page cache            %s  (the push's check; not part of the limit)\n", mb(crcRate))
	fmt.Fprintf(&b, "copy onto a node\n")
	fmt.Fprintf(&b, "  node prepare (runtime, timed here) %s  ratio to limit %.2f, to curl|tee|sha256sum %.2f\n", mb(prepareRate), prepareRate/limit, prepareRate/curlRate)
	fmt.Fprintf(&b, "  link reading the node published    %s  (%s, confidence %.1f, over %d bytes; ratio to limit %.2f)\n",
		mb(float64(link.BytesPerSecond)), link.Source, link.Confidence, link.Bytes, float64(link.BytesPerSecond)/limit)
	fmt.Fprintf(&b, "  run submit → succeeded, wall       %s  (placement, prepare, launch, exit)\n", runWall.Round(time.Millisecond))
	fmt.Fprintf(&b, "  baseline curl URL | tee | sha256sum %s (no fsync)\n", mb(curlRate))
	fmt.Fprintf(&b, "upload\n")
	fmt.Fprintf(&b, "  artifact push, new content         %s  ratio to limit %.2f, to curl -T %.2f (CRC-32C while sent, verified)\n", mb(uploadRate), uploadRate/limit, uploadRate/curlUploadRate)
	fmt.Fprintf(&b, "    CPU, client and server together  %.2f ns/B (of which the server's SHA-256 %.2f, CRC-32C twice %.2f, each with a page-cache read), %.2f of %d cores busy\n",
		uploadCPU, 1e9/hashRate, 2e9/crcRate, uploadCPU*uploadRate/1e9, runtime.NumCPU())
	fmt.Fprintf(&b, "  artifact push, same content again  %s  (hashed first, asked, nothing sent)\n", mb(againRate))
	fmt.Fprintf(&b, "  baseline curl -T to a disk writer  %s\n", mb(curlUploadRate))
	t.Log(b.String())
	if out := os.Getenv(benchEnv + "_OUT"); out != "" {
		os.WriteFile(out, b.Bytes(), 0o644)
	}
}

// profiled is fn, CPU-profiled into $MERCATOR_ARTIFACT_BENCH_PROFILE/NAME.pprof
// when that is set.
func profiled(t *testing.T, name string, fn func()) func() {
	dir := os.Getenv(benchEnv + "_PROFILE")
	if dir == "" {
		return fn
	}
	return func() {
		f, err := os.Create(filepath.Join(dir, name+".pprof"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			t.Fatal(err)
		}
		defer pprof.StopCPUProfile()
		fn()
	}
}

func writeRandom(t *testing.T, path string, size int64) string {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	buf := make([]byte, 4<<20)
	for left := size; left > 0; {
		n := min(int64(len(buf)), left)
		rand.Read(buf[:n])
		f.Write(buf[:n])
		h.Write(buf[:n])
		left -= n
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// warm reads a file so its pages are cached, as a file just written or
// just uploaded is.
func warm(t *testing.T, path string) {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	io.Copy(io.Discard, f)
}

// processCPU is the CPU time this process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func timeRate(size int64, fn func()) float64 {
	exec.Command("sync").Run()
	start := time.Now()
	fn()
	return float64(size) / time.Since(start).Seconds()
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", name, args, err, out)
	}
	return string(out)
}
