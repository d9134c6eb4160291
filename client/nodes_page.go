package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
)

// NodePageOptions asks GET /v1/nodes for one page: at most Limit nodes (1
// to api.MaxNodePage) with IDs after After (a page's Next), of Status (""
// any; ready, unreachable, invited or cordoned).
type NodePageOptions struct {
	Limit  int
	After  string
	Status string
}

// ListNodesPage returns one page of nodes in ID order, with the next
// page's After in Next ("" on the last) and the whole fleet counted in
// Summary. A control plane older than pages answers every node and no
// Summary.
func (c *Client) ListNodesPage(ctx context.Context, opts NodePageOptions) (api.NodeList, error) {
	if opts.Limit < 1 || opts.Limit > api.MaxNodePage {
		return api.NodeList{}, fmt.Errorf("list nodes: %w", failure.Invalid("limit", "must be from 1 to %d, got %d", api.MaxNodePage, opts.Limit))
	}
	q := url.Values{"limit": {strconv.Itoa(opts.Limit)}}
	if opts.After != "" {
		q.Set("after", opts.After)
	}
	if opts.Status != "" {
		q.Set("status", opts.Status)
	}
	var list api.NodeList
	if err := c.do(ctx, http.MethodGet, "/nodes", q, nil, &list); err != nil {
		return api.NodeList{}, fmt.Errorf("list nodes: %w", err)
	}
	if list.Nodes == nil {
		list.Nodes = []api.Node{}
	}
	return list, nil
}
