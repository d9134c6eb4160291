// Package client is the Go client of Mercator's public HTTP API (the routes
// under api.Prefix): submitting, inspecting, waiting on, cancelling and
// reading the logs of runs, and listing and inviting nodes. It also finds
// the control plane's address and credential the way every client command
// does (see LoadConfig), so the CLI and any program embedding Mercator agree
// on where a credential comes from.
//
// Errors the API returns come back as *failure.Error values whose kind
// matches with errors.Is (failure.ErrNotFound, failure.ErrInvalid, …) and
// whose Field names the request field at fault; the translation from HTTP
// happens in one place, api.FailureOf. A control plane that cannot be
// reached is failure.ErrUnavailable; a cancelled or expired context is the
// context's own error (errors.Is(err, context.Canceled) holds).
//
// The CLI (package cli) and end-to-end tests import this package; it imports
// only api, failure and pki (standard library only) of Mercator's, so it is
// safe for third-party programs.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
)

// DefaultWaitPoll is how long one long-poll request of WaitRun asks the
// server to hold the response. It is well under the idle timeouts of common
// proxies (60s), so a quiet run does not look like a dead connection.
const DefaultWaitPoll = 30 * time.Second

// maxErrorBody bounds how much of an error response is read: an error body
// is a small JSON object, and anything larger is a proxy's page, not ours.
const maxErrorBody = 64 << 10

// Client calls one control plane with one bearer token. Its methods are safe
// for concurrent use. The zero value is not usable; call New.
type Client struct {
	base  string // without trailing slash, e.g. "http://127.0.0.1:7070"
	token string
	hc    *http.Client
	// Project is the project the caller's commands use when they name
	// none (Config.Project); the client itself sends it nowhere.
	Project string

	// waitPoll is the timeout each WaitRun request asks for.
	waitPoll time.Duration
	// minPoll is the least time between two WaitRun requests, so a server
	// that answers a long poll at once cannot make the client spin.
	minPoll time.Duration
	// retries is how many consecutive transient failures WaitRun and Logs
	// absorb before giving up.
	retries int
	// now and sleep are injected so the loops are tested without waiting.
	now   func() time.Time
	sleep func(ctx context.Context, d time.Duration) error
}

// New returns a client of the control plane at baseURL (scheme, host and an
// optional path prefix, e.g. "http://127.0.0.1:7070"; a bare host:port is
// taken as http) that authenticates every request with token.
//
// httpClient may be nil for a client with no overall timeout. Requests are
// bounded by their context instead: WaitRun's requests are long polls of
// DefaultWaitPoll and Logs with follow streams for as long as the run goes,
// so an http.Client with a Timeout shorter than those would cut them off.
func New(baseURL, token string, httpClient *http.Client) *Client {
	if httpClient == nil {
		httpClient = &http.Client{}
	}
	return &Client{
		base:     normalizeAddr(baseURL),
		token:    token,
		hc:       httpClient,
		waitPoll: DefaultWaitPoll,
		minPoll:  time.Second,
		retries:  8,
		now:      time.Now,
		sleep:    sleepCtx,
	}
}

// normalizeAddr adds the http scheme to a bare host:port and drops trailing
// slashes, so paths can be appended.
func normalizeAddr(addr string) string {
	addr = strings.TrimSpace(addr)
	if addr != "" && !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	return strings.TrimRight(addr, "/")
}

// Addr is the base URL the client calls, as normalized by New.
func (c *Client) Addr() string { return c.base }

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// SubmitRun creates a run from spec (POST /v1/runs) and returns it as the
// control plane accepted it, with its ID and pinned image. The server is the
// authority on what a valid spec is; an invalid one is failure.ErrInvalid
// with Field naming the spec field (for example "image"). With
// IdempotencyKey, sending it again after a lost answer returns the run the
// first call created (see SubmitRuns).
func (c *Client) SubmitRun(ctx context.Context, spec api.RunSpec, opts ...SubmitOption) (api.Run, error) {
	var run api.Run
	if err := c.doHeader(ctx, http.MethodPost, "/runs", nil, submitHeader(opts), spec, &run); err != nil {
		return api.Run{}, fmt.Errorf("submit run: %w", err)
	}
	return run, nil
}

// SubmitRuns creates runs from specs in one call (POST /v1/runs/batch) and
// returns them as the control plane accepted them, in the order of specs.
// It is all or nothing: if the server refuses any spec, no run is created
// and the error is that spec's, failure.ErrInvalid with Field naming it by
// index (for example "runs[3].image"). specs must hold from 1 to
// api.MaxRunBatch specs (failure.ErrInvalid otherwise, without a request);
// a caller with more splits them into several calls, each its own all or
// nothing. specs is only read.
//
// A call whose answer is lost (failure.ErrUnavailable after the request
// went out) may have created its runs. Retrying it without a key may
// create them twice; with the same IdempotencyKey it returns the runs the
// first call created, whichever replica answers. An answer without one run per spec (a control plane breaking the route's
// contract) is an error that comes with the runs it did list.
func (c *Client) SubmitRuns(ctx context.Context, specs []api.RunSpec, opts ...SubmitOption) ([]api.Run, error) {
	switch n := len(specs); {
	case n == 0:
		return nil, fmt.Errorf("submit runs: %w", failure.Invalid("runs", "is empty; pass at least one run spec"))
	case n > api.MaxRunBatch:
		return nil, fmt.Errorf("submit runs: %w", failure.Invalid("runs", "has %d run specs; a call takes at most %d, so split them", n, api.MaxRunBatch))
	}
	var list api.RunList
	if err := c.doHeader(ctx, http.MethodPost, "/runs/batch", nil, submitHeader(opts), api.RunBatch{Runs: specs}, &list); err != nil {
		return nil, fmt.Errorf("submit %d runs: %w", len(specs), err)
	}
	if len(list.Runs) != len(specs) {
		return list.Runs, fmt.Errorf("submit %d runs: the control plane answered with %d runs, not one per spec", len(specs), len(list.Runs))
	}
	return list.Runs, nil
}

// GetRun returns the run with the given ID (GET /v1/runs/{id}), or
// failure.ErrNotFound.
func (c *Client) GetRun(ctx context.Context, id string) (api.Run, error) {
	var run api.Run
	if err := c.do(ctx, http.MethodGet, "/runs/"+url.PathEscape(id), nil, nil, &run); err != nil {
		return api.Run{}, fmt.Errorf("get run %s: %w", id, err)
	}
	return run, nil
}

// ListRunsOptions filters and pages GET /v1/runs. The zero value lists the
// newest runs, as many as the server's default limit.
type ListRunsOptions struct {
	// Statuses keeps runs whose status is one of these (api.RunQueued, …);
	// empty means any status.
	Statuses []string
	// Limit is the most runs to return; 0 means the server's default.
	Limit int
	// Before is a run ID: only runs older than it are returned. Pass the ID
	// of the last run of one page to get the next page.
	Before string
	// Project keeps only the project's runs; "" means every project.
	Project string
	// Queue lists the queued runs in scheduling order instead, by project,
	// each with its position (api.Run.Queue).
	Queue bool
}

// ListRuns returns runs, newest first (GET /v1/runs).
func (c *Client) ListRuns(ctx context.Context, opts ListRunsOptions) (api.RunList, error) {
	q := url.Values{}
	var statuses []string
	for _, s := range opts.Statuses {
		if s = strings.TrimSpace(s); s != "" {
			statuses = append(statuses, s)
		}
	}
	if len(statuses) > 0 {
		q.Set("status", strings.Join(statuses, ","))
	}
	if opts.Limit < 0 {
		return api.RunList{}, fmt.Errorf("list runs: %w", failure.Invalid("limit", "must not be negative, got %d", opts.Limit))
	}
	if opts.Limit > 0 {
		q.Set("limit", strconv.Itoa(opts.Limit))
	}
	if opts.Before != "" {
		q.Set("before", opts.Before)
	}
	if opts.Project != "" {
		q.Set("project", opts.Project)
	}
	if opts.Queue {
		q.Set("queue", "1")
	}
	var list api.RunList
	if err := c.do(ctx, http.MethodGet, "/runs", q, nil, &list); err != nil {
		return api.RunList{}, fmt.Errorf("list runs: %w", err)
	}
	if list.Runs == nil {
		list.Runs = []api.Run{}
	}
	return list, nil
}

// CancelRun asks the control plane to cancel a run (POST
// /v1/runs/{id}/cancel) and returns the run as it stands after the request.
// Cancelling is asynchronous: the returned run may still be running with
// Cancel set; WaitRun sees it end.
func (c *Client) CancelRun(ctx context.Context, id string) (api.Run, error) {
	var run api.Run
	if err := c.do(ctx, http.MethodPost, "/runs/"+url.PathEscape(id)+"/cancel", nil, nil, &run); err != nil {
		return api.Run{}, fmt.Errorf("cancel run %s: %w", id, err)
	}
	return run, nil
}

// WaitRun blocks until the run is terminal (api.Terminal) and returns it. It
// loops over the long poll GET /v1/runs/{id}/wait, so it may wait as long as
// ctx allows; when ctx ends first it returns the last run it saw (zero if
// none) and ctx's error. Transient failures (the control plane restarting,
// a dropped connection) are retried with backoff a bounded number of times in
// a row; other errors (failure.ErrNotFound, failure.ErrUnauthorized) return
// at once.
func (c *Client) WaitRun(ctx context.Context, id string) (api.Run, error) {
	return c.WaitRunFunc(ctx, id, nil)
}

// WaitRunFunc is WaitRun calling observe (when not nil) with every run state
// a poll returned, terminal one included, from the calling goroutine. It is
// how a caller shows progress while waiting: with observe, each poll asks to
// be answered at the run's next change (changed_since), at most one a
// second.
func (c *Client) WaitRunFunc(ctx context.Context, id string, observe func(api.Run)) (api.Run, error) {
	var last api.Run
	failures := 0
	q := url.Values{"timeout": {c.waitPoll.String()}}
	path := "/runs/" + url.PathEscape(id) + "/wait"
	for {
		if observe != nil {
			// Answered at each change, so every stage is observed (a
			// server without changed_since answers at the end only).
			q.Set("changed_since", last.UpdatedAt.UTC().Format(time.RFC3339Nano))
		}
		start := c.now()
		var run api.Run
		err := c.do(ctx, http.MethodGet, path, q, nil, &run)
		switch {
		case err == nil:
			failures = 0
			last = run
			if observe != nil {
				observe(run)
			}
			if api.Terminal(run.Status) {
				return run, nil
			}
			// A poll that came back at once without an end is a server
			// that does not hold the request; don't hammer it.
			if wait := c.minPoll - c.now().Sub(start); wait > 0 {
				if err := c.sleep(ctx, wait); err != nil {
					return last, fmt.Errorf("wait for run %s: %w", id, err)
				}
			}
		case ctx.Err() == nil && errors.Is(err, failure.ErrUnavailable) && failures < c.retries:
			if err := c.sleep(ctx, backoff(failures)); err != nil {
				return last, fmt.Errorf("wait for run %s: %w", id, err)
			}
			failures++
		default:
			return last, fmt.Errorf("wait for run %s: %w", id, err)
		}
	}
}

// backoff is the pause before retry n (0-based): 250ms doubling, capped at 8s.
func backoff(n int) time.Duration {
	d := 250 * time.Millisecond << min(n, 5)
	return min(d, 8*time.Second)
}

// Logs copies the combined stdout and stderr of the run's latest attempt to
// w, writing each chunk as it arrives (GET /v1/runs/{id}/logs). Without
// follow it returns once the output so far was written; with follow it keeps
// streaming until the run is terminal and all its output was written, or ctx
// ends (then it returns ctx's error).
//
// A stream cut in the middle is resumed at the byte offset already written,
// so w never sees a byte twice or a gap; that is retried a bounded number of
// times in a row. An error writing to w ends Logs with that error.
func (c *Client) Logs(ctx context.Context, id string, follow bool, w io.Writer) error {
	return c.logs(ctx, id, url.Values{}, follow, w)
}

// RankLogs is Logs of one member of a gang run, by rank, in its latest
// attempt set (docs/gpus.md "Gang runs"); a rank the gang does not have is
// failure.ErrInvalid.
func (c *Client) RankLogs(ctx context.Context, id string, rank int, follow bool, w io.Writer) error {
	return c.logs(ctx, id, url.Values{"rank": {strconv.Itoa(rank)}}, follow, w)
}

// logs is Logs with the extra query q (which it changes).
func (c *Client) logs(ctx context.Context, id string, q url.Values, follow bool, w io.Writer) error {
	var offset int64
	failures := 0
	for {
		n, err := c.logsOnce(ctx, id, q, follow, offset, w)
		offset += n
		if err == nil {
			return nil
		}
		if n > 0 {
			failures = 0
		}
		if ctx.Err() != nil || !errors.Is(err, failure.ErrUnavailable) || failures >= c.retries {
			return fmt.Errorf("logs of run %s: %w", id, err)
		}
		if err := c.sleep(ctx, backoff(failures)); err != nil {
			return fmt.Errorf("logs of run %s: %w", id, err)
		}
		failures++
	}
}

// errWrite marks an error from the caller's writer, which is never retried.
type errWrite struct{ err error }

func (e *errWrite) Error() string { return "write logs: " + e.err.Error() }
func (e *errWrite) Unwrap() error { return e.err }

// logsOnce makes one logs request from offset and copies its body to w. It
// returns how many bytes it wrote; a broken stream is ErrUnavailable.
func (c *Client) logsOnce(ctx context.Context, id string, q url.Values, follow bool, offset int64, w io.Writer) (int64, error) {
	q.Set("follow", strconv.FormatBool(follow))
	if offset > 0 {
		q.Set("offset", strconv.FormatInt(offset, 10))
	}
	resp, err := c.send(ctx, http.MethodGet, "/runs/"+url.PathEscape(id)+"/logs", q, nil)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return 0, errorFrom(resp)
	}
	var written int64
	buf := make([]byte, 32<<10)
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			m, werr := w.Write(buf[:n])
			written += int64(m)
			if werr == nil && m < n {
				werr = io.ErrShortWrite
			}
			if werr != nil {
				return written, &errWrite{werr}
			}
		}
		if rerr == io.EOF {
			return written, nil
		}
		if rerr != nil {
			if ctx.Err() != nil {
				return written, ctx.Err()
			}
			return written, fmt.Errorf("%w: log stream broke after %d bytes: %w", failure.ErrUnavailable, offset+written, rerr)
		}
	}
}

// ListNodes returns every node the control plane knows (GET /v1/nodes).
func (c *Client) ListNodes(ctx context.Context) (api.NodeList, error) {
	var list api.NodeList
	if err := c.do(ctx, http.MethodGet, "/nodes", nil, nil, &list); err != nil {
		return api.NodeList{}, fmt.Errorf("list nodes: %w", err)
	}
	if list.Nodes == nil {
		list.Nodes = []api.Node{}
	}
	return list, nil
}

// GetNode returns one node (GET /v1/nodes/{id}), or failure.ErrNotFound.
func (c *Client) GetNode(ctx context.Context, id string) (api.Node, error) {
	var node api.Node
	if err := c.do(ctx, http.MethodGet, "/nodes/"+url.PathEscape(id), nil, nil, &node); err != nil {
		return api.Node{}, fmt.Errorf("get node %s: %w", id, err)
	}
	return node, nil
}

// InviteNode mints a single-use invitation for nodeID to enroll (POST
// /v1/nodes/{id}/invitations). ttl is how long it may be spent, rounded up to
// whole seconds; 0 means the server's default (24 hours); negative is
// failure.ErrInvalid. The returned Invitation holds the token and the exact
// agent command line to run on the machine; it is a secret.
func (c *Client) InviteNode(ctx context.Context, nodeID string, ttl time.Duration) (api.Invitation, error) {
	if ttl < 0 {
		return api.Invitation{}, fmt.Errorf("invite node %s: %w", nodeID, failure.Invalid("ttl", "must not be negative, got %s", ttl))
	}
	req := api.InvitationRequest{TTLSeconds: int64(math.Ceil(ttl.Seconds()))}
	var inv api.Invitation
	if err := c.do(ctx, http.MethodPost, "/nodes/"+url.PathEscape(nodeID)+"/invitations", nil, req, &inv); err != nil {
		return api.Invitation{}, fmt.Errorf("invite node %s: %w", nodeID, err)
	}
	return inv, nil
}

// CordonNode stops new work from being placed on the node.
func (c *Client) CordonNode(ctx context.Context, nodeID string) (api.Node, error) {
	return c.nodeAction(ctx, nodeID, "cordon", nil)
}

// UncordonNode returns the node to service, ending a drain too.
func (c *Client) UncordonNode(ctx context.Context, nodeID string) (api.Node, error) {
	return c.nodeAction(ctx, nodeID, "uncordon", nil)
}

// DrainNode cordons the node; with a positive deadline, work still running
// on it then is stopped.
func (c *Client) DrainNode(ctx context.Context, nodeID string, deadline time.Duration) (api.Node, error) {
	if deadline < 0 {
		return api.Node{}, fmt.Errorf("drain node %s: %w", nodeID, failure.Invalid("deadline", "must not be negative, got %s", deadline))
	}
	return c.nodeAction(ctx, nodeID, "drain", api.DrainRequest{DeadlineSeconds: int64(math.Ceil(deadline.Seconds()))})
}

// ClearGPUDispute is an operator's word that the node's claim to the GPU
// stands: its dispute over the UUID is cleared and the GPU may be placed on
// again (another node's dispute over the same UUID is not).
func (c *Client) ClearGPUDispute(ctx context.Context, nodeID, uuid string) (api.Node, error) {
	return c.nodeAction(ctx, nodeID, "gpus/"+url.PathEscape(uuid)+"/clear", nil)
}

// CordonGPU withholds one GPU of the node from placement; UncordonGPU
// returns it to service, lifting a quarantine too (docs/gpus.md).
func (c *Client) CordonGPU(ctx context.Context, nodeID, uuid string) (api.Node, error) {
	return c.nodeAction(ctx, nodeID, "gpus/"+url.PathEscape(uuid)+"/cordon", nil)
}

// UncordonGPU: see CordonGPU.
func (c *Client) UncordonGPU(ctx context.Context, nodeID, uuid string) (api.Node, error) {
	return c.nodeAction(ctx, nodeID, "gpus/"+url.PathEscape(uuid)+"/uncordon", nil)
}

func (c *Client) nodeAction(ctx context.Context, nodeID, action string, body any) (api.Node, error) {
	if body == nil {
		body = struct{}{}
	}
	var n api.Node
	if err := c.do(ctx, http.MethodPost, "/nodes/"+url.PathEscape(nodeID)+"/"+action, nil, body, &n); err != nil {
		return api.Node{}, fmt.Errorf("%s node %s: %w", action, nodeID, err)
	}
	return n, nil
}

// do sends one JSON request and decodes a 2xx JSON response into out.
func (c *Client) do(ctx context.Context, method, path string, q url.Values, in, out any) error {
	return c.doHeader(ctx, method, path, q, nil, in, out)
}

// doHeader is do with header added to the request.
func (c *Client) doHeader(ctx context.Context, method, path string, q url.Values, header http.Header, in, out any) error {
	resp, err := c.sendHeader(ctx, method, path, q, header, in)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return errorFrom(resp)
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w: decoding the response of %s %s: %w", failure.ErrUnavailable, method, api.Prefix+path, err)
	}
	return nil
}

// send builds and sends one request to base+api.Prefix+path. A request that
// got no response is the context's error when ctx ended, else ErrUnavailable.
func (c *Client) send(ctx context.Context, method, path string, q url.Values, in any) (*http.Response, error) {
	return c.sendHeader(ctx, method, path, q, nil, in)
}

// sendHeader is send with header added to the request.
func (c *Client) sendHeader(ctx context.Context, method, path string, q url.Values, header http.Header, in any) (*http.Response, error) {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, fmt.Errorf("encoding the request of %s %s: %w", method, path, err)
		}
		body = bytes.NewReader(b)
	}
	u := c.base + api.Prefix + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, failure.Invalid("addr", "cannot make a request to %q: %v", c.base, err)
	}
	for name, values := range header {
		req.Header[name] = values
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("%w: cannot reach the control plane at %s: %w", failure.ErrUnavailable, c.base, err)
	}
	return resp, nil
}

// errorFrom turns a non-2xx response into a failure kind through
// api.FailureOf, the one translation from HTTP. A body that is not the API's
// error shape (a proxy's page) becomes the message, shortened.
func errorFrom(resp *http.Response) error {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	var e api.Error
	if err := json.Unmarshal(raw, &e); err != nil || (e.Error.Code == "" && e.Error.Message == "") {
		msg := strings.TrimSpace(string(raw))
		if len(msg) > 200 {
			msg = msg[:200] + "…"
		}
		e.Error = api.ErrorBody{Message: msg}
		if msg != "" {
			e.Error.Message = fmt.Sprintf("%s: %s", http.StatusText(resp.StatusCode), msg)
		}
	}
	return api.FailureOf(resp.StatusCode, e.Error)
}
