package hostfacts

import (
	"os"
	"path/filepath"
	"testing"
)

func TestReadCgroupLimits(t *testing.T) {
	write := func(t *testing.T, path, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("v2", func(t *testing.T) {
		proc, cg := t.TempDir(), t.TempDir()
		write(t, filepath.Join(proc, "self", "cgroup"), "0::/system.slice/agent.service\n")
		write(t, filepath.Join(cg, "cgroup.controllers"), "cpu memory\n")
		write(t, filepath.Join(cg, "system.slice", "cpu.max"), "300000 100000\n")
		write(t, filepath.Join(cg, "system.slice", "memory.max"), "max\n")
		write(t, filepath.Join(cg, "system.slice", "agent.service", "cpu.max"), "max 100000\n")
		write(t, filepath.Join(cg, "system.slice", "agent.service", "memory.max"), "1073741824\n")
		got := CgroupLimits(proc, cg)
		if got.CPUs != 3 || got.MemoryBytes != 1<<30 {
			t.Errorf("limits = %+v, want 3 CPUs from the parent's quota and 1GiB from the leaf", got)
		}
	})
	t.Run("v1 namespaced", func(t *testing.T) {
		// Inside a container without a cgroup namespace the path names the
		// host's hierarchy, but the container's own cgroup is mounted at
		// the root.
		proc, cg := t.TempDir(), t.TempDir()
		write(t, filepath.Join(proc, "self", "cgroup"), "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n")
		write(t, filepath.Join(cg, "cpu,cpuacct", "cpu.cfs_quota_us"), "150000\n")
		write(t, filepath.Join(cg, "cpu,cpuacct", "cpu.cfs_period_us"), "100000\n")
		write(t, filepath.Join(cg, "memory", "memory.limit_in_bytes"), "536870912\n")
		got := CgroupLimits(proc, cg)
		if got.CPUs != 1.5 || got.MemoryBytes != 512<<20 {
			t.Errorf("limits = %+v, want 1.5 CPUs and 512MiB", got)
		}
	})
	t.Run("v1 unlimited", func(t *testing.T) {
		proc, cg := t.TempDir(), t.TempDir()
		write(t, filepath.Join(proc, "self", "cgroup"), "4:memory:/\n1:cpu:/\n")
		write(t, filepath.Join(cg, "cpu", "cpu.cfs_quota_us"), "-1\n")
		write(t, filepath.Join(cg, "cpu", "cpu.cfs_period_us"), "100000\n")
		write(t, filepath.Join(cg, "memory", "memory.limit_in_bytes"), "9223372036854771712\n")
		got := CgroupLimits(proc, cg)
		if got.CPUs != 0 || got.MemoryBytes != 9223372036854771712 {
			t.Errorf("limits = %+v, want no CPU quota and the kernel's no-limit figure, which MemTotal then undercuts", got)
		}
	})
}

func TestMemTotal(t *testing.T) {
	p := filepath.Join(t.TempDir(), "meminfo")
	os.WriteFile(p, []byte("MemTotal:       24576000 kB\nMemFree: 1 kB\n"), 0o644)
	if n, err := MemTotal(p); err != nil || n != 24576000*1024 {
		t.Fatalf("MemTotal = %d, %v", n, err)
	}
	os.WriteFile(p, []byte("MemFree: 1 kB\n"), 0o644)
	if _, err := MemTotal(p); err == nil {
		t.Fatal("no MemTotal line accepted")
	}
}
