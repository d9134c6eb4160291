package gang

import (
	"strconv"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/lifecycle"
)

// LogAttempt is the attempt whose log a request for run's logs asks for:
// attempt (?attempt=N) when given; for a gang, the member of rank (?rank=K,
// 0 unless given) in its latest set; otherwise the latest attempt. 0 is
// "not placed yet". A value out of range is refused, naming the range.
func LogAttempt(run api.Run, attempt, rank string) (int, error) {
	if attempt != "" {
		n, err := strconv.Atoi(attempt)
		if err != nil || n < 1 || n > len(run.Attempts) {
			return 0, failure.Invalid("attempt", "run %s has attempts 1 to %d", run.ID, len(run.Attempts))
		}
		return n, nil
	}
	want := 0
	if rank != "" {
		if !lifecycle.Gang(&run) {
			return 0, failure.Invalid("rank", "run %s is not a gang (it has no ranks); ask for an attempt instead", run.ID)
		}
		n, err := strconv.Atoi(rank)
		if err != nil || n < 0 || n >= run.Nodes {
			return 0, failure.Invalid("rank", "run %s is a gang of %d: its ranks are 0 to %d, not %q", run.ID, run.Nodes, run.Nodes-1, rank)
		}
		want = n
	}
	if !lifecycle.Gang(&run) {
		return len(run.Attempts), nil
	}
	for _, a := range lifecycle.Members(&run) {
		if a.Rank == want {
			return a.Number, nil
		}
	}
	return 0, nil
}
