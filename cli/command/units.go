package command

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// FormatDuration rounds d for people: tenths of a second under a minute,
// whole seconds under an hour, whole minutes above ("1.2s", "4m5s", "24h0m").
func FormatDuration(d time.Duration) string {
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

// FormatTime prints t for a table, "-" when it is unset.
func FormatTime(t *time.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	return t.Format(timeLayout)
}

// FormatExit prints an exit code for a table, "-" when there is none.
func FormatExit(code *int) string {
	if code == nil {
		return "-"
	}
	return strconv.Itoa(*code)
}

// OrDash prints "-" for an empty table cell.
func OrDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// MaxSpan is the longest span ParseSpan accepts: 100 years, far beyond
// any expiry or look-back a person means, and far inside time.Duration's
// 292 years, so no span wraps around.
const MaxSpan = 100 * 365 * 24 * time.Hour

// ParseSpan reads a duration that may count days ("30d") as well as
// Go's units ("12h", "90m"). Negative spans and spans over MaxSpan are
// errors.
func ParseSpan(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseFloat(days, 64)
		if err != nil || !(n >= 0) || n > float64(MaxSpan/(24*time.Hour)) {
			return 0, fmt.Errorf("%q is not a number of days from 0 to %d", s, MaxSpan/(24*time.Hour))
		}
		return time.Duration(n * float64(24*time.Hour)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration (e.g. 30d, 12h, 90m)", s)
	}
	if d < 0 || d > MaxSpan {
		return 0, fmt.Errorf("%q is outside 0 to %dd", s, MaxSpan/(24*time.Hour))
	}
	return d, nil
}

// SpanFlag is a flag.Value that sets *d to a ParseSpan duration.
func SpanFlag(d *time.Duration) flag.Value { return spanFlag{d} }

type spanFlag struct{ d *time.Duration }

func (f spanFlag) String() string {
	if f.d == nil {
		return ""
	}
	return f.d.String()
}

func (f spanFlag) Set(s string) error {
	d, err := ParseSpan(s)
	if err == nil {
		*f.d = d
	}
	return err
}
