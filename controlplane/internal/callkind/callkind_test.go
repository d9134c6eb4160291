package callkind

import "testing"

// TestStatusIsFns: each kind answers the status Fn answers for the same
// end of a call, with a message; a kind nobody named is an internal error.
func TestStatusIsFns(t *testing.T) {
	for kind, want := range map[string]int{
		Busy: 503, NoCapacity: 503, Unreachable: 503, Refused: 503, Unavailable: 503, "capacity_timeout": 503,
		Timeout: 504, "container_init_timeout": 504, "image_pull_timeout": 504,
		NodeLost: 502, "out_of_memory": 502, "no_response": 502, InvalidResponse: 502, "function_failed": 502,
		"image_pull_failed": 502, "container_init_failed": 502, "response_too_big": 502,
		"request_too_big": 413, "invalid": 400, Canceled: 499, "no_such_kind": 500,
	} {
		if got, msg := Status(kind); got != want || msg == "" {
			t.Errorf("Status(%q) = %d %q, want %d with a message", kind, got, msg, want)
		}
	}
	if _, msg := Status(NodeLost); msg != "error receiving function response" {
		t.Errorf("a lost node's message %q is not Fn's", msg)
	}
}
