// Command fn-raw is a test function that speaks Fn's http-stream contract
// with net/http alone, so it can break the contract in ways an FDK never
// would. Standard library only; the static binary is the whole image.
//
// FN_TEST_INIT (set through the function's config) picks how it starts:
//
//	""        listen on a phony socket and symlink lsnr.sock to it by an
//	          absolute path inside the container, as some FDKs do
//	"direct"  listen on lsnr.sock itself
//	"never"   never listen (an init timeout)
//	"exit"    print a message and exit 3 (an init failure)
//	"escape"  symlink lsnr.sock to a path outside the socket directory
//
// FN_TEST_IDLE_MS, when set, is how long the server keeps an idle
// connection before closing it (by default it never does).
//
// The X-Test request header picks what one call does:
//
//	"echo"           200 with the request body, prefixed by "calls=N "
//	"status:CODE"    answer CODE with the body "boom" (502, 504, 418, …)
//	"status:CODE:N"  the same, the body padded to N bytes
//	"bad-status"     200 with a malformed Fn-Http-Status
//	"headers"        200, Fn-Http-Status 201 and Fn-Http-H-X-Custom: yes
//	"sleep:MS"       sleep, then answer "late"
//	"stream:N:MS"    write N chunks "chunk i\n", MS apart, flushing each
//	"big:N"          answer N bytes
//	"crash"          exit 2 without answering
//	"log:TEXT"       print TEXT to stdout and answer "logged"
//	"conn"           answer "conn=N": N numbers the connection the call
//	                 came on, 1 for the process's first
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

var calls, conns atomic.Int64

type connKey struct{}

func main() {
	listener := strings.TrimPrefix(os.Getenv("FN_LISTENER"), "unix:")
	dir := filepath.Dir(listener)
	var l net.Listener
	var err error
	switch os.Getenv("FN_TEST_INIT") {
	case "never":
		fmt.Println("fn-raw: never listening")
		for {
			time.Sleep(time.Hour)
		}
	case "exit":
		fmt.Println("fn-raw: exiting at once as asked")
		os.Exit(3)
	case "direct":
		l, err = net.Listen("unix", listener)
	case "escape":
		l, err = net.Listen("unix", filepath.Join(dir, "phony.sock"))
		if err == nil {
			err = os.Symlink("/etc/../../outside.sock", listener)
		}
	default:
		phony := filepath.Join(dir, "phony"+filepath.Base(listener))
		l, err = net.Listen("unix", phony)
		if err == nil {
			err = os.Symlink(phony, listener)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "fn-raw:", err)
		os.Exit(1)
	}
	server := &http.Server{
		Handler: http.HandlerFunc(serve),
		ConnContext: func(ctx context.Context, _ net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, conns.Add(1))
		},
	}
	if ms, err := strconv.Atoi(os.Getenv("FN_TEST_IDLE_MS")); err == nil {
		server.IdleTimeout = time.Duration(ms) * time.Millisecond
	}
	server.Serve(l)
}

func serve(w http.ResponseWriter, r *http.Request) {
	n := calls.Add(1)
	test := r.Header.Get("X-Test")
	verb, arg, _ := strings.Cut(test, ":")
	switch verb {
	case "status":
		code, size, _ := strings.Cut(arg, ":")
		status, _ := strconv.Atoi(code)
		n, _ := strconv.Atoi(size)
		w.WriteHeader(status)
		io.WriteString(w, "boom"+strings.Repeat(".", max(n-4, 0)))
	case "bad-status":
		w.Header().Set("Fn-Http-Status", "teapot")
		io.WriteString(w, "?")
	case "headers":
		w.Header().Set("Fn-Http-Status", "201")
		w.Header().Set("Fn-Http-H-X-Custom", "yes")
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, "created")
	case "sleep":
		ms, _ := strconv.Atoi(arg)
		time.Sleep(time.Duration(ms) * time.Millisecond)
		io.WriteString(w, "late")
	case "stream":
		count, pause, _ := strings.Cut(arg, ":")
		chunks, _ := strconv.Atoi(count)
		ms, _ := strconv.Atoi(pause)
		for i := 0; i < chunks; i++ {
			if i > 0 {
				time.Sleep(time.Duration(ms) * time.Millisecond)
			}
			fmt.Fprintf(w, "chunk %d\n", i)
			w.(http.Flusher).Flush()
		}
	case "big":
		size, _ := strconv.Atoi(arg)
		w.Write([]byte(strings.Repeat("x", size)))
	case "crash":
		os.Exit(2)
	case "log":
		fmt.Println(arg)
		io.WriteString(w, "logged")
	case "conn":
		fmt.Fprintf(w, "conn=%d", r.Context().Value(connKey{}))
	default:
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "calls=%d %s", n, body)
	}
}
