package registrytest

import (
	"context"
	"net/http"
	"testing"
)

func TestStartServesTheDistributionAPI(t *testing.T) {
	host := Start(t)
	resp, err := http.Get("http://" + host + "/v2/")
	if err != nil {
		t.Fatalf("GET /v2/: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /v2/ = %s, want 200 (the registry API's version check)", resp.Status)
	}
}

func TestServeRefusesNonLoopback(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:0", ":0", "example.test:5000", "localhost"} {
		if _, closeFn, err := Serve(context.Background(), addr, ""); err == nil {
			closeFn()
			t.Errorf("Serve(%q) succeeded; want a refusal, since Docker pulls over plain HTTP only from loopback", addr)
		}
	}
}

func TestServeStopsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	host, closeFn, err := Serve(ctx, "127.0.0.1:0", t.TempDir())
	if err != nil {
		t.Fatalf("Serve: %v", err)
	}
	cancel()
	if err := closeFn(); err != nil {
		t.Errorf("close after the context ended: %v", err)
	}
	if resp, err := http.Get("http://" + host + "/v2/"); err == nil {
		resp.Body.Close()
		t.Errorf("the registry still answers after its context ended")
	}
}
