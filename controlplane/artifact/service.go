// Package artifact is the control plane's Artifacts and content: the
// catalog (names and immutable versions, in the store), resumable verified
// uploads into the content store, the signed reads the local content store
// serves, and minting a read for a command as it is sent.
//
// An upload is staged under Config.UploadDir, one directory per upload
// (meta.json and data), so it survives a restart of the control plane and
// resumes where it stopped. Each PUT appends at the offset the upload has
// reached while hashing the bytes (internal/hashcopy) twice over: the
// SHA-256 that will be the version's identity, and a CRC-32C, the cheap
// check a client that checks as it sends states at the commit. So the
// commit needs no second pass over a large file; after a failed PUT, or a
// restart, both are rebuilt from what is on disk. The commit compares the
// server's own digests with the client's check (a SHA-256 stated when the
// upload began, or, in the commit itself, a CRC-32C or a SHA-256; see
// api.CommitRequest for why a CRC is enough), stores the content by its
// SHA-256, and adds the version to the catalog, or answers with the
// version that already has these bytes: a version never changes, and the
// same content pushed again is the same version.
//
// Commands carry no minted read in the store. The session stream mints one
// for every prepare (and every launch's Artifacts) as it sends the command
// (outbound), so a redelivered command gets a fresh read, and no stored
// operation holds a credential, however short-lived.

// How a run's Artifacts reach the scheduler and its node stays with the
// runs, in package controlplane (runs_artifacts.go). Only package
// controlplane may import this one.
package artifact

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/mercator/mercator/content"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// Config is what the Artifacts service works with.
type Config struct {
	Store store.Store
	// Now is the clock, in UTC.
	Now    func() time.Time
	Logger *slog.Logger
	// Content holds Artifact content; nil means this control plane cannot
	// hold Artifacts (every route answers ErrUnavailable).
	Content content.Store
	// ReadTTL is the life of a minted read (default DefaultContentReadTTL).
	ReadTTL time.Duration
	// UploadDir is where uploads in progress are staged (default: under
	// the system's temporary directory).
	UploadDir string
	// MaxUploadSize is the largest upload a client may declare (default
	// DefaultMaxUploadSize); a larger one is refused before a byte of it
	// is accepted.
	MaxUploadSize int64
}

// Service serves Artifacts. Safe for concurrent use.
type Service struct {
	cfg   Config
	store store.Store
	log   *slog.Logger

	mu      sync.Mutex
	uploads map[string]*upload // uploads in progress this replica touched
}

// New returns the Artifacts service.
func New(cfg Config) *Service {
	return &Service{cfg: cfg, store: cfg.Store, log: cfg.Logger}
}

func (s *Service) now() time.Time { return s.cfg.Now() }

// Routes are the public Artifact routes, each served behind an API
// credential.
func (s *Service) Routes() []httpapi.Route {
	return []httpapi.Route{
		{Pattern: "POST /v1/artifacts/{name}/uploads", Handler: s.createUpload},
		{Pattern: "GET /v1/uploads/{id}", Handler: s.getUpload},
		{Pattern: "PUT /v1/uploads/{id}", Handler: s.putUpload},
		{Pattern: "POST /v1/uploads/{id}/commit", Handler: s.commitUpload},
		{Pattern: "GET /v1/artifacts", Handler: s.listArtifacts},
		{Pattern: "GET /v1/artifacts/{name}", Handler: s.listArtifactVersions},
		{Pattern: "GET /v1/artifacts/{name}/versions/{version}", Handler: s.getArtifactVersion},
	}
}

// Mint gives a prepare command a read of its content, minted now for this
// sending. A read that cannot be minted leaves the command without one
// (logged), which the node refuses in Mercator's words rather than
// fetching anything.
func (s *Service) Mint(ctx context.Context, c *nodeproto.PrepareArtifactCommand) {
	cs, err := s.contentStore()
	if err == nil {
		c.URL, c.ExpiresAt, err = cs.ReadURL(ctx, c.SHA256, s.readTTL())
	}
	if err != nil {
		c.URL, c.ExpiresAt = "", time.Time{}
		s.log.Warn("cannot mint a content read; the command goes without one", "artifact", c.Ref(), "err", err)
	}
}
