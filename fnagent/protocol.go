package fnagent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/mercator/mercator/fnagent/internal/callconn"
	"github.com/mercator/mercator/fnagent/internal/fdksocket"
)

// What the engine tells an FDK beyond the socket (package fdksocket names
// the contract's socket directory and listener).
const (
	// logFrameName is what FDKs print, "=<call ID>", on stdout and stderr
	// at the start of each call (FN_LOGFRAME_NAME), so output is attributed
	// to calls by the function's own word.
	logFrameName = "mercator_call_id"
	// deadlineFormat is RFC 3339 with milliseconds. Fn sends whole seconds,
	// which makes an FDK time a call out up to a second early.
	deadlineFormat = "2006-01-02T15:04:05.000Z07:00"
)

// containerEnv is the container's environment: the function's config, then
// the contract's variables (which config cannot set; see normalized).
func containerEnv(fn FunctionConfig) []string {
	env := make([]string, 0, len(fn.Config)+10)
	for k, v := range fn.Config {
		env = append(env, k+"="+v)
	}
	env = append(env,
		"FN_LISTENER=unix:"+fdksocket.DirInContainer+"/"+fdksocket.Name,
		"FN_FORMAT=http-stream",
		"FN_FN_ID="+fn.ID,
		"FN_APP_ID="+fn.AppID,
		"FN_FN_NAME="+fn.Name,
		"FN_APP_NAME="+fn.AppName,
		"FN_MEMORY="+strconv.FormatInt(fn.MemoryMB, 10),
		"FN_TYPE=sync",
	)
	if !fn.UnframedLogs {
		env = append(env, "FN_LOGFRAME_NAME="+logFrameName, "FN_LOGFRAME_HDR=Fn-Call-Id")
	}
	return env
}

// newCallConn makes the HTTP client of one container (package callconn):
// one connection to its socket, kept between calls, because a container
// serves one call at a time and a fresh connection per call (a connect and
// a close) was a quarter of the engine's CPU per call.
//
// Fn's lesson is never to keep an idle connection longer than the FDK
// keeps it: an FDK's server closing it just as a call is sent fails that
// call. So a connection idle for keepIdle is not used again, well under
// the keep-alive timeouts of HTTP servers FDKs use (Node's 5s, gunicorn's
// 2s; Go's has none), and none is kept across a pause (pauseIdle), because
// a server's idle timer that ran out during the pause fires the moment it
// is unpaused, which is when the next call arrives.
func newCallConn(dir string) *callconn.Client {
	return callconn.New(callconn.Config{
		Dial:           func(ctx context.Context) (net.Conn, error) { return fdksocket.Dial(ctx, dir) },
		Idle:           keepIdle,
		MaxHeaderBytes: 1 << 20,
	})
}

// keepIdle is how long an idle connection to a container may be used
// again; see newCallConn.
const keepIdle = time.Second

// hopByHop are the headers that describe one connection, never a call.
var hopByHop = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true, "Proxy-Authorization": true,
	"Proxy-Connection": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
}

// newContainerRequest is the request for one call: POST /call with the
// caller's headers (less hop-by-hop ones and Host), Fn-Call-Id and
// Fn-Deadline. length is the body's length, -1 if unknown.
func newContainerRequest(ctx context.Context, call CallRequest, deadline time.Time, body io.Reader, length int64) *http.Request {
	if body == nil {
		body, length = http.NoBody, 0
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://localhost/call", body)
	if err != nil {
		// Only a bad method or URL fails, and both are constants.
		panic("fnagent: " + err.Error())
	}
	req.ContentLength = length
	if length < 0 {
		req.ContentLength = -1
	}
	req.Header = make(http.Header, len(call.Header)+2)
	for k, vs := range call.Header {
		k = http.CanonicalHeaderKey(k)
		if hopByHop[k] || k == "Content-Length" || k == "Host" {
			continue
		}
		req.Header[k] = append([]string(nil), vs...)
	}
	if _, ok := req.Header["User-Agent"]; !ok {
		// Go's client would add its own otherwise.
		req.Header["User-Agent"] = []string{""}
	}
	req.Header.Set("Fn-Call-Id", call.ID)
	req.Header.Set("Fn-Deadline", deadline.UTC().Format(deadlineFormat))
	return req
}

// containerStatus applies the contract to the status the container answered
// with: 200 is a response (kind ""); 502 a function error after which the
// container is kept; 504 a timeout; anything else invalid. keep says
// whether the container may serve another call.
func containerStatus(code int) (kind Kind, keep bool) {
	switch code {
	case http.StatusOK:
		return "", true
	case http.StatusBadGateway:
		return KindFunctionFailed, true
	case http.StatusGatewayTimeout:
		// The FDK gave up on the call, but the user's handler may still run;
		// see the package doc.
		return KindTimeout, false
	default:
		return KindInvalidResponse, false
	}
}

// userStatus is the function's own status: Fn-Http-Status, 200 without it.
// It must be a final status: an informational one (1xx) would reach the
// caller as an interim response, and the body after it under a 200 the
// function never chose.
func userStatus(h http.Header) (int, error) {
	v := h.Get("Fn-Http-Status")
	if v == "" {
		return http.StatusOK, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 200 || n > 999 {
		return 0, fmt.Errorf("Fn-Http-Status %q is not a final HTTP status (200 to 999)", v)
	}
	return n, nil
}

// copyUserHeaders adds the function's headers in src to dst: Fn-Http-H-X
// becomes X (the gateway form FDKs use for an HTTP-triggered call). On a
// plain invoke the other headers pass as they are (Content-Type,
// Fn-Fdk-Version, a function's own headers, which FDKs do not wrap); on a
// gateway call (an HTTP trigger's) only Content-Type does besides the
// unwrapped ones, as Fn's trigger gateway passes them: what the FDK says
// about itself is not the web client's business. Fn-Http-Status,
// hop-by-hop headers, Content-Length and Date describe the container's
// response, not the function's, and are dropped: the body is streamed, so
// its length is the caller's transport's business.
func copyUserHeaders(dst, src http.Header, gateway bool) {
	skip := func(k string) bool { return hopByHop[k] || k == "Content-Length" || k == "Date" }
	for k, vs := range src {
		switch {
		case k == "Fn-Http-Status":
		case strings.HasPrefix(k, "Fn-Http-H-"):
			name := http.CanonicalHeaderKey(strings.TrimPrefix(k, "Fn-Http-H-"))
			if name != "" && !skip(name) {
				dst[name] = append(dst[name], vs...)
			}
		case skip(k):
		case gateway && k != "Content-Type":
		default:
			dst[k] = append(dst[k], vs...)
		}
	}
}

// gatewayCall reports whether the container's request was an HTTP
// trigger's (Fn-Intent: httprequest, which the gateway sets).
func gatewayCall(req *http.Request) bool {
	return req != nil && req.Header.Get("Fn-Intent") == "httprequest"
}

// inMemoryLen is the unread length of a body held whole in memory, in one
// of the types Go's HTTP client writes in one piece with the request's
// head; ok is false for any other reader.
func inMemoryLen(r io.Reader) (n int64, ok bool) {
	switch b := r.(type) {
	case *bytes.Reader:
		return int64(b.Len()), true
	case *bytes.Buffer:
		return int64(b.Len()), true
	case *strings.Reader:
		return int64(b.Len()), true
	}
	return 0, false
}

// limitedBody passes a request body through until more than limit bytes
// have been read, then fails and remembers it, so a too-big body is told
// apart from the transport's own errors without parsing them.
type limitedBody struct {
	r        io.Reader
	left     int64
	exceeded atomic.Bool
}

var errBodyTooBig = errors.New("request body exceeds the function's limit")

func (b *limitedBody) Read(p []byte) (int, error) {
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1]
	}
	n, err := b.r.Read(p)
	if int64(n) > b.left {
		b.exceeded.Store(true)
		return 0, errBodyTooBig
	}
	b.left -= int64(n)
	return n, err
}
