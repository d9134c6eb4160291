package cli

import (
	"testing"
	"time"
)

// FuzzParseSpan: a --since or --expires value is a duration of 0 or more,
// at most maxSpan, or an error; never a panic, never a negative or
// wrapped-around duration.
func FuzzParseSpan(f *testing.F) {
	for _, s := range []string{"30d", "12h", "90m", "1.5d", "-1d", "-5h", "NaNd", "Infd", "1e300d", "d", "", "106751d", "2562047h"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := parseSpan(s)
		if err != nil {
			return
		}
		if d < 0 || d > maxSpan {
			t.Fatalf("parseSpan(%q) = %v, outside 0..%v", s, d, maxSpan)
		}
	})
}

// FuzzParseSeconds: Fn's --timeout and --idle-timeout are whole seconds
// from 0 up, or an error; never a negative or wrapped-around count.
func FuzzParseSeconds(f *testing.F) {
	for _, s := range []string{"30", "30s", "2m", "-5", "-5s", "99999999999", "99999999999s", "1.5s", "0.1ns", "NaN"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := parseSeconds(s)
		if err != nil {
			return
		}
		if n < 0 {
			t.Fatalf("parseSeconds(%q) = %d, negative", s, n)
		}
		if time.Duration(n)*time.Second < 0 {
			t.Fatalf("parseSeconds(%q) = %d overflows a duration", s, n)
		}
	})
}
