// Command fn-fdk is a test function built with Fn's Go FDK. The JSON body
// picks what it does, so one image serves every FDK test of package
// fnagent:
//
//	{"sleep_ms": 500}          sleep before answering
//	{"log": ["a", "b"]}        print each line to stderr, then stdout
//	{"alloc_mb": 200}          allocate and touch that much memory
//	{"env": "NAME"}            answer with that environment variable
//
// It answers {"pid": …, "calls": n, "env": …}: calls counts the calls this
// process has served, so a test tells a hot container from a fresh one.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"time"

	fdk "github.com/fnproject/fdk-go"
)

var calls atomic.Int64

// hold keeps allocated memory reachable.
var hold [][]byte

type request struct {
	SleepMS int      `json:"sleep_ms"`
	Log     []string `json:"log"`
	AllocMB int      `json:"alloc_mb"`
	Env     string   `json:"env"`
}

func main() {
	fdk.Handle(fdk.HandlerFunc(func(ctx context.Context, in io.Reader, out io.Writer) {
		n := calls.Add(1)
		var req request
		_ = json.NewDecoder(in).Decode(&req)
		for _, line := range req.Log {
			fmt.Fprintln(os.Stderr, line)
			fmt.Fprintln(os.Stdout, line)
		}
		for i := 0; i < req.AllocMB; i++ {
			b := make([]byte, 1<<20)
			for j := 0; j < len(b); j += 4096 {
				b[j] = 1
			}
			hold = append(hold, b)
		}
		if req.SleepMS > 0 {
			time.Sleep(time.Duration(req.SleepMS) * time.Millisecond)
		}
		resp := map[string]any{"pid": os.Getpid(), "calls": n}
		if req.Env != "" {
			resp["env"] = os.Getenv(req.Env)
		}
		fdk.SetHeader(out, "Content-Type", "application/json")
		json.NewEncoder(out).Encode(resp)
	}))
}
