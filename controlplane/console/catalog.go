package console

import (
	"net/http"
	"strconv"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/failure"
)

// listPage is how many rows the Artifacts and Audit pages list at once.
const listPage = 100

// appView is one app on the Functions page, with its functions and
// triggers.
type appView struct {
	api.App
	Fns      []fnRow
	Triggers []api.Trigger
}

// fnRow is a function on the Functions page, with its containers on the
// nodes (hotPerFn of the busiest listed) and, for the first chartsShown
// functions with calls, its latency chart.
type fnRow struct {
	api.Fn
	Hot   hotView
	Chart *chartView
}

// How many nodes a function's containers are listed on, on the Functions
// page and on a function's page (the totals count every node), and how
// many latency charts the Functions page draws.
const (
	hotPerFn    = 10
	hotOnFnPage = 100
	chartsShown = 10
)

func (c *Console) functions(w http.ResponseWriter, r *http.Request, q *request) {
	apps, err := q.api.ListApps(r.Context())
	if err != nil {
		c.fail(w, r, q, err)
		return
	}
	var out []appView
	var ids []string
	for _, a := range apps {
		v := appView{App: a}
		fns, err := q.api.ListFns(r.Context(), a.ID)
		if err == nil {
			v.Triggers, err = q.api.ListTriggers(r.Context(), a.ID, "")
		}
		if err != nil {
			c.fail(w, r, q, err)
			return
		}
		for _, fn := range fns {
			v.Fns, ids = append(v.Fns, fnRow{Fn: fn}), append(ids, fn.ID)
		}
		out = append(out, v)
	}
	if c.cfg.Stats != nil {
		hot, err := c.cfg.Stats.Hot(r.Context(), ids)
		if err != nil {
			c.fail(w, r, q, err)
			return
		}
		charts := 0
		for _, a := range out {
			for i := range a.Fns {
				f := &a.Fns[i]
				f.Hot = hotOf(hot[f.ID], hotPerFn)
				if charts < chartsShown {
					if f.Chart = latencyChart(c.cfg.Now(), f.Name, c.cfg.Stats.Latency(f.ID)); f.Chart != nil {
						charts++
					}
				}
			}
		}
	}
	c.render(w, r, http.StatusOK, "functions", q, out)
}

// recentCalls is how many of a function's calls its page lists.
const recentCalls = 50

// fnView is a function's page: the function and its recent calls.
type fnView struct {
	fnRow
	Calls   []callRow
	Sampled bool // the replica keeps series (Config.Stats)
}

// callRow is a call with its waits worked out: Queued from creation to
// start, Ran from start to completion.
type callRow struct {
	api.FnCall
	Queued, Ran string
}

func (c *Console) function(w http.ResponseWriter, r *http.Request, q *request) {
	fn, err := q.api.GetFn(r.Context(), r.PathValue("fn_id"))
	var calls api.FnCallList
	if err == nil {
		calls, err = q.api.ListCalls(r.Context(), fn.ID, recentCalls)
	}
	if err != nil {
		c.fail(w, r, q, err)
		return
	}
	v := fnView{fnRow: fnRow{Fn: fn}}
	if c.cfg.Stats != nil {
		hot, err := c.cfg.Stats.Hot(r.Context(), []string{fn.ID})
		if err != nil {
			c.fail(w, r, q, err)
			return
		}
		v.Hot, v.Chart, v.Sampled = hotOf(hot[fn.ID], hotOnFnPage), latencyChart(c.cfg.Now(), fn.Name, c.cfg.Stats.Latency(fn.ID)), true
	}
	for _, call := range calls.Items {
		row := callRow{FnCall: call, Queued: "—", Ran: "—"}
		if call.StartedAt != nil {
			row.Queued = call.StartedAt.Sub(call.CreatedAt).Round(time.Millisecond).String()
			if call.CompletedAt != nil {
				row.Ran = call.CompletedAt.Sub(*call.StartedAt).Round(time.Millisecond).String()
			}
		}
		v.Calls = append(v.Calls, row)
	}
	c.render(w, r, http.StatusOK, "function", q, v)
}

// callLog shows one call's log, as its node kept it.
func (c *Console) callLog(w http.ResponseWriter, r *http.Request, q *request) {
	fnID, callID := r.PathValue("fn_id"), r.PathValue("call_id")
	text, err := q.api.CallLog(r.Context(), fnID, callID)
	if err != nil {
		c.fail(w, r, q, err)
		return
	}
	c.render(w, r, http.StatusOK, "call", q, map[string]string{"Fn": fnID, "Call": callID, "Log": text})
}

// pageOf is a page of rows, by the 1-based page number in ?page.
type pageOf[T any] struct {
	Rows               []T
	Page, Pages, Total int
	Key, Filter        string // the filter's query parameter and value
}

func paginate[T any](r *http.Request, rows []T) pageOf[T] {
	p := pageOf[T]{Total: len(rows), Pages: max(1, (len(rows)+listPage-1)/listPage)}
	p.Page, _ = strconv.Atoi(r.URL.Query().Get("page"))
	p.Page = min(max(p.Page, 1), p.Pages)
	lo := (p.Page - 1) * listPage
	p.Rows = rows[lo:min(lo+listPage, len(rows))]
	return p
}

func (c *Console) artifacts(w http.ResponseWriter, r *http.Request, q *request) {
	name := r.URL.Query().Get("name")
	list, err := q.api.ListArtifacts(r.Context(), name)
	if err != nil {
		c.fail(w, r, q, err)
		return
	}
	p := paginate(r, list.Artifacts)
	p.Key, p.Filter = "name", name
	c.render(w, r, http.StatusOK, "artifacts", q, p)
}

// auditWindow is how far back the Audit page reads by default.
const auditWindow = 24 * time.Hour

func (c *Console) audit(w http.ResponseWriter, r *http.Request, q *request) {
	who := r.URL.Query().Get("who")
	if len(who) > 200 {
		c.fail(w, r, q, failure.Invalid("who", "a token name is at most 200 characters"))
		return
	}
	list, err := q.api.ListAudit(r.Context(), client.AuditOptions{Who: who, Since: c.cfg.Now().Add(-auditWindow), Limit: 1000})
	if err != nil {
		c.fail(w, r, q, err)
		return
	}
	p := paginate(r, list.Entries)
	p.Key, p.Filter = "who", who
	c.render(w, r, http.StatusOK, "audit", q, p)
}

// invalidTab is the error for a Runs filter the page does not have.
func invalidTab(name string) error {
	return failure.Invalid("tab", "unknown runs filter %q: use queue, active, finished, failed or all", name)
}
