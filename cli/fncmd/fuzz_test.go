package fncmd

import (
	"testing"
	"time"
)

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
