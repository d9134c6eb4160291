package fnagent

import (
	"errors"
	"fmt"
	"strings"

	"github.com/mercator/mercator/failure"
)

// Kind is the stable, machine-readable name of one way a call can end
// without a response. Every error Call returns is a *CallError with one of
// these kinds. The HTTP status each deserves is the API package's to choose;
// the comments say what Fn answers, for reference.
type Kind string

const (
	// KindBusy: the node cannot serve the call now: the function is at its
	// MaxConcurrency, the node's capacity is taken by busy containers, the
	// wait for a slot hit its bound, or the engine is closing. Nothing ran;
	// another node may serve it. (Fn: 503.)
	KindBusy Kind = "busy"
	// KindCapacityTimeout: the call waited Config.MaxSlotWait for a
	// container (another call's to free up, or capacity for a new one)
	// with no launch of its function under way, and got none: the bound
	// on waiting for capacity passed. Nothing ran. (Fn: 503.)
	KindCapacityTimeout Kind = "capacity_timeout"
	// KindImagePull: the image could not be pulled (unknown, unauthorized,
	// registry unreachable). (Fn: 502/500.)
	KindImagePull Kind = "image_pull_failed"
	// KindImagePullTimeout: the pull did not finish within Config.PullTimeout.
	KindImagePullTimeout Kind = "image_pull_timeout"
	// KindInitFailed: the container could not be created or started, or
	// exited before opening its socket. The message carries the end of its
	// output.
	KindInitFailed Kind = "container_init_failed"
	// KindInitTimeout: the container did not accept a connection on its
	// socket within the function's InitTimeout. (Fn: 504 "container init
	// timeout".)
	KindInitTimeout Kind = "container_init_timeout"
	// KindOutOfMemory: the container was killed for exceeding its memory
	// limit. (Fn: 502.)
	KindOutOfMemory Kind = "out_of_memory"
	// KindTimeout: the call's deadline passed while the function ran, or the
	// FDK answered 504. The container is replaced. (Fn: 504.)
	KindTimeout Kind = "timeout"
	// KindFunctionFailed: the FDK answered 502; the container is kept.
	// (Fn: 502 "function failed".)
	KindFunctionFailed Kind = "function_failed"
	// KindNoResponse: the container exited (crashed, was killed) or broke
	// its connection during the call, before its response was whole; the
	// container is replaced. (Fn: 502 "error receiving function
	// response".) An out-of-memory kill is KindOutOfMemory.
	KindNoResponse Kind = "no_response"
	// KindInvalidResponse: the container answered outside the contract (a
	// status other than 200, 502 or 504, a malformed Fn-Http-Status); the
	// container is replaced. (Fn: 502 "invalid function response".)
	KindInvalidResponse Kind = "invalid_response"
	// KindRequestTooBig: the request body exceeds MaxRequestBytes. (Fn: 413.)
	KindRequestTooBig Kind = "request_too_big"
	// KindResponseTooBig: the response body exceeds MaxResponseBytes.
	// (Fn: 502.)
	KindResponseTooBig Kind = "response_too_big"
	// KindCanceled: the caller's context was canceled, or writing to the
	// caller failed. The container is replaced if the function was running.
	KindCanceled Kind = "canceled"
	// KindInvalid: the function configuration or the call is malformed;
	// the error matches failure.ErrInvalid.
	KindInvalid Kind = "invalid"
)

// CallError is the error of a call that ended without a full response.
type CallError struct {
	Kind   Kind
	FnID   string
	CallID string
	// Message says what happened, for a person.
	Message string
	// Partial is true when the response's status and headers, and perhaps
	// some of its body, were already written to the caller's ResponseWriter:
	// the response is incomplete and the caller must abort it rather than
	// write an error of its own.
	Partial bool
	// Err is the underlying cause, if any.
	Err error
}

func (e *CallError) Error() string {
	var who []string
	if e.FnID != "" {
		who = append(who, "fn "+e.FnID)
	}
	if e.CallID != "" {
		who = append(who, "call "+e.CallID)
	}
	s := string(e.Kind)
	if len(who) > 0 {
		s = strings.Join(who, " ") + ": " + s
	}
	if e.Message != "" {
		s += ": " + e.Message
	}
	return s
}

// Is matches the sentinel of the same kind (errors.Is(err, ErrTimeout)).
func (e *CallError) Is(target error) bool {
	t, ok := target.(*CallError)
	return ok && t.FnID == "" && t.CallID == "" && t.Message == "" && t.Err == nil && t.Kind == e.Kind
}

// Unwrap returns the cause and the failure kind the Kind implies (busy and
// capacity_timeout are failure.ErrUnavailable, invalid failure.ErrInvalid), so code that knows
// only Mercator's general kinds still classifies it.
func (e *CallError) Unwrap() []error {
	var errs []error
	switch e.Kind {
	case KindBusy, KindCapacityTimeout:
		errs = append(errs, failure.ErrUnavailable)
	case KindInvalid:
		errs = append(errs, failure.ErrInvalid)
	}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

// Sentinels for errors.Is, one per kind a caller tells apart.
var (
	ErrBusy              = &CallError{Kind: KindBusy}
	ErrCapacityTimeout   = &CallError{Kind: KindCapacityTimeout}
	ErrImagePull         = &CallError{Kind: KindImagePull}
	ErrImagePullTimeout  = &CallError{Kind: KindImagePullTimeout}
	ErrInitFailed        = &CallError{Kind: KindInitFailed}
	ErrInitTimeout       = &CallError{Kind: KindInitTimeout}
	ErrOutOfMemory       = &CallError{Kind: KindOutOfMemory}
	ErrTimeout           = &CallError{Kind: KindTimeout}
	ErrFunctionFailed    = &CallError{Kind: KindFunctionFailed}
	ErrInvalidResponse   = &CallError{Kind: KindInvalidResponse}
	ErrNoResponse        = &CallError{Kind: KindNoResponse}
	ErrRequestTooBig     = &CallError{Kind: KindRequestTooBig}
	ErrResponseTooBig    = &CallError{Kind: KindResponseTooBig}
	ErrInvalidCallConfig = &CallError{Kind: KindInvalid}
)

// KindOf is err's Kind, or "" when err is nil or not a *CallError.
func KindOf(err error) Kind {
	var ce *CallError
	if errors.As(err, &ce) {
		return ce.Kind
	}
	return ""
}

// callErr makes a CallError without call identity; Call stamps the IDs.
func callErr(kind Kind, cause error, format string, args ...any) *CallError {
	return &CallError{Kind: kind, Err: cause, Message: fmt.Sprintf(format, args...)}
}
