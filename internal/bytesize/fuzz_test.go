package bytesize

import (
	"math"
	"strconv"
	"testing"
)

// FuzzParse: whatever a person types, Parse answers a size of 0 or more or
// an error, never a panic; a plain count of bytes reads as itself.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"64MiB", "1.5GB", "512 KiB", "1048576", "-1", "1.5", ".", "1..2MB", "64m", "9999999999 EiB", "1e9", " 7 b "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := Parse(s)
		if err != nil {
			if err.Error() == "" {
				t.Fatalf("Parse(%q): an empty error", s)
			}
			return
		}
		if n < 0 {
			t.Fatalf("Parse(%q) = %d, a negative size", s, n)
		}
		back, err := Parse(strconv.FormatInt(n, 10))
		if err != nil || back != n {
			t.Fatalf("Parse(%d) = %d, %v", n, back, err)
		}
	})
}

// FuzzFormat: whatever Format prints for a size, Parse reads back within
// the rounding of Format's one decimal.
func FuzzFormat(f *testing.F) {
	for _, n := range []int64{0, 1, 1023, 1024, 1536, 1 << 40, 1 << 50, 1 << 62, math.MaxInt64} {
		f.Add(n)
	}
	f.Fuzz(func(t *testing.T, n int64) {
		if n < 0 {
			n = -(n + 1)
		}
		s := Format(n)
		back, err := Parse(s)
		if err != nil {
			if n > math.MaxInt64/1024*1000 { // within rounding of the top: "8.0 EiB" is past int64
				return
			}
			t.Fatalf("Parse(Format(%d) = %q): %v", n, s, err)
		}
		if diff := math.Abs(float64(back) - float64(n)); diff > float64(n)*0.05+1 {
			t.Fatalf("Parse(Format(%d) = %q) = %d", n, s, back)
		}
	})
}
