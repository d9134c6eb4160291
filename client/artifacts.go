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
	"strconv"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/internal/hashcopy"
)

// Payload is the content of one push: its exact size, its format
// (api.ArtifactFile or api.ArtifactTar), and Open, which returns the
// content from byte offset on. Open is called again to resume after an
// interrupted send, and to reread what was sent before when a push hashes
// as it sends, so it must return the same bytes every time; content that
// ends before Size bytes, or goes on after them, is refused as changed.
//
// SHA256 is the content's digest (64 lowercase hex digits) when the caller
// already knows it, and empty otherwise, which is the cheap case: the
// client then computes it as the bytes go out (see PushArtifact).
type Payload struct {
	Size   int64
	SHA256 string
	Format string
	Open   func(offset int64) (io.ReadCloser, error)
}

// PushOptions tunes PushArtifact. The zero value is usable.
type PushOptions struct {
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
// Content is read once. When p.SHA256 is empty, the client's SHA-256 is
// computed as the bytes are sent (in a pipeline, so hashing overlaps the
// send rather than adding to it) and stated at the commit; the control
// plane refuses the commit, discarding the upload, unless its own digest
// of what it received is the same. Only when the name already has a
// version of exactly p.Size bytes, so that this may be the same content,
// is the content hashed first, and the control plane asked before anything
// is sent: pushing the same content again then sends nothing. Otherwise
// the content is streamed at once, and if it turns out to be a version the
// name already has (or content the store holds under another name), the
// commit answers with that version or shares the stored content.
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
			d := newRunningDigest()
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
	var d *runningDigest // nil: the digest is p.SHA256, known before the send
	if p.SHA256 == "" {
		d = newRunningDigest()
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
	digest := p.SHA256
	if d != nil {
		// Normally a no-op; it rereads only when this process sent none of
		// the bytes (the upload it resumed was already complete).
		if err := d.rewind(p.Size, p.Open); err != nil {
			return api.ArtifactVersion{}, fmt.Errorf("push artifact %s: upload %s: %w", name, up.ID, err)
		}
		digest = d.sum()
	}
	var v api.ArtifactVersion
	if err := c.do(ctx, http.MethodPost, "/uploads/"+url.PathEscape(up.ID)+"/commit", nil, api.CommitRequest{SHA256: digest}, &v); err != nil {
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
		api.UploadRequest{Size: p.Size, SHA256: p.SHA256, Format: p.Format}, &up)
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

// errSendOver ends a hashing pipeline whose request has returned.
var errSendOver = errors.New("the request carrying this body has ended")

// sendFrom sends the rest of the content in one request body from where
// the upload stands. With d, the bytes are hashed into d as they go out:
// d is first brought to the upload's offset (rewind), and a pipeline
// (hashcopy) reads, hashes and hands on pieces at once, so the send goes
// at the pace of the slower of hashing and the network, not their sum. The
// content is copied into the request through a pipe in either case, so an
// error reading it (or content of another size) is told apart from the
// network's and returned as it is, not as unavailable: a push does not
// retry what a retry cannot fix.
func (c *Client) sendFrom(ctx context.Context, up api.Upload, p Payload, d *runningDigest, progress func(sent, total int64)) (api.Upload, error) {
	if d != nil {
		if err := d.rewind(up.Received, p.Open); err != nil {
			return up, err
		}
	}
	src, err := p.Open(up.Received)
	if err != nil {
		return up, err
	}
	defer src.Close()
	left := p.Size - up.Received
	body := &sizedReader{r: src, at: up.Received, left: left, size: p.Size}
	pr, pw := io.Pipe()
	copied := make(chan error, 1)
	go func() {
		var err error
		if d != nil {
			_, err = hashcopy.Copy(pw, body, d, left)
		} else if _, err = io.Copy(pw, body); errors.Is(err, errSendOver) || errors.Is(err, io.ErrClosedPipe) {
			err = &hashcopy.WriteError{Err: err}
		}
		pw.CloseWithError(err) // nil: the body ends
		copied <- err
	}()
	next, err := c.putBody(ctx, up, pr, left, progress)
	pr.CloseWithError(errSendOver) // a request that ended early stops the copy
	var werr *hashcopy.WriteError
	if cerr := <-copied; cerr != nil && !errors.As(cerr, &werr) {
		return up, cerr // the content's own error, not the network's
	}
	return next, err
}

// putBody is one PUT of left bytes at the offset the upload stands.
func (c *Client) putBody(ctx context.Context, up api.Upload, body io.Reader, left int64, progress func(sent, total int64)) (api.Upload, error) {
	if progress != nil {
		body = &progressReader{r: body, sent: up.Received, total: up.Size, report: progress}
	}
	u := c.base + api.Prefix + "/uploads/" + url.PathEscape(up.ID) + "?" + url.Values{"offset": {strconv.FormatInt(up.Received, 10)}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, u, body)
	if err != nil {
		return up, failure.Invalid("addr", "cannot make a request to %q: %v", c.base, err)
	}
	req.ContentLength = left
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

type progressReader struct {
	r           io.Reader
	sent, total int64
	report      func(sent, total int64)
	last        time.Time
}

func (p *progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	p.sent += int64(n)
	if now := time.Now(); now.Sub(p.last) >= 200*time.Millisecond || err != nil {
		p.last = now
		p.report(p.sent, p.total)
	}
	return n, err
}

// ListArtifacts returns every version of every Artifact, or of one name
// when name is not empty (GET /v1/artifacts).
func (c *Client) ListArtifacts(ctx context.Context, name string) (api.ArtifactList, error) {
	var out api.ArtifactList
	var q url.Values
	if name != "" {
		q = url.Values{"name": {name}}
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

// AddRegistry stores (or replaces) the credential of a registry host. The
// answer never holds the password.
func (c *Client) AddRegistry(ctx context.Context, host, username, password string) (api.Registry, error) {
	var out api.Registry
	if err := c.do(ctx, http.MethodPost, "/registries", nil, api.RegistryCredentialRequest{Host: host, Username: username, Password: password}, &out); err != nil {
		return api.Registry{}, fmt.Errorf("add registry %s: %w", host, err)
	}
	return out, nil
}

// ListRegistries returns the registries with a stored credential.
func (c *Client) ListRegistries(ctx context.Context) (api.RegistryList, error) {
	var out api.RegistryList
	if err := c.do(ctx, http.MethodGet, "/registries", nil, nil, &out); err != nil {
		return api.RegistryList{}, fmt.Errorf("list registries: %w", err)
	}
	return out, nil
}

// RemoveRegistry deletes a registry's credential; failure.ErrNotFound when
// there is none.
func (c *Client) RemoveRegistry(ctx context.Context, host string) (api.Registry, error) {
	var out api.Registry
	if err := c.do(ctx, http.MethodDelete, "/registries/"+url.PathEscape(host), nil, nil, &out); err != nil {
		return api.Registry{}, fmt.Errorf("remove registry %s: %w", host, err)
	}
	return out, nil
}

// BytesPayload is a Payload over content held in memory, for tests and
// small pushes.
func BytesPayload(content []byte, sha256Hex, format string) Payload {
	return Payload{Size: int64(len(content)), SHA256: sha256Hex, Format: format, Open: func(offset int64) (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(content[offset:])), nil
	}}
}
