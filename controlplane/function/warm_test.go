package function

import (
	"slices"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/store"
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

// TestTargetConcurrencyOf: absent is 1; 1–100 as a number or a string;
// anything else refused, by the policy check too, and the spec nodes get
// carries it.
func TestTargetConcurrencyOf(t *testing.T) {
	for raw, want := range map[string]int{`1`: 1, `"4"`: 4, `100`: 100} {
		if got, err := targetConcurrencyOf(api.Annotations{TargetConcurrencyAnnotation: []byte(raw)}); err != nil || got != want {
			t.Errorf("target %s = %d, %v; want %d", raw, got, err, want)
		}
	}
	for _, raw := range []string{`0`, `-1`, `101`, `"many"`} {
		if _, err := targetConcurrencyOf(api.Annotations{TargetConcurrencyAnnotation: []byte(raw)}); err == nil {
			t.Errorf("target %s accepted", raw)
		}
		if _, _, err := warmPolicy(api.Annotations{TargetConcurrencyAnnotation: []byte(raw)}); err == nil {
			t.Errorf("policy with target %s accepted", raw)
		}
	}
	if got, err := targetConcurrencyOf(nil); got != 1 || err != nil {
		t.Errorf("no annotation = %d, %v; want 1", got, err)
	}
	e := newFnEntry(store.Fn{Fn: api.Fn{ID: "f", Annotations: api.Annotations{TargetConcurrencyAnnotation: []byte(`3`)}}}, store.App{}, nil, time.Time{})
	if e.spec.TargetConcurrency != 3 {
		t.Errorf("spec target = %d, want 3", e.spec.TargetConcurrency)
	}
}

// TestLogFramesOf: frames unless the annotation says "false" (a string or
// a bare JSON boolean); anything else refused; the spec carries it.
func TestLogFramesOf(t *testing.T) {
	for raw, want := range map[string]bool{`"false"`: false, `false`: false, `"true"`: true, `true`: true} {
		if got, err := logFramesOf(api.Annotations{LogFramesAnnotation: []byte(raw)}); err != nil || got != want {
			t.Errorf("log-frames %s = %v, %v; want %v", raw, got, err, want)
		}
	}
	if _, _, err := warmPolicy(api.Annotations{LogFramesAnnotation: []byte(`"sometimes"`)}); err == nil {
		t.Error("log-frames \"sometimes\" accepted")
	}
	if got, err := logFramesOf(nil); !got || err != nil {
		t.Errorf("no annotation = %v, %v; want frames", got, err)
	}
	e := newFnEntry(store.Fn{Fn: api.Fn{ID: "f", Annotations: api.Annotations{LogFramesAnnotation: []byte(`"false"`)}}}, store.App{}, nil, time.Time{})
	if !e.spec.UnframedLogs || newFnEntry(store.Fn{Fn: api.Fn{ID: "f"}}, store.App{}, nil, time.Time{}).spec.UnframedLogs {
		t.Error("the spec's UnframedLogs does not follow the annotation")
	}
}

// TestMaxHotSplit: max_hot is split over the nodes a call may try, each
// node's share its per-node cap, never above the function's own, and never
// more nodes tried than there are containers to share.
func TestMaxHotSplit(t *testing.T) {
	e := &fnEntry{maxHot: 5}
	e.spec.MaxConcurrency = 2
	if got := e.tries(10); got != maxTries {
		t.Errorf("tries(10) with max_hot 5 = %d, want %d", got, maxTries)
	}
	var caps []int
	total := 0
	for i := range e.tries(10) {
		c := e.specFor(i, e.tries(10)).MaxConcurrency
		caps = append(caps, c)
		total += c
	}
	if !slices.Equal(caps, []int{2, 1, 1, 1}) || total > 5 {
		t.Errorf("per-node caps = %v, want [2 1 1 1] (max_hot 5 over 4 nodes, within max_concurrency 2)", caps)
	}
	one := &fnEntry{maxHot: 1}
	if got := one.tries(10); got != 1 || one.specFor(0, 1).MaxConcurrency != 1 {
		t.Errorf("max_hot 1: tries %d, cap %d; want one node capped at 1", got, one.specFor(0, 1).MaxConcurrency)
	}
	if free := (&fnEntry{}); free.tries(10) != maxTries || free.specFor(0, maxTries).MaxConcurrency != 0 {
		t.Errorf("no max_hot: tries %d, cap %d", free.tries(10), free.specFor(0, maxTries).MaxConcurrency)
	}
	if _, _, err := warmPolicy(api.Annotations{MinHotAnnotation: []byte(`3`), MaxHotAnnotation: []byte(`2`)}); err == nil {
		t.Error("min-hot above max-hot accepted")
	}
	if lo, hi, err := warmPolicy(api.Annotations{MinHotAnnotation: []byte(`2`), MaxHotAnnotation: []byte(`"50"`)}); err != nil || lo != 2 || hi != 50 {
		t.Errorf("policy 2/50 = %d/%d, %v", lo, hi, err)
	}
}
