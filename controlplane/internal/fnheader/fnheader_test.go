package fnheader

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestMappings: by ID a function sees the caller's headers as sent, by
// trigger wrapped as Fn-Http-H-* with the method, URL and intent; neither
// sees the credential, the connection's own headers, Host or the length.
func TestMappings(t *testing.T) {
	r := httptest.NewRequest(http.MethodPut, "http://cp.example/t/app/hook?x=1", nil)
	r.Header.Set("Authorization", "Bearer mca_secret")
	r.Header.Set("Connection", "keep-alive")
	r.Header.Set("Content-Length", "3")
	r.Header.Set("Content-Type", "text/plain")
	r.Header.Set("X-Custom", "v")
	inv := Invoke(r)
	if inv.Get("X-Custom") != "v" || inv.Get("Content-Type") != "text/plain" || len(inv) != 2 {
		t.Errorf("by ID the function sees %v, want X-Custom and Content-Type alone", inv)
	}
	trig := Trigger(r)
	want := map[string]string{"Fn-Http-H-X-Custom": "v", "Fn-Http-H-Content-Type": "text/plain", "Content-Type": "text/plain",
		"Fn-Http-Method": "PUT", "Fn-Http-Request-Url": "http://cp.example/t/app/hook?x=1", "Fn-Intent": "httprequest"}
	for k, v := range want {
		if got := trig.Get(k); got != v {
			t.Errorf("by trigger %s = %q, want %q", k, got, v)
		}
	}
	if len(trig) != len(want) {
		t.Errorf("by trigger the function sees %v, want exactly %v", trig, want)
	}
}
