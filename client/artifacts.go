package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/internal/hashcopy"
)

// Payload is the content of one push: its exact size, its format
// (api.ArtifactFile or api.ArtifactTar), and Open, which returns the
// content from byte offset on. Open is called again to resume after an
// interrupted send, and to reread what was sent before when a push checks
// as it sends, so it must return the same bytes every time; content that
// ends before Size bytes, or goes on after them, is refused as changed.
//
// SHA256 is the content's digest (64 lowercase hex digits) when the caller
// already knows it, and empty otherwise, which is the cheap case: the
// client then checks the content with a CRC-32C as the bytes go out (see
// PushArtifact).
//
// OpenFile, which may be nil, returns the same content as a regular file
// whose current position is offset. A push over plain HTTP on Linux then
// makes the file itself the request's body, which the transport hands to
// the kernel (sendfile), and computes its check with a second read through
// Open alongside (see sendFileFrom); FilePayload sets it.
type Payload struct {
	Size     int64
	SHA256   string
	Format   string
	Open     func(offset int64) (io.ReadCloser, error)
	OpenFile func(offset int64) (*os.File, error)
}

// PushOptions tunes PushArtifact. The zero value is usable.
type PushOptions struct {
	// Project is the project the name belongs to (docs/teams.md); "" is
	// the caller's (its token's first project, else default).
	Project string
	// UploadID, when set, is an upload of this content started earlier
	// (by a push that was interrupted); it is resumed where it stands if
	// the control plane still holds it, and a new upload starts otherwise.
	UploadID string
	// Started is called with the upload's ID once it exists, so a caller
	// can remember it for a later UploadID.
	Started func(id string)
	// Progress is called as content is sent, with the bytes the control
	// plane holds and the total.
	Progress func(sent, total int64)
	// Attempts bounds how many sends one push makes, resuming each from
	// where the upload stands (default 8).
	Attempts int
}

// PushArtifact uploads one version of the named Artifact and returns it:
// the existing version when the control plane already holds this content
// under this name, else a new one. A send that breaks is resumed from
// where the upload stands, up to Attempts times.
//
// When p.SHA256 is empty, the client computes a CRC-32C of new content as
// it is sent (in a pipeline that reads the content once, so the check
// overlaps the send rather than adding to it; or, for a file sent by the
// kernel, by a read of the file alongside: see sendFileFrom) and states it
// at the commit; the control plane, which computes a CRC-32C beside its SHA-256 as it stores the
// bytes, refuses the commit, discarding the upload, unless the two are
// the same. The CRC-32C is the end-to-end check against accidental damage
// (a file changed under the push, bytes broken on the way) at a fraction
// of SHA-256's CPU; the version is known by the control plane's SHA-256
// (see api.CommitRequest). Only when the name already has a version of
// exactly p.Size bytes, so that this may be the same content, is the
// content's SHA-256 computed first and the control plane asked before
// anything is sent: pushing the same content again then sends nothing,
// and new content is stated by that SHA-256 instead. Content the store
// already holds under another name is sent, and the new version shares
// the stored object. A resumed push rereads what was sent before it, back
// to the last saved state of its check, to rebuild the check.
func (c *Client) PushArtifact(ctx context.Context, name string, p Payload, opts PushOptions) (api.ArtifactVersion, error) {
	if opts.Attempts <= 0 {
		opts.Attempts = 8
	}
	if p.SHA256 == "" {
		same, err := c.hasVersionOfSize(ctx, name, p.Size)
		if err != nil {
			return api.ArtifactVersion{}, fmt.Errorf("push artifact %s: %w", name, err)
		}
		if same {
			d := newContentDigest()
			if err := d.rewind(p.Size, p.Open); err != nil {
				return api.ArtifactVersion{}, fmt.Errorf("push artifact %s: hashing the content: %w", name, err)
			}
			p.SHA256 = d.sum()
		}
	}
	up, err := c.resumeOrStart(ctx, name, p, opts)
	if err != nil {
		return api.ArtifactVersion{}, fmt.Errorf("push artifact %s: %w", name, err)
	}
	if up.Existing != nil {
		if opts.Progress != nil {
			opts.Progress(p.Size, p.Size)
		}
		return *up.Existing, nil
	}
	if opts.Started != nil {
		opts.Started(up.ID)
	}
	var d *runningDigest // nil: the check is p.SHA256, known before the send
	if p.SHA256 == "" {
		d = newSendCheck()
	}
	for attempt := 1; up.Received < p.Size; attempt++ {
		next, err := c.sendFrom(ctx, up, p, d, opts.Progress)
		if err == nil && next.Received <= up.Received {
			err = fmt.Errorf("%w: the control plane took none of the bytes sent (it holds %d of %d)", failure.ErrUnavailable, next.Received, p.Size)
		}
		if err == nil {
			up = next
			continue
		}
		if ctx.Err() != nil {
			return api.ArtifactVersion{}, ctx.Err()
		}
		if attempt >= opts.Attempts || !(errors.Is(err, failure.ErrUnavailable) || errors.Is(err, failure.ErrConflict)) {
			return api.ArtifactVersion{}, fmt.Errorf("push artifact %s: upload %s: %w", name, up.ID, err)
		}
		if err := c.sleep(ctx, backoff(attempt)); err != nil {
			return api.ArtifactVersion{}, err
		}
		if up, err = c.GetUpload(ctx, up.ID); err != nil {
			return api.ArtifactVersion{}, fmt.Errorf("push artifact %s: %w", name, err)
		}
	}
	check := api.CommitRequest{SHA256: p.SHA256}
	if d != nil {
		// Normally a no-op; it rereads only when this process sent none of
		// the bytes (the upload it resumed was already complete).
		if err := d.rewind(p.Size, p.Open); err != nil {
			return api.ArtifactVersion{}, fmt.Errorf("push artifact %s: upload %s: %w", name, up.ID, err)
		}
		check = api.CommitRequest{CRC32C: d.sum()}
	}
	var v api.ArtifactVersion
	if err := c.do(ctx, http.MethodPost, "/uploads/"+url.PathEscape(up.ID)+"/commit", nil, check, &v); err != nil {
		return api.ArtifactVersion{}, fmt.Errorf("push artifact %s: commit: %w", name, err)
	}
	return v, nil
}

// hasVersionOfSize reports whether the name has a version of exactly size
// bytes: the one case in which new content may be content it already has.
func (c *Client) hasVersionOfSize(ctx context.Context, name string, size int64) (bool, error) {
	list, err := c.ListArtifacts(ctx, name)
	if err != nil {
		return false, err
	}
	for _, v := range list.Artifacts {
		if v.Name == name && v.Size == size {
			return true, nil
		}
	}
	return false, nil
}

// resumeOrStart resumes opts.UploadID when the control plane still holds it
// and it is an upload of this name, size and format whose digest, where
// both sides know one, is this content's; else it starts a new upload.
func (c *Client) resumeOrStart(ctx context.Context, name string, p Payload, opts PushOptions) (api.Upload, error) {
	if opts.UploadID != "" {
		up, err := c.GetUpload(ctx, opts.UploadID)
		sameDigest := up.SHA256 == "" || p.SHA256 == "" || up.SHA256 == p.SHA256
		sameFormat := up.Format == p.Format || (p.Format == "" && up.Format == api.ArtifactFile)
		if err == nil && up.Name == name && up.Size == p.Size && sameDigest && sameFormat && up.Received <= up.Size {
			return up, nil
		}
	}
	var up api.Upload
	err := c.do(ctx, http.MethodPost, "/artifacts/"+url.PathEscape(name)+"/uploads", nil,
		api.UploadRequest{Size: p.Size, SHA256: p.SHA256, Format: p.Format, Project: opts.Project}, &up)
	return up, err
}

// GetUpload returns where an upload stands (GET /v1/uploads/{id}).
func (c *Client) GetUpload(ctx context.Context, id string) (api.Upload, error) {
	var up api.Upload
	if err := c.do(ctx, http.MethodGet, "/uploads/"+url.PathEscape(id), nil, nil, &up); err != nil {
		return api.Upload{}, fmt.Errorf("get upload %s: %w", id, err)
	}
	return up, nil
}

// sendFrom sends the rest of the content in one request body from where
// the upload stands; with d, the bytes are fed to d as they go out,
// d first brought to the upload's offset (rewind). An error of the content
// itself (a read failure, another size) is returned as it is, not as
// unavailable, so a push does not retry what a retry cannot fix.
func (c *Client) sendFrom(ctx context.Context, up api.Upload, p Payload, d *runningDigest, progress func(sent, total int64)) (api.Upload, error) {
	if d != nil {
		if err := d.rewind(up.Received, p.Open); err != nil {
			return up, err
		}
	}
	if p.OpenFile != nil && sendsFiles(c.base) {
		return c.sendFileFrom(ctx, up, p, d, progress)
	}
	src, err := p.Open(up.Received)
	if err != nil {
		return up, err
	}
	defer src.Close()
	body := &contentBody{
		src:  &sizedReader{r: src, at: up.Received, left: p.Size - up.Received, size: p.Size},
		d:    d,
		left: p.Size - up.Received,
		done: make(chan struct{}),
	}
	if progress != nil {
		body.progress = &progressWriter{sent: up.Received, total: p.Size, report: progress}
	}
	next, err := c.putBody(ctx, up, body, -1)
	if cerr := body.wait(); cerr != nil {
		return up, cerr
	}
	return next, err
}

// putBody is one PUT of body, length bytes or -1 for unstated, at the
// offset the upload stands. A contentBody goes with its length unstated
// (chunked): that is how the HTTP/1.1 transport comes to call its
// WriteTo, rather than reading it through a length-limited 32 KiB copy. A
// file goes with its length stated: that is how the transport comes to
// hand it to the connection's ReadFrom, which is sendfile.
func (c *Client) putBody(ctx context.Context, up api.Upload, body io.ReadCloser, length int64) (api.Upload, error) {
	u := c.base + api.Prefix + "/uploads/" + url.PathEscape(up.ID) + "?" + url.Values{"offset": {strconv.FormatInt(up.Received, 10)}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, u, body)
	if err != nil {
		body.Close()
		return up, failure.Invalid("addr", "cannot make a request to %q: %v", c.base, err)
	}
	req.ContentLength = length
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Accept", "application/json")
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return up, ctx.Err()
		}
		return up, fmt.Errorf("%w: sending to the control plane at %s: %w", failure.ErrUnavailable, c.base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return up, errorFrom(resp)
	}
	var next api.Upload
	if err := json.NewDecoder(resp.Body).Decode(&next); err != nil {
		return up, fmt.Errorf("%w: decoding the answer to an upload: %w", failure.ErrUnavailable, err)
	}
	return next, nil
}

// errBodyUsed refuses a second reading of a contentBody: it is sent once.
var errBodyUsed = errors.New("this upload body was already sent")

// errSendOver ends a body's pipe when the transport closes it.
var errSendOver = errors.New("the request carrying this body has ended")

// contentBody is a PUT's body: left bytes of the content, fed to d (the
// push's check) on the way when d is set (hashcopy's pipeline: reading,
// checking and sending pieces at once, so the check overlaps the send
// instead of adding to it).
//
// The HTTP/1.1 transport sends it through WriteTo, which runs the copy
// straight into the connection in whole pieces; a transport that reads it
// instead (Read, as HTTP/2's does) gets the same copy through a pipe. It is
// sent once. wait reports, after the copy has ended (or, never begun, the
// body was closed, which the transport always does), the content's own
// error, and nil when the copy ended for the connection's reasons, which
// are the request's to report. d is not touched after wait returns.
type contentBody struct {
	src      io.Reader
	d        *runningDigest // nil: not checked here
	left     int64
	progress *progressWriter // nil: none reported

	start sync.Once
	pr    *io.PipeReader // set when read through Read
	done  chan struct{}  // closed when the copy has ended, or will not begin
	err   error          // the content's error; written before done is closed
}

// copy sends the content to w. Errors of w come back as
// *hashcopy.WriteError, so finish can tell them from the content's.
func (b *contentBody) copy(w io.Writer) (int64, error) {
	if b.progress != nil {
		b.progress.w = w
		w = b.progress
	}
	if b.d != nil {
		return hashcopy.Copy(w, b.src, b.d, b.left)
	}
	return io.CopyBuffer(writeErrors{w}, b.src, make([]byte, hashcopy.PieceSize))
}

func (b *contentBody) finish(err error) {
	var werr *hashcopy.WriteError
	if err != nil && !errors.As(err, &werr) {
		b.err = err
	}
	close(b.done)
}

// WriteTo implements io.WriterTo for the transport.
func (b *contentBody) WriteTo(w io.Writer) (int64, error) {
	first := false
	b.start.Do(func() { first = true })
	if !first {
		return 0, errBodyUsed
	}
	n, err := b.copy(w)
	b.finish(err)
	return n, err
}

// Read implements io.Reader for a transport that reads the body.
func (b *contentBody) Read(p []byte) (int, error) {
	b.start.Do(func() {
		pr, pw := io.Pipe()
		b.pr = pr
		go func() {
			_, err := b.copy(pw)
			pw.CloseWithError(err)
			b.finish(err)
		}()
	})
	if b.pr == nil {
		return 0, errBodyUsed
	}
	return b.pr.Read(p)
}

// Close implements io.Closer: a body never sent will not be; one being
// read through the pipe stops (its copy ends with a write error).
func (b *contentBody) Close() error {
	b.start.Do(func() { b.finish(nil) })
	if b.pr != nil {
		b.pr.CloseWithError(errSendOver)
	}
	return nil
}

func (b *contentBody) wait() error {
	<-b.done
	return b.err
}

// writeErrors marks its writer's errors as write errors.
type writeErrors struct{ w io.Writer }

func (w writeErrors) Write(p []byte) (int, error) {
	n, err := w.w.Write(p)
	if err != nil {
		err = &hashcopy.WriteError{Err: err}
	}
	return n, err
}

// sizedReader reads the content from byte at on, to its declared size:
// exactly left bytes, then io.EOF once it has checked that nothing
// follows. Content that ends early or goes on is an invalid error naming
// both sizes: it changed since the push took its size, and no retry can
// fix that.
type sizedReader struct {
	r              io.Reader
	at, left, size int64
}

func (s *sizedReader) Read(b []byte) (int, error) {
	if s.left <= 0 {
		var probe [1]byte
		n, err := io.ReadFull(s.r, probe[:])
		switch {
		case n > 0:
			return 0, failure.Invalid("content", "the content goes on past its %d bytes: it changed while it was pushed; push it again once it is complete", s.size)
		case err == io.EOF:
			return 0, io.EOF
		}
		return 0, err
	}
	if int64(len(b)) > s.left {
		b = b[:s.left]
	}
	n, err := s.r.Read(b)
	s.at += int64(n)
	s.left -= int64(n)
	if err == io.EOF && s.left > 0 {
		return n, failure.Invalid("content", "the content ended after %d of its %d bytes: it changed while it was pushed; push it again once it is complete", s.at, s.size)
	}
	if err == io.EOF {
		err = nil // the probe says whether it really ends
	}
	return n, err
}

// progressWriter reports the bytes written through it, at most every 200
// ms and at the end of each write that fails.
type progressWriter struct {
	w           io.Writer
	sent, total int64
	report      func(sent, total int64)
	last        time.Time
}

func (p *progressWriter) Write(b []byte) (int, error) {
	n, err := p.w.Write(b)
	p.sent += int64(n)
	if now := time.Now(); now.Sub(p.last) >= 200*time.Millisecond || err != nil || p.sent == p.total {
		p.last = now
		p.report(p.sent, p.total)
	}
	return n, err
}

// ListArtifacts returns every version of every Artifact the caller may
// see, or of one name when name is not empty (GET /v1/artifacts).
func (c *Client) ListArtifacts(ctx context.Context, name string) (api.ArtifactList, error) {
	return c.ListArtifactsOf(ctx, "", name)
}

// ListArtifactsOf is ListArtifacts of one project's names ("" every
// project the caller may see).
func (c *Client) ListArtifactsOf(ctx context.Context, project, name string) (api.ArtifactList, error) {
	var out api.ArtifactList
	q := projectQuery(project)
	if name != "" {
		q.Set("name", name)
	}
	if err := c.do(ctx, http.MethodGet, "/artifacts", q, nil, &out); err != nil {
		return api.ArtifactList{}, fmt.Errorf("list artifacts: %w", err)
	}
	return out, nil
}

// GetArtifact returns one version; version "" or "latest" is the newest.
// A name or version that does not exist is failure.ErrNotFound.
func (c *Client) GetArtifact(ctx context.Context, name, version string) (api.ArtifactVersion, error) {
	if version == "" {
		version = "latest"
	}
	var v api.ArtifactVersion
	if err := c.do(ctx, http.MethodGet, "/artifacts/"+url.PathEscape(name)+"/versions/"+url.PathEscape(version), nil, nil, &v); err != nil {
		return api.ArtifactVersion{}, fmt.Errorf("get artifact %s@%s: %w", name, version, err)
	}
	return v, nil
}

// AddRegistry stores (or replaces) the caller's project's credential for
// a registry host. The answer never holds the password.
func (c *Client) AddRegistry(ctx context.Context, host, username, password string) (api.Registry, error) {
	return c.AddRegistryTo(ctx, "", host, username, password)
}

// AddRegistryTo is AddRegistry for project ("" the caller's).
func (c *Client) AddRegistryTo(ctx context.Context, project, host, username, password string) (api.Registry, error) {
	var out api.Registry
	req := api.RegistryCredentialRequest{Host: host, Username: username, Password: password, Project: project}
	if err := c.do(ctx, http.MethodPost, "/registries", nil, req, &out); err != nil {
		return api.Registry{}, fmt.Errorf("add registry %s: %w", host, err)
	}
	return out, nil
}

// ListRegistries returns the registries with a stored credential, of
// every project the caller may see.
func (c *Client) ListRegistries(ctx context.Context) (api.RegistryList, error) {
	return c.ListRegistriesOf(ctx, "")
}

// ListRegistriesOf is ListRegistries of one project ("" every project the
// caller may see).
func (c *Client) ListRegistriesOf(ctx context.Context, project string) (api.RegistryList, error) {
	var out api.RegistryList
	if err := c.do(ctx, http.MethodGet, "/registries", projectQuery(project), nil, &out); err != nil {
		return api.RegistryList{}, fmt.Errorf("list registries: %w", err)
	}
	return out, nil
}

// RemoveRegistry deletes the caller's project's credential for a
// registry; failure.ErrNotFound when there is none.
func (c *Client) RemoveRegistry(ctx context.Context, host string) (api.Registry, error) {
	return c.RemoveRegistryFrom(ctx, "", host)
}

// RemoveRegistryFrom is RemoveRegistry for project ("" the caller's).
func (c *Client) RemoveRegistryFrom(ctx context.Context, project, host string) (api.Registry, error) {
	var out api.Registry
	if err := c.do(ctx, http.MethodDelete, "/registries/"+url.PathEscape(host), projectQuery(project), nil, &out); err != nil {
		return api.Registry{}, fmt.Errorf("remove registry %s: %w", host, err)
	}
	return out, nil
}

// projectQuery is ?project= for project, or no query for "".
func projectQuery(project string) url.Values {
	q := url.Values{}
	if project != "" {
		q.Set("project", project)
	}
	return q
}

// BytesPayload is a Payload over content held in memory, for tests and
// small pushes.
func BytesPayload(content []byte, sha256Hex, format string) Payload {
	return Payload{Size: int64(len(content)), SHA256: sha256Hex, Format: format, Open: func(offset int64) (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(content[offset:])), nil
	}}
}
