package dockerruntime

// This file is the node's side of Artifacts: fetching one immutable version
// through the location the control plane minted for it, landing it on disk
// under the artifact root exactly (hashed on the way in, checked, published
// atomically), keeping the disk within its budget, mounting copies into
// containers read-only, and timing every copy as the node's link reading.
//
// Layout under the artifact root (WithArtifactRoot):
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

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/filters"

	"github.com/mercator/mercator/capability"
	"github.com/mercator/mercator/dockerengine"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/internal/directio"
	"github.com/mercator/mercator/internal/hashcopy"
)

// ArtifactCopySource names what a node measured when it timed itself reading
// Artifact content, in the words of the process that did it. It is the whole
// copy: the bytes crossing the path, landing on this disk, and being hashed
// on the way past, because one read does all three jobs here and the node
// holds one duration over all of them.
//
// The name says so rather than claiming the link alone, and the difference
// is not pedantry. A machine on a ten gigabit path whose Artifact root is a
// slow disk delivers content at the disk's rate, and that rate is the honest
// answer to both questions anything asks this fact: how long the next read
// of forty gigabytes takes here, and whether a Run that states a floor on
// reading its dataset can be served by this machine. Timing the socket alone
// would answer neither, and would be wrong in the direction that wins
// placements the machine cannot honour.
const ArtifactCopySource = "node_artifact_copy"

// MeasuredLinkConfidence is how much a node stands behind its own reading of
// a path. It is more than scheduler.AssumedLinkConfidence, which is what
// Mercator's fleet-wide guess about an unmeasured path is worth, and
// deliberately short of certainty: what is published is the slowest transfer
// this node has seen, which is a floor over a handful of readings rather
// than a distribution.
//
// The figure itself is stated rather than derived, and that is the honest
// description of it. Deriving it from the sample count would be an estimator
// this slice has not measured, and predicted-versus-actual for the fetch
// stage is what a calibration slice will replace it with.
//
// (The node-agent design calls the assumption domain.AssumedLinkConfidence; Mercator has
// no domain package, and the assumption lives with its only reader, the
// scheduler.)
const MeasuredLinkConfidence = 0.9

// MeasuredLinkValidity is how long one reading of a path stands. A
// measurement is evidence about the path as it was, and a node that has
// moved nothing for an hour is not evidence about the path now: it keeps
// reporting its liveness, its containers, and its disk, so without an expiry
// its oldest reading would be published as a current fact forever.
//
// It is the life of one reading, and every reading serves it alone. That is
// what retires the slow one: the machine that read a hundred megabits while
// a container shared its link stops standing behind that reading an hour
// later however busy it has been since, because no later transfer can extend
// a window it was not measured in.
const MeasuredLinkValidity = time.Hour

// DefaultMinLinkSample is the smallest copy whose timing counts as a link
// reading. Below it a copy's duration is mostly the request's round trip,
// and a reading of it would publish a floor the path does not have.
const DefaultMinLinkSample = 8 << 20

// LabelArtifacts lists, comma-separated, the digests of the Artifact content
// a container mounts. It is how the node knows, after a restart too, which
// copies running work uses and must not be evicted.
const LabelArtifacts = dockerengine.LabelArtifacts

// fetchAttempts bounds how often one prepare fetches content that arrived
// wrong (a digest or length that does not match) or was cut off, within the
// life of its minted read.
const fetchAttempts = 3

// ArtifactOptions configures how the runtime keeps Artifact copies. The zero
// value is usable.
type ArtifactOptions struct {
	// Budget is the most bytes of Artifact content kept under the root;
	// older copies no running or placed work uses are evicted to make room,
	// least recently used first. 0 means no budget but the disk's free
	// space, which is always checked.
	Budget int64
	// MinLinkSample is the smallest copy timed as a link reading (default
	// DefaultMinLinkSample; negative: every copy).
	MinLinkSample int64
	// Client fetches content (default: a client with connection and
	// response-header timeouts and no overall one, since a copy of a large
	// version takes as long as it takes).
	Client *http.Client
	// Logger reports corrupt transfers retried and copies evicted.
	Logger *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// WithArtifactOptions sets how Artifact copies are kept (see
// ArtifactOptions). It has effect only with WithArtifactRoot.
func WithArtifactOptions(o ArtifactOptions) Option {
	return func(docker *Runtime) { docker.artifacts.opts = o }
}

// artifactStore is the runtime's Artifact copies. Its methods are safe for
// concurrent use; it is set up on first use from the runtime's root.
type artifactStore struct {
	opts ArtifactOptions

	once    sync.Once
	root    string
	initErr error
	client  *http.Client
	log     *slog.Logger
	now     func() time.Time
	// inUse lists the digests containers on this node mount (see
	// Runtime.artifactsInUse).
	inUse func(ctx context.Context) (map[string]bool, error)

	mu       sync.Mutex
	held     map[string]*heldCopy  // published copies, by digest
	fetching map[string]*fetchCall // copies in progress, by digest
	reserved int64                 // bytes promised to copies in progress
	pins     map[string]int        // launches holding a digest until their container exists
	readings []capability.LinkReading
}

type heldCopy struct {
	Size   int64     `json:"size"`
	Format string    `json:"format"`
	Refs   []string  `json:"refs"`
	used   time.Time // last use; the directory's mtime on disk
}

// fetchCall is one copy in flight, shared by every prepare of its digest.
type fetchCall struct {
	done chan struct{}
	err  error // written before done is closed
}

func (docker *Runtime) artifactStore() (*artifactStore, error) {
	s := &docker.artifacts
	s.once.Do(func() {
		if docker.artifactRoot == "" {
			s.initErr = failure.Unavailable("this node has no artifact root (start the agent with --artifact-root DIR), so it cannot hold Artifacts")
			return
		}
		s.inUse = docker.artifactsInUse
		s.initErr = s.init(docker.artifactRoot)
	})
	return s, s.initErr
}

// init reads what a previous run of the agent left under root: published
// copies are kept, copies in progress are removed.
func (s *artifactStore) init(root string) error {
	s.root = root
	s.client = s.opts.Client
	if s.client == nil {
		transport := http.DefaultTransport.(*http.Transport).Clone()
		transport.ResponseHeaderTimeout = 30 * time.Second
		transport.DialContext = (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext
		s.client = &http.Client{Transport: transport}
	}
	s.log = s.opts.Logger
	if s.log == nil {
		s.log = slog.Default()
	}
	s.now = s.opts.Now
	if s.now == nil {
		s.now = time.Now
	}
	if s.opts.MinLinkSample == 0 {
		s.opts.MinLinkSample = DefaultMinLinkSample
	}
	s.held, s.fetching, s.pins = map[string]*heldCopy{}, map[string]*fetchCall{}, map[string]int{}
	if err := os.RemoveAll(filepath.Join(root, "tmp")); err != nil {
		return fmt.Errorf("artifact root %s: clearing copies in progress: %w", root, err)
	}
	for _, dir := range []string{"sha256", "tmp"} {
		if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
			return fmt.Errorf("artifact root %s: %w", root, err)
		}
	}
	entries, err := os.ReadDir(filepath.Join(root, "sha256"))
	if err != nil {
		return fmt.Errorf("artifact root %s: %w", root, err)
	}
	for _, e := range entries {
		dir := filepath.Join(root, "sha256", e.Name())
		raw, err := os.ReadFile(filepath.Join(dir, "meta.json"))
		var h heldCopy
		if err != nil || !validDigest(e.Name()) || json.Unmarshal(raw, &h) != nil {
			// Not something this agent published: leave nothing that
			// could be mistaken for a verified copy.
			_ = os.RemoveAll(dir)
			continue
		}
		if info, err := os.Stat(dir); err == nil {
			h.used = info.ModTime()
		}
		s.held[e.Name()] = &h
	}
	return nil
}

func validDigest(d string) bool {
	if len(d) != 64 {
		return false
	}
	for _, c := range d {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func (s *artifactStore) dir(digest string) string { return filepath.Join(s.root, "sha256", digest) }

// contentPath is what a container mounts: the file, or the directory of a
// tar version.
func (s *artifactStore) contentPath(digest string) string { return contentPath(s.root, digest) }

func contentPath(root, digest string) string {
	return filepath.Join(root, "sha256", digest, "content")
}

// PrepareArtifact replicates one immutable version onto this machine. It
// reads through the location the control plane minted for this one fetch
// and nowhere else: the object store's own key stays in the control plane,
// so a node holds no standing read of anything and a compromised machine can
// fetch exactly the content it was told to, until the read expires.
//
// A command with no minted read is refused rather than attempted
// (failure.ErrInvalid), and so is one whose read has expired, unless the
// version is already held and nothing needs fetching. The durable
// location the catalog states is a name for content, and a node that went
// to the network with it would fail in the object store's vocabulary
// instead of in Mercator's, which is an operator reading a 404 for a
// missing configuration.
//
// The content is streamed to disk under the artifact root while it is
// hashed, and published only when its length and SHA-256 match the
// command's; content that arrives wrong is discarded and fetched again, a
// few times, within the read's life. Concurrent prepares of one version
// share one copy; a version already held returns at once. Room is made by
// evicting the least recently used copies that no container on this node
// mounts; content that cannot fit is an error saying so, and never a partial
// copy. The whole copy is timed as one link reading (ArtifactCopySource).
func (docker *Runtime) prepareArtifact(ctx context.Context, command capability.PrepareArtifactCommand) error {
	s, err := docker.artifactStore()
	if err != nil {
		return fmt.Errorf("prepare artifact %s: %w", command.Ref(), err)
	}
	return s.prepare(ctx, command)
}

func (s *artifactStore) prepare(ctx context.Context, c capability.PrepareArtifactCommand) error {
	ref := c.Ref()
	switch {
	case !validDigest(c.SHA256):
		return failure.Invalid("sha256", "prepare artifact %s: %q is not a SHA-256 digest", ref, c.SHA256)
	case c.Size < 0:
		return failure.Invalid("size", "prepare artifact %s: size %d is negative", ref, c.Size)
	case c.Format != "" && c.Format != "file" && c.Format != "tar":
		return failure.Invalid("format", "prepare artifact %s: unknown format %q (this agent knows file and tar)", ref, c.Format)
	}
	// Content already held needs no read: a node keeps running work whose
	// data it has while the content store is unreachable.
	s.mu.Lock()
	if h := s.held[c.SHA256]; h != nil {
		s.touch(c.SHA256, h, ref)
		s.mu.Unlock()
		return nil
	}
	s.mu.Unlock()
	switch {
	case c.URL == "":
		return failure.Invalid("url", "prepare artifact %s: the command carries no minted read. A node fetches Artifact content only through a location the control plane minted for that one fetch, and this command has none, so nothing was fetched", ref)
	case !c.ExpiresAt.IsZero() && !s.now().Before(c.ExpiresAt):
		return failure.Invalid("url", "prepare artifact %s: the minted read expired at %s, before the fetch began; the control plane mints a fresh one when it sends the command again", ref, c.ExpiresAt.UTC().Format(time.RFC3339))
	}
	for {
		s.mu.Lock()
		if h := s.held[c.SHA256]; h != nil {
			s.touch(c.SHA256, h, ref)
			s.mu.Unlock()
			return nil
		}
		call := s.fetching[c.SHA256]
		if call == nil {
			call = &fetchCall{done: make(chan struct{})}
			s.fetching[c.SHA256] = call
			s.mu.Unlock()
			call.err = s.fetch(ctx, c)
			s.mu.Lock()
			delete(s.fetching, c.SHA256)
			s.mu.Unlock()
			close(call.done)
			return call.err
		}
		s.mu.Unlock()
		select {
		case <-call.done:
		case <-ctx.Done():
			return fmt.Errorf("prepare artifact %s: %w", ref, ctx.Err())
		}
		if call.err == nil || !(errors.Is(call.err, context.Canceled) || errors.Is(call.err, context.DeadlineExceeded)) {
			if call.err != nil {
				return call.err
			}
			continue // now held: record this reference too
		}
		// The prepare that was copying gave up; this one copies itself.
	}
}

// touch records a use of a held copy (under s.mu) and, for a reference it
// did not know, rewrites the copy's metadata.
func (s *artifactStore) touch(digest string, h *heldCopy, ref string) {
	now := s.now()
	h.used = now
	_ = os.Chtimes(s.dir(digest), now, now)
	if ref == "" || slices.Contains(h.Refs, ref) {
		return
	}
	h.Refs = append(h.Refs, ref)
	sort.Strings(h.Refs)
	if err := writeMeta(s.dir(digest), h); err != nil {
		s.log.Warn("recording artifact reference", "ref", ref, "err", err)
	}
}

func writeMeta(dir string, h *heldCopy) error {
	raw, err := json.Marshal(h)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "meta.json.tmp")
	if err := writeSynced(tmp, raw); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, "meta.json"))
}

func writeSynced(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// fetch makes room, copies, verifies and publishes one version, retrying
// content that arrived wrong.
func (s *artifactStore) fetch(ctx context.Context, c capability.PrepareArtifactCommand) error {
	ref := c.Ref()
	if err := s.reserve(ctx, c); err != nil {
		return err
	}
	defer func() {
		s.mu.Lock()
		s.reserved -= c.Size
		s.mu.Unlock()
	}()
	var last error
	for attempt := 1; attempt <= fetchAttempts; attempt++ {
		if !c.ExpiresAt.IsZero() && !s.now().Before(c.ExpiresAt) {
			return fmt.Errorf("prepare artifact %s: the minted read expired at %s after %d failed attempt(s); last: %w",
				ref, c.ExpiresAt.UTC().Format(time.RFC3339), attempt-1, last)
		}
		start := time.Now()
		err := s.copyOnce(ctx, c)
		if err == nil {
			s.record(c, time.Since(start))
			return nil
		}
		last = err
		var retry *retryable
		if !errors.As(err, &retry) || ctx.Err() != nil {
			return err
		}
		s.log.Warn("artifact copy failed; fetching again", "ref", ref, "attempt", attempt, "err", err)
	}
	return fmt.Errorf("prepare artifact %s: gave up after %d attempts: %w", ref, fetchAttempts, last)
}

// retryable marks a copy that may succeed if made again: content that
// arrived wrong or was cut off, or a server that could not answer.
type retryable struct{ err error }

func (r *retryable) Error() string { return r.err.Error() }
func (r *retryable) Unwrap() error { return r.err }

// reserve makes room for c: within the budget, and on the disk. It evicts
// least recently used copies that no container mounts and no launch holds,
// and fails, evicting nothing more, when that is not enough.
func (s *artifactStore) reserve(ctx context.Context, c capability.PrepareArtifactCommand) error {
	inUse, err := s.inUse(ctx)
	if err != nil {
		return fmt.Errorf("prepare artifact %s: cannot tell which copies running work uses, so none is evicted: %w", c.Ref(), err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var heldBytes int64
	for _, h := range s.held {
		heldBytes += h.Size
	}
	// Margin for the metadata and filesystem blocks a copy needs beyond
	// its bytes.
	need := c.Size + 1<<20
	fits := func() (bool, string) {
		if b := s.opts.Budget; b > 0 && heldBytes+s.reserved+c.Size > b {
			return false, fmt.Sprintf("the artifact budget is %d bytes and %d are held or being copied", b, heldBytes+s.reserved)
		}
		free, err := diskFree(s.root)
		if err != nil {
			return false, fmt.Sprintf("free space of %s unknown: %v", s.root, err)
		}
		if free-s.reserved < need {
			return false, fmt.Sprintf("the disk holding %s has %d bytes free and %d are promised to copies in progress", s.root, free, s.reserved)
		}
		return true, ""
	}
	ok, why := fits()
	if !ok {
		var victims []string
		for d := range s.held {
			if !inUse[d] && s.pins[d] == 0 {
				victims = append(victims, d)
			}
		}
		sort.Slice(victims, func(i, j int) bool { return s.held[victims[i]].used.Before(s.held[victims[j]].used) })
		for _, d := range victims {
			if ok, why = fits(); ok {
				break
			}
			h := s.held[d]
			if err := s.evict(d); err != nil {
				return fmt.Errorf("prepare artifact %s: evicting %s: %w", c.Ref(), d, err)
			}
			heldBytes -= h.Size
			s.log.Info("evicted artifact copy", "sha256", d, "refs", h.Refs, "size", h.Size, "for", c.Ref())
		}
		ok, why = fits()
	}
	if !ok {
		return &failure.Error{Kind: failure.ErrConflict, Field: "size", Message: fmt.Sprintf(
			"prepare artifact %s: %d bytes do not fit on this node: %s, and every copy still held is used by work on this node; nothing was written", c.Ref(), c.Size, why)}
	}
	s.reserved += c.Size
	return nil
}

// evict removes one copy (under s.mu): out of the published name first, in
// one rename, so no reader sees it half removed.
func (s *artifactStore) evict(digest string) error {
	doomed := filepath.Join(s.root, "tmp", "evict-"+digest)
	if err := os.Rename(s.dir(digest), doomed); err != nil {
		return err
	}
	delete(s.held, digest)
	return os.RemoveAll(doomed)
}

// copyOnce fetches the content into a directory under tmp and publishes it
// when its length and digest are right.
func (s *artifactStore) copyOnce(ctx context.Context, c capability.PrepareArtifactCommand) (err error) {
	ref := c.Ref()
	stage, err := os.MkdirTemp(filepath.Join(s.root, "tmp"), c.SHA256[:12]+"-")
	if err != nil {
		return diskError(ref, c.Size, err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(stage)
		}
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.URL, nil)
	if err != nil {
		return failure.Invalid("url", "prepare artifact %s: the minted read is not a URL this node can request: %v", ref, err)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("prepare artifact %s: %w", ref, ctx.Err())
		}
		return &retryable{failure.Unavailable("prepare artifact %s: the content could not be reached: %v", ref, redactURL(err, c.URL))}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return readRefusal(ref, resp)
	}
	if resp.ContentLength >= 0 && resp.ContentLength != c.Size {
		return &retryable{fmt.Errorf("prepare artifact %s: the server announced %d bytes, the version has %d", ref, resp.ContentLength, c.Size)}
	}
	content := filepath.Join(stage, "content")
	var sink contentSink
	if c.Format == "tar" {
		sink, err = newTarSink(content)
	} else {
		sink, err = newFileSink(content)
	}
	if err != nil {
		return diskError(ref, c.Size, err)
	}
	n, digest, err := pipeline(resp.Body, sink, c.Size)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("prepare artifact %s: %w", ref, ctx.Err())
		}
		var sinkErr *sinkError
		if errors.As(err, &sinkErr) {
			if sinkErr.disk {
				return diskError(ref, c.Size, sinkErr.err)
			}
			return &retryable{fmt.Errorf("prepare artifact %s: the content is not a valid %s: %w", ref, c.Format, sinkErr.err)}
		}
		return &retryable{fmt.Errorf("prepare artifact %s: reading the content after %d of %d bytes: %w", ref, n, c.Size, err)}
	}
	if n != c.Size || digest != c.SHA256 {
		return &retryable{fmt.Errorf("prepare artifact %s: the content that arrived is not the version: %d bytes with sha256 %s, want %d bytes with sha256 %s; it was discarded",
			ref, n, digest, c.Size, c.SHA256)}
	}
	h := &heldCopy{Size: c.Size, Format: cmpOr(c.Format, "file"), Refs: []string{ref}}
	if err := writeMeta(stage, h); err != nil {
		return diskError(ref, c.Size, err)
	}
	if err := syncDir(stage); err != nil {
		return diskError(ref, c.Size, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := os.Rename(stage, s.dir(c.SHA256)); err != nil {
		return diskError(ref, c.Size, err)
	}
	if err := syncDir(filepath.Join(s.root, "sha256")); err != nil {
		return diskError(ref, c.Size, err)
	}
	h.used = s.now()
	s.held[c.SHA256] = h
	return nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// redactURL keeps the minted read's signature out of an error: the URL is
// a credential for as long as it lives.
func redactURL(err error, raw string) string {
	msg := err.Error()
	if i := strings.IndexByte(raw, '?'); i >= 0 {
		msg = strings.ReplaceAll(msg, raw, raw[:i]+"?…")
	}
	return msg
}

// readRefusal turns a non-200 answer into an error in Mercator's words,
// keeping the server's own message (the control plane's API error, or an
// object store's XML) short.
func readRefusal(ref string, resp *http.Response) error {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	msg := strings.TrimSpace(string(raw))
	var apiErr struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(raw, &apiErr) == nil && apiErr.Error.Message != "" {
		msg = apiErr.Error.Message
	}
	if len(msg) > 300 {
		msg = msg[:300] + "…"
	}
	switch {
	case resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden:
		return failure.Unauthorized("prepare artifact %s: the minted read was refused (HTTP %d): %s", ref, resp.StatusCode, msg)
	case resp.StatusCode == http.StatusNotFound:
		return &failure.Error{Kind: failure.ErrNotFound, Message: fmt.Sprintf("prepare artifact %s: the content store does not hold this version (HTTP 404): %s", ref, msg)}
	case resp.StatusCode >= 500 || resp.StatusCode == http.StatusTooManyRequests:
		return &retryable{failure.Unavailable("prepare artifact %s: the content store could not answer (HTTP %d): %s", ref, resp.StatusCode, msg)}
	}
	return fmt.Errorf("prepare artifact %s: unexpected answer to the minted read (HTTP %d): %s", ref, resp.StatusCode, msg)
}

// diskError describes a failure to write under the artifact root. A full
// disk says so in those words: the copy was removed, and what is left is
// the disk's state before the prepare.
func diskError(ref string, size int64, err error) error {
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return &failure.Error{Kind: failure.ErrConflict, Field: "size", Message: fmt.Sprintf(
			"prepare artifact %s: the disk holding the artifact root is full (%d bytes needed); the partial copy was removed: %v", ref, size, err)}
	}
	return fmt.Errorf("prepare artifact %s: writing under the artifact root: %w", ref, err)
}

// record keeps one timed copy as a link reading, when it was large enough
// to time a path rather than a round trip.
func (s *artifactStore) record(c capability.PrepareArtifactCommand, took time.Duration) {
	if c.Size < s.opts.MinLinkSample || took <= 0 {
		return
	}
	now := s.now().UTC()
	bps := int64(float64(c.Size) / took.Seconds())
	s.mu.Lock()
	defer s.mu.Unlock()
	s.readings = append(s.readings, capability.LinkReading{
		Source: ArtifactCopySource, BytesPerSecond: bps, Confidence: MeasuredLinkConfidence,
		Bytes: c.Size, MeasuredAt: now, ValidUntil: now.Add(MeasuredLinkValidity),
	})
}

// describe adds the inventory and the link floor to facts: the slowest
// reading still valid, none when every reading has expired.
func (s *artifactStore) describe(facts *capability.NodeFacts) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var floor *capability.LinkReading
	kept := s.readings[:0]
	for _, r := range s.readings {
		if !now.Before(r.ValidUntil) {
			continue
		}
		kept = append(kept, r)
		if floor == nil || r.BytesPerSecond < floor.BytesPerSecond {
			r := r
			floor = &r
		}
	}
	s.readings = kept
	facts.Link = floor
	digests := make([]string, 0, len(s.held))
	for d := range s.held {
		digests = append(digests, d)
	}
	sort.Strings(digests)
	for _, d := range digests {
		h := s.held[d]
		facts.Artifacts = append(facts.Artifacts, capability.HeldArtifact{SHA256: d, Size: h.Size, Refs: slices.Clone(h.Refs)})
	}
}

// describeArtifacts adds the Artifact inventory and link floor to facts, or
// a note when this node cannot hold Artifacts.
func (docker *Runtime) describeArtifacts(facts *capability.NodeFacts) {
	s, err := docker.artifactStore()
	if err != nil {
		if docker.artifactRoot != "" {
			facts.Notes = append(facts.Notes, fmt.Sprintf("artifacts: %v", err))
		}
		return
	}
	s.describe(facts)
}

// artifactsInUse lists the digests mounted by this node's containers that
// exist and have not exited: a created container will mount its copies when
// it starts, and a running one reads them.
func (docker *Runtime) artifactsInUse(ctx context.Context) (map[string]bool, error) {
	filter := filters.NewArgs(filters.Arg("label", LabelArtifacts))
	if docker.nodeID != "" {
		filter.Add("label", LabelNode+"="+docker.nodeID)
	}
	list, err := docker.api.ContainerList(ctx, container.ListOptions{All: true, Filters: filter})
	if err != nil {
		return nil, daemonError(err, "list containers that mount artifacts")
	}
	used := map[string]bool{}
	for _, c := range list {
		if c.State == container.StateExited || c.State == container.StateDead {
			continue
		}
		for _, d := range strings.Split(c.Labels[LabelArtifacts], ",") {
			if d != "" {
				used[d] = true
			}
		}
	}
	return used, nil
}

// artifactPath is where the copy of one digest is kept: what a container
// mounts.
func (docker *Runtime) artifactPath(digest string) string {
	return contentPath(docker.artifactRoot, digest)
}

// holdArtifacts prepares every Artifact of a launch (or waits for the
// prepares under way) and pins them: until release is called, once the
// container exists, no eviction removes them between their preparation and
// the container that mounts them.
func (docker *Runtime) holdArtifacts(ctx context.Context, artifacts []capability.ArtifactMount) (release func(), err error) {
	if len(artifacts) == 0 {
		return func() {}, nil
	}
	s, err := docker.artifactStore()
	if err != nil {
		return nil, fmt.Errorf("launch needs Artifacts: %w", err)
	}
	var digests []string
	seen := map[string]bool{}
	for _, a := range artifacts {
		if !seen[a.SHA256] {
			seen[a.SHA256] = true
			digests = append(digests, a.SHA256)
		}
	}
	s.mu.Lock()
	for _, d := range digests {
		s.pins[d]++
	}
	s.mu.Unlock()
	release = func() {
		s.mu.Lock()
		for _, d := range digests {
			if s.pins[d]--; s.pins[d] <= 0 {
				delete(s.pins, d)
			}
		}
		s.mu.Unlock()
	}
	for _, a := range artifacts {
		if err := s.prepare(ctx, a.PrepareArtifactCommand); err != nil {
			release()
			return nil, err
		}
	}
	return release, nil
}

// contentSink receives a version's bytes in order.
type contentSink interface {
	io.Writer
	// finish completes and fsyncs what was written.
	finish() error
	// abort releases what finish would have, after a failure.
	abort()
}

// sinkError is a failure of the sink rather than of the transfer: disk
// marks one writing to disk, otherwise the content itself was malformed.
type sinkError struct {
	err  error
	disk bool
}

func (e *sinkError) Error() string { return e.err.Error() }
func (e *sinkError) Unwrap() error { return e.err }

// fileSink writes a file version, directly to the disk where the
// filesystem allows (package directio says why).
type fileSink struct{ f *directio.Writer }

func newFileSink(path string) (*fileSink, error) {
	f, err := directio.Create(path, 0o444)
	if err != nil {
		return nil, err
	}
	return &fileSink{f: f}, nil
}

func (s *fileSink) Write(p []byte) (int, error) {
	n, err := s.f.Write(p)
	if err != nil {
		return n, &sinkError{err: err, disk: true}
	}
	return n, nil
}

func (s *fileSink) finish() error {
	if err := s.f.Sync(); err != nil {
		s.f.Close()
		return &sinkError{err: err, disk: true}
	}
	if err := s.f.Close(); err != nil {
		return &sinkError{err: err, disk: true}
	}
	return nil
}

func (s *fileSink) abort() { s.f.Close() }

// tarSink extracts a tar stream into a directory as it arrives: regular
// files and directories only, every name inside the directory. Anything
// else (a link, a device, a name that climbs out) makes the content
// invalid. The bytes after the archive's end are read too, because the
// digest is over the whole stream.
type tarSink struct {
	pw   *io.PipeWriter
	done chan error
}

func newTarSink(dir string) (*tarSink, error) {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	pr, pw := io.Pipe()
	s := &tarSink{pw: pw, done: make(chan error, 1)}
	go func() {
		err := extractTar(pr, dir)
		if err == nil {
			_, err = io.Copy(io.Discard, pr)
		}
		pr.CloseWithError(err)
		s.done <- err
	}()
	return s, nil
}

func (s *tarSink) Write(p []byte) (int, error) {
	n, err := s.pw.Write(p)
	if err != nil {
		return n, s.failure(err)
	}
	return n, nil
}

func (s *tarSink) failure(err error) error {
	var se *sinkError
	if errors.As(err, &se) {
		return se
	}
	return &sinkError{err: err}
}

func (s *tarSink) finish() error {
	s.pw.Close()
	if err := <-s.done; err != nil {
		return s.failure(err)
	}
	return nil
}

func (s *tarSink) abort() {
	s.pw.CloseWithError(errors.New("copy abandoned"))
	<-s.done
}

func extractTar(r io.Reader, dir string) error {
	tr := tar.NewReader(r)
	var dirs []string
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return err
		}
		name := path.Clean(strings.TrimPrefix(h.Name, "./"))
		if name == "." && h.Typeflag == tar.TypeDir {
			continue
		}
		if path.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") || strings.ContainsRune(name, 0) {
			return fmt.Errorf("entry %q is outside the artifact", h.Name)
		}
		target := filepath.Join(dir, filepath.FromSlash(name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755); err != nil {
				return &sinkError{err: err, disk: true}
			}
			dirs = append(dirs, target)
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return &sinkError{err: err, disk: true}
			}
			f, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, os.FileMode(h.Mode)&0o555|0o444)
			if err != nil {
				return &sinkError{err: err, disk: errors.Is(err, syscall.ENOSPC) || !errors.Is(err, os.ErrExist)}
			}
			_, err = io.Copy(f, tr)
			if err == nil {
				err = f.Sync()
			}
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				var pe *os.PathError
				return &sinkError{err: err, disk: errors.As(err, &pe)}
			}
		default:
			return fmt.Errorf("entry %q is a %s; an artifact holds regular files and directories only", h.Name, typeName(h.Typeflag))
		}
	}
	dirs = append(dirs, dir)
	for _, d := range dirs {
		if err := syncDir(d); err != nil {
			return &sinkError{err: err, disk: true}
		}
	}
	return nil
}

func typeName(t byte) string {
	switch t {
	case tar.TypeSymlink:
		return "symbolic link"
	case tar.TypeLink:
		return "hard link"
	case tar.TypeChar, tar.TypeBlock:
		return "device"
	case tar.TypeFifo:
		return "named pipe"
	}
	return fmt.Sprintf("entry of type %q", t)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// pipeline copies body into sink while hashing it (hashcopy.Copy: read,
// hash and write at once), reading at most limit+1 bytes, and finishes
// (fsyncs) the sink. It returns how many bytes arrived and their hex digest.
func pipeline(body io.Reader, sink contentSink, limit int64) (int64, string, error) {
	h := sha256.New()
	n, err := hashcopy.Copy(sink, body, h, limit)
	if err != nil {
		sink.abort()
		var we *hashcopy.WriteError
		if errors.As(err, &we) {
			return n, "", we.Err
		}
		return n, "", err
	}
	if err := sink.finish(); err != nil {
		return n, "", err
	}
	return n, hex.EncodeToString(h.Sum(nil)), nil
}
