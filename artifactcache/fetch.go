package artifactcache

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/hostfacts"
	"github.com/mercator/mercator/nodeproto"
)

// fetch makes room, copies, verifies and publishes one version, retrying
// content that arrived wrong.
func (s *Cache) fetch(ctx context.Context, c nodeproto.PrepareArtifactCommand) error {
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
func (s *Cache) reserve(ctx context.Context, c nodeproto.PrepareArtifactCommand) error {
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
		free, err := hostfacts.DiskFree(s.root)
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
func (s *Cache) evict(digest string) error {
	doomed := filepath.Join(s.root, "tmp", "evict-"+digest)
	if err := os.Rename(s.dir(digest), doomed); err != nil {
		return err
	}
	delete(s.held, digest)
	return os.RemoveAll(doomed)
}

// copyOnce fetches the content into a directory under tmp and publishes it
// when its length and digest are right.
func (s *Cache) copyOnce(ctx context.Context, c nodeproto.PrepareArtifactCommand) (err error) {
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
