package agentupgrade

import "fmt"

// Recover is the service manager's half of the rollback, run by the
// previous binary after the agent's process ended (the unit's
// ExecStopPost, `mercator agent recover`): a new binary on trial that
// ended in failure counts one more start, and past maxStarts the previous
// binary is put back, so the service manager's next start runs it. It
// covers a new binary that dies before its own start count (a crash in
// its flag parsing, say), which the agent alone cannot see. failed is
// whether the process ended in failure ($SERVICE_RESULT other than
// "success"); a clean stop counts nothing. It reports whether it restored.
func Recover(stateDir string, failed bool) (bool, error) {
	rec, err := readRecord(stateDir)
	if err != nil || rec == nil || rec.Failed != "" || !failed {
		return false, err
	}
	rec.Starts++
	if rec.Starts <= maxStarts {
		return false, writeRecord(stateDir, rec)
	}
	if err := restore(rec); err != nil {
		return false, err
	}
	rec.Failed = fmt.Sprintf("version %s ended in failure %d times before it came back connected", rec.To, rec.Starts)
	return true, writeRecord(stateDir, rec)
}
