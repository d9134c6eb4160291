package cli

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/mercator/mercator/cli/internal/clitest"
	"github.com/mercator/mercator/controlplane"
	"github.com/mercator/mercator/daemon"
	"github.com/mercator/mercator/store/sqlstore"
)

// startControlPlane serves a real control plane over SQLite in dir until
// the test ends, and returns the CLI's environment for it and the file of
// its admin token.
func startControlPlane(t *testing.T, dir string) (env map[string]string, adminFile string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	st, err := sqlstore.Open(ctx, "sqlite://"+filepath.Join(dir, "db"))
	if err != nil {
		t.Fatal(err)
	}
	adminFile, err = daemon.EnsureAdminToken(ctx, st, dir, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := controlplane.New(controlplane.Config{PublicURL: "http://" + l.Addr().String()}, st, clitest.PinAll{}, nil)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, l) }()
	t.Cleanup(func() { cancel(); <-served; st.Close() })
	return map[string]string{"MERCATOR_ADDR": "http://" + l.Addr().String(), "HOME": t.TempDir()}, adminFile
}
