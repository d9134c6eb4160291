package httpapi

import (
	"encoding/base64"
	"net/http"
	"strconv"

	"github.com/mercator/mercator/api"
)

// PageParams reads Fn's paging parameters: per_page (default
// api.DefaultFnPerPage, at most api.MaxFnPerPage) and cursor, the base64url
// (unpadded) key the previous page ended with. A cursor that does not
// decode starts from the beginning.
func PageParams(r *http.Request) (after string, perPage int) {
	q := r.URL.Query()
	perPage, _ = strconv.Atoi(q.Get("per_page"))
	if perPage <= 0 {
		perPage = api.DefaultFnPerPage
	}
	perPage = min(perPage, api.MaxFnPerPage)
	if c := q.Get("cursor"); c != "" {
		if b, err := base64.RawURLEncoding.DecodeString(c); err == nil {
			after = string(b)
		}
	}
	return after, perPage
}

// ListPage is one page of a list route's records as the API shows them
// (view), and Fn's next_cursor: the key of the last record when the page is
// full (NextCursor).
func ListPage[R, V any](records []R, perPage int, view func(R) V, key func(R) string) ([]V, string) {
	items := make([]V, 0, len(records))
	for _, r := range records {
		items = append(items, view(r))
	}
	if len(records) == 0 {
		return items, ""
	}
	return items, NextCursor(len(records), perPage, key(records[len(records)-1]))
}

// NextCursor is the cursor after a page of n records ending at key: empty
// when the page is not full (there is no next page).
func NextCursor(n, perPage int, key string) string {
	if n < perPage || n == 0 {
		return ""
	}
	return base64.RawURLEncoding.EncodeToString([]byte(key))
}
