package controlplane

// This file is the control plane's part of Artifacts: the catalog (names
// and immutable versions, in the store), resumable verified uploads into
// the content store, the signed reads the local content store serves, and
// how a run's Artifacts reach the scheduler and its node.
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

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/capability"
	"github.com/mercator/mercator/content"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/internal/directio"
	"github.com/mercator/mercator/internal/hashcopy"
	"github.com/mercator/mercator/node"
	"github.com/mercator/mercator/scheduler"
	"github.com/mercator/mercator/store"
)

// DefaultContentReadTTL is the life of a minted content read when
// Config.ContentReadTTL is zero. A read is checked when a fetch begins, not
// while it runs, so it needs to cover the wait before the fetch, not the
// copy itself.
const DefaultContentReadTTL = 15 * time.Minute

// uploadTTL is how long an upload that is not committed is kept after it
// was last written to.
const uploadTTL = 24 * time.Hour

// maxArtifacts bounds the Artifacts of one run.
const maxArtifacts = 64

var artifactName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

func validArtifactName(field, name string) error {
	if !artifactName.MatchString(name) {
		return failure.Invalid(field, "%q is not an artifact name: use letters, digits, '.', '_' and '-', starting with a letter or digit, at most 128 characters", name)
	}
	return nil
}

// artifactState is the control plane's in-memory side of uploads.
type artifactState struct {
	mu      sync.Mutex
	uploads map[string]*upload
}

// upload is one upload in progress. Its mutex is held by the request
// writing to it; a second writer is refused rather than queued.
type upload struct {
	mu   sync.Mutex
	meta uploadMeta
	dir  string
	// sha256 and crc32c are the digests of the first received bytes,
	// kept together: both nil when they must be rebuilt from disk.
	sha256   hash.Hash
	crc32c   hash.Hash32
	received int64
}

// hashes is both digests, for rebuilding them from what is on disk.
func (u *upload) hashes() io.Writer { return io.MultiWriter(u.sha256, u.crc32c) }

// forget drops both digests, to be rebuilt from disk on the next request.
func (u *upload) forget() { u.sha256, u.crc32c = nil, nil }

type uploadMeta struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	Size      int64     `json:"size"`
	SHA256    string    `json:"sha256,omitempty"`
	Format    string    `json:"format"`
	ExpiresAt time.Time `json:"expires_at"`
}

func (s *Server) contentStore() (content.Store, error) {
	if s.cfg.Content == nil {
		return nil, failure.Unavailable("this control plane has no content store configured, so it cannot hold Artifacts")
	}
	return s.cfg.Content, nil
}

func (s *Server) uploadDir() string {
	if s.cfg.UploadDir != "" {
		return s.cfg.UploadDir
	}
	return filepath.Join(os.TempDir(), "mercator-uploads")
}

func (s *Server) readTTL() time.Duration {
	if s.cfg.ContentReadTTL > 0 {
		return s.cfg.ContentReadTTL
	}
	return DefaultContentReadTTL
}

// createUpload starts an upload (POST /v1/artifacts/{name}/uploads), or,
// when the client's digest names content this name already has (or the
// content store already holds), answers with that version and nothing to
// send.
func (s *Server) createUpload(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := validArtifactName("name", name); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	var req api.UploadRequest
	if err := httpapi.Decode(r, httpapi.MaxBody, &req); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	switch {
	case req.Size < 0:
		httpapi.WriteError(w, failure.Invalid("size", "must be 0 or more bytes, not %d", req.Size))
		return
	case req.Format == "":
		req.Format = api.ArtifactFile
	case req.Format != api.ArtifactFile && req.Format != api.ArtifactTar:
		httpapi.WriteError(w, failure.Invalid("format", "must be %q or %q, not %q", api.ArtifactFile, api.ArtifactTar, req.Format))
		return
	}
	if req.SHA256 != "" && !content.ValidDigest(req.SHA256) {
		httpapi.WriteError(w, failure.Invalid("sha256", "%q is not a SHA-256 digest: want 64 lowercase hex digits", req.SHA256))
		return
	}
	cs, err := s.contentStore()
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if req.SHA256 != "" {
		existing, err := s.findVersion(r.Context(), name, req.SHA256)
		if err == nil && existing == nil {
			// Content held under another name: verified when it was
			// stored, so it needs no second upload.
			if size, serr := cs.Stat(r.Context(), req.SHA256); serr == nil && size == req.Size {
				v, _, aerr := s.addVersion(r.Context(), name, req.SHA256, req.Size, req.Format)
				existing, err = &v, aerr
			}
		}
		if err != nil {
			httpapi.WriteError(w, err)
			return
		}
		if existing != nil {
			httpapi.WriteJSON(w, http.StatusOK, api.Upload{Name: name, Size: existing.Size, Received: existing.Size, SHA256: existing.SHA256,
				Format: existing.Format, Existing: existing})
			return
		}
	}
	s.sweepUploads()
	meta := uploadMeta{ID: httpapi.NewID("up-"), Name: name, Size: req.Size, SHA256: req.SHA256, Format: req.Format, ExpiresAt: s.now().Add(uploadTTL)}
	dir := filepath.Join(s.uploadDir(), meta.ID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		httpapi.WriteError(w, fmt.Errorf("staging upload: %w", err))
		return
	}
	if err := writeUploadMeta(dir, meta); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	f, err := os.OpenFile(filepath.Join(dir, "data"), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		httpapi.WriteError(w, fmt.Errorf("staging upload: %w", err))
		return
	}
	f.Close()
	u := &upload{meta: meta, dir: dir, sha256: sha256.New(), crc32c: api.NewCRC32C()}
	s.artifacts.mu.Lock()
	if s.artifacts.uploads == nil {
		s.artifacts.uploads = map[string]*upload{}
	}
	s.artifacts.uploads[meta.ID] = u
	s.artifacts.mu.Unlock()
	s.log.Info("upload started", "upload", meta.ID, "artifact", name, "size", meta.Size)
	httpapi.WriteJSON(w, http.StatusCreated, u.view())
}

func (u *upload) view() api.Upload {
	m := u.meta
	return api.Upload{ID: m.ID, Name: m.Name, Size: m.Size, Received: u.received, SHA256: m.SHA256, Format: m.Format, ExpiresAt: m.ExpiresAt}
}

func writeUploadMeta(dir string, m uploadMeta) error {
	raw, err := json.Marshal(m)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "meta.json.tmp")
	if err := os.WriteFile(tmp, raw, 0o600); err != nil {
		return fmt.Errorf("staging upload: %w", err)
	}
	return os.Rename(tmp, filepath.Join(dir, "meta.json"))
}

// loadUpload finds an upload in memory or, after a restart, on disk.
func (s *Server) loadUpload(id string) (*upload, error) {
	s.artifacts.mu.Lock()
	defer s.artifacts.mu.Unlock()
	if u := s.artifacts.uploads[id]; u != nil {
		return u, nil
	}
	if !strings.HasPrefix(id, "up-") || strings.ContainsAny(id, `/\.`) {
		return nil, failure.NotFound("upload", id)
	}
	dir := filepath.Join(s.uploadDir(), id)
	raw, err := os.ReadFile(filepath.Join(dir, "meta.json"))
	if err != nil {
		return nil, failure.NotFound("upload", id)
	}
	var meta uploadMeta
	if err := json.Unmarshal(raw, &meta); err != nil {
		return nil, fmt.Errorf("upload %s: %w", id, err)
	}
	fi, err := os.Stat(filepath.Join(dir, "data"))
	if err != nil {
		return nil, failure.NotFound("upload", id)
	}
	u := &upload{meta: meta, dir: dir, received: fi.Size()}
	if s.artifacts.uploads == nil {
		s.artifacts.uploads = map[string]*upload{}
	}
	s.artifacts.uploads[id] = u
	return u, nil
}

// rebuild recomputes the digests of what the upload holds on disk, after
// a failed write or a restart left the in-memory ones unusable. Called
// with u.mu held.
func (u *upload) rebuild() error {
	if u.sha256 != nil {
		return nil
	}
	f, err := os.Open(filepath.Join(u.dir, "data"))
	if err != nil {
		return fmt.Errorf("upload %s: %w", u.meta.ID, err)
	}
	defer f.Close()
	u.sha256, u.crc32c = sha256.New(), api.NewCRC32C()
	n, err := io.Copy(u.hashes(), f)
	if err != nil {
		u.forget()
		return fmt.Errorf("upload %s: rereading what was received: %w", u.meta.ID, err)
	}
	u.received = n
	return nil
}

func (s *Server) dropUpload(u *upload) {
	s.artifacts.mu.Lock()
	delete(s.artifacts.uploads, u.meta.ID)
	s.artifacts.mu.Unlock()
	_ = os.RemoveAll(u.dir)
}

// sweepUploads removes uploads past their expiry. It is best effort: an
// upload dir that cannot be read is left for the next sweep.
func (s *Server) sweepUploads() {
	entries, err := os.ReadDir(s.uploadDir())
	if err != nil {
		return
	}
	now := s.now()
	for _, e := range entries {
		raw, err := os.ReadFile(filepath.Join(s.uploadDir(), e.Name(), "meta.json"))
		var meta uploadMeta
		if err != nil || json.Unmarshal(raw, &meta) != nil || now.Before(meta.ExpiresAt) {
			continue
		}
		s.artifacts.mu.Lock()
		u := s.artifacts.uploads[meta.ID]
		s.artifacts.mu.Unlock()
		if u != nil && !u.mu.TryLock() {
			continue // being written to
		}
		if u != nil {
			s.dropUpload(u)
			u.mu.Unlock()
			continue
		}
		_ = os.RemoveAll(filepath.Join(s.uploadDir(), e.Name()))
	}
}

func (s *Server) getUpload(w http.ResponseWriter, r *http.Request) {
	u, err := s.loadUpload(r.PathValue("id"))
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if !u.mu.TryLock() {
		// Being written to: report what is on disk without waiting.
		view := api.Upload{ID: u.meta.ID, Name: u.meta.Name, Size: u.meta.Size, SHA256: u.meta.SHA256, Format: u.meta.Format, ExpiresAt: u.meta.ExpiresAt}
		if fi, err := os.Stat(filepath.Join(u.dir, "data")); err == nil {
			view.Received = fi.Size()
		}
		httpapi.WriteJSON(w, http.StatusOK, view)
		return
	}
	defer u.mu.Unlock()
	httpapi.WriteJSON(w, http.StatusOK, u.view())
}

// putUpload appends the request body at ?offset=N, which must be where the
// upload stands (GET says where), so a resumed upload can neither skip nor
// repeat bytes. What a broken request delivered is kept: the client asks
// where the upload stands and resumes from there.
func (s *Server) putUpload(w http.ResponseWriter, r *http.Request) {
	u, err := s.loadUpload(r.PathValue("id"))
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	offset, err := strconv.ParseInt(r.URL.Query().Get("offset"), 10, 64)
	if err != nil || offset < 0 {
		httpapi.WriteError(w, failure.Invalid("offset", "?offset=N is required: the byte position of this body in the content (GET the upload for where it stands)"))
		return
	}
	if !u.mu.TryLock() {
		httpapi.WriteError(w, failure.Conflict("upload %s is being written by another request; wait for it, then resume from where the upload stands", u.meta.ID))
		return
	}
	defer u.mu.Unlock()
	if err := u.rebuild(); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if offset != u.received {
		httpapi.WriteError(w, &failure.Error{Kind: failure.ErrConflict, Field: "offset", Message: fmt.Sprintf(
			"upload %s holds %d bytes; send from offset %d, not %d", u.meta.ID, u.received, u.received, offset)})
		return
	}
	f, err := directio.Append(filepath.Join(u.dir, "data"))
	if err != nil {
		httpapi.WriteError(w, fmt.Errorf("upload %s: %w", u.meta.ID, err))
		return
	}
	left := u.meta.Size - u.received
	// SHA-256 in hashcopy's hashing stage, CRC-32C in its reading stage
	// (as each read arrives, while it is in the cache): the hashing stage
	// is the copy's slowest, and the write stage waits on the disk.
	n, err := hashcopy.Copy(f, io.TeeReader(hashcopy.InCache(r.Body), u.crc32c), u.sha256, left)
	if cerr := f.Close(); err == nil && cerr != nil {
		err = &hashcopy.WriteError{Err: cerr}
	}
	u.received += n
	if err == nil && n > left {
		err = failure.Invalid("size", "upload %s was declared as %d bytes and this body goes beyond that", u.meta.ID, u.meta.Size)
		_ = os.Truncate(filepath.Join(u.dir, "data"), u.meta.Size)
	}
	if err != nil {
		u.forget() // rebuilt from disk on the next request
		var we *hashcopy.WriteError
		if errors.As(err, &we) {
			err = fmt.Errorf("upload %s: storing what was received: %w", u.meta.ID, we.Err)
		} else if !errors.Is(err, failure.ErrInvalid) {
			err = failure.Unavailable("upload %s: the body ended early after %d bytes (%v); resume from where the upload stands", u.meta.ID, n, err)
		}
		httpapi.WriteError(w, err)
		return
	}
	u.meta.ExpiresAt = s.now().Add(uploadTTL)
	_ = writeUploadMeta(u.dir, u.meta)
	httpapi.WriteJSON(w, http.StatusOK, u.view())
}

// commitUpload verifies a complete upload and adds its version: 201 with a
// new version, 200 with the version that already had these bytes. The
// client's check comes in the body (api.CommitRequest: a CRC-32C or a
// SHA-256), from the start of the upload (a SHA-256), or both; with none
// the commit is refused and the upload kept, so the client can commit
// again with its check. A check that does not match discards the upload.
func (s *Server) commitUpload(w http.ResponseWriter, r *http.Request) {
	u, err := s.loadUpload(r.PathValue("id"))
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	var req api.CommitRequest
	if r.ContentLength != 0 {
		if err := httpapi.Decode(r, httpapi.MaxBody, &req); err != nil {
			httpapi.WriteError(w, err)
			return
		}
	}
	if req.SHA256 != "" && !content.ValidDigest(req.SHA256) {
		httpapi.WriteError(w, failure.Invalid("sha256", "%q is not a SHA-256 digest: want 64 lowercase hex digits", req.SHA256))
		return
	}
	if req.CRC32C != "" && !api.ValidCRC32C(req.CRC32C) {
		httpapi.WriteError(w, failure.Invalid("crc32c", "%q is not a CRC-32C: want 8 lowercase hex digits", req.CRC32C))
		return
	}
	if !u.mu.TryLock() {
		httpapi.WriteError(w, failure.Conflict("upload %s is being written by another request", u.meta.ID))
		return
	}
	defer u.mu.Unlock()
	if req.SHA256 == "" && req.CRC32C == "" && u.meta.SHA256 == "" {
		httpapi.WriteError(w, failure.Invalid("crc32c", "upload %s was started without the client's digest, so the commit must state its check: "+
			"send {\"crc32c\": CHECK}, your CRC-32C (Castagnoli, 8 hex digits) of the content you sent, or {\"sha256\": DIGEST}; "+
			"no version is stored unverified", u.meta.ID))
		return
	}
	cs, err := s.contentStore()
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if err := u.rebuild(); err != nil {
		httpapi.WriteError(w, err)
		return
	}
	if u.received != u.meta.Size {
		httpapi.WriteError(w, failure.Conflict("upload %s holds %d of its %d bytes; send the rest from offset %d before committing", u.meta.ID, u.received, u.meta.Size, u.received))
		return
	}
	digest := hex.EncodeToString(u.sha256.Sum(nil))
	if err := checkUpload(u.meta.Size, digest, api.FormatCRC32C(u.crc32c.Sum32()), u.meta.SHA256, req); err != nil {
		s.dropUpload(u)
		httpapi.WriteError(w, err)
		return
	}
	data := filepath.Join(u.dir, "data")
	if err := cs.Put(r.Context(), digest, data, u.meta.Size); err != nil {
		httpapi.WriteError(w, fmt.Errorf("upload %s: storing the content: %w", u.meta.ID, err))
		return
	}
	v, created, err := s.addVersion(r.Context(), u.meta.Name, digest, u.meta.Size, u.meta.Format)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	s.dropUpload(u)
	status := http.StatusOK
	if created {
		status = http.StatusCreated
		s.log.Info("artifact version created", "artifact", v.Ref(), "sha256", digest, "size", v.Size)
	}
	httpapi.WriteJSON(w, status, v)
}

// checkUpload compares what the client stated about an upload of size
// bytes (startSHA256, when it began, and the commit's body) with the
// control plane's own SHA-256 and CRC-32C of the bytes it received: nil
// when every stated value matches, else an invalid error naming the field
// and both values. Unstated values are not compared.
func checkUpload(size int64, sha256Hex, crc32cHex, startSHA256 string, req api.CommitRequest) error {
	for _, c := range []struct{ field, verb, got, claimed string }{
		{"sha256", "hash to", sha256Hex, startSHA256},
		{"sha256", "hash to", sha256Hex, req.SHA256},
		{"crc32c", "have the CRC-32C", crc32cHex, req.CRC32C},
	} {
		if c.claimed != "" && c.claimed != c.got {
			return failure.Invalid(c.field, "the %d bytes received %s %s, not %s: the content changed or was damaged on the way; the upload was discarded, push again",
				size, c.verb, c.got, c.claimed)
		}
	}
	return nil
}

// findVersion returns the version of name whose content is digest, or nil.
func (s *Server) findVersion(ctx context.Context, name, digest string) (*api.ArtifactVersion, error) {
	var out *api.ArtifactVersion
	err := s.store.View(ctx, func(tx store.Tx) error {
		out = nil
		vs, err := tx.ListArtifacts(name)
		for _, v := range vs {
			if v.SHA256 == digest {
				out = &v.ArtifactVersion
			}
		}
		return err
	})
	return out, err
}

// addVersion adds the next version of name for content digest, unless a
// version of name already has that content; created says which.
func (s *Server) addVersion(ctx context.Context, name, digest string, size int64, format string) (api.ArtifactVersion, bool, error) {
	var out store.Artifact
	var created bool
	var err error
	for range 3 { // a concurrent push of another content may take the number
		err = s.store.Update(ctx, func(tx store.Tx) error {
			created = false
			vs, err := tx.ListArtifacts(name)
			if err != nil {
				return err
			}
			seq := 1
			for _, v := range vs {
				if v.SHA256 == digest {
					out = v
					return nil
				}
				seq = max(seq, v.Seq+1)
			}
			out = store.Artifact{Seq: seq, ArtifactVersion: api.ArtifactVersion{Name: name, Version: "v" + strconv.Itoa(seq),
				SHA256: digest, Size: size, Format: format, CreatedAt: s.now()}}
			created = true
			return tx.CreateArtifact(out)
		})
		if !errors.Is(err, failure.ErrConflict) {
			break
		}
	}
	return out.ArtifactVersion, created, err
}

// listArtifacts answers GET /v1/artifacts: every version of every name,
// ordered by name and then oldest first; ?name= keeps one name.
func (s *Server) listArtifacts(w http.ResponseWriter, r *http.Request) {
	s.writeArtifacts(w, r, r.URL.Query().Get("name"), false)
}

// listArtifactVersions answers GET /v1/artifacts/{name}; an unknown name is
// not found.
func (s *Server) listArtifactVersions(w http.ResponseWriter, r *http.Request) {
	s.writeArtifacts(w, r, r.PathValue("name"), true)
}

func (s *Server) writeArtifacts(w http.ResponseWriter, r *http.Request, name string, must bool) {
	out := api.ArtifactList{Artifacts: []api.ArtifactVersion{}}
	err := s.store.View(r.Context(), func(tx store.Tx) error {
		vs, err := tx.ListArtifacts(name)
		out.Artifacts = out.Artifacts[:0]
		for _, v := range vs {
			out.Artifacts = append(out.Artifacts, v.ArtifactVersion)
		}
		return err
	})
	if err == nil && must && len(out.Artifacts) == 0 {
		err = failure.NotFound("artifact", name)
	}
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// getArtifactVersion answers GET /v1/artifacts/{name}/versions/{version};
// the version "latest" is the newest.
func (s *Server) getArtifactVersion(w http.ResponseWriter, r *http.Request) {
	var out store.Artifact
	err := s.store.View(r.Context(), func(tx store.Tx) error {
		var err error
		out, err = s.lookupVersion(tx, r.PathValue("name"), r.PathValue("version"))
		return err
	})
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, out.ArtifactVersion)
}

// lookupVersion finds name@version; "" and "latest" are the newest.
func (s *Server) lookupVersion(tx store.Tx, name, version string) (store.Artifact, error) {
	if version != "" && version != "latest" {
		return tx.GetArtifact(name, version)
	}
	vs, err := tx.ListArtifacts(name)
	if err != nil {
		return store.Artifact{}, err
	}
	if len(vs) == 0 {
		return store.Artifact{}, failure.NotFound("artifact", name)
	}
	return vs[len(vs)-1], nil
}

// serveContent serves the local content store's signed reads. With another
// store, content is never served here.
func (s *Server) serveContent(w http.ResponseWriter, r *http.Request) {
	if l, ok := s.cfg.Content.(*content.Local); ok {
		l.ServeRead(w, r)
		return
	}
	httpapi.WriteError(w, failure.NotFound("content", r.PathValue("digest")))
}

// validateArtifactMounts checks a run's Artifacts: names, versions, mount
// paths (absolute, clean, not /, unique) and floors. Whether each version
// exists is resolveArtifacts' question.
func validateArtifactMounts(mounts []api.ArtifactMount) error {
	if len(mounts) > maxArtifacts {
		return failure.Invalid("artifacts", "has %d entries; at most %d are accepted", len(mounts), maxArtifacts)
	}
	seen := map[string]string{}
	for i, m := range mounts {
		field := fmt.Sprintf("artifacts[%d]", i)
		if err := validArtifactName(field+".name", m.Name); err != nil {
			return err
		}
		if m.Version != "" && m.Version != "latest" && !regexp.MustCompile(`^v[1-9][0-9]{0,8}$`).MatchString(m.Version) {
			return failure.Invalid(field+".version", "%q is not a version: versions are v1, v2, …, or empty for the newest", m.Version)
		}
		p := m.MountPath
		switch {
		case p == "":
			return failure.Invalid(field+".mount_path", "is required: where %s appears in the container, for example /data", m.Name)
		case !strings.HasPrefix(p, "/"):
			return failure.Invalid(field+".mount_path", "%q must be an absolute path, such as /data", p)
		case strings.ContainsAny(p, "\x00:,"):
			return failure.Invalid(field+".mount_path", "%q must not contain NUL, ':' or ','", p)
		case p == "/" || path.Clean(p) == "/":
			return failure.Invalid(field+".mount_path", "must not be /: an artifact cannot replace the container's root")
		case slicesContains(strings.Split(p, "/"), ".."):
			return failure.Invalid(field+".mount_path", "%q must not contain \"..\"", p)
		case path.Clean(p) != p:
			return failure.Invalid(field+".mount_path", "%q is not clean; write %q", p, path.Clean(p))
		case len(p) > 1024:
			return failure.Invalid(field+".mount_path", "is longer than 1024 bytes")
		}
		if other, dup := seen[p]; dup {
			return failure.Invalid(field+".mount_path", "%q is also the mount path of %s; every artifact needs its own", p, other)
		}
		seen[p] = m.Name
		if m.MinReadBytesPerSecond < 0 {
			return failure.Invalid(field+".min_read_bytes_per_second", "must be 0 (no floor) or more, not %d", m.MinReadBytesPerSecond)
		}
		if m.SHA256 != "" && !content.ValidDigest(m.SHA256) {
			return failure.Invalid(field+".sha256", "%q is not a SHA-256 digest", m.SHA256)
		}
	}
	return nil
}

func slicesContains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// resolveArtifacts pins every Artifact of a run to the exact version it
// will read: a missing version is refused at submit (the user can fix it),
// an empty one becomes the newest, and the digest is recorded (and, when
// the client stated one, checked).
func (s *Server) resolveArtifacts(ctx context.Context, spec *api.RunSpec) error {
	if len(spec.Artifacts) == 0 {
		return nil
	}
	spec.Artifacts = append([]api.ArtifactMount(nil), spec.Artifacts...)
	return s.store.View(ctx, func(tx store.Tx) error {
		for i := range spec.Artifacts {
			m := &spec.Artifacts[i]
			field := fmt.Sprintf("artifacts[%d]", i)
			v, err := s.lookupVersion(tx, m.Name, m.Version)
			if errors.Is(err, failure.ErrNotFound) {
				ref := m.Name + "@" + m.Version
				if m.Version == "" || m.Version == "latest" {
					ref = m.Name
				}
				return failure.Invalid(field, "artifact %s does not exist; push it with `mercator artifact push %s PATH`, or list what exists with `mercator artifact ls`", ref, m.Name)
			}
			if err != nil {
				return err
			}
			if m.SHA256 != "" && m.SHA256 != v.SHA256 {
				return failure.Invalid(field+".sha256", "artifact %s has content %s, not %s", v.Ref(), v.SHA256, m.SHA256)
			}
			m.Version, m.SHA256 = v.Version, v.SHA256
		}
		return nil
	})
}

// artifactFacts is the scheduler's view of a node's Artifacts: the digests
// it holds, and its link floor (a valid measured reading, else the fleet's
// assumption).
func (s *Server) artifactFacts(sn *scheduler.Node, f *capability.NodeFacts) {
	sn.LinkFloorBPS = scheduler.AssumedLinkBytesPerSecond
	if f == nil {
		return
	}
	if l := f.Link; l != nil && l.BytesPerSecond > 0 && s.now().Before(l.ValidUntil) {
		sn.LinkFloorBPS = l.BytesPerSecond
	}
	if len(f.Artifacts) > 0 {
		sn.Artifacts = make(map[string]bool, len(f.Artifacts))
		for _, a := range f.Artifacts {
			sn.Artifacts[a.SHA256] = true
		}
	}
}

// artifactDemand is the scheduler's view of a run's Artifacts.
func artifactDemand(sr *scheduler.Run, spec api.RunSpec) {
	for _, m := range spec.Artifacts {
		sr.Artifacts = append(sr.Artifacts, m.SHA256)
		sr.MinReadBPS = max(sr.MinReadBPS, m.MinReadBytesPerSecond)
	}
}

// placeArtifacts adds a run's Artifacts to its launch and issues a
// prepare_artifact for every one the node does not report holding, ahead of
// the launch, so the copies begin as soon as the node hears of them. The
// launch waits for them on the node either way.
func (s *Server) placeArtifacts(tx store.Tx, nodeID string, run store.Run, launch *capability.LaunchWorkloadCommand) error {
	if len(run.Artifacts) == 0 {
		return nil
	}
	held := map[string]bool{}
	if n, err := tx.GetNode(nodeID); err == nil && n.Facts != nil {
		for _, a := range n.Facts.Artifacts {
			held[a.SHA256] = true
		}
	}
	issued := map[string]bool{}
	for _, m := range run.Artifacts {
		v, err := tx.GetArtifact(m.Name, m.Version)
		if err != nil {
			return fmt.Errorf("run %s: %w", run.ID, err)
		}
		prep := capability.PrepareArtifactCommand{Name: v.Name, Version: v.Version, SHA256: v.SHA256, Size: v.Size, Format: v.Format}
		launch.Artifacts = append(launch.Artifacts, capability.ArtifactMount{PrepareArtifactCommand: prep, MountPath: m.MountPath})
		if held[v.SHA256] || issued[v.SHA256] {
			continue
		}
		issued[v.SHA256] = true
		p := prep
		if err := s.issue(tx, nodeID, node.Command{Kind: node.KindPrepareArtifact, PrepareArtifact: &p}); err != nil {
			return err
		}
	}
	return nil
}

// outbound is a stored command as it is sent: every Artifact read minted
// now, for this sending, and the image's registry credential attached. The
// stored command is not changed, so neither ever reaches the database. A
// read that cannot be minted is sent without one, which the node refuses in
// Mercator's words rather than fetching anything.
func (s *Server) outbound(ctx context.Context, cmd node.Command) node.Command {
	switch {
	case cmd.PrepareArtifact != nil:
		c := *cmd.PrepareArtifact
		s.mint(ctx, &c)
		cmd.PrepareArtifact = &c
	case cmd.LaunchWorkload != nil:
		l := *cmd.LaunchWorkload
		l.Artifacts = append([]capability.ArtifactMount(nil), l.Artifacts...)
		for i := range l.Artifacts {
			s.mint(ctx, &l.Artifacts[i].PrepareArtifactCommand)
		}
		if l.RegistryAuth == "" {
			l.RegistryAuth = s.registryAuth(ctx, l.Image)
		}
		cmd.LaunchWorkload = &l
	case cmd.PrepareImage != nil:
		c := *cmd.PrepareImage
		if c.RegistryAuth == "" {
			c.RegistryAuth = s.registryAuth(ctx, c.Image)
		}
		cmd.PrepareImage = &c
	}
	return cmd
}

func (s *Server) mint(ctx context.Context, c *capability.PrepareArtifactCommand) {
	cs, err := s.contentStore()
	if err == nil {
		c.URL, c.ExpiresAt, err = cs.ReadURL(ctx, c.SHA256, s.readTTL())
	}
	if err != nil {
		c.URL, c.ExpiresAt = "", time.Time{}
		s.log.Warn("cannot mint a content read; the command goes without one", "artifact", c.Ref(), "err", err)
	}
}
