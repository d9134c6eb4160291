package controlplane

import (
	"fmt"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// An attempt's log is capped where it is ingested (nodeLogs): a run that
// writes without end must not grow the database without end. The cap is
// the run's log_limit_bytes, or Config.DefaultLogLimit when it sets none;
// at submit a run may not ask for more than Config.MaxLogLimit.

// checkLogLimit refuses a spec asking for a larger log than this control
// plane keeps.
func (s *Server) checkLogLimit(spec api.RunSpec) error {
	if spec.LogLimitBytes > s.cfg.MaxLogLimit {
		return failure.Invalid("log_limit_bytes", "%d bytes is more than this control plane keeps of one attempt's log (at most %d bytes, its --max-log-limit)",
			spec.LogLimitBytes, s.cfg.MaxLogLimit)
	}
	return nil
}

// logLimit is the cap of each of r's attempts' logs.
func (s *Server) logLimit(r api.Run) int64 {
	if r.LogLimitBytes > 0 {
		return min(r.LogLimitBytes, s.cfg.MaxLogLimit)
	}
	return s.cfg.DefaultLogLimit
}

// TruncationLine is the line a log capped at limit bytes ends with.
func TruncationLine(limit int64) string {
	return fmt.Sprintf("\n[mercator: log truncated at %d bytes, the run's log limit (log_limit_bytes); later output was dropped]\n", limit)
}

// appendCapped appends chunk to its attempt's log as store.Tx.AppendLog
// does (bytes already held are skipped), keeping at most limit bytes of
// output: the chunk that crosses the limit is cut there and followed by
// TruncationLine, and everything after is dropped. A log longer than limit
// is one that was truncated, since only the line takes it past. It
// returns the log's size and whether the log is truncated.
func appendCapped(tx store.Tx, limit int64, chunk nodeproto.LogChunk) (int64, bool, error) {
	key := chunk.WorkloadKey
	_, size, err := tx.ReadLog(key, 0, 0)
	if err != nil || size > limit {
		return size, err == nil, err
	}
	skip := min(max(size-chunk.Offset, 0), int64(len(chunk.Data)))
	tail := chunk.Data[skip:]
	room := limit - size
	if int64(len(tail)) <= room {
		size, err = tx.AppendLog(key, size, tail)
		return size, false, err
	}
	if _, err := tx.AppendLog(key, size, tail[:room]); err != nil {
		return 0, false, err
	}
	size, err = tx.AppendLog(key, limit, []byte(TruncationLine(limit)))
	return size, true, err
}
