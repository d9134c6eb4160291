package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"

	"github.com/mercator/mercator/api"
)

// CreateProject creates a project (operator); failure.ErrConflict when the
// name is taken.
func (c *Client) CreateProject(ctx context.Context, p api.Project) (api.Project, error) {
	var out api.Project
	if err := c.do(ctx, http.MethodPost, "/projects", nil, p, &out); err != nil {
		return api.Project{}, fmt.Errorf("create project %s: %w", p.Name, err)
	}
	return out, nil
}

// UpdateProject replaces a project's quota, cap, weight and pools with p's
// (operator).
func (c *Client) UpdateProject(ctx context.Context, p api.Project) (api.Project, error) {
	var out api.Project
	if err := c.do(ctx, http.MethodPut, "/projects/"+url.PathEscape(p.Name), nil, p, &out); err != nil {
		return api.Project{}, fmt.Errorf("update project %s: %w", p.Name, err)
	}
	return out, nil
}

// GetProject returns one project; failure.ErrNotFound when there is none.
func (c *Client) GetProject(ctx context.Context, name string) (api.Project, error) {
	var out api.Project
	if err := c.do(ctx, http.MethodGet, "/projects/"+url.PathEscape(name), nil, nil, &out); err != nil {
		return api.Project{}, fmt.Errorf("get project %s: %w", name, err)
	}
	return out, nil
}

// ListProjects returns every project by name, the default one included.
func (c *Client) ListProjects(ctx context.Context) (api.ProjectList, error) {
	var out api.ProjectList
	if err := c.do(ctx, http.MethodGet, "/projects", nil, nil, &out); err != nil {
		return api.ProjectList{}, fmt.Errorf("list projects: %w", err)
	}
	return out, nil
}

// RemoveProject deletes a project without unfinished runs (operator).
func (c *Client) RemoveProject(ctx context.Context, name string) (api.Project, error) {
	var out api.Project
	if err := c.do(ctx, http.MethodDelete, "/projects/"+url.PathEscape(name), nil, nil, &out); err != nil {
		return api.Project{}, fmt.Errorf("remove project %s: %w", name, err)
	}
	return out, nil
}

// LabelNode sets and removes a node's labels (operator).
func (c *Client) LabelNode(ctx context.Context, nodeID string, req api.NodeLabelsRequest) (api.Node, error) {
	return c.nodeAction(ctx, nodeID, "labels", req)
}
