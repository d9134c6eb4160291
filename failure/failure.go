// Package failure defines the small set of error kinds every Mercator package
// uses: not found, conflict, invalid, unauthorized, forbidden, fenced and
// unavailable.
//
// Errors are wrapped with %w and the identifiers involved, and checked with
// errors.Is against the sentinel kinds below. The translation to HTTP status
// codes happens in exactly one place each way (package api), so a handler
// never picks a status code itself and a client never parses a message.
//
// Any package may import failure; it imports nothing of Mercator's.
package failure

import (
	"errors"
	"fmt"
)

// The kinds. Compare with errors.Is; never compare messages.
var (
	// ErrNotFound: the named object does not exist.
	ErrNotFound = errors.New("not found")
	// ErrConflict: the request contradicts the object's current state (an
	// invitation already spent, a name already taken, a run already ended).
	ErrConflict = errors.New("conflict")
	// ErrInvalid: the request itself is malformed; retrying it unchanged
	// will fail the same way.
	ErrInvalid = errors.New("invalid")
	// ErrUnauthorized: no credential, a wrong one, or an expired one.
	ErrUnauthorized = errors.New("unauthorized")
	// ErrForbidden: a valid credential whose role does not allow the
	// request. Distinct from ErrUnauthorized: another credential, not a
	// fresh copy of this one, is the remedy.
	ErrForbidden = errors.New("forbidden")
	// ErrFenced: the caller holds a fencing token that a later enrollment of
	// the same node has superseded. It is distinct from ErrUnauthorized so an
	// agent can tell "you were replaced" from "your credential is wrong".
	ErrFenced = errors.New("fenced")
	// ErrUnavailable: a dependency (the daemon, a registry, the database) could
	// not be reached; retrying later may succeed.
	ErrUnavailable = errors.New("unavailable")
)

// Error carries a kind, the field of the request it concerns (empty when it
// concerns no single field) and a message written for a person.
type Error struct {
	Kind    error
	Field   string
	Message string
}

func (e *Error) Error() string {
	if e.Field != "" {
		return e.Field + ": " + e.Message
	}
	return e.Message
}

// Unwrap lets errors.Is match the kind.
func (e *Error) Unwrap() error { return e.Kind }

// Invalid reports a problem with one field of a request. The message should
// say what was wrong and what to do instead.
func Invalid(field, format string, args ...any) error {
	return &Error{Kind: ErrInvalid, Field: field, Message: fmt.Sprintf(format, args...)}
}

// NotFound reports that the object of the given kind and ID does not exist.
func NotFound(what, id string) error {
	return &Error{Kind: ErrNotFound, Message: fmt.Sprintf("%s %q not found", what, id)}
}

// Conflict reports that the request contradicts current state.
func Conflict(format string, args ...any) error {
	return &Error{Kind: ErrConflict, Message: fmt.Sprintf(format, args...)}
}

// Unauthorized reports a missing, wrong or expired credential.
func Unauthorized(format string, args ...any) error {
	return &Error{Kind: ErrUnauthorized, Message: fmt.Sprintf(format, args...)}
}

// Forbidden reports a credential whose role does not allow the request.
func Forbidden(format string, args ...any) error {
	return &Error{Kind: ErrForbidden, Message: fmt.Sprintf(format, args...)}
}

// Fenced reports a superseded fencing token.
func Fenced(format string, args ...any) error {
	return &Error{Kind: ErrFenced, Message: fmt.Sprintf(format, args...)}
}

// Unavailable reports an unreachable dependency.
func Unavailable(format string, args ...any) error {
	return &Error{Kind: ErrUnavailable, Message: fmt.Sprintf(format, args...)}
}

// Code is the stable, machine-readable name of err's kind, as the API
// reports it: "not_found", "conflict", "invalid", "unauthorized",
// "forbidden", "fenced",
// "unavailable", or "internal" for anything else.
func Code(err error) string {
	switch {
	case errors.Is(err, ErrNotFound):
		return "not_found"
	case errors.Is(err, ErrConflict):
		return "conflict"
	case errors.Is(err, ErrInvalid):
		return "invalid"
	case errors.Is(err, ErrUnauthorized):
		return "unauthorized"
	case errors.Is(err, ErrForbidden):
		return "forbidden"
	case errors.Is(err, ErrFenced):
		return "fenced"
	case errors.Is(err, ErrUnavailable):
		return "unavailable"
	}
	return "internal"
}

// FromCode is Code's inverse: the sentinel kind for a code, or nil for
// "internal" and unknown codes.
func FromCode(code string) error {
	switch code {
	case "not_found":
		return ErrNotFound
	case "conflict":
		return ErrConflict
	case "invalid":
		return ErrInvalid
	case "unauthorized":
		return ErrUnauthorized
	case "forbidden":
		return ErrForbidden
	case "fenced":
		return ErrFenced
	case "unavailable":
		return ErrUnavailable
	}
	return nil
}
