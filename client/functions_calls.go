package client

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	"github.com/mercator/mercator/api"
)

// ListCalls returns a function's most recent calls, newest first, at most
// perPage of them (0: the server's default; it caps the count at
// api.MaxFnPerPage) (GET /v2/fns/{fn_id}/calls).
func (c *Client) ListCalls(ctx context.Context, fnID string, perPage int) (api.FnCallList, error) {
	var q url.Values
	if perPage > 0 {
		q = url.Values{"per_page": {strconv.Itoa(perPage)}}
	}
	var out api.FnCallList
	if err := c.fnDo(ctx, http.MethodGet, api.FnPrefix+"/fns/"+url.PathEscape(fnID)+"/calls", q, nil, &out); err != nil {
		return api.FnCallList{}, fmt.Errorf("list the calls of %s: %w", fnID, err)
	}
	return out, nil
}
