package node

import (
	"testing"

	"github.com/mercator/mercator/capability"
)

func TestRequiredVersion(t *testing.T) {
	withArtifact := &capability.LaunchWorkloadCommand{Artifacts: []capability.ArtifactMount{{MountPath: "/data"}}}
	for _, tc := range []struct {
		name string
		cmd  Command
		want int
	}{
		{"prepare_image", Command{Kind: KindPrepareImage, PrepareImage: &capability.PrepareImageCommand{}}, 1},
		{"launch without Artifacts", Command{Kind: KindLaunchWorkload, LaunchWorkload: &capability.LaunchWorkloadCommand{}}, 1},
		{"launch with Artifacts", Command{Kind: KindLaunchWorkload, LaunchWorkload: withArtifact}, capability.VersionArtifacts},
		{"prepare_artifact", Command{Kind: KindPrepareArtifact, PrepareArtifact: &capability.PrepareArtifactCommand{}}, capability.VersionArtifacts},
		{"stop_workload", Command{Kind: KindStopWorkload, StopWorkload: &capability.StopWorkloadCommand{}}, 1},
		{"invoke", Command{Kind: KindInvoke, Invoke: &capability.InvokeCommand{}}, capability.VersionFunctions},
		{"call_log", Command{Kind: KindCallLog, CallLog: &capability.CallLogCommand{}}, capability.VersionCallLogs},
		{"keep_alive", Command{Kind: KindKeepAlive}, 1},
	} {
		if got := RequiredVersion(tc.cmd); got != tc.want {
			t.Errorf("%s: RequiredVersion = %d, want %d", tc.name, got, tc.want)
		}
	}
	// The history's numbers, which stored facts and running agents rely on.
	if capability.VersionArtifacts != 2 || capability.VersionFunctions != 3 || capability.VersionCallLogs != 4 || capability.Version < capability.VersionCallLogs {
		t.Errorf("capability versions moved: artifacts %d, functions %d, call logs %d, this build %d",
			capability.VersionArtifacts, capability.VersionFunctions, capability.VersionCallLogs, capability.Version)
	}
}
