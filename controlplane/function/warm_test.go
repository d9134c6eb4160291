package function

import (
	"slices"
	"testing"

	"github.com/mercator/mercator/api"
)

func TestHoldPlan(t *testing.T) {
	for _, c := range []struct {
		nodes, count, prefetch int
		want                   []int
	}{
		{0, 2, 2, []int{}},
		{1, 0, 2, []int{0}},       // a prefetch on the only node
		{5, 0, 2, []int{0, 0}},    // a prefetch on the first two
		{5, 1, 2, []int{1, 0}},    // one held, the next node prefetches
		{5, 2, 2, []int{1, 1}},    // spread
		{3, 7, 2, []int{3, 2, 2}}, // more than nodes: the first ones take the rest
		{1, 3, 2, []int{3}},
	} {
		if got := holdPlan(c.nodes, c.count, c.prefetch); !slices.Equal(got, c.want) {
			t.Errorf("holdPlan(%d, %d, %d) = %v, want %v", c.nodes, c.count, c.prefetch, got, c.want)
		}
	}
}

func TestMinHotOf(t *testing.T) {
	for raw, want := range map[string]int{`2`: 2, `"2"`: 2, `0`: 0, `100`: 100} {
		if got, err := minHotOf(api.Annotations{MinHotAnnotation: []byte(raw)}); err != nil || got != want {
			t.Errorf("min-hot %s = %d, %v; want %d", raw, got, err, want)
		}
	}
	for _, raw := range []string{`-1`, `101`, `"lots"`, `1.5`, `{}`} {
		if _, err := minHotOf(api.Annotations{MinHotAnnotation: []byte(raw)}); err == nil {
			t.Errorf("min-hot %s accepted", raw)
		}
	}
	if got, err := minHotOf(nil); got != 0 || err != nil {
		t.Errorf("no annotation = %d, %v", got, err)
	}
}
