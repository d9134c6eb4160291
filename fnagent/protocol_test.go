package fnagent

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestContainerRequest(t *testing.T) {
	deadline := time.Date(2030, 1, 2, 3, 4, 5, 678_000_000, time.UTC)
	call := CallRequest{ID: "c1", Header: http.Header{
		"Content-Type": {"application/json"}, "Connection": {"close"}, "X-Custom": {"a", "b"},
		"Fn-Intent": {"httprequest"}, "Content-Length": {"3"},
	}}
	req := newContainerRequest(context.Background(), call, deadline, strings.NewReader("abc"), 3)
	if req.Method != http.MethodPost || req.URL.Path != "/call" || req.ContentLength != 3 {
		t.Fatalf("request %s %s length %d", req.Method, req.URL, req.ContentLength)
	}
	want := http.Header{"Content-Type": {"application/json"}, "X-Custom": {"a", "b"}, "Fn-Intent": {"httprequest"},
		"Fn-Call-Id": {"c1"}, "Fn-Deadline": {"2030-01-02T03:04:05.678Z"}, "User-Agent": {""}}
	if len(req.Header) != len(want) {
		t.Fatalf("headers %v; want %v", req.Header, want)
	}
	for k, v := range want {
		if strings.Join(req.Header[k], ",") != strings.Join(v, ",") {
			t.Errorf("header %s = %q; want %q", k, req.Header[k], v)
		}
	}
	// The FDK parses Fn-Deadline as RFC 3339.
	if got, err := time.Parse(time.RFC3339, req.Header.Get("Fn-Deadline")); err != nil || !got.Equal(deadline) {
		t.Fatalf("Fn-Deadline parses to %v, %v", got, err)
	}
	if empty := newContainerRequest(context.Background(), CallRequest{ID: "c"}, deadline, nil, -1); empty.Body != http.NoBody || empty.ContentLength != 0 {
		t.Fatalf("nil body: %v %d", empty.Body, empty.ContentLength)
	}
}

func TestStatusContract(t *testing.T) {
	for code, want := range map[int]struct {
		kind Kind
		keep bool
	}{200: {"", true}, 502: {KindFunctionFailed, true}, 504: {KindTimeout, false}, 500: {KindInvalidResponse, false}, 201: {KindInvalidResponse, false}} {
		if kind, keep := containerStatus(code); kind != want.kind || keep != want.keep {
			t.Errorf("containerStatus(%d) = %q, %v; want %q, %v", code, kind, keep, want.kind, want.keep)
		}
	}
	for v, want := range map[string]int{"": 200, "404": 404, "201": 201, "200": 200, "999": 999} {
		if got, err := userStatus(http.Header{"Fn-Http-Status": {v}}); err != nil || got != want {
			t.Errorf("userStatus(%q) = %d, %v", v, got, err)
		}
	}
	for _, bad := range []string{"teapot", "42", "1000", "100", "103", "199"} {
		if _, err := userStatus(http.Header{"Fn-Http-Status": {bad}}); err == nil {
			t.Errorf("userStatus(%q) accepted", bad)
		}
	}
}

func TestCopyUserHeaders(t *testing.T) {
	src := http.Header{
		"Fn-Http-Status":           {"201"},
		"Fn-Http-H-X-Custom":       {"yes"},
		"Fn-Http-H-Cache-Control":  {"no-store"},
		"Fn-Http-H-Content-Length": {"99"},
		"Content-Type":             {"text/plain"},
		"Content-Length":           {"7"},
		"Date":                     {"today"},
		"Fn-Fdk-Version":           {"fdk-go/0.0.50"},
		"Transfer-Encoding":        {"chunked"},
	}
	for _, c := range []struct {
		gateway bool
		want    http.Header
	}{
		{false, http.Header{"X-Custom": {"yes"}, "Cache-Control": {"no-store"}, "Content-Type": {"text/plain"}, "Fn-Fdk-Version": {"fdk-go/0.0.50"}}},
		// An HTTP trigger's caller gets the unwrapped headers and
		// Content-Type only, as from Fn's gateway.
		{true, http.Header{"X-Custom": {"yes"}, "Cache-Control": {"no-store"}, "Content-Type": {"text/plain"}}},
	} {
		dst := http.Header{}
		copyUserHeaders(dst, src, c.gateway)
		if len(dst) != len(c.want) {
			t.Fatalf("gateway %v: got %v; want %v", c.gateway, dst, c.want)
		}
		for k, v := range c.want {
			if dst.Get(k) != v[0] {
				t.Errorf("gateway %v: %s = %q; want %q", c.gateway, k, dst.Get(k), v[0])
			}
		}
	}
}

func TestLimitedBody(t *testing.T) {
	b := &limitedBody{r: strings.NewReader("12345"), left: 5}
	if got, err := io.ReadAll(b); err != nil || string(got) != "12345" || b.exceeded.Load() {
		t.Fatalf("at the limit: %q, %v", got, err)
	}
	b = &limitedBody{r: strings.NewReader("123456"), left: 5}
	if _, err := io.ReadAll(b); !errors.Is(err, errBodyTooBig) || !b.exceeded.Load() {
		t.Fatalf("past the limit: %v", err)
	}
	b = &limitedBody{r: io.MultiReader(bytes.NewReader([]byte("123")), bytes.NewReader([]byte("456"))), left: 5}
	if _, err := io.ReadAll(b); !errors.Is(err, errBodyTooBig) {
		t.Fatalf("past the limit over two reads: %v", err)
	}
}

func TestContainerEnv(t *testing.T) {
	fn := FunctionConfig{ID: "f1", AppID: "a1", Name: "hello", AppName: "app", MemoryMB: 64, Config: map[string]string{"GREETING": "hi"}}
	env := strings.Join(containerEnv(fn), "\n") + "\n"
	for _, want := range []string{"GREETING=hi", "FN_LISTENER=unix:/tmp/iofs/lsnr.sock", "FN_FORMAT=http-stream",
		"FN_FN_ID=f1", "FN_APP_ID=a1", "FN_MEMORY=64", "FN_TYPE=sync", "FN_FN_NAME=hello", "FN_APP_NAME=app",
		"FN_LOGFRAME_NAME=" + logFrameName, "FN_LOGFRAME_HDR=Fn-Call-Id"} {
		if !strings.Contains(env, want+"\n") {
			t.Errorf("env lacks %s:\n%s", want, env)
		}
	}
}

func TestInMemoryLen(t *testing.T) {
	partly := strings.NewReader("abcdef")
	if _, err := partly.Read(make([]byte, 2)); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		r    io.Reader
		n    int64
		want bool
	}{
		{bytes.NewReader([]byte("abc")), 3, true},
		{bytes.NewBufferString("abcd"), 4, true},
		{partly, 4, true},
		{io.MultiReader(strings.NewReader("abc")), 0, false},
		{nil, 0, false},
	} {
		if n, ok := inMemoryLen(c.r); n != c.n || ok != c.want {
			t.Errorf("inMemoryLen(%T) = %d, %v; want %d, %v", c.r, n, ok, c.n, c.want)
		}
	}
}
