package client

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
)

// Agent releases and rollouts (docs/upgrades.md).

// PushAgentRelease stores size bytes read from body as the agent release
// version for platform, with its Ed25519 signature when sig is not empty.
func (c *Client) PushAgentRelease(ctx context.Context, version, platform string, body io.Reader, size int64, sig []byte) (api.AgentRelease, error) {
	q := url.Values{"version": {version}, "platform": {platform}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+api.Prefix+"/agent-releases?"+q.Encode(), body)
	if err != nil {
		return api.AgentRelease{}, failure.Invalid("addr", "cannot make a request to %q: %v", c.base, err)
	}
	req.ContentLength = size
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Content-Type", "application/octet-stream")
	req.Header.Set("Accept", "application/json")
	if len(sig) > 0 {
		req.Header.Set(api.HeaderReleaseSignature, base64.StdEncoding.EncodeToString(sig))
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return api.AgentRelease{}, ctx.Err()
		}
		return api.AgentRelease{}, fmt.Errorf("%w: sending to the control plane at %s: %w", failure.ErrUnavailable, c.base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return api.AgentRelease{}, fmt.Errorf("push agent release %s: %w", version, errorFrom(resp))
	}
	var out api.AgentRelease
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return out, fmt.Errorf("%w: decoding the answer to a release push: %w", failure.ErrUnavailable, err)
	}
	return out, nil
}

// ListAgentReleases lists the stored releases.
func (c *Client) ListAgentReleases(ctx context.Context) (api.AgentReleaseList, error) {
	var out api.AgentReleaseList
	if err := c.do(ctx, http.MethodGet, "/agent-releases", nil, nil, &out); err != nil {
		return out, fmt.Errorf("list agent releases: %w", err)
	}
	return out, nil
}

// RemoveAgentRelease removes one release; failure.ErrConflict while a
// running rollout uses it.
func (c *Client) RemoveAgentRelease(ctx context.Context, version, platform string) error {
	if err := c.do(ctx, http.MethodDelete, "/agent-releases/"+url.PathEscape(version), url.Values{"platform": {platform}}, nil, nil); err != nil {
		return fmt.Errorf("remove agent release %s %s: %w", version, platform, err)
	}
	return nil
}

// StartRollout starts upgrading nodes.
func (c *Client) StartRollout(ctx context.Context, req api.RolloutRequest) (api.Rollout, error) {
	var out api.Rollout
	if err := c.do(ctx, http.MethodPost, "/rollouts", nil, req, &out); err != nil {
		return out, fmt.Errorf("start rollout: %w", err)
	}
	return out, nil
}

// ListRollouts lists rollouts, newest first.
func (c *Client) ListRollouts(ctx context.Context) (api.RolloutList, error) {
	var out api.RolloutList
	if err := c.do(ctx, http.MethodGet, "/rollouts", nil, nil, &out); err != nil {
		return out, fmt.Errorf("list rollouts: %w", err)
	}
	return out, nil
}

// GetRollout returns one rollout.
func (c *Client) GetRollout(ctx context.Context, id string) (api.Rollout, error) {
	var out api.Rollout
	if err := c.do(ctx, http.MethodGet, "/rollouts/"+url.PathEscape(id), nil, nil, &out); err != nil {
		return out, fmt.Errorf("get rollout %s: %w", id, err)
	}
	return out, nil
}
