package nodeagent

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"
)

// Transport is the agent's outbound connection to the control plane.
//
// Where this differs from the node-agent design: results are not a call of their own.
// They travel in the event spool (node.EventResult), so a result owed during
// a partition is kept on disk and delivered in order with the observations
// around it; SendEvents answers which events the control plane now holds;
// and SendLogs carries container output, which is bulk data rather than a
// fact and so is not spooled (the daemon keeps it, and the agent re-reads it
// from the offset the control plane acknowledges).
type Transport interface {
	// Enroll spends the single-use invitation.
	Enroll(ctx context.Context, request nodeproto.EnrollmentRequest) (nodeproto.Enrollment, error)
	// RenewSession takes a later credential using the one the agent holds. It
	// is separate from Enroll because the material is separate: enrolling
	// spends the single-use invitation the machine was bootstrapped with, and
	// renewing spends nothing.
	RenewSession(ctx context.Context, nodeID, sessionToken string) (nodeproto.SessionRenewal, error)
	// Session opens the command stream and sends each command to commands. It
	// returns when the connection ends; the agent reconnects.
	Session(ctx context.Context, nodeID, sessionToken string, commands chan<- nodeproto.Command) error
	// SendEvents delivers a batch and returns the IDs the control plane now
	// holds. An empty batch is a liveness report.
	SendEvents(ctx context.Context, nodeID, sessionToken string, events []nodeproto.Event) ([]string, error)
	// SendLogs delivers a piece of a workload's output.
	SendLogs(ctx context.Context, nodeID, sessionToken string, chunk nodeproto.LogChunk) (nodeproto.LogAck, error)
}

// sessionIdle is how long a session stream may stay silent before the agent
// declares it dead. The control plane sends a keep-alive every few seconds;
// a stream silent for this long went through a cut the kernel has not
// noticed.
const sessionIdle = 30 * time.Second

// keepAliveJSON is a keep-alive as this version's control plane encodes it;
// a line that differs is decoded and judged by its kind.
var keepAliveJSON, _ = json.Marshal(nodeproto.Command{Kind: nodeproto.KindKeepAlive})

// HTTPTransport reaches the control plane over the node protocol. Every call
// is outbound: the agent opens the session and posts what it owes, and
// nothing ever connects to the machine.
type HTTPTransport struct {
	base   string
	client *http.Client
}

// WithTLS makes the agent's calls to the control plane outside its
// Transport (function results, call logs) verify the server with cfg, the
// configuration the Transport's client uses. Nil leaves the defaults
// (plain HTTP on loopback, or the system's CAs).
func WithTLS(cfg *tls.Config) Option { return func(a *Agent) { a.tls = cfg } }

// controlPlaneClient is the client for calls outside the Transport (call
// logs, and function errors when no function engine's client is
// configured). It is made once, so its connections, and over TLS its
// sessions, are kept between calls.
func (a *Agent) controlPlaneClient() *http.Client { return a.cpClient }

func (a *Agent) newControlPlaneClient() *http.Client {
	if a.tls == nil {
		return http.DefaultClient
	}
	return &http.Client{Transport: &http.Transport{Proxy: http.ProxyFromEnvironment, TLSClientConfig: a.tls}}
}

// NewHTTPTransport returns a transport to the control plane at baseURL. A nil
// client means a default one without an overall timeout (the session is a
// long-lived stream; the other calls carry their own deadlines).
func NewHTTPTransport(baseURL string, client *http.Client) *HTTPTransport {
	if client == nil {
		client = &http.Client{}
	}
	return &HTTPTransport{base: strings.TrimRight(baseURL, "/"), client: client}
}

// Enroll implements Transport.
func (t *HTTPTransport) Enroll(ctx context.Context, request nodeproto.EnrollmentRequest) (nodeproto.Enrollment, error) {
	var out nodeproto.Enrollment
	err := t.call(ctx, nodeproto.PathEnroll, "", "", request, &out)
	return out, err
}

// RenewSession takes a later credential using the one this agent still
// holds. It is what keeps a machine reachable past the life of the
// invitation it joined with.
func (t *HTTPTransport) RenewSession(ctx context.Context, nodeID, sessionToken string) (nodeproto.SessionRenewal, error) {
	var out nodeproto.SessionRenewal
	err := t.call(ctx, nodeproto.PathRenew, nodeID, sessionToken, struct{}{}, &out)
	return out, err
}

// SendEvents implements Transport.
func (t *HTTPTransport) SendEvents(ctx context.Context, nodeID, sessionToken string, events []nodeproto.Event) ([]string, error) {
	return t.SendEventsThrough(ctx, nodeID, sessionToken, events, "")
}

// SendEventsThrough implements ThroughSender.
func (t *HTTPTransport) SendEventsThrough(ctx context.Context, nodeID, sessionToken string, events []nodeproto.Event, through string) ([]string, error) {
	if events == nil {
		events = []nodeproto.Event{}
	}
	body, err := eventBody(events, through)
	if err != nil {
		return nil, err
	}
	var ack nodeproto.EventAck
	err = t.call(ctx, nodeproto.PathEvents, nodeID, sessionToken, body, &ack)
	return ack.Accepted, err
}

// ThroughSender is a Transport that can also carry the agent's event
// watermark (nodeproto.EventBatch.Through), which lets the control plane
// prune its de-duplication rows; a Transport without it delivers events
// with none.
type ThroughSender interface {
	SendEventsThrough(ctx context.Context, nodeID, sessionToken string, events []nodeproto.Event, through string) ([]string, error)
}

// eventBody encodes the longest prefix of events whose batch fits in
// nodeproto.MaxEventBody (at least one event): the control plane takes
// that and answers which it holds, and the agent sends the rest next
// (flushLoop), where a batch over the limit would be refused whole, every
// time. An event that alone is over the limit is sent alone, to be refused
// with the control plane's reason. The watermark through holds for any
// prefix: it is below every event the agent still owes, sent or not.
func eventBody(events []nodeproto.Event, through string) (json.RawMessage, error) {
	for n := len(events); ; n = (n + 1) / 2 {
		data, err := json.Marshal(nodeproto.EventBatch{Events: events[:n], Through: through})
		if err != nil || len(data) <= nodeproto.MaxEventBody || n <= 1 {
			return data, err
		}
	}
}

// SendLogs implements Transport.
func (t *HTTPTransport) SendLogs(ctx context.Context, nodeID, sessionToken string, chunk nodeproto.LogChunk) (nodeproto.LogAck, error) {
	var ack nodeproto.LogAck
	err := t.call(ctx, nodeproto.PathLogs, nodeID, sessionToken, chunk, &ack)
	return ack, err
}

// Session implements Transport: one POST whose response is a stream of
// newline-delimited JSON commands.
func (t *HTTPTransport) Session(ctx context.Context, nodeID, sessionToken string, commands chan<- nodeproto.Command) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// A watchdog cancels the call if nothing, not even a keep-alive,
	// arrives for sessionIdle. It starts before the request is sent: a
	// pooled connection that died silently (a NAT that forgot it) would
	// otherwise leave the agent waiting for response headers forever, with
	// no session while its heartbeats, on fresh connections, keep the node
	// looking ready.
	alive := make(chan struct{}, 1)
	go func() {
		timer := time.NewTimer(sessionIdle)
		defer timer.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-alive:
				timer.Reset(sessionIdle)
			case <-timer.C:
				cancel()
				return
			}
		}
	}()
	req, err := t.request(ctx, nodeproto.PathSession, nodeID, sessionToken, struct{}{})
	if err != nil {
		return err
	}
	// Invokes may come as binary frames (nodeproto/invokebin.go).
	req.Header.Set(nodeproto.HeaderSessionBinary, nodeproto.SessionBinaryInvoke)
	resp, err := t.client.Do(req)
	if err != nil {
		return failure.Unavailable("open session with %s: %v", t.base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		err := decodeError(resp)
		// Refused by the control plane's limits: wait what it asks before
		// the session loop's own (shorter, at first) backoff starts.
		if wait, busy := retryAfter(resp); busy {
			waitFor(ctx, wait)
		}
		return err
	}
	select {
	case alive <- struct{}{}:
	default:
	}
	scanner := bufio.NewScanner(resp.Body)
	scanner.Buffer(make([]byte, 64<<10), 16<<20)
	scanner.Split(splitSession)
	for scanner.Scan() {
		select {
		case alive <- struct{}{}:
		default:
		}
		var cmd nodeproto.Command
		if frame := scanner.Bytes(); len(frame) > 0 && frame[0] == nodeproto.SessionBinaryMarker {
			if cmd, err = nodeproto.DecodeInvokeFrame(frame); err != nil {
				return fmt.Errorf("session stream: %w", err)
			}
		} else if line := bytes.TrimSpace(frame); len(line) == 0 || bytes.Equal(line, keepAliveJSON) {
			continue // most of what an idle stream carries: not decoded
		} else if err := json.Unmarshal(line, &cmd); err != nil {
			return fmt.Errorf("session stream: malformed command: %w", err)
		}
		if cmd.Kind == nodeproto.KindKeepAlive {
			continue
		}
		select {
		case commands <- cmd:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err := scanner.Err(); err != nil {
		return failure.Unavailable("session stream from %s: %v", t.base, err)
	}
	return failure.Unavailable("session stream from %s ended", t.base)
}

// splitSession splits a session stream into its commands: JSON lines, and
// binary invoke frames (nodeproto.SessionBinaryMarker, a length, the
// payload; nodeproto/invokebin.go), which may hold any byte, newlines
// included.
func splitSession(data []byte, atEOF bool) (int, []byte, error) {
	if len(data) == 0 || data[0] != nodeproto.SessionBinaryMarker {
		return bufio.ScanLines(data, atEOF)
	}
	n, err := nodeproto.InvokeFrameLen(data)
	switch {
	case err != nil:
		return 0, nil, err
	case n > 0 && n <= len(data):
		return n, data[:n], nil
	case atEOF:
		return 0, nil, fmt.Errorf("session stream: %w: cut off", nodeproto.ErrInvokeFrame)
	}
	return 0, nil, nil // more bytes needed
}

func (t *HTTPTransport) request(ctx context.Context, path, nodeID, token string, body any) (*http.Request, error) {
	data, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.base+path, bytes.NewReader(data))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "mercator-agent")
	if nodeID != "" {
		req.Header.Set(nodeproto.HeaderNodeID, nodeID)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return req, nil
}

// callAttempts bounds how many times one call is sent when the control
// plane answers 429 or 503 (its limits, package controlplane/internal/limits);
// after that, or when the wait would pass the call's deadline, the error
// goes to the agent's loop, which retries with its own backoff.
const callAttempts = 4

func (t *HTTPTransport) call(ctx context.Context, path, nodeID, token string, body, out any) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for attempt := 1; ; attempt++ {
		req, err := t.request(ctx, path, nodeID, token, body)
		if err != nil {
			return err
		}
		resp, err := t.client.Do(req)
		if err != nil {
			return failure.Unavailable("%s%s: %v", t.base, path, err)
		}
		if resp.StatusCode/100 != 2 {
			err := decodeError(resp)
			resp.Body.Close()
			wait, busy := retryAfter(resp)
			if !busy || attempt == callAttempts || !waitFor(ctx, wait) {
				return err
			}
			continue
		}
		err = json.NewDecoder(resp.Body).Decode(out)
		resp.Body.Close()
		if err != nil {
			return failure.Unavailable("%s%s: reading answer: %v", t.base, path, err)
		}
		return nil
	}
}

// Waits asked for by a 429 or 503: at least minRetryWait, at most
// maxRetryWait (a Retry-After of an hour from a misconfigured proxy must
// not park the agent), defaultRetryWait when the answer names none.
const (
	minRetryWait     = 100 * time.Millisecond
	defaultRetryWait = time.Second
	maxRetryWait     = 30 * time.Second
)

// retryAfter is how long a 429 (this caller is over its share) or 503 (the
// control plane is full) asks the agent to wait, from Retry-After (seconds
// or an HTTP date), bounded, plus up to half again at random, so that
// nodes refused in the same instant do not all come back in the same
// instant. busy is false for any other answer.
func retryAfter(resp *http.Response) (wait time.Duration, busy bool) {
	if resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusServiceUnavailable {
		return 0, false
	}
	wait = defaultRetryWait
	if v := resp.Header.Get("Retry-After"); v != "" {
		if secs, err := strconv.Atoi(v); err == nil && secs >= 0 {
			wait = time.Duration(min(secs, int(maxRetryWait/time.Second))) * time.Second
		} else if at, err := http.ParseTime(v); err == nil {
			wait = time.Until(at)
		}
	}
	wait = min(max(wait, minRetryWait), maxRetryWait)
	return wait + rand.N(wait/2+1), true
}

// waitFor waits d unless ctx ends first or would end before d passed
// (then it returns false at once: the caller gives up now, not later).
func waitFor(ctx context.Context, d time.Duration) bool {
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < d {
		return false
	}
	return sleep(ctx, d)
}

// maxForeignError is how much of an answer that is not in the API's error
// shape an error quotes.
const maxForeignError = 512

// decodeError is the error a refusal means: the API's error shape as the
// server wrote it, or, for anything else, a message quoting what came (or
// saying nothing did), never an empty one.
func decodeError(resp *http.Response) error {
	var body api.Error
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if json.Unmarshal(data, &body) != nil || body.Error.Code == "" {
		// Not Mercator's error shape (a proxy's page, an empty answer):
		// the start of what came, so the agent's log says who answered.
		body.Error.Message = strings.TrimSpace(strings.ToValidUTF8(string(data[:min(len(data), maxForeignError)]), "?"))
	}
	if body.Error.Message == "" {
		body.Error.Message = fmt.Sprintf("control plane answered %d %s with no explanation", resp.StatusCode, http.StatusText(resp.StatusCode))
	}
	err := api.FailureOf(resp.StatusCode, body.Error)
	if resp.StatusCode >= 500 && !errors.Is(err, failure.ErrUnavailable) {
		return failure.Unavailable("control plane answered %d: %v", resp.StatusCode, err)
	}
	return err
}
