package artifactcache

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"
)

// CopySource names what a node measured when it timed itself reading
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
const CopySource = "node_artifact_copy"

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

// fetchAttempts bounds how often one prepare fetches content that arrived
// wrong (a digest or length that does not match) or was cut off, within the
// life of its minted read.
const fetchAttempts = 3

// Options configures how the runtime keeps Artifact copies. The zero
// value is usable.
type Options struct {
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

// Cache is a node's Artifact copies. Its methods are safe for
// concurrent use; it is set up on first use from the runtime's root.
type Cache struct {
	opts Options

	// configured is the root New was given; init sets root from it.
	configured string
	once       sync.Once
	root       string
	initErr    error
	client     *http.Client
	log        *slog.Logger
	now        func() time.Time
	// inUse lists the digests containers on this node mount (New).
	inUse func(ctx context.Context) (map[string]bool, error)

	mu       sync.Mutex
	held     map[string]*heldCopy  // published copies, by digest
	fetching map[string]*fetchCall // copies in progress, by digest
	reserved int64                 // bytes promised to copies in progress
	pins     map[string]int        // launches holding a digest until their container exists
	readings []nodeproto.LinkReading
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

// New returns the cache of Artifact copies under root, set up on its first
// use (what a previous agent left there is read then). inUse lists the
// digests that containers on this node mount: those are never evicted. With
// an empty root every use fails with failure.ErrUnavailable: the node has
// nowhere to keep copies.
func New(root string, opts Options, inUse func(ctx context.Context) (map[string]bool, error)) *Cache {
	return &Cache{opts: opts, configured: root, inUse: inUse}
}

// ready sets the cache up on first use and says whether it can be used.
func (s *Cache) ready() error {
	s.once.Do(func() {
		if s.configured == "" {
			s.initErr = failure.Unavailable("this node has no artifact root (start the agent with --artifact-root DIR), so it cannot hold Artifacts")
			return
		}
		s.initErr = s.init(s.configured)
	})
	return s.initErr
}

// Path is where the copy of one digest is kept, held or not: the file, or
// the directory of a tar version. It is what a container mounts.
func (s *Cache) Path(digest string) string { return contentPath(s.configured, digest) }

// init reads what a previous run of the agent left under root: published
// copies are kept, copies in progress are removed.
func (s *Cache) init(root string) error {
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

func (s *Cache) dir(digest string) string { return filepath.Join(s.root, "sha256", digest) }

// contentPath is what a container mounts: the file, or the directory of a
// tar version.
func (s *Cache) contentPath(digest string) string { return contentPath(s.root, digest) }

func contentPath(root, digest string) string {
	return filepath.Join(root, "sha256", digest, "content")
}

// Prepare replicates one immutable version onto this machine. It
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
// copy. The whole copy is timed as one link reading (CopySource).
func (s *Cache) Prepare(ctx context.Context, command nodeproto.PrepareArtifactCommand) error {
	if err := s.ready(); err != nil {
		return fmt.Errorf("prepare artifact %s: %w", command.Ref(), err)
	}
	return s.prepare(ctx, command)
}

func (s *Cache) prepare(ctx context.Context, c nodeproto.PrepareArtifactCommand) error {
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
func (s *Cache) touch(digest string, h *heldCopy, ref string) {
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

// record keeps one timed copy as a link reading, when it was large enough
// to time a path rather than a round trip.
func (s *Cache) record(c nodeproto.PrepareArtifactCommand, took time.Duration) {
	if c.Size < s.opts.MinLinkSample || took <= 0 {
		return
	}
	now := s.now().UTC()
	bps := int64(float64(c.Size) / took.Seconds())
	s.mu.Lock()
	defer s.mu.Unlock()
	s.readings = append(s.readings, nodeproto.LinkReading{
		Source: CopySource, BytesPerSecond: bps, Confidence: MeasuredLinkConfidence,
		Bytes: c.Size, MeasuredAt: now, ValidUntil: now.Add(MeasuredLinkValidity),
	})
}

// describe adds the inventory and the link floor to facts: the slowest
// reading still valid, none when every reading has expired.
func (s *Cache) describe(facts *nodeproto.NodeFacts) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var floor *nodeproto.LinkReading
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
		facts.Artifacts = append(facts.Artifacts, nodeproto.HeldArtifact{SHA256: d, Size: h.Size, Refs: slices.Clone(h.Refs)})
	}
}

// Describe adds the Artifact inventory and link floor to facts, or a note
// when the configured root cannot be used. A cache without a root adds
// nothing: the runtime's facts already say no root is configured.
func (s *Cache) Describe(facts *nodeproto.NodeFacts) {
	if err := s.ready(); err != nil {
		if s.configured != "" {
			facts.Notes = append(facts.Notes, fmt.Sprintf("artifacts: %v", err))
		}
		return
	}
	s.describe(facts)
}

// Hold prepares every Artifact of a launch (or waits for the prepares under
// way) and pins them: until release is called, once the container exists,
// no eviction removes them between their preparation and the container that
// mounts them. A launch without Artifacts holds nothing.
func (s *Cache) Hold(ctx context.Context, artifacts []nodeproto.ArtifactMount) (release func(), err error) {
	if len(artifacts) == 0 {
		return func() {}, nil
	}
	if err := s.ready(); err != nil {
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
