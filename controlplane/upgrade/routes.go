// Package upgrade holds agent releases and rollouts (docs/upgrades.md):
// the routes that store, list and remove releases and start and show
// rollouts (routes.go), and the loop that advances a rollout by sending
// upgrade_agent commands (rollout.go; its rules are the pure package
// controlplane/internal/rollout). Releases live in the content store; a
// command carries no read until the session stream mints one (Mint).
//
// Only package controlplane may import it.
package upgrade

import (
	"cmp"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/mercator/mercator/content"
	"github.com/mercator/mercator/nodeproto"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"time"

	"github.com/mercator/mercator/agentrelease"
	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
)

// Bounds of a rollout request.
const (
	maxRolloutNodes    = 100_000
	maxRolloutDeadline = time.Hour
	defaultDeadline    = 2 * time.Minute
)

// Config is what the Service needs from the control plane.
type Config struct {
	Store   store.Store
	Content content.Store // nil: no releases can be held
	Now     func() time.Time
	Logger  *slog.Logger
	// ReleaseKey, when set, must have signed every release.
	ReleaseKey ed25519.PublicKey
	// UploadDir stages a release's bytes as they arrive.
	UploadDir string
	// ReadTTL is the life of a minted read of a release.
	ReadTTL time.Duration
	// Every is the rollout loop's period.
	Every time.Duration
	// NodeReady says whether a node is inside its lease.
	NodeReady func(store.Node) bool
	// Issue stores a command for a node under fence (the control plane's
	// issueFenced) and returns it as stored.
	Issue func(tx store.Tx, nodeID string, fence uint64, cmd nodeproto.Command) (nodeproto.Command, error)
	// NodeChanged wakes a node's session after a command was issued.
	NodeChanged func(nodeID string)
	// Leader says whether this replica leads (only the leader advances
	// rollouts, so no node is sent two upgrades).
	Leader func() bool
}

// Service serves the routes and runs the rollout loop.
type Service struct {
	cfg Config
	log *slog.Logger
}

// New returns the Service.
func New(cfg Config) *Service { return &Service{cfg: cfg, log: cfg.Logger} }

func (s *Service) now() time.Time { return s.cfg.Now().UTC() }

// Mint gives c a read of its release, minted now; a read that cannot be
// minted leaves c without one, which the node refuses in words.
func (s *Service) Mint(ctx context.Context, c *nodeproto.UpgradeAgentCommand) {
	if s.cfg.Content == nil {
		return
	}
	var err error
	if c.URL, c.ExpiresAt, err = s.cfg.Content.ReadURL(ctx, c.SHA256, s.cfg.ReadTTL); err != nil {
		c.URL, c.ExpiresAt = "", time.Time{}
		s.log.Warn("cannot mint a read of the agent release; the command goes without one", "version", c.Version, "err", err)
	}
}

// Routes are the public routes, each behind an API credential.
func (s *Service) Routes() []httpapi.Route {
	return []httpapi.Route{
		{Pattern: "POST /v1/agent-releases", Handler: s.pushRelease},
		{Pattern: "GET /v1/agent-releases", Handler: s.listReleases},
		{Pattern: "DELETE /v1/agent-releases/{version}", Handler: s.removeRelease},
		{Pattern: "POST /v1/rollouts", Handler: s.startRollout},
		{Pattern: "GET /v1/rollouts", Handler: s.listRollouts},
		{Pattern: "GET /v1/rollouts/{id}", Handler: s.getRollout},
	}
}

// pushRelease stores a release: the body is the binary (at most
// agentrelease.MaxSize), ?version= and ?platform= say what it is, and the
// signature header carries its signature, which must verify when the
// server has a release key.
func (s *Service) pushRelease(w http.ResponseWriter, r *http.Request) {
	rel, err := s.receiveRelease(r)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	s.log.Info("agent release stored", "version", rel.Version, "platform", rel.Platform, "sha256", rel.SHA256, "size", rel.Size, "signed", len(rel.Signature) > 0)
	httpapi.WriteJSON(w, http.StatusCreated, releaseView(rel))
}

func (s *Service) receiveRelease(r *http.Request) (store.AgentRelease, error) {
	q := r.URL.Query()
	rel := store.AgentRelease{Version: q.Get("version"), Platform: cmp.Or(q.Get("platform"), "linux/amd64"), CreatedAt: s.now()}
	if err := agentrelease.CheckVersion(rel.Version); err != nil {
		return rel, err
	}
	if err := agentrelease.CheckPlatform(rel.Platform); err != nil {
		return rel, err
	}
	if sig := r.Header.Get(api.HeaderReleaseSignature); sig != "" {
		b, err := base64.StdEncoding.DecodeString(sig)
		if err != nil {
			return rel, failure.Invalid("signature", "the %s header is not base64: %v", api.HeaderReleaseSignature, err)
		}
		if rel.Signature, err = agentrelease.ParseSignature(b); err != nil {
			return rel, err
		}
	}
	if s.cfg.Content == nil {
		return rel, failure.Unavailable("this control plane has no content store, so it cannot hold agent releases")
	}
	if s.cfg.UploadDir != "" {
		if err := os.MkdirAll(s.cfg.UploadDir, 0o700); err != nil {
			return rel, err
		}
	}
	f, err := os.CreateTemp(s.cfg.UploadDir, "release-*")
	if err != nil {
		return rel, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), io.LimitReader(r.Body, agentrelease.MaxSize+1))
	if err != nil {
		return rel, fmt.Errorf("receive the release: %w", err)
	}
	if n == 0 || n > agentrelease.MaxSize {
		return rel, failure.Invalid("body", "a release is 1 to %d bytes; this one is %d or more", agentrelease.MaxSize, n)
	}
	rel.Size, rel.SHA256 = n, hex.EncodeToString(h.Sum(nil))
	if s.cfg.ReleaseKey != nil {
		b, err := os.ReadFile(f.Name())
		if err != nil {
			return rel, err
		}
		if err := agentrelease.CheckSignature(b, rel.Signature, s.cfg.ReleaseKey); err != nil {
			return rel, err
		}
	}
	if err := f.Close(); err != nil {
		return rel, err
	}
	if err := s.cfg.Content.Put(r.Context(), rel.SHA256, f.Name(), n); err != nil {
		return rel, err
	}
	return rel, s.cfg.Store.Update(r.Context(), func(tx store.Tx) error { return tx.CreateAgentRelease(rel) })
}

func releaseView(r store.AgentRelease) api.AgentRelease {
	return api.AgentRelease{Version: r.Version, Platform: r.Platform, SHA256: r.SHA256, Size: r.Size, Signed: len(r.Signature) > 0, CreatedAt: r.CreatedAt}
}

func (s *Service) listReleases(w http.ResponseWriter, r *http.Request) {
	out := api.AgentReleaseList{Releases: []api.AgentRelease{}}
	err := s.cfg.Store.View(r.Context(), func(tx store.Tx) error {
		rels, err := tx.ListAgentReleases()
		for _, rel := range rels {
			out.Releases = append(out.Releases, releaseView(rel))
		}
		return err
	})
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// removeRelease deletes a release's record (its content stays: content is
// shared by digest, and a node mid-fetch keeps its read). A release a
// running rollout uses is refused.
func (s *Service) removeRelease(w http.ResponseWriter, r *http.Request) {
	version, platform := r.PathValue("version"), cmp.Or(r.URL.Query().Get("platform"), "linux/amd64")
	err := s.cfg.Store.Update(r.Context(), func(tx store.Tx) error {
		ros, err := tx.ListRollouts()
		if err != nil {
			return err
		}
		for _, ro := range ros {
			if ro.State == store.RolloutRunning && ro.Version == version && ro.Platform == platform {
				return failure.Conflict("release %s %s is in use by running rollout %s; wait for it to finish", version, platform, ro.ID)
			}
		}
		return tx.DeleteAgentRelease(version, platform)
	})
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// startRollout creates a rollout; the rollout loop sends the commands at
// its next pass (within ReconcileEvery).
// At most one rollout runs at a time.
func (s *Service) startRollout(w http.ResponseWriter, r *http.Request) {
	var req api.RolloutRequest
	if err := httpapi.Decode(r, httpapi.MaxBody, &req); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	var ro store.Rollout
	err := s.cfg.Store.Update(r.Context(), func(tx store.Tx) (err error) {
		ro, err = s.newRollout(tx, req)
		return err
	})
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusCreated, rolloutView(ro))
}

func (s *Service) newRollout(tx store.Tx, req api.RolloutRequest) (store.Rollout, error) {
	ro := store.Rollout{ID: httpapi.NewID("ro-"), Platform: cmp.Or(req.Platform, "linux/amd64"), MaxParallel: cmp.Or(req.MaxParallel, 1),
		Canary: 1, Deadline: time.Duration(req.DeadlineSeconds) * time.Second, State: store.RolloutRunning, CreatedAt: s.now(), UpdatedAt: s.now()}
	if req.Canary != nil {
		ro.Canary = *req.Canary
	}
	switch {
	case ro.Deadline == 0:
		ro.Deadline = defaultDeadline
	case ro.Deadline < 0 || ro.Deadline > maxRolloutDeadline:
		return ro, failure.Invalid("deadline_seconds", "must be 1 to %d, got %d", int(maxRolloutDeadline.Seconds()), req.DeadlineSeconds)
	}
	if ro.MaxParallel < 1 || ro.Canary < 0 {
		return ro, failure.Invalid("max_parallel", "max_parallel must be at least 1 and canary at least 0")
	}
	if req.All == (len(req.Nodes) > 0) {
		return ro, failure.Invalid("nodes", "name the nodes to upgrade, or all, not both or neither")
	}
	if len(req.Nodes) > maxRolloutNodes {
		return ro, failure.Invalid("nodes", "at most %d nodes, got %d", maxRolloutNodes, len(req.Nodes))
	}
	rel, err := s.releaseFor(tx, req.Version, ro.Platform)
	if err != nil {
		return ro, err
	}
	ro.Version = rel.Version
	existing, err := tx.ListRollouts()
	if err != nil {
		return ro, err
	}
	for _, o := range existing {
		if o.State == store.RolloutRunning {
			return ro, failure.Conflict("rollout %s (to %s) is still running; one rollout runs at a time", o.ID, o.Version)
		}
	}
	if ro.Nodes, err = rolloutNodes(tx, req, s.cfg.NodeReady); err != nil {
		return ro, err
	}
	// Retention: the oldest rollouts beyond store.KeepRollouts go.
	for _, o := range existing[min(len(existing), store.KeepRollouts-1):] {
		if err := tx.DeleteRollout(o.ID); err != nil {
			return ro, err
		}
	}
	return ro, tx.PutRollout(ro)
}

// releaseFor is the release named, or the newest for the platform.
func (s *Service) releaseFor(tx store.Tx, version, platform string) (store.AgentRelease, error) {
	if version != "" {
		return tx.GetAgentRelease(version, platform)
	}
	rels, err := tx.ListAgentReleases()
	if err != nil {
		return store.AgentRelease{}, err
	}
	rels = slices.DeleteFunc(rels, func(r store.AgentRelease) bool { return r.Platform != platform })
	if len(rels) == 0 {
		return store.AgentRelease{}, failure.NotFound("agent release for", platform)
	}
	return slices.MaxFunc(rels, func(a, b store.AgentRelease) int { return a.CreatedAt.Compare(b.CreatedAt) }), nil
}

// rolloutNodes lists the rollout's nodes: those named (each must exist, not
// be removed and upgrade itself), or every ready node that upgrades itself.
// A node whose agent cannot (nodeproto.NodeFacts.NoSelfUpgrade: it runs in
// the control plane's process) is upgraded with the server, never by a
// rollout, which would otherwise stop at it.
func rolloutNodes(tx store.Tx, req api.RolloutRequest, ready func(store.Node) bool) ([]store.RolloutNode, error) {
	var out []store.RolloutNode
	if req.All {
		nodes, err := tx.ListNodes()
		if err != nil {
			return nil, err
		}
		for _, n := range nodes {
			if ready(n) && !noSelfUpgrade(n) {
				out = append(out, store.RolloutNode{ID: n.ID, State: store.RolloutNodePending})
			}
		}
		if len(out) == 0 {
			return nil, failure.Invalid("all", "no node is ready to upgrade itself")
		}
		return out, nil
	}
	seen := map[string]bool{}
	for _, id := range req.Nodes {
		n, err := tx.GetNode(id)
		if err != nil {
			return nil, err
		}
		if n.RemovedAt != nil {
			return nil, failure.Invalid("nodes", "node %s was removed", id)
		}
		if noSelfUpgrade(n) {
			return nil, failure.Invalid("nodes", "node %s runs its agent in the control plane's process (mercator server --local-agent) and is upgraded with the server, not by a rollout", id)
		}
		if !seen[id] {
			seen[id] = true
			out = append(out, store.RolloutNode{ID: id, State: store.RolloutNodePending})
		}
	}
	return out, nil
}

func rolloutView(ro store.Rollout) api.Rollout {
	v := api.Rollout{ID: ro.ID, Version: ro.Version, Platform: ro.Platform, Canary: ro.Canary, MaxParallel: ro.MaxParallel,
		State: ro.State, Reason: ro.Reason, CreatedAt: ro.CreatedAt, UpdatedAt: ro.UpdatedAt, Nodes: []api.RolloutNode{}}
	for _, n := range ro.Nodes {
		v.Nodes = append(v.Nodes, api.RolloutNode{ID: n.ID, State: n.State, SentAt: n.SentAt, Error: n.Error})
	}
	return v
}

func (s *Service) listRollouts(w http.ResponseWriter, r *http.Request) {
	out := api.RolloutList{Rollouts: []api.Rollout{}}
	err := s.cfg.Store.View(r.Context(), func(tx store.Tx) error {
		ros, err := tx.ListRollouts()
		for _, ro := range ros {
			out.Rollouts = append(out.Rollouts, rolloutView(ro))
		}
		return err
	})
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

func (s *Service) getRollout(w http.ResponseWriter, r *http.Request) {
	var ro store.Rollout
	err := s.cfg.Store.View(r.Context(), func(tx store.Tx) (err error) {
		ro, err = tx.GetRollout(r.PathValue("id"))
		return err
	})
	if errors.Is(err, failure.ErrNotFound) {
		err = failure.NotFound("rollout", r.PathValue("id"))
	}
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, rolloutView(ro))
}

// noSelfUpgrade says n's agent reported it cannot replace its own binary.
func noSelfUpgrade(n store.Node) bool { return n.Facts != nil && n.Facts.NoSelfUpgrade }
