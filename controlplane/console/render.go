package console

import (
	"bytes"
	"fmt"
	"html/template"
	"net/http"
	"strings"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/internal/bytesize"
)

// frame is what every page's template gets: the page's own data (Data)
// and what the navigation bar and forms need.
type frame struct {
	Title  string
	Nav    string // the navigation entry to mark current
	Who    string
	Role   httpapi.Role
	CSRF   string
	Admin  bool // the Audit entry shows
	Status int
	Data   any
}

// render writes the page tmpl with data, as the request's caller (q may be
// nil before sign-in). Rendering into a buffer first means a template
// error becomes a clean 500, never half a page.
func (c *Console) render(w http.ResponseWriter, _ *http.Request, status int, tmpl string, q *request, data any) {
	f := frame{Title: tmpl, Nav: tmpl, Status: status, Data: data}
	if q != nil {
		f.Who, f.Role, f.CSRF = q.who.Name, q.who.Role, q.sess.csrf
		f.Admin = q.may(httpapi.RoleAdmin)
	}
	var buf bytes.Buffer
	if err := c.pages.ExecuteTemplate(&buf, tmpl, f); err != nil {
		c.cfg.Log.Error("console template", "page", tmpl, "err", err)
		http.Error(w, "the console could not render this page; the control plane's log says why", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	w.Write(buf.Bytes())
}

// fail shows err on an error page with the status the API would answer.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, q *request, err error) {
	status := api.StatusOf(err)
	if q == nil {
		http.Error(w, err.Error(), status)
		return
	}
	c.render(w, r, status, "error", q, map[string]any{"Message": err.Error(), "Back": r.Referer()})
}

// stampLayout is how the pages print a moment.
const stampLayout = "2006-01-02 15:04:05Z"

// funcs are the templates' helpers: the same units the CLI prints.
func funcs(now func() time.Time) template.FuncMap {
	return template.FuncMap{
		"bytes": bytesize.Format,
		"when": func(t *time.Time) string {
			if t == nil || t.IsZero() {
				return "—"
			}
			return t.UTC().Format(stampLayout)
		},
		"at":   func(t time.Time) string { return t.UTC().Format(stampLayout) },
		"join": strings.Join,
		"exit": func(p *int) string {
			if p == nil {
				return "—"
			}
			return fmt.Sprint(*p)
		},
		"may": func(f frame, role string) bool { return httpapi.Access{Role: httpapi.Role(role)}.Allows(f.Role) },
		"add": func(a, b int) int { return a + b },
		"ago": func(t *time.Time) string { return ago(now(), t) },
		// runOf is the run of a node's "RUN/ATTEMPT".
		"runOf": func(ra string) string { run, _, _ := strings.Cut(ra, "/"); return run },
		// A GPU sample's figures; -1 is one the tool did not state.
		"pct":   func(v float64) string { return unstated(v, "%.0f%%") },
		"mib":   func(v float64) string { return unstated(v, "%.0f MiB") },
		"watts": func(v float64) string { return unstated(v, "%.0f W") },
	}
}

// unstated formats a sampled figure, or a dash for one not stated (-1).
func unstated(v float64, format string) string {
	if v < 0 {
		return "—"
	}
	return fmt.Sprintf(format, v)
}

// ago is how long before now t was, to the second, for lease ages.
func ago(now time.Time, t *time.Time) string {
	if t == nil || t.IsZero() {
		return "never"
	}
	d := now.Sub(*t).Round(time.Second)
	if d < 0 {
		d = 0
	}
	return d.String() + " ago"
}
