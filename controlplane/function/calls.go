package function

import (
	"context"
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"strings"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
)

// callView is a durable call as the API shows it.
func callView(c store.Call) api.FnCall {
	out := c.FnCall
	out.CreatedAt = fnTime(out.CreatedAt)
	if out.StartedAt != nil {
		t := fnTime(*out.StartedAt)
		out.StartedAt = &t
	}
	if out.CompletedAt != nil {
		t := fnTime(*out.CompletedAt)
		out.CompletedAt = &t
	}
	return out
}

// readCall returns the function's durable call.
func (s *Service) readCall(ctx context.Context, fnID, callID string) (store.Call, error) {
	var c store.Call
	err := s.store.View(ctx, func(tx store.Tx) (err error) {
		c, err = tx.GetCall(callID)
		if err == nil && c.FnID != fnID {
			err = failure.NotFound("call", callID)
		}
		return notFoundAs(err, errCallNotFound)
	})
	return c, err
}

func (s *Service) fnGetCall(w http.ResponseWriter, r *http.Request) {
	c, err := s.readCall(r.Context(), r.PathValue("fn_id"), r.PathValue("call_id"))
	if err != nil {
		s.fnFail(w, err)
		return
	}
	writeFnJSON(w, http.StatusOK, callView(c))
}

func (s *Service) fnListCalls(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	_, perPage := httpapi.PageParams(r)
	after := ""
	if c := q.Get("cursor"); c != "" {
		if b, err := base64.RawURLEncoding.DecodeString(c); err == nil {
			after = string(b)
		}
	}
	var calls []store.Call
	err := s.store.View(r.Context(), func(tx store.Tx) error {
		if _, err := tx.GetFn(r.PathValue("fn_id")); err != nil {
			return notFoundAs(err, errFnNotFound)
		}
		var err error
		calls, err = tx.ListCalls(store.ListFnOptions{FnID: r.PathValue("fn_id"), After: after, Limit: perPage})
		return notFoundAs(err, errCallNotFound)
	})
	if err != nil {
		s.fnFail(w, err)
		return
	}
	var out api.FnCallList
	out.Items, out.NextCursor = httpapi.ListPage(calls, perPage, callView, func(c store.Call) string { return c.ID })
	writeFnJSON(w, http.StatusOK, out)
}

// fnGetCallLog answers with the call's output: text, or Fn's JSON body
// when the client asks for application/json. A durable call's is stored
// with it (one that has not run yet has none); any other call ID is taken
// for a synchronous call's, whose log the nodes keep (logs.go).
func (s *Service) fnGetCallLog(w http.ResponseWriter, r *http.Request) {
	fnID, callID := r.PathValue("fn_id"), r.PathValue("call_id")
	c, err := s.readCall(r.Context(), fnID, callID)
	text := c.Log
	switch {
	case errors.Is(err, errCallNotFound):
		text, err = s.syncCallLog(r.Context(), fnID, callID)
	case err == nil && c.Status == api.CallQueued && c.Attempts == 0:
		err = errCallLogNotFound
	}
	if err != nil {
		s.fnFail(w, err)
		return
	}
	if strings.Contains(r.Header.Get("Accept"), "application/json") {
		writeFnJSON(w, http.StatusOK, api.CallLogResponse{Message: "Successfully loaded log", Log: api.CallLog{CallID: callID, Log: text}})
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, text)
}

// fnGetCallResult (Mercator) answers with the function's response to a
// durable call, as the function gave it: its status, headers and body.
func (s *Service) fnGetCallResult(w http.ResponseWriter, r *http.Request) {
	c, err := s.readCall(r.Context(), r.PathValue("fn_id"), r.PathValue("call_id"))
	if err == nil && c.ResponseStatus == 0 {
		err = fnError(http.StatusNotFound, "Call result not found: the call is %s", c.Status)
	}
	if err != nil {
		s.fnFail(w, err)
		return
	}
	for k, vs := range c.ResponseHeader {
		w.Header()[k] = append([]string(nil), vs...)
	}
	w.Header().Set("Fn-Call-Id", c.ID)
	w.WriteHeader(c.ResponseStatus)
	w.Write(c.ResponseBody)
}
