package daemon

import (
	"flag"
	"fmt"
	"time"

	"github.com/mercator/mercator/controlplane"
	"github.com/mercator/mercator/controlplane/artifact"
	"github.com/mercator/mercator/internal/bytesize"
)

// RetentionFlags adds the flags of `mercator server` that say how long
// what the control plane stores is kept and what it caps
// (docs/hardening.md, "Retention") to fs, and returns the configuration
// they fill as fs is parsed; RunServer checks it. span parses a span of
// time as the rest of the command line does ("30d", "12h").
func RetentionFlags(fs *flag.FlagSet, span func(string) (time.Duration, error)) *controlplane.RetentionConfig {
	c := new(controlplane.RetentionConfig)
	*c = c.WithDefaults()
	c.MaxUploadSize = artifact.DefaultMaxUploadSize
	spanFlag := func(name, usage string, p *time.Duration, forever bool) {
		fs.Func(name, fmt.Sprintf("%s (default %dd)", usage, *p/(24*time.Hour)), func(s string) error {
			if forever && s == "forever" {
				*p = -1
				return nil
			}
			d, err := span(s)
			if err = positive(err, d > 0, s); err == nil {
				*p = d
			}
			return err
		})
	}
	spanFlag("retain", "how long finished runs (with their logs), done operations and durable calls are kept, e.g. 30d, or forever", &c.Runs, true)
	spanFlag("audit-retention", "how long audit entries are kept, e.g. 30d (the log also keeps at most 1,000,000)", &c.Audit, false)
	fs.DurationVar(&c.SweepEvery, "sweep-every", c.SweepEvery, "how often the retention sweep runs (on the leader; staged uploads on every replica)")
	size := func(name string, p *int64, usage string) {
		fs.Func(name, usage+" (default "+bytesize.Format(*p)+")", func(s string) error {
			var v bytesize.Value
			err := v.Set(s)
			if err = positive(err, v > 0, s); err == nil {
				*p = int64(v)
			}
			return err
		})
	}
	size("log-limit", &c.DefaultLogLimit, "an attempt's log cap when its run sets no log_limit_bytes: output past it is dropped and the log says so")
	size("max-log-limit", &c.MaxLogLimit, "the largest log_limit_bytes a run may set")
	size("max-upload-size", &c.MaxUploadSize, "the largest Artifact upload a client may declare; larger ones are refused with 413")
	return c
}

// positive is err, or, when the value parsed but is not ok, an error
// saying a positive one is wanted.
func positive(err error, ok bool, s string) error {
	if err == nil && !ok {
		err = fmt.Errorf("%q: want a positive value", s)
	}
	return err
}

// check refuses options RunServer cannot start with: no data directory,
// or a default log cap above the maximum, which would refuse every run
// that sets none.
func (o ServerOptions) check() error {
	c := o.Config.Retention
	switch {
	case o.DataDir == "":
		return fmt.Errorf("a data directory is required (--data-dir)")
	case c.MaxLogLimit > 0 && c.DefaultLogLimit > c.MaxLogLimit:
		return fmt.Errorf("--log-limit (%s) is above --max-log-limit (%s)", bytesize.Format(c.DefaultLogLimit), bytesize.Format(c.MaxLogLimit))
	}
	return nil
}
