package cputime

import (
	"crypto/sha256"
	"os"
	"testing"
)

// TestSamplesGrowWithWork: hashing for a while shows up in this process's
// time, in the same process read through /proc, and in the machine's.
func TestSamplesGrowWithWork(t *testing.T) {
	before := Take(os.Getpid(), nil)
	buf := make([]byte, 1<<20)
	for i := 0; i < 2000; i++ {
		sha256.Sum256(buf)
	}
	d := Take(os.Getpid(), nil).Minus(before)
	if d.Self <= 0 || d.Process <= 0 || d.Machine <= 0 {
		t.Fatalf("after 2 GB of hashing: %+v; want self, process and machine time", d)
	}
	if d.Containers != 0 {
		t.Errorf("containers %v with no container asked for", d.Containers)
	}
	if per := d.Per(2); per.Self != d.Self/2 {
		t.Errorf("Per(2).Self = %v; want %v", per.Self, d.Self/2)
	}
}
