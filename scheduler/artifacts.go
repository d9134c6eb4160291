package scheduler

// This file is the scheduler's part of Artifacts: the link-floor predicate
// and the preference for nodes that already hold a run's Artifact content.
// It is kept apart from the index so that the index's search stays what it
// was for runs without Artifacts (the hooks in index.go are one predicate in
// check and one call in place).
//
// The floor. A run may state the slowest rate at which it accepts its
// Artifacts to be copied onto its node (Run.MinReadBPS, the largest of its
// mounts' min_read_bytes_per_second). A node's rate is its LinkFloorBPS:
// the slowest whole artifact copy it measured within the reading's validity
// (the node agent's ArtifactCopySource), or, for a node that has measured
// nothing yet, AssumedLinkBytesPerSecond, the fleet-wide assumption, which
// the control plane fills in. The predicate is the same either way; what
// differs is how much the figure is worth (MeasuredLinkConfidence against
// AssumedLinkConfidence), which the control plane reports and this function
// does not need: a measured floor simply replaces the assumption.
//
// The floor is a predicate on the node alone, not waived for a node that
// already holds the content: the predicates must depend on the run's shape
// only (see index.go), and the floor also bounds how fast the node takes in
// whatever else the run reads later.
//
// The preference. Among nodes that fit, one that holds every Artifact the
// run mounts comes first (and of those, one that also holds the image),
// because an Artifact is typically far larger than an image: a dataset or a
// model's weights. A node holding some but not all of them is not preferred
// over one holding none; partial overlap is not scored.

import (
	"fmt"
	"sort"
	"strings"
)

// AssumedLinkBytesPerSecond is the fleet-wide assumption about a node that
// has not measured an artifact copy yet: 1 GB/s, a 10 Gbit/s path landing
// on an ordinary NVMe disk. A run stating a floor above it waits for a
// measured node rather than trusting a guess with its deadline.
const AssumedLinkBytesPerSecond = 1_000_000_000

// AssumedLinkConfidence is what AssumedLinkBytesPerSecond is worth: a
// fleet-wide guess about a path nobody measured. It is deliberately below a
// node's own MeasuredLinkConfidence (0.9, nodeagent), so any reading a node
// publishes replaces it.
const AssumedLinkConfidence = 0.5

// belowLinkFloor reports whether the node copies Artifact content slower
// than the run accepts.
func belowLinkFloor(n *Node, sh *shape) bool {
	return sh.minRead > 0 && n.LinkFloorBPS < sh.minRead
}

// floorText is the waiting reason of belowFloor.
func floorText(sh shape) string {
	return fmt.Sprintf("has an artifact-copy floor below the run's (need %s)", Rate(sh.minRead))
}

// Rate formats a rate in bytes per second for people, in decimal units as
// link speeds are quoted ("500.0 MB/s").
func Rate(bps int64) string {
	const unit = 1000
	if bps < unit {
		return fmt.Sprintf("%d B/s", bps)
	}
	div, exp := int64(unit), 0
	for m := bps / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %cB/s", float64(bps)/float64(div), "kMGTP"[exp])
}

// placeOnArtifactHolders searches, for a run with Artifacts, the nodes
// holding all of them and its image, then the nodes holding all of them;
// -1 when neither has a node that fits (or the run mounts nothing), and the
// caller goes on to its image and fleet pools.
func (x *index) placeOnArtifactHolders(r *Run, sh *shape, key shapeKey) int32 {
	if len(r.Artifacts) == 0 {
		return -1
	}
	for _, withImage := range []bool{true, false} {
		p := x.artifactPool(r, withImage)
		if p == nil || p.nowhere[key] {
			continue
		}
		if n := x.search(p, sh); n >= 0 {
			return n
		}
		p.nowhere[key] = true
	}
	return -1
}

// artifactPool is the pool of eligible nodes holding every Artifact of r
// (and its image, withImage), built on first use and kept in x.pools under
// a key no image reference can have; nil when no node qualifies.
func (x *index) artifactPool(r *Run, withImage bool) *pool {
	digests := append([]string(nil), r.Artifacts...)
	sort.Strings(digests)
	key := "\x00artifacts\x00" + strings.Join(digests, ",")
	if withImage {
		key += "\x00" + r.Image
	}
	if p, ok := x.pools[key]; ok {
		return p
	}
	var members []int32
	for _, ni := range x.eligible {
		n := x.nodes[ni].node
		if withImage && !n.Images[r.Image] {
			continue
		}
		all := true
		for _, d := range digests {
			if !n.Artifacts[d] {
				all = false
				break
			}
		}
		if all {
			members = append(members, ni)
		}
	}
	var p *pool
	if len(members) > 0 {
		p = x.newPool(members)
	}
	x.pools[key] = p
	return p
}
