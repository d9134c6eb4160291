// Package clitest holds what the tests of the command packages (cli,
// cli/fncmd) share: a resolver that pins any image reference, for a real
// control plane that cannot reach a registry. Only tests import it.
package clitest

import (
	"context"
	"strings"
)

// PinAll pins any reference to a fixed digest.
type PinAll struct{}

// Resolve pins ref's repository to a digest of 64 b's.
func (PinAll) Resolve(_ context.Context, ref string) (string, error) {
	name, _, _ := strings.Cut(ref, ":")
	return name + "@sha256:" + strings.Repeat("b", 64), nil
}
