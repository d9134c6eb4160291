// Package clirun runs the whole command line in process, as the binary
// does, for the external tests of the command packages (cli/fncmd,
// cli/daemoncmd). It is apart from clitest because it imports package cli,
// whose own tests import clitest. Only tests import it.
package clirun

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/cli"
)

// Result is what one execution of the command line produced.
type Result struct {
	Stdout, Stderr string
	Code           int
}

// Run runs the command line with args and env as its environment, stdin
// empty, within 30 seconds.
func Run(t testing.TB, env map[string]string, args ...string) Result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code := cli.Main(ctx, args, strings.NewReader(""), &stdout, &stderr, func(k string) string { return env[k] })
	return Result{Stdout: stdout.String(), Stderr: stderr.String(), Code: code}
}
