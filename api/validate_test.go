package api

import (
	"errors"
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/mercator/mercator/failure"
)

// validSpec returns a spec that passes Validate; each case changes one
// thing.
func validSpec() RunSpec {
	return RunSpec{
		Image:          "127.0.0.1:5000/hello:1",
		Command:        []string{"/hello", "world"},
		Env:            map[string]string{"A_1": "x"},
		Secrets:        map[string]string{"TOKEN": "s3cr3t"},
		CPU:            0.5,
		MemoryBytes:    64 << 20,
		TimeoutSeconds: 60,
		Retries:        2,
		GPUs:           1,
		GPUModel:       "H100",
		GPUMemoryBytes: 80 << 30,
		Artifacts: []ArtifactMount{
			{Name: "data", Version: "v3", MountPath: "/data"},
			{Name: "w", MountPath: "/models/w.bin", MinReadBytesPerSecond: 5e8, SHA256: strings.Repeat("a", 64)},
		},
	}
}

func TestRunSpecValidate(t *testing.T) {
	cases := []struct {
		name   string
		change func(*RunSpec)
		field  string // "" when the spec is valid
		says   string
	}{
		{"valid", func(*RunSpec) {}, "", ""},
		{"no limits", func(s *RunSpec) { *s = RunSpec{Image: "x", Command: []string{"true"}} }, "", ""},
		{"image with spaces", func(s *RunSpec) { s.Image = " x " }, "", ""},
		{"never replace", func(s *RunSpec) { s.ReplaceAfterSeconds = -1 }, "", ""},
		{"no image", func(s *RunSpec) { s.Image = "" }, "image", "is required, for example"},
		{"blank image", func(s *RunSpec) { s.Image = " \t" }, "image", "is required"},
		{"no command", func(s *RunSpec) { s.Command = nil }, "command", "is required: the program to run"},
		{"empty program", func(s *RunSpec) { s.Command = []string{"", "x"} }, "command", "first element"},
		{"many args", func(s *RunSpec) { s.Command = make([]string, MaxRunArgs+1) }, "command", "at most 4096"},
		{"NUL in arg", func(s *RunSpec) { s.Command = []string{"a", "b\x00"} }, "command", "NUL"},
		{"huge command", func(s *RunSpec) { s.Command = []string{strings.Repeat("a", MaxRunStringBytes+1)} }, "command", "total"},
		{"negative cpu", func(s *RunSpec) { s.CPU = -1 }, "cpu", "from 0 (the node's default) to 1024"},
		{"NaN cpu", func(s *RunSpec) { s.CPU = math.NaN() }, "cpu", "number of cores"},
		{"infinite cpu", func(s *RunSpec) { s.CPU = math.Inf(1) }, "cpu", "number of cores"},
		{"too much cpu", func(s *RunSpec) { s.CPU = MaxRunCPU + 1 }, "cpu", "number of cores"},
		{"negative memory", func(s *RunSpec) { s.MemoryBytes = -1 }, "memory_bytes", "from 0"},
		{"tiny memory", func(s *RunSpec) { s.MemoryBytes = 1 << 20 }, "memory_bytes", "at least 6 MiB"},
		{"vast memory", func(s *RunSpec) { s.MemoryBytes = MaxRunMemory + 1 }, "memory_bytes", "from 0"},
		{"negative timeout", func(s *RunSpec) { s.TimeoutSeconds = -1 }, "timeout_seconds", "30 days"},
		{"long timeout", func(s *RunSpec) { s.TimeoutSeconds = MaxRunTimeout + 1 }, "timeout_seconds", "30 days"},
		{"negative retries", func(s *RunSpec) { s.Retries = -1 }, "retries", "from 0 to 100"},
		{"many retries", func(s *RunSpec) { s.Retries = MaxRunRetries + 1 }, "retries", "from 0 to 100"},
		{"negative gpus", func(s *RunSpec) { s.GPUs = -1 }, "gpus", "from 0 to 64"},
		{"many gpus", func(s *RunSpec) { s.GPUs = MaxRunGPUs + 1 }, "gpus", "from 0 to 64"},
		{"model without gpus", func(s *RunSpec) { s.GPUs = 0; s.GPUMemoryBytes = 0 }, "gpus", "need gpus of 1 or more"},
		{"negative gpu memory", func(s *RunSpec) { s.GPUMemoryBytes = -1 }, "gpu_memory_bytes", "from 0 (any)"},
		{"two-line model", func(s *RunSpec) { s.GPUModel = "H\n100" }, "gpu_model", "one line"},
		{"late replace", func(s *RunSpec) { s.ReplaceAfterSeconds = MaxRunTimeout + 1 }, "replace_after_seconds", "at most"},
		{"bad env name", func(s *RunSpec) { s.Env = map[string]string{"1X": ""} }, "env", `"1X" is not a valid variable name`},
		{"NUL in env", func(s *RunSpec) { s.Env = map[string]string{"X": "\x00"} }, "env", "NUL"},
		{"a user, read-only, no network, more processes", func(s *RunSpec) {
			s.User, s.ReadOnlyRootfs, s.Network, s.PidsLimit = "1000:1000", true, NetworkNone, 100000
		}, "", ""},
		{"a user by name", func(s *RunSpec) { s.User = "nobody" }, "", ""},
		{"user as an option", func(s *RunSpec) { s.User = "-0" }, "user", "is not a user"},
		{"user with a path", func(s *RunSpec) { s.User = "../root" }, "user", "is not a user"},
		{"user with two colons", func(s *RunSpec) { s.User = "1:2:3" }, "user", "such as 1000"},
		{"host network", func(s *RunSpec) { s.Network = "host" }, "network", "only a gang's members"},
		{"host network for a gang", func(s *RunSpec) { s.Network, s.Nodes = NetworkHost, 2 }, "", ""},
		{"a gang of 64 on a port", func(s *RunSpec) { s.Nodes, s.MasterPort = MaxRunNodes, 23456 }, "", ""},
		{"negative nodes", func(s *RunSpec) { s.Nodes = -1 }, "nodes", "from 1 to 64"},
		{"vast gang", func(s *RunSpec) { s.Nodes = MaxRunNodes + 1 }, "nodes", "from 1 to 64"},
		{"port out of range", func(s *RunSpec) { s.Nodes, s.MasterPort = 2, 70000 }, "master_port", "from 1 to 65535"},
		{"port without a gang", func(s *RunSpec) { s.MasterPort = 29501 }, "master_port", "nodes to 2 or more"},
		{"another container's network", func(s *RunSpec) { s.Network = "container:abc" }, "network", "not a network a run may ask for"},
		{"a named network", func(s *RunSpec) { s.Network = "bridge" }, "network", "use \"none\""},
		{"negative pids", func(s *RunSpec) { s.PidsLimit = -1 }, "pids_limit", "from 0 (the node's limit)"},
		{"vast pids", func(s *RunSpec) { s.PidsLimit = MaxRunPidsLimit + 1 }, "pids_limit", "from 0"},
		{"relative mount", func(s *RunSpec) { s.Artifacts[0].MountPath = "data" }, "artifacts[0].mount_path", "absolute"},
		{"mount at /", func(s *RunSpec) { s.Artifacts[0].MountPath = "/" }, "artifacts[0].mount_path", "must not be /"},
		{"dot-dot mount", func(s *RunSpec) { s.Artifacts[0].MountPath = "/a/../etc" }, "artifacts[0].mount_path", ".."},
		{"unclean mount", func(s *RunSpec) { s.Artifacts[0].MountPath = "/a//b" }, "artifacts[0].mount_path", `write "/a/b"`},
		{"no mount path", func(s *RunSpec) { s.Artifacts[0].MountPath = "" }, "artifacts[0].mount_path", "is required"},
		{"colon in mount", func(s *RunSpec) { s.Artifacts[0].MountPath = "/a:b" }, "artifacts[0].mount_path", "':'"},
		{"same mount twice", func(s *RunSpec) { s.Artifacts[1].MountPath = "/data" }, "artifacts[1].mount_path", "also the mount path of data"},
		{"bad artifact name", func(s *RunSpec) { s.Artifacts[1].Name = "a@b" }, "artifacts[1].name", "not an artifact name"},
		{"bad version", func(s *RunSpec) { s.Artifacts[0].Version = "3" }, "artifacts[0].version", "v1, v2"},
		{"negative floor", func(s *RunSpec) { s.Artifacts[1].MinReadBytesPerSecond = -1 }, "artifacts[1].min_read_bytes_per_second", "0 (no floor)"},
		{"short digest", func(s *RunSpec) { s.Artifacts[1].SHA256 = "abc" }, "artifacts[1].sha256", "SHA-256"},
		{"many artifacts", func(s *RunSpec) { s.Artifacts = make([]ArtifactMount, MaxRunArtifacts+1) }, "artifacts", "at most 64"},
		{"bad secret name", func(s *RunSpec) { s.Secrets = map[string]string{"A-B": "x"} }, "secrets", `"A-B" is not a valid variable name`},
		{"secret also in env", func(s *RunSpec) { s.Secrets = map[string]string{"A_1": "x"} }, "secrets.A_1", "also set in env"},
		{"redacted secret", func(s *RunSpec) { s.Secrets["TOKEN"] = SecretRedacted }, "secrets.TOKEN", "what a read shows"},
		{"NUL in secret", func(s *RunSpec) { s.Secrets["TOKEN"] = "a\x00b" }, "secrets.TOKEN", "NUL"},
		{"binary secret", func(s *RunSpec) { s.Secrets["TOKEN"] = "\xff\xfe" }, "secrets.TOKEN", "UTF-8"},
		{"large secret", func(s *RunSpec) { s.Secrets["TOKEN"] = strings.Repeat("k", MaxRunSecretBytes+1) }, "secrets.TOKEN", "at most 32768"},
		{"largest secret", func(s *RunSpec) { s.Secrets["TOKEN"] = strings.Repeat("k", MaxRunSecretBytes) }, "", ""},
		{"empty secret", func(s *RunSpec) { s.Secrets["TOKEN"] = "" }, "", ""},
		{"many secrets", func(s *RunSpec) { s.Secrets = manySecrets(MaxRunSecrets + 1) }, "secrets", "at most 64"},
		{"secrets count in the total", func(s *RunSpec) {
			s.Secrets = manySecrets(5)
			for k := range s.Secrets {
				s.Secrets[k] = strings.Repeat("k", MaxRunSecretBytes)
			}
		}, "command", "command, environment and secrets total"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			spec := validSpec()
			tc.change(&spec)
			before := validSpec()
			tc.change(&before)
			err := spec.Validate()
			if !reflect.DeepEqual(spec, before) && !math.IsNaN(spec.CPU) {
				t.Errorf("Validate changed its input: %+v, was %+v", spec, before)
			}
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			var fe *failure.Error
			if !errors.As(err, &fe) || !errors.Is(err, failure.ErrInvalid) {
				t.Fatalf("Validate() = %v, want a failure.ErrInvalid", err)
			}
			if fe.Field != tc.field || !strings.Contains(fe.Message, tc.says) {
				t.Errorf("Validate() = %q (field %q), want field %q saying %q", err, fe.Field, tc.field, tc.says)
			}
		})
	}
}

// manySecrets returns n secrets S0…S(n-1), each with a short value.
func manySecrets(n int) map[string]string {
	m := map[string]string{}
	for i := range n {
		m["S"+strconv.Itoa(i)] = "v"
	}
	return m
}

// TestRunSpecValidateNeverShowsASecret: whatever is wrong with a secret,
// the error names it and never repeats its value.
func TestRunSpecValidateNeverShowsASecret(t *testing.T) {
	const value = "hunter2-\x00-" + "value-that-must-not-appear"
	for _, secrets := range []map[string]string{
		{"TOKEN": value},
		{"TOKEN": value + strings.Repeat("x", MaxRunSecretBytes)},
		{"A_1": value},
	} {
		spec := validSpec()
		spec.Secrets = secrets
		err := spec.Validate()
		if err == nil {
			t.Fatalf("Validate() = nil for %d bytes of secret with a NUL", len(value))
		}
		if strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "must-not-appear") {
			t.Errorf("Validate() = %q shows the secret's value", err)
		}
	}
}

func TestRunSpecNormalized(t *testing.T) {
	spec := validSpec()
	spec.Image = "  127.0.0.1:5000/hello:1\n"
	n := spec.Normalized()
	if n.Image != "127.0.0.1:5000/hello:1" {
		t.Errorf("Normalized().Image = %q", n.Image)
	}
	if spec.Image != "  127.0.0.1:5000/hello:1\n" {
		t.Errorf("Normalized changed its input's image to %q", spec.Image)
	}
	n.Image = spec.Image
	if !reflect.DeepEqual(n, spec) {
		t.Errorf("Normalized changed more than the image: %+v", n)
	}
}
