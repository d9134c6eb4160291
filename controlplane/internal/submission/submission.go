// Package submission makes a keyed run submission (api.HeaderIdempotencyKey)
// create its runs once. Its runs' IDs are derived from the caller, the key
// and each run's place in the request, and every run carries the
// submission's fingerprint (store.Run.Submission: route, caller, key and
// body). A retry, on any replica, finds the runs by those IDs and is
// answered with them; two copies of the request racing both try to create
// the same IDs and the store refuses the second (ErrConflict), which then
// answers with the first's runs. Nothing is kept beside the runs, so a key
// holds as long as its runs do (retention) and needs no table or sweep of
// its own.
//
// Without it, a submission whose answer was lost (the replica it reached
// died after committing) could only be retried blind: a leader-kill
// simulation that retried on the other replica created 100 runs twice.
// Only package controlplane imports it; it reads and writes through the
// functions it is given.
package submission

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
)

// Key is one keyed request.
type Key struct {
	key         string
	caller      string
	fingerprint string
}

// Of reads r's idempotency key; nil without one. body is the decoded
// request, which the fingerprint covers as JSON (so a retry encoded
// differently, its fields in another order, is still the same request).
func Of(r *http.Request, body any) (*Key, error) {
	key := r.Header.Get(api.HeaderIdempotencyKey)
	if key == "" {
		return nil, nil
	}
	if err := Valid(key); err != nil {
		return nil, err
	}
	caller, _ := httpapi.CallerOf(r.Context())
	canonical, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256([]byte(r.URL.Path + "\x00" + caller.Name + "\x00" + key + "\x00" + string(canonical)))
	return &Key{key: key, caller: caller.Name, fingerprint: hex.EncodeToString(sum[:])}, nil
}

// Valid checks a key's length and characters.
func Valid(key string) error {
	if len(key) > api.MaxIdempotencyKey {
		return failure.Invalid(api.HeaderIdempotencyKey, "is %d characters; at most %d", len(key), api.MaxIdempotencyKey)
	}
	for _, c := range key {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' || c == ':'
		if !ok {
			return failure.Invalid(api.HeaderIdempotencyKey, "holds %q; use letters, digits and - _ . : only (a UUID will do)", c)
		}
	}
	return nil
}

// ID is the ID of the submission's run i (its place in the request), ""
// for an unkeyed submission (nil k), whose runs get new IDs. A run must be
// given its ID as it is admitted, before anything that binds to the ID is
// made: its secrets are sealed with the ID as associated data, and a run
// sealed under one ID and stored under another could never open them.
func (k *Key) ID(i int) string {
	if k == nil {
		return ""
	}
	return httpapi.DerivedID("r-", "submission", k.caller, k.key, strconv.Itoa(i))
}

// ids are the IDs of the submission's n runs, in request order.
func (k *Key) ids(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = k.ID(i)
	}
	return out
}

// View reads the store (store.Store.View).
type View func(ctx context.Context, fn func(tx store.Tx) error) error

// Write commits fn (the control plane's group commit).
type Write func(ctx context.Context, fn func(tx store.Tx) error) error

// Replayed returns the n runs an earlier copy of k created, in request
// order, and true; false when it created none. A key used for another
// request, or whose runs are no longer all kept, is a conflict.
func (k *Key) Replayed(ctx context.Context, view View, n int) ([]store.Run, bool, error) {
	ids := k.ids(n)
	var found []store.Run
	if err := view(ctx, func(tx store.Tx) error {
		var err error
		found, err = tx.GetRuns(ids)
		return err
	}); err != nil {
		return nil, false, err
	}
	if len(found) == 0 {
		return nil, false, nil
	}
	byID := make(map[string]store.Run, len(found))
	for _, run := range found {
		if run.Submission != k.fingerprint {
			return nil, false, failure.Conflict("%s %q was used for another request by this caller; send a new key with a new submission", api.HeaderIdempotencyKey, k.key)
		}
		byID[run.ID] = run
	}
	runs := make([]store.Run, n)
	for i, id := range ids {
		run, ok := byID[id]
		if !ok {
			return nil, false, failure.Conflict("the runs submitted with %s %q are no longer all kept (retention); send a new key", api.HeaderIdempotencyKey, k.key)
		}
		runs[i] = run
	}
	return runs, true, nil
}

// Create creates the admitted runs of the submission k (nil: an unkeyed
// one, created as they are); the caller has looked for an earlier copy
// (Replayed) before admitting them, and admitted run i under k.ID(i). It
// returns the runs to answer with and whether they are an earlier copy's,
// one that committed since that look. A run admitted under another ID is
// refused rather than renamed (see ID).
func (k *Key) Create(ctx context.Context, write Write, view View, runs []store.Run) ([]store.Run, bool, error) {
	if k == nil {
		return runs, false, write(ctx, func(tx store.Tx) error { return tx.CreateRuns(runs) })
	}
	for i, id := range k.ids(len(runs)) {
		if runs[i].ID != id {
			return nil, false, fmt.Errorf("keyed submission: run %d was admitted as %s, not under its key's ID %s", i, runs[i].ID, id)
		}
		runs[i].Submission = k.fingerprint
	}
	err := write(ctx, func(tx store.Tx) error { return tx.CreateRuns(runs) })
	if errors.Is(err, failure.ErrConflict) {
		// A copy of this request committed between the look and the
		// create: answer with its runs.
		if earlier, ok, rerr := k.Replayed(ctx, view, len(runs)); rerr != nil || ok {
			return earlier, ok, rerr
		}
	}
	return runs, false, err
}

// Render is the API's picture of a stored run.
type Render func(store.Run) api.Run

// Answer writes a submission's answer: 201 with the runs, marked as a
// replay when they are an earlier copy's. one answers a single submission
// (POST /v1/runs: the run itself) rather than a batch's list.
func Answer(w http.ResponseWriter, runs []store.Run, replay, one bool, render Render) {
	if replay {
		w.Header().Set(api.HeaderIdempotentReplayed, "true")
	}
	if one {
		httpapi.WriteJSON(w, http.StatusCreated, render(runs[0]))
		return
	}
	out := api.RunList{Runs: make([]api.Run, len(runs))}
	for i, run := range runs {
		out.Runs[i] = render(run)
	}
	httpapi.WriteJSON(w, http.StatusCreated, out)
}

// AnswerEarlier answers r from an earlier copy of the keyed submission k
// (nil: none) of n runs, when there is one, and reports whether it
// answered (or wrote an error). A handler calls it before admission: a
// retry then costs no registry call, and is answered even if its image's
// tag has moved since.
func (k *Key) AnswerEarlier(w http.ResponseWriter, r *http.Request, view View, n int, one bool, render Render) bool {
	if k == nil {
		return false
	}
	runs, ok, err := k.Replayed(r.Context(), view, n)
	switch {
	case err != nil:
		httpapi.WriteError(w, err)
		return true
	case ok:
		Answer(w, runs, true, one, render)
		return true
	}
	return false
}
