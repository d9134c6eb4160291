package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
)

// Functions: the Fn-compatible API under api.FnPrefix (/v2) and the invoke
// and trigger endpoints. Errors come back as *failure.Error values like the
// rest of the client's, translated from Fn's {"message": …} body and the
// status through api.FailureOf; a call's error Kind (api.FnError.Kind) is
// kept in a *CallError.

// CallError is how a function call ended without a response: the HTTP
// status the control plane answered with and its Fn error body.
type CallError struct {
	Status int
	api.FnError
}

func (e *CallError) Error() string {
	s := fmt.Sprintf("%d %s", e.Status, e.Message)
	if e.Kind != "" {
		s += " (" + e.Kind + ")"
	}
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// Unwrap is the failure kind the status implies.
func (e *CallError) Unwrap() error {
	return api.FailureOf(e.Status, api.ErrorBody{Message: e.Message})
}

// fnDo is do for the Fn-compatible routes: path is absolute (from the
// base URL), errors are Fn's shape.
func (c *Client) fnDo(ctx context.Context, method, path string, q url.Values, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encoding the request of %s %s: %w", method, path, err)
		}
		body = bytes.NewReader(b)
	}
	u := c.base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return failure.Invalid("addr", "cannot make a request to %q: %v", c.base, err)
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w: cannot reach the control plane at %s: %w", failure.ErrUnavailable, c.base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fnErrorFrom(resp)
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w: decoding the response of %s %s: %w", failure.ErrUnavailable, method, path, err)
	}
	return nil
}

// fnErrorFrom reads an Fn error body.
func fnErrorFrom(resp *http.Response) error {
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	var body api.FnError
	if json.Unmarshal(raw, &body) != nil || body.Message == "" {
		// Not Fn's shape: perhaps the /v1 shape, or a proxy's page.
		var v1 api.Error
		if json.Unmarshal(raw, &v1) == nil && v1.Error.Message != "" {
			return api.FailureOf(resp.StatusCode, v1.Error)
		}
		body.Message = strings.TrimSpace(string(raw))
		if len(body.Message) > 200 {
			body.Message = body.Message[:200] + "…"
		}
		if body.Message == "" {
			body.Message = http.StatusText(resp.StatusCode)
		}
	}
	if body.Kind != "" {
		return &CallError{Status: resp.StatusCode, FnError: body}
	}
	return api.FailureOf(resp.StatusCode, api.ErrorBody{Message: body.Message})
}

// CreateApp creates an app (POST /v2/apps).
func (c *Client) CreateApp(ctx context.Context, app api.App) (api.App, error) {
	var out api.App
	if err := c.fnDo(ctx, http.MethodPost, api.FnPrefix+"/apps", nil, app, &out); err != nil {
		return api.App{}, fmt.Errorf("create app %s: %w", app.Name, err)
	}
	return out, nil
}

// UpdateApp applies a patch to an app (PUT /v2/apps/{id}): config merges,
// an empty value deletes.
func (c *Client) UpdateApp(ctx context.Context, id string, patch api.App) (api.App, error) {
	var out api.App
	if err := c.fnDo(ctx, http.MethodPut, api.FnPrefix+"/apps/"+url.PathEscape(id), nil, patch, &out); err != nil {
		return api.App{}, fmt.Errorf("update app %s: %w", id, err)
	}
	return out, nil
}

// DeleteApp deletes an app with its functions and triggers.
func (c *Client) DeleteApp(ctx context.Context, id string) error {
	if err := c.fnDo(ctx, http.MethodDelete, api.FnPrefix+"/apps/"+url.PathEscape(id), nil, nil, nil); err != nil {
		return fmt.Errorf("delete app %s: %w", id, err)
	}
	return nil
}

// ListApps lists every app, following the cursor.
func (c *Client) ListApps(ctx context.Context) ([]api.App, error) {
	var all []api.App
	q := url.Values{"per_page": {"100"}}
	for {
		var page api.AppList
		if err := c.fnDo(ctx, http.MethodGet, api.FnPrefix+"/apps", q, nil, &page); err != nil {
			return nil, fmt.Errorf("list apps: %w", err)
		}
		all = append(all, page.Items...)
		if page.NextCursor == "" {
			return all, nil
		}
		q.Set("cursor", page.NextCursor)
	}
}

// AppByName finds an app by name (GET /v2/apps?name=), or
// failure.ErrNotFound.
func (c *Client) AppByName(ctx context.Context, name string) (api.App, error) {
	var page api.AppList
	if err := c.fnDo(ctx, http.MethodGet, api.FnPrefix+"/apps", url.Values{"name": {name}}, nil, &page); err != nil {
		return api.App{}, fmt.Errorf("find app %s: %w", name, err)
	}
	if len(page.Items) == 0 {
		return api.App{}, fmt.Errorf("find app: %w", failure.NotFound("app", name))
	}
	return page.Items[0], nil
}

// CreateFn creates a function (POST /v2/fns); the control plane pins its
// image.
func (c *Client) CreateFn(ctx context.Context, fn api.Fn) (api.Fn, error) {
	var out api.Fn
	if err := c.fnDo(ctx, http.MethodPost, api.FnPrefix+"/fns", nil, fn, &out); err != nil {
		return api.Fn{}, fmt.Errorf("create function %s: %w", fn.Name, err)
	}
	return out, nil
}

// GetFn returns a function by ID.
func (c *Client) GetFn(ctx context.Context, id string) (api.Fn, error) {
	var out api.Fn
	if err := c.fnDo(ctx, http.MethodGet, api.FnPrefix+"/fns/"+url.PathEscape(id), nil, nil, &out); err != nil {
		return api.Fn{}, fmt.Errorf("get function %s: %w", id, err)
	}
	return out, nil
}

// UpdateFn applies a patch to a function (PUT /v2/fns/{id}); an image in
// the patch is pinned again.
func (c *Client) UpdateFn(ctx context.Context, id string, patch api.Fn) (api.Fn, error) {
	var out api.Fn
	if err := c.fnDo(ctx, http.MethodPut, api.FnPrefix+"/fns/"+url.PathEscape(id), nil, patch, &out); err != nil {
		return api.Fn{}, fmt.Errorf("update function %s: %w", id, err)
	}
	return out, nil
}

// DeleteFn deletes a function and its triggers.
func (c *Client) DeleteFn(ctx context.Context, id string) error {
	if err := c.fnDo(ctx, http.MethodDelete, api.FnPrefix+"/fns/"+url.PathEscape(id), nil, nil, nil); err != nil {
		return fmt.Errorf("delete function %s: %w", id, err)
	}
	return nil
}

// ListFns lists an app's functions, following the cursor.
func (c *Client) ListFns(ctx context.Context, appID string) ([]api.Fn, error) {
	var all []api.Fn
	q := url.Values{"app_id": {appID}, "per_page": {"100"}}
	for {
		var page api.FnList
		if err := c.fnDo(ctx, http.MethodGet, api.FnPrefix+"/fns", q, nil, &page); err != nil {
			return nil, fmt.Errorf("list functions: %w", err)
		}
		all = append(all, page.Items...)
		if page.NextCursor == "" {
			return all, nil
		}
		q.Set("cursor", page.NextCursor)
	}
}

// FnByName finds an app's function by name, or failure.ErrNotFound.
func (c *Client) FnByName(ctx context.Context, appID, name string) (api.Fn, error) {
	var page api.FnList
	if err := c.fnDo(ctx, http.MethodGet, api.FnPrefix+"/fns", url.Values{"app_id": {appID}, "name": {name}}, nil, &page); err != nil {
		return api.Fn{}, fmt.Errorf("find function %s: %w", name, err)
	}
	if len(page.Items) == 0 {
		return api.Fn{}, fmt.Errorf("find function: %w", failure.NotFound("function", name))
	}
	return page.Items[0], nil
}

// CreateTrigger creates a trigger (POST /v2/triggers).
func (c *Client) CreateTrigger(ctx context.Context, t api.Trigger) (api.Trigger, error) {
	var out api.Trigger
	if err := c.fnDo(ctx, http.MethodPost, api.FnPrefix+"/triggers", nil, t, &out); err != nil {
		return api.Trigger{}, fmt.Errorf("create trigger %s: %w", t.Name, err)
	}
	return out, nil
}

// ListTriggers lists an app's triggers, of one function when fnID is set.
func (c *Client) ListTriggers(ctx context.Context, appID, fnID string) ([]api.Trigger, error) {
	var all []api.Trigger
	q := url.Values{"app_id": {appID}, "per_page": {"100"}}
	if fnID != "" {
		q.Set("fn_id", fnID)
	}
	for {
		var page api.TriggerList
		if err := c.fnDo(ctx, http.MethodGet, api.FnPrefix+"/triggers", q, nil, &page); err != nil {
			return nil, fmt.Errorf("list triggers: %w", err)
		}
		all = append(all, page.Items...)
		if page.NextCursor == "" {
			return all, nil
		}
		q.Set("cursor", page.NextCursor)
	}
}

// DeleteTrigger deletes a trigger.
func (c *Client) DeleteTrigger(ctx context.Context, id string) error {
	if err := c.fnDo(ctx, http.MethodDelete, api.FnPrefix+"/triggers/"+url.PathEscape(id), nil, nil, nil); err != nil {
		return fmt.Errorf("delete trigger %s: %w", id, err)
	}
	return nil
}

// InvokeResult is a function's response.
type InvokeResult struct {
	Status int
	Header http.Header
	// CallID is the call's ID (Fn-Call-Id).
	CallID string
}

// Invoke calls a function synchronously (POST /invoke/{id}), streaming
// body to it and its response body to out as it arrives. header is sent
// as it is (Content-Type, …). A call that ended without a response is a
// *CallError; a response that broke off midway is an error after part of
// it was written to out.
func (c *Client) Invoke(ctx context.Context, fnID string, body io.Reader, header http.Header, out io.Writer) (InvokeResult, error) {
	return c.invoke(ctx, c.base+"/invoke/"+url.PathEscape(fnID), http.MethodPost, body, header, out)
}

// InvokeURL is Invoke at an endpoint URL (an invoke endpoint or an HTTP
// trigger's, as the annotations give them) with any method.
func (c *Client) InvokeURL(ctx context.Context, method, endpoint string, body io.Reader, header http.Header, out io.Writer) (InvokeResult, error) {
	return c.invoke(ctx, endpoint, method, body, header, out)
}

func (c *Client) invoke(ctx context.Context, u, method string, body io.Reader, header http.Header, out io.Writer) (InvokeResult, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return InvokeResult{}, failure.Invalid("addr", "cannot make a request to %q: %v", u, err)
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return InvokeResult{}, ctx.Err()
		}
		return InvokeResult{}, fmt.Errorf("%w: cannot reach the control plane at %s: %w", failure.ErrUnavailable, c.base, err)
	}
	defer resp.Body.Close()
	res := InvokeResult{Status: resp.StatusCode, Header: resp.Header, CallID: resp.Header.Get("Fn-Call-Id")}
	if resp.Header.Get("Content-Type") == "application/json" && resp.StatusCode >= 400 {
		// The control plane's own error (the function's errors come with
		// its own content type, or as its status with its body).
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		var fe api.FnError
		if json.Unmarshal(raw, &fe) == nil && fe.Kind != "" {
			return res, &CallError{Status: resp.StatusCode, FnError: fe}
		}
		_, err := out.Write(raw)
		return res, err
	}
	if _, err := io.Copy(out, resp.Body); err != nil {
		return res, fmt.Errorf("the response broke off: %w", err)
	}
	return res, nil
}

// InvokeDetached enqueues a durable call (Fn-Invoke-Type: detached) and
// returns its ID.
func (c *Client) InvokeDetached(ctx context.Context, fnID string, body io.Reader, header http.Header) (string, error) {
	h := http.Header{}
	for k, vs := range header {
		h[k] = vs
	}
	h.Set("Fn-Invoke-Type", "detached")
	var buf bytes.Buffer
	res, err := c.Invoke(ctx, fnID, body, h, &buf)
	if err != nil {
		return "", err
	}
	if res.Status != http.StatusAccepted {
		return "", fmt.Errorf("detached invoke answered %d: %s", res.Status, strings.TrimSpace(buf.String()))
	}
	var dc api.DetachedCall
	if err := json.Unmarshal(buf.Bytes(), &dc); err != nil || dc.CallID == "" {
		return res.CallID, nil
	}
	return dc.CallID, nil
}

// GetCall returns a durable call's status.
func (c *Client) GetCall(ctx context.Context, fnID, callID string) (api.FnCall, error) {
	var out api.FnCall
	if err := c.fnDo(ctx, http.MethodGet, api.FnPrefix+"/fns/"+url.PathEscape(fnID)+"/calls/"+url.PathEscape(callID), nil, nil, &out); err != nil {
		return api.FnCall{}, fmt.Errorf("get call %s: %w", callID, err)
	}
	return out, nil
}

// CallLog returns a call's output: a durable call's, stored with it, or a
// synchronous call's, from the node that keeps it (failure.ErrNotFound,
// with the control plane's reason, when none does any more).
func (c *Client) CallLog(ctx context.Context, fnID, callID string) (string, error) {
	var out api.CallLogResponse
	if err := c.fnDo(ctx, http.MethodGet, api.FnPrefix+"/fns/"+url.PathEscape(fnID)+"/calls/"+url.PathEscape(callID)+"/log", nil, nil, &out); err != nil {
		return "", fmt.Errorf("get the log of call %s: %w", callID, err)
	}
	return out.Log.Log, nil
}

// CallResult writes a durable call's response body to out and returns its
// status and headers.
func (c *Client) CallResult(ctx context.Context, fnID, callID string, out io.Writer) (InvokeResult, error) {
	u := c.base + api.FnPrefix + "/fns/" + url.PathEscape(fnID) + "/calls/" + url.PathEscape(callID) + "/result"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return InvokeResult{}, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return InvokeResult{}, ctx.Err()
		}
		return InvokeResult{}, fmt.Errorf("%w: %w", failure.ErrUnavailable, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound && resp.Header.Get("Content-Type") == "application/json" {
		return InvokeResult{}, fnErrorFrom(resp)
	}
	_, err = io.Copy(out, resp.Body)
	return InvokeResult{Status: resp.StatusCode, Header: resp.Header, CallID: callID}, err
}

// FnContainers is one node's containers of a function, as the node last
// reported them in its facts.
type FnContainers struct {
	NodeID                         string
	Idle, Busy, Starting, Prepared int
}

// FunctionContainers lists, node by node, the containers of function fnID
// the nodes last reported (their facts' function share): what warm
// capacity holds and calls started. It needs a role that may list nodes.
func (c *Client) FunctionContainers(ctx context.Context, fnID string) ([]FnContainers, error) {
	nodes, err := c.ListNodes(ctx)
	if err != nil {
		return nil, err
	}
	var out []FnContainers
	for _, n := range nodes.Nodes {
		if n.Facts == nil {
			continue
		}
		raw, _ := json.Marshal((*n.Facts)["functions"])
		var share struct {
			Containers []struct {
				FnID                           string `json:"fn_id"`
				Idle, Busy, Starting, Prepared int
			} `json:"containers"`
		}
		if json.Unmarshal(raw, &share) != nil {
			continue
		}
		for _, ct := range share.Containers {
			if ct.FnID == fnID {
				out = append(out, FnContainers{NodeID: n.ID, Idle: ct.Idle, Busy: ct.Busy, Starting: ct.Starting, Prepared: ct.Prepared})
			}
		}
	}
	return out, nil
}

// NodesHoldingImage lists the nodes whose last reported facts say their
// daemon holds image (a pinned reference, repo@sha256:…, as a function's
// image is): where a function's image was prefetched or pulled, so a cold
// start there waits for no pull. It needs a role that may list nodes.
func (c *Client) NodesHoldingImage(ctx context.Context, image string) ([]string, error) {
	nodes, err := c.ListNodes(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, n := range nodes.Nodes {
		if n.Facts == nil {
			continue
		}
		raw, _ := json.Marshal((*n.Facts)["images"])
		var images []string
		if json.Unmarshal(raw, &images) == nil && slices.Contains(images, image) {
			out = append(out, n.ID)
		}
	}
	return out, nil
}
