package e2e

import (
	"slices"
	"strings"
	"testing"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/internal/testimage"
)

// A tag is a name anyone with push rights can move. Content is exact
// (docs/design.md, promise 5): a run or a function is resolved to a manifest
// digest when it is submitted or deployed, and what runs is that digest,
// even if the tag names another image by the time a node pulls it. These
// tests move the tag between the submission (or the deployment) and the
// first pull, and check which image the daemon ran.

// pushAs tags the local image local as remote ("HOST/name:tag") and pushes
// it, moving the tag if it named something else; it returns the pinned
// reference of what was pushed.
func (c *cluster) pushAs(local, remote string) string {
	c.t.Helper()
	if out, err := execOutput("docker", "tag", local, remote); err != nil {
		c.t.Fatalf("docker tag %s %s: %v %s", local, remote, err, out)
	}
	pinned, err := testimage.Push(c.ctx, remote)
	if err != nil {
		c.t.Fatal(err)
	}
	return pinned
}

// imageID is the daemon's ID (config digest) of a local image or container's
// image: format is {{.Id}} for an image, {{.Image}} for a container.
func imageID(t testing.TB, format, ref string) string {
	t.Helper()
	out, err := execOutput("docker", "inspect", "--format", format, ref)
	if err != nil {
		t.Fatalf("docker inspect %s: %v %s", ref, err, out)
	}
	return strings.TrimSpace(out)
}

// containerImages returns the image IDs of the daemon's containers carrying
// label (key=value).
func containerImages(t testing.TB, label string) []string {
	t.Helper()
	out, err := execOutput("docker", "ps", "-a", "-q", "--filter", "label="+label)
	if err != nil {
		t.Fatalf("docker ps: %v", err)
	}
	var ids []string
	for _, ctr := range strings.Fields(out) {
		ids = append(ids, imageID(t, "{{.Image}}", ctr))
	}
	return ids
}

// TestTagMovedAfterSubmit: a run submitted by tag while no node can take
// it; the tag then moves to another image; when a node arrives, the run
// runs the image the tag named at submission.
func TestTagMovedAfterSubmit(t *testing.T) {
	c := startCluster(t)
	c.publish("hello") // builds the second image locally
	const a, b = "mercator-testimage/workload:latest", "mercator-testimage/hello:latest"
	tag := c.registry + "/moving:t"
	pinnedA := c.pushAs(a, tag)
	t.Cleanup(func() { testimage.Untag(c.ctx, tag, pinnedA) })

	run := c.submit(api.RunSpec{Image: tag, Command: []string{"echo", "pinned"}})
	if run.PinnedImage != pinnedA {
		t.Fatalf("run pinned %q at submission, want %q (what the tag named)", run.PinnedImage, pinnedA)
	}
	pinnedB := c.pushAs(b, tag)
	t.Cleanup(func() { testimage.Untag(c.ctx, pinnedB) })
	if pinnedB == pinnedA {
		t.Fatalf("the tag did not move: both pushes pinned %s", pinnedA)
	}

	c.startAgent("n")
	done := c.wait(run.ID)
	if done.Status != api.RunSucceeded || !strings.Contains(c.logs(run.ID), "pinned") {
		t.Fatalf("run %s (%q): want it to succeed with the workload image's echo", done.Status, done.Reason)
	}
	want, moved := imageID(t, "{{.Id}}", a), imageID(t, "{{.Id}}", b)
	got := containerImages(t, "mercator.run="+run.ID)
	if len(got) != 1 || got[0] != want {
		t.Fatalf("the run's container ran image %v, want %s (the tag at submission; the moved tag names %s)", got, want, moved)
	}
}

// TestTagMovedAfterDeploy: a function deployed by tag; the tag then moves
// to another function image before the first call; the call runs the image
// the tag named at deployment.
func TestTagMovedAfterDeploy(t *testing.T) {
	c := startCluster(t)
	c.startAgent("n")
	c.publish("fn-hello")
	c.publish("fn-fdk")
	const a, b = "mercator-testimage/fn-hello:latest", "mercator-testimage/fn-fdk:latest"
	tag := c.registry + "/movingfn:t"
	pinnedA := c.pushAs(a, tag)
	t.Cleanup(func() { testimage.Untag(c.ctx, tag, pinnedA) })

	_, fn := c.deployHello("tagmove", api.Fn{Name: "moving", Image: tag})
	if fn.PinnedImage != pinnedA {
		t.Fatalf("function pinned %q at deployment, want %q (what the tag named)", fn.PinnedImage, pinnedA)
	}
	pinnedB := c.pushAs(b, tag)
	t.Cleanup(func() { testimage.Untag(c.ctx, pinnedB) })
	if pinnedB == pinnedA {
		t.Fatalf("the tag did not move: both pushes pinned %s", pinnedA)
	}

	if status, body := c.invoke(fn.ID, `{"name":"tag"}`); status != 200 || !strings.Contains(body, "Hello, tag") {
		t.Fatalf("call = %d %q, want fn-hello's greeting", status, body)
	}
	want, moved := imageID(t, "{{.Id}}", a), imageID(t, "{{.Id}}", b)
	// Every container of the function (the one that answered, and the
	// next one a node prepares ahead) is of the image the tag named at
	// deployment.
	got := containerImages(t, "mercator.fn="+fn.ID)
	if len(got) == 0 || slices.ContainsFunc(got, func(id string) bool { return id != want }) {
		t.Fatalf("the function's containers are of images %v, want all %s (the tag at deployment; the moved tag names %s)", got, want, moved)
	}
}
