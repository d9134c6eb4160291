package netnsholder

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/docker/docker/api/types/container"

	"github.com/mercator/mercator/dockerengine"
)

// TestProgram parses each architecture's program back with debug/elf: a
// static executable of the right machine whose one loadable segment maps
// the whole file readable and executable, starting at the entry point with
// the machine code, and nothing else (no interpreter, no dynamic section).
func TestProgram(t *testing.T) {
	for _, tc := range []struct {
		arch    string
		machine elf.Machine
		text    []byte
	}{
		{"amd64", elf.EM_X86_64, []byte{0xb8, 34, 0, 0, 0, 0x0f, 0x05, 0xeb, 0xf7}},
		{"arm64", elf.EM_AARCH64, []byte{
			0x00, 0x00, 0x80, 0xd2, 0x01, 0x00, 0x80, 0xd2, 0x02, 0x00, 0x80, 0xd2, 0x03, 0x00, 0x80, 0xd2,
			0x28, 0x09, 0x80, 0xd2, 0x01, 0x00, 0x00, 0xd4, 0xfa, 0xff, 0xff, 0x17}},
	} {
		t.Run(tc.arch, func(t *testing.T) {
			program, err := Program(tc.arch)
			if err != nil {
				t.Fatal(err)
			}
			f, err := elf.NewFile(bytes.NewReader(program))
			if err != nil {
				t.Fatalf("debug/elf cannot read it: %v", err)
			}
			if f.Class != elf.ELFCLASS64 || f.Data != elf.ELFDATA2LSB || f.Machine != tc.machine || f.Type != elf.ET_EXEC || f.OSABI != elf.ELFOSABI_NONE {
				t.Errorf("header %+v; want a little-endian 64-bit executable for %v", f.FileHeader, tc.machine)
			}
			if len(f.Progs) != 1 {
				t.Fatalf("%d program headers; want one", len(f.Progs))
			}
			p := f.Progs[0]
			if p.Type != elf.PT_LOAD || p.Flags != elf.PF_R|elf.PF_X || p.Off != 0 || p.Filesz != uint64(len(program)) || p.Memsz != p.Filesz ||
				p.Vaddr%p.Align != 0 || p.Align != 0x1000 {
				t.Errorf("segment %+v; want the whole %d-byte file loaded read+execute at a page boundary", p.ProgHeader, len(program))
			}
			if f.Entry < p.Vaddr || f.Entry >= p.Vaddr+p.Memsz {
				t.Fatalf("entry %#x outside the segment %#x+%d", f.Entry, p.Vaddr, p.Memsz)
			}
			at := f.Entry - p.Vaddr
			if got := program[at:]; !bytes.Equal(got, tc.text) {
				t.Errorf("code at the entry point % x; want % x", got, tc.text)
			}
			if len(f.Sections) != 0 {
				t.Errorf("sections %v: want none (a static program with no loader)", f.Sections)
			}
			again, _ := Program(tc.arch)
			if !bytes.Equal(again, program) {
				t.Error("two calls differ")
			}
		})
	}
	if _, err := Program("riscv64"); !errors.Is(err, ErrUnsupportedArch) {
		t.Errorf("riscv64: err %v; want ErrUnsupportedArch", err)
	}
}

// TestRootfsAndRef: the root filesystem is one executable file, /hold,
// the program itself, with no timestamp or owner of this machine; the
// reference is stable for a program and differs for another.
func TestRootfsAndRef(t *testing.T) {
	amd, _ := Program("amd64")
	arm, _ := Program("arm64")
	rootfs := Rootfs(amd)
	r := tar.NewReader(bytes.NewReader(rootfs))
	h, err := r.Next()
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(r)
	if h.Name != "hold" || h.Typeflag != tar.TypeReg || h.Mode != 0o555 || h.Uid != 0 || h.Gid != 0 || h.ModTime.Unix() != 0 || !bytes.Equal(body, amd) {
		t.Errorf("entry %+v with %d bytes; want hold, 0555, root's, the program", h, len(body))
	}
	if _, err := r.Next(); err != io.EOF {
		t.Errorf("a second entry: %v", err)
	}
	ref := Ref(rootfs)
	if !strings.HasPrefix(ref, Repository+":") || len(ref) != len(Repository)+1+12 {
		t.Errorf("ref %q; want %s:<12 hex digits>", ref, Repository)
	}
	if Ref(Rootfs(amd)) != ref || Ref(Rootfs(arm)) == ref {
		t.Error("the reference is not a function of the content")
	}
}

func TestJoinable(t *testing.T) {
	for network, want := range map[string]bool{
		"": true, "bridge": true, "default": true, "fns": true,
		"host": false, "none": false, "container:abc": false,
	} {
		if got := Joinable(network); got != want {
			t.Errorf("Joinable(%q) = %v; want %v", network, got, want)
		}
	}
	if NetworkMode("h1") != "container:h1" {
		t.Errorf("NetworkMode = %q", NetworkMode("h1"))
	}
}

// TestContainerConfig: the holder is on the engine's network, labelled,
// read-only, unprivileged, and held to the node's containment with its own
// tiny memory and process limits.
func TestContainerConfig(t *testing.T) {
	contain := dockerengine.Containment{DefaultCPU: 1, DefaultMemoryBytes: 2 << 30, PidsLimit: 321, MaxPidsLimit: 1000, LogMaxBytes: 1 << 20}
	labels := map[string]string{dockerengine.LabelHolder: "mercator-fn-f-1", dockerengine.LabelNode: "n1"}
	config, host := ContainerConfig("mercator/netns-holder:abc", "fns", contain, labels)
	if config.Image != "mercator/netns-holder:abc" || !reflect.DeepEqual(config.Labels, labels) || config.User != "65534:65534" {
		t.Errorf("config %+v", config)
	}
	if host.NetworkMode != container.NetworkMode("fns") || !host.ReadonlyRootfs || host.LogConfig.Type != "none" ||
		host.Memory != MemoryBytes || host.MemorySwap != MemoryBytes {
		t.Errorf("host config %+v; want network fns, read-only, no log driver, %d bytes of memory and swap", host, MemoryBytes)
	}
	if host.Privileged || !reflect.DeepEqual([]string(host.CapDrop), dockerengine.DroppedCapabilities) ||
		!reflect.DeepEqual(host.SecurityOpt, []string{dockerengine.NoNewPrivileges}) || host.PidsLimit == nil || *host.PidsLimit != PidsLimit {
		t.Errorf("Privileged %v, CapDrop %v, SecurityOpt %v, PidsLimit %v; want the containment with %d processes",
			host.Privileged, host.CapDrop, host.SecurityOpt, host.PidsLimit, PidsLimit)
	}
}
