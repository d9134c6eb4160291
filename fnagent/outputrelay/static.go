package outputrelay

import (
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// CheckStatic reports whether the executable at path is statically linked (an
// ELF file with no program interpreter), so it runs in an image with no C
// library, and says why not when it is not.
func CheckStatic(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return staticELF(f, path)
}

// errNotStatic is CheckStatic's error for an executable that needs a dynamic
// loader.
var errNotStatic = errors.New("is dynamically linked (build it with CGO_ENABLED=0)")

func staticELF(r io.ReaderAt, path string) error {
	info, err := elfInterp(r)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if info != "" {
		return fmt.Errorf("%s %w: it needs %s", path, errNotStatic, info)
	}
	return nil
}

// elfInterp returns the program interpreter an ELF executable names (its
// dynamic loader), "" for a static one.
func elfInterp(r io.ReaderAt) (string, error) {
	f, err := elf.NewFile(r)
	if err != nil {
		return "", fmt.Errorf("not an ELF executable: %w", err)
	}
	defer f.Close()
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return "", fmt.Errorf("an ELF file of type %v, not an executable", f.Type)
	}
	for _, prog := range f.Progs {
		if prog.Type != elf.PT_INTERP {
			continue
		}
		b := make([]byte, min(prog.Filesz, 4096))
		if _, err := prog.ReadAt(b, 0); err != nil && err != io.EOF {
			return "", fmt.Errorf("read its interpreter: %w", err)
		}
		return strings.TrimRight(string(b), "\x00"), nil
	}
	return "", nil
}
