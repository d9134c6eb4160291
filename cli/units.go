package cli

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// sizeUnits are the units parseSize accepts, matched without regard to case:
// decimal (powers of 1000) and binary (powers of 1024). Single letters such
// as "m" are refused on purpose: Docker reads "64m" as MiB and Kubernetes
// reads "64M" as MB, and a memory limit is no place to guess.
var sizeUnits = map[string]int64{
	"":    1,
	"b":   1,
	"kb":  1000,
	"mb":  1000 * 1000,
	"gb":  1000 * 1000 * 1000,
	"tb":  1000 * 1000 * 1000 * 1000,
	"kib": 1 << 10,
	"mib": 1 << 20,
	"gib": 1 << 30,
	"tib": 1 << 40,
}

// parseSize reads a byte count such as "64MiB", "1.5GB", "512 KiB" or
// "1048576" (a plain number is bytes). The result is rounded to whole bytes.
// Negative numbers, unknown or ambiguous units, and values beyond int64 are
// errors whose message says what to write instead.
func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.') {
		i++
	}
	num, unit := t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	if strings.HasPrefix(t, "-") {
		return 0, fmt.Errorf("%q is negative; a size is 0 or more", s)
	}
	if num == "" {
		return 0, fmt.Errorf("%q is not a size; write a number with a unit, like 512MiB or 2GB", s)
	}
	mult, ok := sizeUnits[unit]
	if !ok {
		switch unit {
		case "k", "m", "g", "t":
			u := strings.ToUpper(unit)
			return 0, fmt.Errorf("%q has an ambiguous unit %q: write %siB (powers of 1024) or %sB (powers of 1000)", s, t[i:], u, u)
		}
		return 0, fmt.Errorf("%q has an unknown unit %q; use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB", s, t[i:])
	}
	v, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a size; write a number with a unit, like 512MiB or 2GB", s)
	}
	bytes := math.Round(v * float64(mult))
	if bytes >= math.MaxInt64 {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return int64(bytes), nil
}

// formatDuration rounds d for people: tenths of a second under a minute,
// whole seconds under an hour, whole minutes above ("1.2s", "4m5s", "24h0m").
func formatDuration(d time.Duration) string {
	switch a := d.Abs(); {
	case a < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	case a < time.Hour:
		return d.Round(time.Second).String()
	default:
		return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
	}
}

// timeLayout is how times are printed in tables: RFC 3339 with
// milliseconds, because attempt moments come from the container daemon and
// sub-second order matters when reading them.
const timeLayout = "2006-01-02T15:04:05.000Z07:00"

func formatTime(t *time.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	return t.Format(timeLayout)
}

func formatExit(code *int) string {
	if code == nil {
		return "-"
	}
	return strconv.Itoa(*code)
}

// orDash prints "-" for an empty table cell.
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
