package client

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"

	"github.com/mercator/mercator/api"
)

// SubmitOption adjusts a submission (SubmitRun, SubmitRuns).
type SubmitOption func(*submitOptions)

type submitOptions struct{ key string }

// IdempotencyKey keys a submission (api.HeaderIdempotencyKey): sent again
// with the same key and the same specs, to any replica, it returns the
// runs the first call created instead of creating more, and the same key
// with other specs is refused (failure.ErrConflict). Use one key for every
// retry of one submission, and a new one (NewIdempotencyKey) for the next.
func IdempotencyKey(key string) SubmitOption {
	return func(o *submitOptions) { o.key = key }
}

// NewIdempotencyKey is a fresh key: 128 random bits in hex.
func NewIdempotencyKey() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// submitHeader is the request header opts ask for; nil for none.
func submitHeader(opts []SubmitOption) http.Header {
	var o submitOptions
	for _, opt := range opts {
		opt(&o)
	}
	if o.key == "" {
		return nil
	}
	return http.Header{api.HeaderIdempotencyKey: {o.key}}
}
