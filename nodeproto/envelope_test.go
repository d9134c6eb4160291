package nodeproto

import (
	"testing"
)

func TestRequiredVersion(t *testing.T) {
	withArtifact := &LaunchWorkloadCommand{Artifacts: []ArtifactMount{{MountPath: "/data"}}}
	for _, tc := range []struct {
		name string
		cmd  Command
		want int
	}{
		{"prepare_image", Command{Kind: KindPrepareImage, PrepareImage: &PrepareImageCommand{}}, 1},
		{"launch without Artifacts", Command{Kind: KindLaunchWorkload, LaunchWorkload: &LaunchWorkloadCommand{}}, 1},
		{"launch with Artifacts", Command{Kind: KindLaunchWorkload, LaunchWorkload: withArtifact}, VersionArtifacts},
		{"launch as a user", Command{Kind: KindLaunchWorkload, LaunchWorkload: &LaunchWorkloadCommand{User: "1000"}}, VersionHardening},
		{"launch read-only", Command{Kind: KindLaunchWorkload, LaunchWorkload: &LaunchWorkloadCommand{ReadOnlyRootfs: true}}, VersionHardening},
		{"launch without network", Command{Kind: KindLaunchWorkload, LaunchWorkload: &LaunchWorkloadCommand{Network: "none"}}, VersionHardening},
		{"launch with a pids limit and Artifacts", Command{Kind: KindLaunchWorkload, LaunchWorkload: &LaunchWorkloadCommand{PidsLimit: 10, Artifacts: withArtifact.Artifacts}}, VersionHardening},
		{"prepare_artifact", Command{Kind: KindPrepareArtifact, PrepareArtifact: &PrepareArtifactCommand{}}, VersionArtifacts},
		{"stop_workload", Command{Kind: KindStopWorkload, StopWorkload: &StopWorkloadCommand{}}, 1},
		{"invoke", Command{Kind: KindInvoke, Invoke: &InvokeCommand{}}, VersionFunctions},
		{"call_log", Command{Kind: KindCallLog, CallLog: &CallLogCommand{}}, VersionCallLogs},
		{"keep_alive", Command{Kind: KindKeepAlive}, 1},
		{"launch with secrets, as stored", Command{Kind: KindLaunchWorkload, LaunchWorkload: &LaunchWorkloadCommand{SecretNames: []string{"T"}, Artifacts: withArtifact.Artifacts}}, VersionHardening},
		{"launch with secrets, as sent", Command{Kind: KindLaunchWorkload, LaunchWorkload: &LaunchWorkloadCommand{Secrets: map[string]string{"T": "v"}}}, VersionHardening},
	} {
		if got := RequiredVersion(tc.cmd); got != tc.want {
			t.Errorf("%s: RequiredVersion = %d, want %d", tc.name, got, tc.want)
		}
	}
	// The history's numbers, which stored facts and running agents rely on.
	if VersionArtifacts != 2 || VersionFunctions != 3 || VersionCallLogs != 4 || VersionHardening != 5 || Version < VersionHardening {
		t.Errorf("capability versions moved: artifacts %d, functions %d, call logs %d, this build %d",
			VersionArtifacts, VersionFunctions, VersionCallLogs, Version)
	}
}

func TestLaunchEnvironment(t *testing.T) {
	l := LaunchWorkloadCommand{Env: map[string]string{"A": "1"}, SecretNames: []string{"T", "U"}, Secrets: map[string]string{"T": "s"}}
	env := l.Environment()
	if len(env) != 2 || env["A"] != "1" || env["T"] != "s" {
		t.Errorf("Environment() = %v, want A and T", env)
	}
	if len(l.Env) != 1 {
		t.Errorf("Environment changed Env: %v", l.Env)
	}
	if m := l.MissingSecrets(); len(m) != 1 || m[0] != "U" {
		t.Errorf("MissingSecrets() = %v, want [U]", m)
	}
	plain := LaunchWorkloadCommand{Env: map[string]string{"A": "1"}}
	if plain.MissingSecrets() != nil || len(plain.Environment()) != 1 {
		t.Errorf("a launch without secrets: missing %v, environment %v", plain.MissingSecrets(), plain.Environment())
	}
}
