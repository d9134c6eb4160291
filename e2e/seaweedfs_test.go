package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/mercator/mercator/internal/pgtest"
)

// weedEnv names the SeaweedFS binary the S3 tests start
// (scripts/ensure-seaweedfs.sh builds it; scripts/test.sh sets it).
const weedEnv = "MERCATOR_TEST_WEED"

// seaweedS3 is a SeaweedFS server on loopback serving S3 (master, volume,
// filer and S3 gateway in one `weed server` process), with one identity
// whose signatures it checks.
type seaweedS3 struct {
	// Endpoint is the S3 gateway's "127.0.0.1:PORT".
	Endpoint string
	// AccessKey and SecretKey are the identity's; any other is refused.
	AccessKey, SecretKey string
}

// startSeaweedS3 runs `weed server -s3` from $MERCATOR_TEST_WEED in a
// temporary directory, on free loopback ports, until the test ends (its
// process group is killed then), and returns once bucket exists in it.
// Without the binary the test is skipped, or fails in CI.
func startSeaweedS3(t *testing.T, accessKey, secretKey, bucket string) *seaweedS3 {
	t.Helper()
	weed := os.Getenv(weedEnv)
	if weed == "" {
		how := weedEnv + ` is not set: run "export ` + weedEnv + `=$(bash scripts/ensure-seaweedfs.sh)" to test against a real S3-compatible server`
		if pgtest.InCI() {
			t.Fatal(how + "; in CI the S3 tests must run")
		}
		t.Skip(how)
	}
	dir := t.TempDir()
	config, err := json.Marshal(map[string]any{"identities": []map[string]any{{
		"name":        "mercator",
		"credentials": []map[string]string{{"accessKey": accessKey, "secretKey": secretKey}},
		"actions":     []string{"Admin", "Read", "List", "Tagging", "Write"},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	configPath := filepath.Join(dir, "s3.json")
	if err := os.WriteFile(configPath, config, 0o600); err != nil {
		t.Fatal(err)
	}
	// The master's settings for a one-node test: one volume grown at a
	// time (not seven), and no hold on the first volume's allocation (which
	// gives a rebuilt master's old volume servers time to report; a fresh
	// one has none). weed reads master.toml from its working directory.
	masterTOML := "[master.volume_growth]\ncopy_1 = 1\nallocation_deferral = \"0s\"\n"
	if err := os.WriteFile(filepath.Join(dir, "master.toml"), []byte(masterTOML), 0o600); err != nil {
		t.Fatal(err)
	}
	ports := freePorts(t, 8)
	s := &seaweedS3{Endpoint: "127.0.0.1:" + strconv.Itoa(ports[6]), AccessKey: accessKey, SecretKey: secretKey}
	logPath := filepath.Join(dir, "weed.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.Command(weed, "server",
		"-dir="+filepath.Join(dir, "data"), "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
		"-master.port="+strconv.Itoa(ports[0]), "-master.port.grpc="+strconv.Itoa(ports[1]),
		"-volume.port="+strconv.Itoa(ports[2]), "-volume.port.grpc="+strconv.Itoa(ports[3]),
		"-filer", "-filer.port="+strconv.Itoa(ports[4]), "-filer.port.grpc="+strconv.Itoa(ports[5]),
		"-s3", "-s3.port="+strconv.Itoa(ports[6]), "-s3.port.grpc="+strconv.Itoa(ports[7]),
		"-s3.port.iceberg=0", "-s3.config="+configPath,
		"-filer.localSocket="+filepath.Join(dir, "filer.sock"), "-s3.localSocket="+filepath.Join(dir, "s3.sock"),
		"-master.volumeSizeLimitMB=64", "-volume.max=16")
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", weed, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	// Killed outright at the end: its data is the test's temporary
	// directory, and a graceful stop takes it over 20 seconds. Its gRPC
	// services' local sockets are always /tmp/seaweedfs-NAME-grpc-PORT.sock
	// (no flag moves them), so they are removed here.
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
		for i, name := range []string{"master", "volume", "filer", "s3"} {
			os.Remove(fmt.Sprintf("/tmp/seaweedfs-%s-grpc-%d.sock", name, ports[2*i+1]))
		}
	})
	started := time.Now()
	defer func() {
		t.Logf("weed's S3 gateway served at %s after %s", s.Endpoint, time.Since(started).Round(time.Millisecond))
	}()

	// Ready when an object can be written to the bucket: the gateway
	// answers and checks the signature, and the filer has joined the
	// master's lock ring (a write waits for that, seconds after the bucket
	// can be made). The probe object is removed again.
	client, err := minio.New(s.Endpoint, &minio.Options{Creds: credentials.NewStaticV4(accessKey, secretKey, ""), Region: "us-east-1"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ready := func() error {
		if ok, err := client.BucketExists(ctx, bucket); err != nil {
			return err
		} else if !ok {
			if err := client.MakeBucket(ctx, bucket, minio.MakeBucketOptions{Region: "us-east-1"}); err != nil {
				return err
			}
		}
		if _, err := client.PutObject(ctx, bucket, "ready-probe", bytes.NewReader([]byte("ok")), 2, minio.PutObjectOptions{}); err != nil {
			return err
		}
		return client.RemoveObject(ctx, bucket, "ready-probe", minio.RemoveObjectOptions{})
	}
	for {
		err = ready()
		if err == nil {
			break
		}
		select {
		case werr := <-exited:
			t.Fatalf("weed exited before serving S3 (%v); its log:\n%s", werr, tailFile(logPath, 4000))
		case <-ctx.Done():
			t.Fatalf("weed's S3 gateway at %s took no write within 2 minutes (last: %v); its log:\n%s", s.Endpoint, err, tailFile(logPath, 4000))
		case <-time.After(200 * time.Millisecond):
		}
	}
	return s
}

// freePorts returns n distinct loopback ports free at the time of asking
// (all held until every one is found, then released for the caller).
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// tailFile is the last n bytes of a file, for a failure message.
func tailFile(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	if len(data) > n {
		data = data[len(data)-n:]
	}
	return string(bytes.TrimSpace(data))
}
