// Package netnsholder provides the network namespace holder of the
// function engine's prepared containers: a container that does nothing but
// stay up, started ahead, whose network namespace a prepared function
// container joins (NetworkMode container:ID), so that the daemon's start
// of the function container, on a cold call's path, does not make one.
// Making the namespace is most of a start on a bridge network.
//
// A function's image may have no program to hold with, and a node may
// reach no registry, so the holder's image is made here from nothing: a
// static ELF program of a few instructions that waits forever (Program),
// in a root filesystem of that one file (Rootfs), imported into the daemon
// under a tag carrying its content hash (Ensure). The pure parts are
// Program, Rootfs, Ref and ContainerConfig; Ensure is the one call to the
// daemon. Only package fnagent imports it.
package netnsholder

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"fmt"
)

// ErrUnsupportedArch is Program's error for an architecture it has no
// instructions for; the engine then prepares containers without a holder.
var ErrUnsupportedArch = fmt.Errorf("netnsholder: no holder program for this architecture")

// loadAddr is where the program's one segment is mapped: the conventional
// base of a static executable, above the kernel's mmap_min_addr.
const loadAddr = 0x400000

// ehdrSize and phdrSize are the sizes of an ELF64 file header and program
// header (elf.Header64, elf.Prog64), fixed by the format.
const (
	ehdrSize = 64
	phdrSize = 56
)

// code is each architecture's machine code: a loop around one system
// call that sleeps until a signal arrives. As PID 1 of its container the
// program gets only signals it handles (none) or SIGKILL, so the loop is
// belt and braces; the engine removes holders by force.
var code = map[string]struct {
	machine elf.Machine
	text    []byte
}{
	// pause(2) is x86-64's system call 34:
	//   mov eax, 34; syscall; jmp back to the mov (-9 bytes).
	"amd64": {elf.EM_X86_64, []byte{
		0xb8, 0x22, 0x00, 0x00, 0x00, // mov eax, 34
		0x0f, 0x05, // syscall
		0xeb, 0xf7, // jmp -9
	}},
	// arm64 has no pause(2); ppoll(NULL, 0, NULL, NULL) (system call 73)
	// sleeps the same way, forever and until a signal:
	//   mov x0..x3, #0; mov x8, #73; svc #0; b back to the first mov.
	"arm64": {elf.EM_AARCH64, words(
		0xd2800000, // mov x0, #0
		0xd2800001, // mov x1, #0
		0xd2800002, // mov x2, #0
		0xd2800003, // mov x3, #0
		0xd2800928, // mov x8, #73
		0xd4000001, // svc #0
		0x17fffffa, // b -6 instructions
	)},
}

// words is arm64 instructions in memory order (little-endian).
func words(ws ...uint32) []byte {
	b := make([]byte, 0, 4*len(ws))
	for _, w := range ws {
		b = binary.LittleEndian.AppendUint32(b, w)
	}
	return b
}

// Program is the holder's executable for goarch (runtime.GOARCH's
// spelling): a static little-endian ELF64 of an ELF header, one PT_LOAD
// program header mapping the whole file readable and executable, and the
// code, which starts right after the headers and is the entry point. It
// needs no libc, loader or file besides itself. The result is the same on
// every call. The error is ErrUnsupportedArch for anything but amd64 and
// arm64.
func Program(goarch string) ([]byte, error) {
	c, ok := code[goarch]
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrUnsupportedArch, goarch)
	}
	const headers = ehdrSize + phdrSize
	size := uint64(headers + len(c.text))
	var ident [elf.EI_NIDENT]byte
	copy(ident[:], elf.ELFMAG)
	ident[elf.EI_CLASS] = byte(elf.ELFCLASS64)
	ident[elf.EI_DATA] = byte(elf.ELFDATA2LSB)
	ident[elf.EI_VERSION] = byte(elf.EV_CURRENT)
	ident[elf.EI_OSABI] = byte(elf.ELFOSABI_NONE)
	header := elf.Header64{
		Ident:     ident,
		Type:      uint16(elf.ET_EXEC),
		Machine:   uint16(c.machine),
		Version:   uint32(elf.EV_CURRENT),
		Entry:     loadAddr + headers,
		Phoff:     ehdrSize,
		Ehsize:    ehdrSize,
		Phentsize: phdrSize,
		Phnum:     1,
	}
	prog := elf.Prog64{
		Type:   uint32(elf.PT_LOAD),
		Flags:  uint32(elf.PF_R | elf.PF_X),
		Off:    0,
		Vaddr:  loadAddr,
		Paddr:  loadAddr,
		Filesz: size,
		Memsz:  size,
		Align:  0x1000,
	}
	var b bytes.Buffer
	// Writes to a bytes.Buffer of fixed-size structs cannot fail.
	_ = binary.Write(&b, binary.LittleEndian, header)
	_ = binary.Write(&b, binary.LittleEndian, prog)
	b.Write(c.text)
	return b.Bytes(), nil
}
