package fnagent

import (
	"os"
	"path/filepath"
	"testing"
)

func writeFiles(t *testing.T, root string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		path := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

const meminfo16G = "MemTotal:       16777216 kB\nMemFree:        1000 kB\n"

func TestDetectCapacityCgroupV2(t *testing.T) {
	proc, cg := t.TempDir(), t.TempDir()
	writeFiles(t, proc, map[string]string{"meminfo": meminfo16G, "self/cgroup": "0::/agent.slice/agent.service\n"})
	writeFiles(t, cg, map[string]string{
		"cgroup.controllers":                       "cpu memory",
		"agent.slice/memory.max":                   "4294967296\n",
		"agent.slice/cpu.max":                      "max 100000\n",
		"agent.slice/agent.service/memory.max":     "max\n",
		"agent.slice/agent.service/cpu.max":        "250000 100000\n",
		"agent.slice/agent.service/cgroup.procs":   "1\n",
		"agent.slice/agent.service/memory.current": "1\n",
	})
	c, err := detectCapacity(proc, cg, 8, 512*mib)
	if err != nil {
		t.Fatal(err)
	}
	// The parent's 4 GiB binds the child; the child's quota binds CPU.
	if c.MemoryBytes != 4096*mib-512*mib || c.MilliCPUs != 2500 {
		t.Fatalf("capacity = %+v; want 3.5 GiB and 2500 mCPU", c)
	}
}

func TestDetectCapacityCgroupV1(t *testing.T) {
	proc, cg := t.TempDir(), t.TempDir()
	writeFiles(t, proc, map[string]string{"meminfo": meminfo16G,
		"self/cgroup": "4:memory:/docker/abc\n2:cpu,cpuacct:/docker/abc\n1:name=systemd:/\n"})
	writeFiles(t, cg, map[string]string{
		"memory/memory.limit_in_bytes":             "9223372036854771712\n", // v1's "unlimited"
		"memory/docker/abc/memory.limit_in_bytes":  "2147483648\n",
		"cpu,cpuacct/docker/abc/cpu.cfs_quota_us":  "-1\n",
		"cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
	})
	c, err := detectCapacity(proc, cg, 4, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := int64(2048*mib) - DefaultHeadroom(2048*mib)
	if c.MemoryBytes != want || c.MilliCPUs != 4000 {
		t.Fatalf("capacity = %+v; want %d bytes and 4000 mCPU", c, want)
	}
}

func TestDetectCapacityNoCgroupLimit(t *testing.T) {
	proc, cg := t.TempDir(), t.TempDir()
	writeFiles(t, proc, map[string]string{"meminfo": meminfo16G})
	c, err := detectCapacity(proc, cg, 2, 1024*mib)
	if err != nil {
		t.Fatal(err)
	}
	if c.MemoryBytes != 15*1024*mib || c.MilliCPUs != 2000 {
		t.Fatalf("capacity = %+v", c)
	}
	if _, err := detectCapacity(t.TempDir(), cg, 2, 0); err == nil {
		t.Fatal("no meminfo: want an error, not a guess")
	}
}

func TestDefaultHeadroom(t *testing.T) {
	for _, c := range []struct{ total, want int64 }{
		{64 * 1024 * mib, 64 * 1024 * mib / 10},
		{1024 * mib, 256 * mib},
		{256 * mib, 128 * mib},
	} {
		if got := DefaultHeadroom(c.total); got != c.want {
			t.Errorf("DefaultHeadroom(%d MiB) = %d MiB; want %d MiB", c.total>>20, got>>20, c.want>>20)
		}
	}
}
