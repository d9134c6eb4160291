package nodeagent

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"
)

// recordingRuntime is a memRuntime that records the calls a launch makes,
// and fails the ones named in fail.
type recordingRuntime struct {
	*memRuntime
	calls []string
	fail  map[string]error
}

func (r *recordingRuntime) call(what string) error {
	r.calls = append(r.calls, what)
	return r.fail[what]
}

func (r *recordingRuntime) PrepareImage(_ context.Context, c nodeproto.PrepareImageCommand) error {
	return r.call("image " + c.Image)
}

func (r *recordingRuntime) PrepareArtifact(_ context.Context, c nodeproto.PrepareArtifactCommand) error {
	return r.call("artifact " + c.SHA256)
}

func (r *recordingRuntime) LaunchWorkload(ctx context.Context, c nodeproto.LaunchWorkloadCommand) error {
	if err := r.call("container " + c.RunID); err != nil {
		return err
	}
	return r.memRuntime.LaunchWorkload(ctx, c)
}

func runSteps(rt Runtime, l nodeproto.LaunchWorkloadCommand) error {
	for _, step := range launchSteps {
		if err := step.run(context.Background(), rt, l, nil); err != nil {
			return err
		}
	}
	return nil
}

func TestLaunchStepsRunInOrderImageOnce(t *testing.T) {
	mount := func(digest, at string) nodeproto.ArtifactMount {
		return nodeproto.ArtifactMount{PrepareArtifactCommand: nodeproto.PrepareArtifactCommand{Name: "d", Version: "v1", SHA256: digest}, MountPath: at}
	}
	l := nodeproto.LaunchWorkloadCommand{WorkloadKey: nodeproto.WorkloadKey{RunID: "r1", Attempt: 1}, Image: pinnedImage("img"),
		Artifacts: []nodeproto.ArtifactMount{mount("b", "/b"), mount("a", "/a"), mount("b", "/b2")}}
	rt := &recordingRuntime{memRuntime: newMemRuntime()}
	if err := runSteps(rt, l); err != nil {
		t.Fatal(err)
	}
	want := []string{"image " + pinnedImage("img"), "artifact b", "artifact a", "container r1"}
	if !slices.Equal(rt.calls, want) {
		t.Errorf("calls = %q, want %q: the image once, each Artifact version once, then the container", rt.calls, want)
	}
}

func TestLaunchStepFailureStopsTheLaunch(t *testing.T) {
	l := nodeproto.LaunchWorkloadCommand{WorkloadKey: nodeproto.WorkloadKey{RunID: "r1", Attempt: 1}, Image: pinnedImage("img"),
		Artifacts: []nodeproto.ArtifactMount{{PrepareArtifactCommand: nodeproto.PrepareArtifactCommand{SHA256: "a"}, MountPath: "/a"}}}
	for _, tc := range []struct {
		fail, wantPrefix string
		wantCalls        int
	}{
		{"image " + pinnedImage("img"), "prepare image: ", 1},
		{"artifact a", "", 2},
		{"container r1", "", 3},
	} {
		refusal := failure.Invalid("x", "refused")
		rt := &recordingRuntime{memRuntime: newMemRuntime(), fail: map[string]error{tc.fail: refusal}}
		err := runSteps(rt, l)
		if !errors.Is(err, refusal) || !strings.HasPrefix(err.Error(), tc.wantPrefix) {
			t.Errorf("failing %q: launch = %v, want the step's error with prefix %q", tc.fail, err, tc.wantPrefix)
		}
		if len(rt.calls) != tc.wantCalls {
			t.Errorf("failing %q: calls = %q, want the launch to stop there", tc.fail, rt.calls)
		}
	}
}
