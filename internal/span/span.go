// Package span parses the spans of time people write on a command line:
// days ("30d") as well as Go's units ("12h", "90m"). It is the CLI's
// parser, shared with the server's retention flags (package daemon).
package span

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Parse reads a span: a number of days with the suffix d, or a Go
// duration.
func Parse(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseFloat(days, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("%q is not a number of days", s)
		}
		return time.Duration(n * float64(24*time.Hour)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration (e.g. 30d, 12h, 90m)", s)
	}
	return d, nil
}

// Flag is a flag.Value of Parse's spans, stored in *D.
type Flag struct{ D *time.Duration }

func (f Flag) String() string {
	if f.D == nil {
		return ""
	}
	return f.D.String()
}

// Set parses s into *f.D.
func (f Flag) Set(s string) error {
	d, err := Parse(s)
	if err == nil {
		*f.D = d
	}
	return err
}
