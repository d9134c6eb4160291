package record

import "github.com/mercator/mercator/store"

// AgentRelease checks that r can be stored: it needs a version and a
// platform.
func AgentRelease(r store.AgentRelease) error {
	if err := required("version", r.Version); err != nil {
		return err
	}
	return required("platform", r.Platform)
}

// AgentReleaseKey is the one key memstore files a release under.
func AgentReleaseKey(version, platform string) string { return version + "\x00" + platform }

// Rollout checks that r can be stored: it needs an ID.
func Rollout(r store.Rollout) error { return required("id", r.ID) }
