// Command mercator is the one Mercator binary: the control plane, the node
// agent, a local development stack and the client commands. Everything is in
// package cli; this file only wires the process to it, so an end-to-end test
// can call cli.Main the same way.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/mercator/mercator/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Main(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}
