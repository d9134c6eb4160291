// Package bytesize prints byte counts for people and reads the ones they
// write. It is the one formatter of sizes in the module: the scheduler's
// reasons ("need 64.0 MiB") and the CLI's tables and progress lines print
// the same number the same way; Parse reads the CLI's size flags.
// Any package in the module may import it; it imports nothing of the
// module's own.
package bytesize

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Format prints n in binary units with one decimal ("1.5 GiB"); counts
// under 1 KiB are printed whole ("512 B").
func Format(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// sizeUnits are the units Parse accepts, matched without regard to case:
// decimal (powers of 1000) and binary (powers of 1024), up to the exa
// units Format may print, so whatever Format prints Parse reads. Single letters such
// as "m" are refused on purpose: Docker reads "64m" as MiB and Kubernetes
// reads "64M" as MB, and a memory limit is no place to guess.
var sizeUnits = map[string]int64{
	"":    1,
	"b":   1,
	"kb":  1000,
	"mb":  1000 * 1000,
	"gb":  1000 * 1000 * 1000,
	"tb":  1000 * 1000 * 1000 * 1000,
	"pb":  1000 * 1000 * 1000 * 1000 * 1000,
	"eb":  1000 * 1000 * 1000 * 1000 * 1000 * 1000,
	"kib": 1 << 10,
	"mib": 1 << 20,
	"gib": 1 << 30,
	"tib": 1 << 40,
	"pib": 1 << 50,
	"eib": 1 << 60,
}

// Parse reads a byte count, the inverse of Format for people's input, such as "64MiB", "1.5GB", "512 KiB" or
// "1048576" (a plain number is bytes). The result is rounded to whole bytes.
// Negative numbers, unknown or ambiguous units, and values beyond int64 are
// errors whose message says what to write instead.
func Parse(s string) (int64, error) {
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
		return 0, fmt.Errorf("%q has an unknown unit %q; use B, KB, MB, GB, TB, PB, EB, KiB, MiB, GiB, TiB, PiB or EiB", s, t[i:])
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

// Value is a size flag (flag.Value): Set reads what Parse reads, String
// prints what Format prints, so a flag's default shows as people write it.
// A CLI whose flags take sizes needs no parsing of its own.
type Value int64

// Set implements flag.Value.
func (v *Value) Set(s string) error {
	n, err := Parse(s)
	if err != nil {
		return err
	}
	*v = Value(n)
	return nil
}

// String implements flag.Value; zero is "0", which help output takes for
// a flag without a default.
func (v *Value) String() string {
	if v == nil || *v == 0 {
		return "0"
	}
	return Format(int64(*v))
}
