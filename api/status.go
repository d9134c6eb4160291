package api

import (
	"errors"
	"net/http"

	"github.com/mercator/mercator/failure"
)

// StatusOf is the one place a failure kind becomes an HTTP status.
func StatusOf(err error) int {
	switch {
	case errors.Is(err, failure.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, failure.ErrConflict):
		return http.StatusConflict
	case errors.Is(err, failure.ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(err, failure.ErrUnauthorized):
		return http.StatusUnauthorized
	case errors.Is(err, failure.ErrForbidden):
		return http.StatusForbidden
	case errors.Is(err, failure.ErrFenced):
		return http.StatusConflict
	case errors.Is(err, failure.ErrUnavailable):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// ErrorOf renders err in the API's error shape.
func ErrorOf(err error) Error {
	body := ErrorBody{Code: failure.Code(err), Message: err.Error()}
	var fe *failure.Error
	if errors.As(err, &fe) {
		body.Field = fe.Field
		body.Message = fe.Message
	}
	return Error{Error: body}
}

// FailureOf is the one place an HTTP error response becomes a failure kind
// again, on the client side. The code in the body wins over the status.
func FailureOf(status int, body ErrorBody) error {
	kind := failure.FromCode(body.Code)
	if kind == nil {
		switch status {
		case http.StatusNotFound:
			kind = failure.ErrNotFound
		case http.StatusConflict:
			kind = failure.ErrConflict
		case http.StatusBadRequest:
			kind = failure.ErrInvalid
		case http.StatusUnauthorized:
			kind = failure.ErrUnauthorized
		case http.StatusForbidden:
			kind = failure.ErrForbidden
		case http.StatusServiceUnavailable, http.StatusBadGateway, http.StatusGatewayTimeout:
			kind = failure.ErrUnavailable
		default:
			kind = errors.New("internal error")
		}
	}
	msg := body.Message
	if msg == "" {
		msg = http.StatusText(status)
	}
	return &failure.Error{Kind: kind, Field: body.Field, Message: msg}
}
