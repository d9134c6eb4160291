package command

import (
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
