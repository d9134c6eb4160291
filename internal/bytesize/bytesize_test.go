package bytesize

import (
	"math"
	"strings"
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

func TestParseSize(t *testing.T) {
	good := map[string]int64{
		"0":         0,
		"1048576":   1048576,
		"512B":      512,
		"64MiB":     64 << 20,
		"64mib":     64 << 20,
		"1.5GiB":    3 << 29,
		"1.5GB":     1_500_000_000,
		"512 KiB":   512 << 10,
		"2KB":       2000,
		"1TiB":      1 << 40,
		"3TB":       3_000_000_000_000,
		" 10 MB ":   10_000_000,
		"0.5KiB":    512,
		"100.0 GiB": 100 << 30,
	}
	for in, want := range good {
		got, err := Parse(in)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	bad := map[string]string{
		"":               "not a size",
		"-1":             "negative",
		"-64MiB":         "negative",
		"abc":            "not a size",
		"12XB":           "unknown unit",
		"64m":            "ambiguous",
		"64M":            "ambiguous",
		"1.2.3MB":        "not a size",
		"1e9":            "unknown unit",
		"99999999999TiB": "too large",
		"MiB":            "not a size",
	}
	for in, want := range bad {
		_, err := Parse(in)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Parse(%q) err = %v, want it to say %q", in, err, want)
		}
	}
}

func TestValue(t *testing.T) {
	var v Value
	if v.String() != "0" {
		t.Errorf("zero Value prints %q, want 0", v.String())
	}
	if err := v.Set("64MiB"); err != nil || v != 64<<20 || v.String() != "64.0 MiB" {
		t.Errorf("Set(64MiB) = %v, %d %q", err, v, v.String())
	}
	if err := v.Set("-1"); err == nil || v != 64<<20 {
		t.Errorf("Set(-1) = %v, left %d; want an error and the value unchanged", err, v)
	}
}
