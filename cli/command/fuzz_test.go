package command

import (
	"testing"
)

// FuzzParseSpan: a --since or --expires value is a duration of 0 or more,
// at most MaxSpan, or an error; never a panic, never a negative or
// wrapped-around duration.
func FuzzParseSpan(f *testing.F) {
	for _, s := range []string{"30d", "12h", "90m", "1.5d", "-1d", "-5h", "NaNd", "Infd", "1e300d", "d", "", "106751d", "2562047h"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseSpan(s)
		if err != nil {
			return
		}
		if d < 0 || d > MaxSpan {
			t.Fatalf("ParseSpan(%q) = %v, outside 0..%v", s, d, MaxSpan)
		}
	})
}
