// Package callkind names the kinds a function call can end with before
// its response began, beyond the node engine's own (fnagent's Kind), as the
// control plane reports them (api.FnError.Kind), and what each kind means
// to a caller of the Fn API: the HTTP status and Fn's own message. Only
// package controlplane/function uses it; it is apart to keep that package
// within its size.
package callkind

import "net/http"

// Kinds a call can end with beyond fnagent's.
const (
	Busy        = "busy"
	NoCapacity  = "no_capacity"
	NodeLost    = "node_lost"
	Unreachable = "unreachable"
	Refused     = "refused"
	Timeout     = "timeout"
	Canceled    = "canceled"
	Unavailable = "unavailable"
	// InvalidResponse is the engine's for a container's answer outside the
	// contract (fnagent.KindInvalidResponse), and the control plane's for
	// a node's answer that is no final response.
	InvalidResponse = "invalid_response"
)

// Status is the HTTP status and Fn's message for a call that ended with
// kind before its response began: what Fn answers for the same, so an Fn
// client sees the codes it knows.
func Status(kind string) (int, string) {
	switch kind {
	case Busy, NoCapacity, Unreachable, Refused, Unavailable, "capacity_timeout":
		return http.StatusServiceUnavailable, "Timed out - server too busy"
	case Timeout:
		return http.StatusGatewayTimeout, "Timed out"
	case "image_pull_timeout":
		return http.StatusGatewayTimeout, "Image pull timed out"
	case "image_pull_failed":
		return http.StatusBadGateway, "Failed to pull image"
	case "container_init_failed":
		return http.StatusBadGateway, "Container failed to initialize, please ensure you are using the latest fdk and check the logs"
	case "container_init_timeout":
		return http.StatusGatewayTimeout, "Container initialization timed out, please ensure you are using the latest fdk and check the logs"
	case "function_failed":
		return http.StatusBadGateway, "function failed"
	case "out_of_memory", "no_response", NodeLost:
		// Fn says this of any call whose container's answer did not
		// arrive: a crash, an OOM kill, a broken connection.
		return http.StatusBadGateway, "error receiving function response"
	case InvalidResponse:
		return http.StatusBadGateway, "invalid function response"
	case "request_too_big":
		return http.StatusRequestEntityTooLarge, "Request content too large"
	case "response_too_big":
		return http.StatusBadGateway, "function response body too large"
	case "invalid":
		return http.StatusBadRequest, "Invalid function configuration"
	case Canceled:
		return 499, "Client cancelled context"
	}
	return http.StatusInternalServerError, "internal server error"
}
