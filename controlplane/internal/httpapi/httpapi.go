package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/internal/decoder"
	"github.com/mercator/mercator/store"
)

// MaxBody bounds every request body the server decodes as JSON, except a
// POST /v1/runs/batch's (its own limit, in package controlplane).
const MaxBody = 1 << 20

// Route is one public route: a ServeMux pattern, its handler, and who may
// call it. Every route is served behind an API credential (Tokens.Require).
// The packages that serve routes leave Role empty: package controlplane
// declares every route's role in one table, next to the route table.
type Route struct {
	Pattern string
	Handler func(http.ResponseWriter, *http.Request)
	Access  Access
}

// NodeCaller is the node a node-protocol request comes from, as its session
// credential proved.
type NodeCaller struct {
	NodeID  string
	Session store.Session
}

// NodeHandler serves a node-protocol request from an authenticated node.
type NodeHandler func(http.ResponseWriter, *http.Request, NodeCaller)

// NodeRoute is one node-protocol route served behind a session credential.
type NodeRoute struct {
	Pattern string
	Handler NodeHandler
}

// Bearer returns the request's bearer credential; false when there is none.
func Bearer(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	tok, ok := strings.CutPrefix(h, "Bearer ")
	tok = strings.TrimSpace(tok)
	return tok, ok && tok != ""
}

// Decode reads exactly one JSON object into v, refusing unknown fields,
// trailing data and bodies over limit bytes with an invalid-kind error.
// The body is decoded as it is read, not read whole first: the decoder's
// buffer is then the one copy of it in memory (a body read whole and then
// decoded was two, with the garbage of both growing).
func Decode(r *http.Request, limit int64, v any) error {
	body := &countingReader{r: io.LimitReader(r.Body, limit+1)}
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	switch {
	case body.n > limit:
		return tooLarge(limit)
	case body.err != nil:
		return failure.Invalid("", "reading request body: %v", body.err)
	case err == io.EOF:
		return failure.Invalid("", "request body is empty; send a JSON object")
	case err != nil:
		return invalidJSON(err)
	}
	more := dec.More()
	if body.n > limit {
		return tooLarge(limit)
	}
	if more {
		return failure.Invalid("", "trailing data after the JSON object")
	}
	return nil
}

// DecodeBuffered is Decode for the small, machine-written bodies of the hot
// paths (an agent's events: every heartbeat is one): it reads the body
// whole, at most limit bytes, and decodes it with package decoder, three to
// five times faster than encoding/json on those types. It accepts and
// refuses exactly what Decode does, with the same errors.
func DecodeBuffered(r *http.Request, limit int64, v any) error {
	body := &countingReader{r: io.LimitReader(r.Body, limit+1)}
	data, _ := io.ReadAll(body)
	switch {
	case body.n > limit:
		return tooLarge(limit)
	case body.err != nil:
		return failure.Invalid("", "reading request body: %v", body.err)
	case len(bytes.TrimSpace(data)) == 0:
		return failure.Invalid("", "request body is empty; send a JSON object")
	}
	err := decoder.Strict(data, v)
	if errors.Is(err, decoder.ErrTrailing) {
		return failure.Invalid("", "trailing data after the JSON object")
	}
	if err != nil {
		return invalidJSON(err)
	}
	return nil
}

// invalidJSON is the invalid-kind error for a body encoding/json refused:
// the field and the type it wanted, where the body had a wrong one.
func invalidJSON(err error) error {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr):
		return failure.Invalid(typeErr.Field, "must be of JSON type %s, not %s", typeErr.Type, typeErr.Value)
	case errors.As(err, &syntaxErr):
		return failure.Invalid("", "malformed JSON at byte %d: %v", syntaxErr.Offset, err)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		field := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return failure.Invalid(field, "unknown field; see /v1/openapi.json for the accepted fields")
	}
	return failure.Invalid("", "malformed JSON: %v", err)
}

func tooLarge(limit int64) error {
	return failure.Invalid("", "request body is larger than %d bytes", limit)
}

// countingReader counts what it read and keeps the first read error other
// than io.EOF (a body cut off, a read deadline, http.MaxBytesReader's).
type countingReader struct {
	r   io.Reader
	n   int64
	err error
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if err != nil && err != io.EOF && c.err == nil {
		c.err = err
	}
	return n, err
}

// WriteJSON answers with status and v as indented JSON.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// WriteError answers with err in the /v1 API's error shape, its status
// the one its failure kind maps to (api.StatusOf).
func WriteError(w http.ResponseWriter, err error) {
	WriteJSON(w, api.StatusOf(err), api.ErrorOf(err))
}

// Recoverer turns a panic in a handler into a 500 with the API's error
// shape instead of a dropped connection, and logs it. A malformed request
// must never take the process down. http.ErrAbortHandler passes through:
// it is how a handler cuts a response off on purpose.
func Recoverer(log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				log.Error("handler panic", "method", r.Method, "path", r.URL.Path, "panic", v)
				WriteError(w, fmt.Errorf("internal error"))
			}
		}()
		next.ServeHTTP(w, r)
	})
}
