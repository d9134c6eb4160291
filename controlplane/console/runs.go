package console

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/client"
)

// runsPage is how many runs one Runs page lists.
const runsPage = 50

// runTabs are the Runs page's filters, by the statuses each lists.
var runTabs = []struct {
	Name, Label string
	Statuses    []string
}{
	{"queue", "Queue", []string{api.RunQueued}},
	{"active", "Running", []string{api.RunPlaced, api.RunPreparing, api.RunRunning}},
	{"finished", "Finished", []string{api.RunSucceeded, api.RunFailed, api.RunCancelled}},
	{"failed", "Failed", []string{api.RunFailed}},
	{"all", "All", nil},
}

// runsView is one page of the Runs page.
type runsView struct {
	Tab    string
	Tabs   []tab
	Runs   []api.Run
	Before string // this page's cursor
	Next   string // the next page's cursor; empty on the last
	// Ordered is set when the Queue tab lists the runs in scheduling
	// order (each with its position), from the replica that schedules;
	// otherwise the queue is listed newest first.
	Ordered bool
}

type tab struct {
	Name, Label string
	Current     bool
}

func (c *Console) runs(w http.ResponseWriter, r *http.Request, q *request) {
	v := runsView{Tab: r.URL.Query().Get("tab"), Before: r.URL.Query().Get("before")}
	if v.Tab == "" {
		v.Tab = "all"
	}
	opts := client.ListRunsOptions{Limit: runsPage, Before: v.Before}
	found := false
	for _, t := range runTabs {
		if t.Name == v.Tab {
			opts.Statuses, found = t.Statuses, true
		}
		v.Tabs = append(v.Tabs, tab{Name: t.Name, Label: t.Label, Current: t.Name == v.Tab})
	}
	if !found {
		c.fail(w, r, q, invalidTab(v.Tab))
		return
	}
	if v.Tab == "queue" && v.Before == "" {
		// The scheduling order, as the last pass left it: known to the
		// replica that schedules (the API's ?queue=1), which answers
		// with nothing elsewhere or before its first pass.
		ordered, err := q.api.ListRuns(r.Context(), client.ListRunsOptions{Limit: runsPage, Queue: true})
		if err != nil {
			c.fail(w, r, q, err)
			return
		}
		if len(ordered.Runs) > 0 {
			v.Runs, v.Ordered = ordered.Runs, true
			c.render(w, r, http.StatusOK, "runs", q, v)
			return
		}
	}
	list, err := q.api.ListRuns(r.Context(), opts)
	if err != nil {
		c.fail(w, r, q, err)
		return
	}
	v.Runs = list.Runs
	if len(list.Runs) == runsPage {
		v.Next = list.Runs[len(list.Runs)-1].ID
	}
	c.render(w, r, http.StatusOK, "runs", q, v)
}

// runView is a run's page.
type runView struct {
	api.Run
	Terminal bool
	EnvKeys  []string
	// Rows are the attempts table's cells (attemptRows), as the live
	// status events send them.
	Rows [][]string
}

// attemptRows is the attempts table, first to last, one row of cells per
// attempt: number, node, GPUs, status, placed, started, finished, exit,
// why it stopped. The page renders it and the status events carry it, so
// the table the script redraws is the one the server drew.
func attemptRows(attempts []api.Attempt) [][]string {
	stamp := func(t *time.Time) string {
		if t == nil || t.IsZero() {
			return "—"
		}
		return t.UTC().Format(stampLayout)
	}
	rows := make([][]string, 0, len(attempts))
	for _, a := range attempts {
		exit := "—"
		if a.ExitCode != nil {
			exit = fmt.Sprint(*a.ExitCode)
		}
		if a.OOMKilled {
			exit += " (out of memory)"
		}
		rows = append(rows, []string{fmt.Sprint(a.Number), a.NodeID, strings.Join(a.GPUs, ", "), a.Status,
			stamp(&a.PlacedAt), stamp(a.StartedAt), stamp(a.FinishedAt), exit, strings.TrimSpace(a.StopReason + " " + a.Error)})
	}
	return rows
}

func (c *Console) run(w http.ResponseWriter, r *http.Request, q *request) {
	run, err := q.api.GetRun(r.Context(), r.PathValue("id"))
	if err != nil {
		c.fail(w, r, q, err)
		return
	}
	v := runView{Run: run, Terminal: api.Terminal(run.Status), Rows: attemptRows(run.Attempts)}
	for k := range run.Env {
		v.EnvKeys = append(v.EnvKeys, k)
	}
	c.render(w, r, http.StatusOK, "run", q, v)
}

// cancel asks the control plane to cancel the run (submitters).
func (c *Console) cancel(r *http.Request, q *request) (string, error) {
	run, err := q.api.CancelRun(r.Context(), r.PathValue("id"))
	if err != nil {
		return "", err
	}
	return "/ui/runs/" + run.ID, nil
}

// resubmit submits a new run with the run's spec (submitters) and shows it.
func (c *Console) resubmit(r *http.Request, q *request) (string, error) {
	old, err := q.api.GetRun(r.Context(), r.PathValue("id"))
	if err != nil {
		return "", err
	}
	run, err := q.api.SubmitRun(r.Context(), old.RunSpec)
	if err != nil {
		return "", err
	}
	return "/ui/runs/" + run.ID, nil
}

// runLog streams the run as server-sent events: its log, one event a
// line, followed while the run goes; a "status" event at each change of the
// run (its status and stage, the node's pull progress included, from the
// API's long poll answered at each change); then an "end" event (the page's
// script closes the stream then, rather than let the browser reconnect and
// replay the log). One stream per open run page; nothing polls.
func (c *Console) runLog(w http.ResponseWriter, r *http.Request, q *request) {
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming is not supported here", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	out := &lockedWriter{w: w, flush: fl.Flush}
	out.Write(nil)
	id := r.PathValue("id")
	watch, stop := context.WithCancel(r.Context())
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		q.api.WaitRunFunc(watch, id, func(run api.Run) {
			data, _ := json.Marshal(statusEvent{Status: run.Status, Stage: cmp.Or(run.Stage(), run.Reason), Attempts: attemptRows(run.Attempts)})
			fmt.Fprintf(out, "event: status\ndata: %s\n\n", data)
		})
	}()
	ev := &eventWriter{w: out}
	err := q.api.Logs(r.Context(), id, true, ev)
	ev.close()
	if err != nil && r.Context().Err() == nil {
		fmt.Fprintf(out, "event: failure\ndata: %s\n\n", oneLine(err.Error()))
	}
	// The log ends as the run does; its last status follows within a
	// poll, unless the log ended for another reason.
	select {
	case <-watched:
	case <-time.After(statusLinger):
	}
	stop()
	<-watched
	fmt.Fprint(out, "event: end\ndata: \n\n")
}

// statusEvent is a "status" event's data: the run's status, its stage
// (or why it waits), and its attempts table (attemptRows), which the page's
// script redraws, so the table follows the run without a reload.
type statusEvent struct {
	Status   string     `json:"status"`
	Stage    string     `json:"stage"`
	Attempts [][]string `json:"attempts"`
}

// statusLinger is how long a finished log stream waits for the run's final
// status before it ends.
const statusLinger = 3 * time.Second

// lockedWriter serializes the stream's writers (the log and the status
// watch) and flushes each write to the browser.
type lockedWriter struct {
	mu    sync.Mutex
	w     io.Writer
	flush func()
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n, err := l.w.Write(p)
	l.flush()
	return n, err
}

// eventWriter turns log bytes into server-sent events: each complete line
// one "data:" event, the partial line held until its end (or close).
type eventWriter struct {
	w       io.Writer
	pending []byte
}

func (e *eventWriter) Write(p []byte) (int, error) {
	e.pending = append(e.pending, p...)
	i := bytes.LastIndexByte(e.pending, '\n')
	if i < 0 {
		return len(p), nil
	}
	var out bytes.Buffer
	sc := bufio.NewScanner(bytes.NewReader(e.pending[:i+1]))
	sc.Buffer(nil, len(e.pending)+1)
	for sc.Scan() {
		out.WriteString("data: ")
		out.WriteString(strings.TrimSuffix(sc.Text(), "\r"))
		out.WriteString("\n\n")
	}
	e.pending = append(e.pending[:0], e.pending[i+1:]...)
	if _, err := e.w.Write(out.Bytes()); err != nil {
		return 0, err
	}
	return len(p), nil
}

// close sends the partial last line, if any.
func (e *eventWriter) close() {
	if len(e.pending) > 0 {
		e.Write([]byte("\n"))
	}
}

// oneLine keeps a text to one SSE data line.
func oneLine(s string) string { return strings.NewReplacer("\r", " ", "\n", " ").Replace(s) }
