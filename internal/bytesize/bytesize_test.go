package bytesize

import (
	"math"
	"testing"
)

func TestFormat(t *testing.T) {
	for n, want := range map[int64]string{
		0:             "0 B",
		1023:          "1023 B",
		1024:          "1.0 KiB",
		1536:          "1.5 KiB",
		64 << 20:      "64.0 MiB",
		3 << 29:       "1.5 GiB",
		1 << 40:       "1.0 TiB",
		1 << 50:       "1.0 PiB",
		math.MaxInt64: "8.0 EiB",
	} {
		if got := Format(n); got != want {
			t.Errorf("Format(%d) = %q, want %q", n, got, want)
		}
	}
}
