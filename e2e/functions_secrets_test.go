package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
)

// TestFunctionSecretsSealedAtRest: an app's and a function's secret
// configuration reach the function's container as its environment in a
// real call, reads show them redacted, and no file of the control plane's
// data directory (the SQLite database, its write-ahead log) or of the
// agent's state holds them in the clear.
func TestFunctionSecretsSealedAtRest(t *testing.T) {
	c := startCluster(t)
	c.startAgent("n")
	fnSecret := "fn-secret-" + sha256Hex([]byte(time.Now().String()))[:24]
	appSecret := "app-secret-" + sha256Hex([]byte(fnSecret))[:24]
	if _, err := c.client.CreateApp(c.ctx, api.App{Name: "sealed", SecretConfig: map[string]string{"APP_TOKEN": appSecret}}); err != nil {
		t.Fatal(err)
	}
	_, fn := c.deployHello("sealed", api.Fn{Image: c.publish("fn-fdk"), SecretConfig: map[string]string{"TOKEN": fnSecret}})

	for name, want := range map[string]string{"TOKEN": fnSecret, "APP_TOKEN": appSecret} {
		status, body := c.invoke(fn.ID, `{"env":"`+name+`"}`)
		var resp struct {
			Env string `json:"env"`
		}
		if status != 200 || json.Unmarshal([]byte(body), &resp) != nil || resp.Env != want {
			t.Errorf("the function's %s = %d %q, want %q", name, status, body, want)
		}
	}
	got, err := c.client.GetFn(c.ctx, fn.ID)
	if err != nil || got.SecretConfig["TOKEN"] != api.SecretRedacted {
		t.Errorf("read of the function: %v %v", got.SecretConfig, err)
	}

	// The database holds the function (so searching it proves something),
	// and nothing of the control plane's or the agent's holds the secrets.
	db, err := os.ReadFile(filepath.Join(c.dataDir, "mercator.db"))
	wal, _ := os.ReadFile(filepath.Join(c.dataDir, "mercator.db-wal"))
	if err != nil || !bytes.Contains(append(db, wal...), []byte(fn.ID)) {
		t.Fatalf("the database does not hold the function %s (%v): the search would prove nothing", fn.ID, err)
	}
	searchTree(t, c.dataDir, [][]byte{[]byte(fnSecret), []byte(appSecret)})
}
