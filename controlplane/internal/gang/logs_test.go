package gang

import (
	"errors"
	"strings"
	"testing"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
)

// TestLogAttempt: ?attempt names any attempt; ?rank names a member of a
// gang's latest set; neither is the latest attempt (a gang's rank 0); a
// run not yet placed is 0; what is out of range is refused with the range.
func TestLogAttempt(t *testing.T) {
	single := api.Run{ID: "r", Attempts: []api.Attempt{{Number: 1, NodeID: "a"}, {Number: 2, NodeID: "b"}}}
	gang := api.Run{ID: "g", RunSpec: api.RunSpec{Nodes: 2}, Attempts: []api.Attempt{
		{Number: 1, NodeID: "a", Set: 1}, {Number: 2, NodeID: "b", Set: 1, Rank: 1},
		{Number: 3, NodeID: "c", Set: 2}, {Number: 4, NodeID: "d", Set: 2, Rank: 1},
	}}
	for _, c := range []struct {
		name          string
		run           api.Run
		attempt, rank string
		want          int
		refused       string // the field refused, if any
	}{
		{"latest", single, "", "", 2, ""},
		{"an earlier attempt", single, "1", "", 1, ""},
		{"not placed yet", api.Run{ID: "q"}, "", "", 0, ""},
		{"a gang's rank 0 by default", gang, "", "", 3, ""},
		{"a gang's rank 1, latest set", gang, "", "1", 4, ""},
		{"a gang's earlier set by attempt", gang, "2", "", 2, ""},
		{"attempt 0", single, "0", "", 0, "attempt"},
		{"attempt past the last", single, "3", "", 0, "attempt"},
		{"attempt not a number", single, "x", "", 0, "attempt"},
		{"rank of a run that is not a gang", single, "", "0", 0, "rank"},
		{"rank past the gang", gang, "", "2", 0, "rank"},
		{"rank negative", gang, "", "-1", 0, "rank"},
	} {
		got, err := LogAttempt(c.run, c.attempt, c.rank)
		if c.refused != "" {
			var fe *failure.Error
			if !errors.As(err, &fe) || fe.Kind != failure.ErrInvalid || fe.Field != c.refused || !strings.Contains(fe.Message, "run "+c.run.ID) {
				t.Errorf("%s: got %d, %v; want refused on %s", c.name, got, err, c.refused)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s: got %d, %v; want %d", c.name, got, err, c.want)
		}
	}
}
