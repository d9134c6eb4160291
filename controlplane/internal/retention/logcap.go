package retention

import (
	"fmt"

	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// An attempt's log is capped where the control plane ingests it: a run
// that writes without end must not grow the database without end. The cap
// is the run's log_limit_bytes, or the control plane's default when it
// sets none (Config.LogLimit); at submit a run may not ask for more than
// the control plane's maximum (Config.CheckLogLimit).

// TruncationLine is the line a log capped at limit bytes ends with.
func TruncationLine(limit int64) string {
	return fmt.Sprintf("\n[mercator: log truncated at %d bytes, the run's log limit (log_limit_bytes); later output was dropped]\n", limit)
}

// AppendCapped appends chunk to its attempt's log as store.Tx.AppendLog
// does (bytes already held are skipped), keeping at most limit bytes of
// output: the chunk that crosses the limit is cut there and followed by
// TruncationLine, and everything after is dropped. A log longer than limit
// is one that was truncated, since only the line takes it past. It
// returns the log's size and whether the log is truncated.
func AppendCapped(tx store.Tx, limit int64, chunk nodeproto.LogChunk) (int64, bool, error) {
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
