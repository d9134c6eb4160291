package controlplane

import (
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/function"
	"github.com/mercator/mercator/nodeproto"
)

// nextHold is the next hold command n gets for fnID.
func (n *fakeNode) nextHold(t *testing.T, fnID string) nodeproto.HoldCommand {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case h := <-n.holds:
			if h.Function != nil && h.Function.ID == fnID {
				return h
			}
		case <-timeout:
			t.Fatalf("node %s got no hold for %s", n.id, fnID)
		}
	}
}

// TestWarmCapacityHolds: a deploy asks the function's first node to pull
// its image (a hold of none) or to hold its minimum, with the pinned image
// and a lapse; a change of the minimum is sent at once; a minimum that is
// not a whole number in range is refused in Fn's shape.
func TestWarmCapacityHolds(t *testing.T) {
	f := newFnFixture(t)
	n := f.startNode("n1", echo)
	_, plain := f.deploy("warm", api.Fn{Name: "plain"})
	if h := n.nextHold(t, plain.ID); h.Count != 0 || !strings.Contains(h.Function.Image, "@sha256:") || h.For <= 0 {
		t.Errorf("deploy without a minimum: hold %+v, want a prefetch (count 0) of the pinned image", h)
	}
	_, hot := f.deploy("warm", api.Fn{Name: "hot", Annotations: api.Annotations{function.MinHotAnnotation: []byte(`2`)}})
	if h := n.nextHold(t, hot.ID); h.Count != 2 {
		t.Errorf("deploy with min-hot 2: hold count %d", h.Count)
	}
	f.want(200, nil, "PUT", "/v2/fns/"+hot.ID, map[string]any{"annotations": map[string]any{function.MinHotAnnotation: "3"}})
	if h := n.nextHold(t, hot.ID); h.Count != 3 {
		t.Errorf("min-hot raised to 3: hold count %d", h.Count)
	}
	f.wantFnError(400, "want a whole number from 0 to 100", "PUT", "/v2/fns/"+hot.ID, map[string]any{"annotations": map[string]any{function.MinHotAnnotation: "lots"}})
	f.wantFnError(400, "want a whole number from 0 to 100", "POST", "/v2/fns", api.Fn{Name: "x", AppID: hot.AppID, Image: "registry.local/f:1",
		Annotations: api.Annotations{function.MinHotAnnotation: []byte(`101`)}})
}

// TestDeleteReleasesSpares: deleting a function sends its node a release
// (a hold that says Release, for an agent at VersionFnSpares), so the node
// drops the spare and idle containers it keeps of it.
func TestDeleteReleasesSpares(t *testing.T) {
	f := newFnFixture(t)
	n := f.startNode("n1", echo)
	_, fn := f.deploy("spares", api.Fn{Name: "gone"})
	if h := n.nextHold(t, fn.ID); h.Release {
		t.Fatalf("deploy: hold %+v; want a prefetch, not a release", h)
	}
	f.want(204, nil, "DELETE", "/v2/fns/"+fn.ID, nil)
	if h := n.nextHold(t, fn.ID); !h.Release || h.Function.Image == "" {
		t.Errorf("delete: hold %+v; want a release naming the function", h)
	}
}
