package agentupgrade

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/mercator/mercator/pki"
)

// recordName is the pending upgrade's file in the agent's state directory.
// It is apart from the agent's bbolt state on purpose: the upgrade
// touches nothing the new binary resumes from.
const recordName = "upgrade.json"

// Record is an upgrade in progress, written before the exec and read by
// whichever binary starts next.
type Record struct {
	OperationID string `json:"operation_id"`
	From        string `json:"from"`
	To          string `json:"to"`
	// Binary is the path that was replaced; Prev holds what it was.
	Binary   string    `json:"binary"`
	Prev     string    `json:"prev"`
	Deadline time.Time `json:"deadline"`
	// Starts counts the new binary's starts: one more than maxStarts and
	// it is rolled back (it keeps crashing under a service manager).
	Starts int `json:"starts"`
	// Failed is set when the previous binary was restored: why. The
	// restored agent answers the redelivered command with it.
	Failed string `json:"failed,omitempty"`
}

// Decision is what a binary starting with a pending Record must do.
type Decision int

const (
	// Nothing: no upgrade is pending, or this binary already failed one
	// and only answers for it.
	Nothing Decision = iota
	// Watch: this is the new binary on trial; confirm by the deadline.
	Watch
	// RollBack: this is the new binary and it must give way now.
	RollBack
	// Failed: this binary is not the one the upgrade installed (the
	// exec did not happen, or something else restored the previous
	// binary); the upgrade failed, and the record says so from now on.
	Failed
)

// maxStarts is how many times the new binary may start on trial; a binary
// restarted again and again by a service manager before it confirms is
// rolled back.
const maxStarts = 3

// Decide is the pure decision at start: rec (nil when none) read by a
// binary of version self at now. It returns the record to write back
// (Starts counted, Failed set) and the reason when it rolls back or fails.
func Decide(rec *Record, self string, now time.Time) (Decision, *Record, string) {
	if rec == nil || rec.Failed != "" {
		return Nothing, rec, ""
	}
	r := *rec
	if self != r.To {
		r.Failed = fmt.Sprintf("the agent started at version %s, not %s: the new binary never ran", self, r.To)
		return Failed, &r, r.Failed
	}
	r.Starts++
	switch {
	case r.Starts > maxStarts:
		return RollBack, &r, fmt.Sprintf("version %s started %d times without coming back connected", r.To, r.Starts-1)
	case !now.Before(r.Deadline):
		return RollBack, &r, fmt.Sprintf("version %s did not come back connected by its deadline %s", r.To, r.Deadline.Format(time.RFC3339))
	}
	return Watch, &r, ""
}

func recordPath(dir string) string { return filepath.Join(dir, recordName) }

// readRecord returns the pending record, or nil when there is none.
func readRecord(dir string) (*Record, error) {
	b, err := os.ReadFile(recordPath(dir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("read %s: %w", recordPath(dir), err)
	}
	return &r, nil
}

// writeRecord replaces the record atomically and durably (a crash leaves
// the old one or the new one).
func writeRecord(dir string, r *Record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return writeFileSync(recordPath(dir), b, 0o600)
}

func removeRecord(dir string) error {
	err := os.Remove(recordPath(dir))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

// writeFileSync writes path through a temporary file, synced, renamed
// into place (pki.WriteFileAtomic), and the directory synced, so the
// rename survives a crash too.
func writeFileSync(path string, b []byte, mode os.FileMode) error {
	if err := pki.WriteFileAtomic(path, b, mode); err != nil {
		return err
	}
	return syncDir(filepath.Dir(path))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
