// Package artifactcache is the node's side of Artifacts: fetching one immutable version
// through the location the control plane minted for it, landing it on disk
// under the artifact root exactly (hashed on the way in, checked, published
// atomically), keeping the disk within its budget, mounting copies into
// containers read-only, and timing every copy as the node's link reading.
//
// Layout under the artifact root (New):
//
//	sha256/DIGEST/content    the file, or the directory of a tar version
//	sha256/DIGEST/meta.json  size, format and the NAME@VERSION references
//	tmp/…                    copies in progress; emptied at start
//
// Content is kept by digest, so two versions (or two names) with the same
// bytes share one copy. A copy is written into tmp, fsynced, and renamed to
// sha256/DIGEST in one step: a reader, a container or an agent that starts
// after a crash sees the whole verified copy or nothing, never a half copy.
// The directory's modification time is the copy's last use, which is what
// least-recently-used eviction orders by across restarts.
//
// The cache knows no container runtime: what running work mounts (and so
// must not be evicted) is asked of the inUse function its owner gives New.
// Imported by the node agent's Docker runtime (nodeagent/dockerruntime),
// the composition root, and tests.
package artifactcache
