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
)

// Payload is the content of one push: its exact size and SHA-256 (64 hex
// digits), its format (api.ArtifactFile or api.ArtifactTar), and Open,
// which returns the content from byte offset on. Open is called again to
// resume after an interrupted send, so it must return the same bytes every
// time.
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
// under this name (nothing is sent then), else a new one. A send that
// breaks is resumed from where the upload stands, up to Attempts times.
// The control plane computes the digest of what it received and refuses
// the commit unless it is p.SHA256.
func (c *Client) PushArtifact(ctx context.Context, name string, p Payload, opts PushOptions) (api.ArtifactVersion, error) {
	if opts.Attempts <= 0 {
		opts.Attempts = 8
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
	for attempt := 1; up.Received < p.Size; attempt++ {
		next, err := c.sendFrom(ctx, up, p, opts.Progress)
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
	var v api.ArtifactVersion
	if err := c.do(ctx, http.MethodPost, "/uploads/"+url.PathEscape(up.ID)+"/commit", nil, nil, &v); err != nil {
		return api.ArtifactVersion{}, fmt.Errorf("push artifact %s: commit: %w", name, err)
	}
	return v, nil
}

func (c *Client) resumeOrStart(ctx context.Context, name string, p Payload, opts PushOptions) (api.Upload, error) {
	if opts.UploadID != "" {
		up, err := c.GetUpload(ctx, opts.UploadID)
		if err == nil && up.Name == name && up.Size == p.Size && up.SHA256 == p.SHA256 && up.Received <= up.Size {
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

// sendFrom sends the rest of the content in one request body from where
// the upload stands.
func (c *Client) sendFrom(ctx context.Context, up api.Upload, p Payload, progress func(sent, total int64)) (api.Upload, error) {
	body, err := p.Open(up.Received)
	if err != nil {
		return up, err
	}
	defer body.Close()
	var r io.Reader = io.LimitReader(body, p.Size-up.Received)
	if progress != nil {
		r = &progressReader{r: r, sent: up.Received, total: p.Size, report: progress}
	}
	u := c.base + api.Prefix + "/uploads/" + url.PathEscape(up.ID) + "?" + url.Values{"offset": {strconv.FormatInt(up.Received, 10)}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, u, r)
	if err != nil {
		return up, failure.Invalid("addr", "cannot make a request to %q: %v", c.base, err)
	}
	req.ContentLength = p.Size - up.Received
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
