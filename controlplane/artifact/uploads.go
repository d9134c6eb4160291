package artifact

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/content"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/internal/directio"
	"github.com/mercator/mercator/internal/hashcopy"
)

// DefaultContentReadTTL is the life of a minted content read when
// Config.ReadTTL is zero. A read is checked when a fetch begins, not
// while it runs, so it needs to cover the wait before the fetch, not the
// copy itself.
const DefaultContentReadTTL = 15 * time.Minute

// uploadTTL is how long an upload that is not committed is kept after it
// was started. It is fixed at creation and not extended by later writes:
// a refreshed expiry let one upload be kept open forever by a byte a day.
// A client that needs longer starts again (the content it already sent
// elsewhere is found by digest, not re-sent).
const uploadTTL = 24 * time.Hour

// DefaultMaxUploadSize is Config.MaxUploadSize's default: the largest
// upload a client may declare.
const DefaultMaxUploadSize = 1 << 40

func (s *Service) maxUploadSize() int64 {
	if s.cfg.MaxUploadSize > 0 {
		return s.cfg.MaxUploadSize
	}
	return DefaultMaxUploadSize
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
	Project   string    `json:"project,omitempty"` // the name's (scope.go)
}

func (s *Service) contentStore() (content.Store, error) {
	if s.cfg.Content == nil {
		return nil, failure.Unavailable("this control plane has no content store configured, so it cannot hold Artifacts")
	}
	return s.cfg.Content, nil
}

func (s *Service) uploadDir() string {
	if s.cfg.UploadDir != "" {
		return s.cfg.UploadDir
	}
	return filepath.Join(os.TempDir(), "mercator-uploads")
}

func (s *Service) readTTL() time.Duration {
	if s.cfg.ReadTTL > 0 {
		return s.cfg.ReadTTL
	}
	return DefaultContentReadTTL
}

// createUpload starts an upload (POST /v1/artifacts/{name}/uploads), or,
// when the client's digest names content this name already has (or the
// content store already holds), answers with that version and nothing to
// send.
func (s *Service) createUpload(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if err := api.ValidateArtifactName("name", name); err != nil {
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
	case req.Size > s.maxUploadSize():
		// 413, with the body of an invalid argument: the client's error
		// names the field and the limit.
		httpapi.WriteJSON(w, http.StatusRequestEntityTooLarge, api.ErrorOf(failure.Invalid("size",
			"an upload of %d bytes is larger than this control plane accepts (at most %d bytes, its --max-upload-size); nothing was stored",
			req.Size, s.maxUploadSize())))
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
	if err == nil {
		req.Project, err = s.pushProject(r, name, req.Project) // scope.go
	}
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
				v, _, aerr := s.addVersion(r.Context(), req.Project, name, req.SHA256, req.Size, req.Format)
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
	meta := uploadMeta{ID: httpapi.NewID("up-"), Name: name, Size: req.Size, SHA256: req.SHA256, Format: req.Format, ExpiresAt: s.now().Add(uploadTTL),
		Project: req.Project}
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
	s.mu.Lock()
	if s.uploads == nil {
		s.uploads = map[string]*upload{}
	}
	s.uploads[meta.ID] = u
	s.mu.Unlock()
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
func (s *Service) loadUpload(id string) (*upload, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if u := s.uploads[id]; u != nil {
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
	if s.uploads == nil {
		s.uploads = map[string]*upload{}
	}
	s.uploads[id] = u
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

func (s *Service) dropUpload(u *upload) {
	s.mu.Lock()
	delete(s.uploads, u.meta.ID)
	s.mu.Unlock()
	_ = os.RemoveAll(u.dir)
}

// SweepUploads removes uploads past their expiry and reports how many.
// The control plane's retention sweep calls it on a timer, on every
// replica (each stages its own uploads). It is best effort: an upload dir
// that cannot be read is left for the next sweep.
func (s *Service) SweepUploads() int {
	entries, err := os.ReadDir(s.uploadDir())
	if err != nil {
		return 0
	}
	swept := 0
	now := s.now()
	for _, e := range entries {
		raw, err := os.ReadFile(filepath.Join(s.uploadDir(), e.Name(), "meta.json"))
		var meta uploadMeta
		if err != nil || json.Unmarshal(raw, &meta) != nil || now.Before(meta.ExpiresAt) {
			continue
		}
		s.mu.Lock()
		u := s.uploads[meta.ID]
		s.mu.Unlock()
		if u != nil && !u.mu.TryLock() {
			continue // being written to
		}
		swept++
		if u != nil {
			s.dropUpload(u)
			u.mu.Unlock()
			continue
		}
		_ = os.RemoveAll(filepath.Join(s.uploadDir(), e.Name()))
	}
	return swept
}

func (s *Service) getUpload(w http.ResponseWriter, r *http.Request) {
	u, err := s.scopedUpload(r) // scope.go
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
func (s *Service) putUpload(w http.ResponseWriter, r *http.Request) {
	u, err := s.scopedUpload(r) // scope.go
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
	httpapi.WriteJSON(w, http.StatusOK, u.view())
}

// commitUpload verifies a complete upload and adds its version: 201 with a
// new version, 200 with the version that already had these bytes. The
// client's check comes in the body (api.CommitRequest: a CRC-32C or a
// SHA-256), from the start of the upload (a SHA-256), or both; with none
// the commit is refused and the upload kept, so the client can commit
// again with its check. A check that does not match discards the upload.
func (s *Service) commitUpload(w http.ResponseWriter, r *http.Request) {
	u, err := s.scopedUpload(r) // scope.go
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
	v, created, err := s.addVersion(r.Context(), u.meta.Project, u.meta.Name, digest, u.meta.Size, u.meta.Format)
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
