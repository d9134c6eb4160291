// Package fnheader is Fn's mapping of a caller's request headers to the
// headers a function sees: as sent when the function is invoked by ID
// (/invoke/{fn_id}), and wrapped as Fn-Http-H-* with the method, URL and
// intent when it is called through an HTTP trigger, as Fn's HTTP gateway
// does. What describes one connection (hop-by-hop headers, Host,
// Content-Length) and Mercator's own credential (Authorization) never
// reach a function. It is pure; only package controlplane/function
// imports it.
package fnheader

import "net/http"

// hopByHop are headers of one connection, never passed on.
var hopByHop = map[string]bool{"Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true, "Proxy-Authorization": true,
	"Proxy-Connection": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true}

// passed reports whether a caller's header k may reach a function.
func passed(k string) bool {
	return !hopByHop[k] && k != "Authorization" && k != "Content-Length" && k != "Host"
}

// Invoke is the request's headers as a function invoked by ID sees them:
// as sent, less hop-by-hop headers, Host, Content-Length, and
// Authorization, which carries Mercator's credential.
func Invoke(r *http.Request) http.Header {
	h := http.Header{}
	for k, vs := range r.Header {
		if passed(k) {
			h[k] = vs
		}
	}
	return h
}

// Trigger is Fn's HTTP-trigger mapping: the client's headers as
// Fn-Http-H-*, the method, the full URL and Fn-Intent, plus Content-Type
// as it is (FDKs read it for the body).
func Trigger(r *http.Request) http.Header {
	h := http.Header{}
	for k, vs := range r.Header {
		if passed(k) {
			h["Fn-Http-H-"+k] = vs
		}
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		h.Set("Content-Type", ct)
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	h.Set("Fn-Http-Method", r.Method)
	h.Set("Fn-Http-Request-Url", scheme+"://"+r.Host+r.URL.RequestURI())
	h.Set("Fn-Intent", "httprequest")
	return h
}
