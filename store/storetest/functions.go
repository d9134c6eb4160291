package storetest

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
)

// The Functions part of the suite (store.FunctionsTx).

func sampleApp(id, name string) store.App {
	return store.App{App: api.App{ID: id, Name: name, Config: map[string]string{"A": "1"},
		Annotations: api.Annotations{"team": json.RawMessage(`"ml"`)}, Shape: "GENERIC_X86",
		CreatedAt: at(0), UpdatedAt: at(time.Second)},
		SealedConfig: map[string][]byte{"TOKEN": {0, 1, 2, 0xff}}}
}

func sampleFn(id, appID, name string) store.Fn {
	return store.Fn{Fn: api.Fn{ID: id, AppID: appID, Name: name, Image: "registry.local/f:1",
		PinnedImage: "registry.local/f@sha256:" + fmt.Sprintf("%064x", 1), Memory: 256, Timeout: 30, IdleTimeout: 30,
		Config: map[string]string{"B": "2"}, CPU: 0.5, GPUs: 1, GPUModel: "H100", MaxConcurrency: 4, Shape: "GENERIC_ARM",
		CreatedAt: at(0), UpdatedAt: at(time.Second)},
		SealedConfig: map[string][]byte{"KEY": {0xff, 0}}}
}

func sampleTrigger(id, appID, fnID, name, source string) store.Trigger {
	return store.Trigger{Trigger: api.Trigger{ID: id, AppID: appID, FnID: fnID, Name: name, Type: "http", Source: source,
		CreatedAt: at(0), UpdatedAt: at(time.Second)}}
}

func sampleCall(id, fnID string, created time.Time, status string, due time.Time) store.Call {
	return store.Call{FnCall: api.FnCall{ID: id, FnID: fnID, AppID: "app-1", Status: status, CreatedAt: created},
		Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte{0, 1, 2, 0xff},
		Due: due}
}

func appNames(as []store.App) []string { return ids(as, func(a store.App) string { return a.Name }) }
func fnNames(fs []store.Fn) []string   { return ids(fs, func(f store.Fn) string { return f.Name }) }
func triggerNames(ts []store.Trigger) []string {
	return ids(ts, func(t store.Trigger) string { return t.Name })
}
func callIDs(cs []store.Call) []string { return ids(cs, func(c store.Call) string { return c.ID }) }

// testApps: unique IDs and names, lookup by name, byte-wise name order
// with a cursor, replace and delete.
func testApps(t *testing.T, s store.Store) {
	update(t, s, func(tx store.Tx) error {
		_, err := tx.GetApp("app-missing")
		wantKind(t, err, failure.ErrNotFound, "app-missing")
		_, err = tx.GetAppByName("missing")
		wantKind(t, err, failure.ErrNotFound, "missing")
		// Upper case sorts before lower case byte-wise, whatever a
		// database's collation says.
		for i, name := range []string{"beta", "Zeta", "alpha", "alpha-2", "a_b"} {
			must(t, tx.CreateApp(sampleApp(fmt.Sprintf("app-%d", i), name)))
		}
		wantKind(t, tx.CreateApp(sampleApp("app-0", "other")), failure.ErrConflict, "")
		wantKind(t, tx.CreateApp(sampleApp("app-new", "beta")), failure.ErrConflict, "")
		// A secret in the clear is refused: the store holds secrets
		// only sealed.
		clear := sampleApp("app-clear", "clear")
		clear.SecretConfig = map[string]string{"TOKEN": "s3cret"}
		wantKind(t, tx.CreateApp(clear), failure.ErrInvalid, "app-clear")
		// The failed creates left the transaction usable.
		must(t, tx.CreateApp(sampleApp("app-9", "omega")))
		return nil
	})
	view(t, s, func(tx store.Tx) error {
		same(t, "GetApp", must1[store.App](t)(tx.GetApp("app-0")), sampleApp("app-0", "beta"))
		same(t, "GetAppByName", must1[store.App](t)(tx.GetAppByName("alpha")), sampleApp("app-2", "alpha"))
		all := []string{"Zeta", "a_b", "alpha", "alpha-2", "beta", "omega"}
		wantIDs(t, "ListApps", appNames(must1[[]store.App](t)(tx.ListApps(store.ListFnOptions{}))), all)
		wantIDs(t, "ListApps page 1", appNames(must1[[]store.App](t)(tx.ListApps(store.ListFnOptions{Limit: 2}))), all[:2])
		wantIDs(t, "ListApps page 2", appNames(must1[[]store.App](t)(tx.ListApps(store.ListFnOptions{After: "a_b", Limit: 2}))), all[2:4])
		wantIDs(t, "ListApps last page", appNames(must1[[]store.App](t)(tx.ListApps(store.ListFnOptions{After: "beta", Limit: 2}))), all[5:])
		wantIDs(t, "ListApps by name", appNames(must1[[]store.App](t)(tx.ListApps(store.ListFnOptions{Name: "alpha"}))), []string{"alpha"})
		return nil
	})
	update(t, s, func(tx store.Tx) error {
		a := sampleApp("app-0", "beta")
		a.Config = map[string]string{"C": "3"}
		must(t, tx.PutApp(a))
		same(t, "after PutApp", must1[store.App](t)(tx.GetApp("app-0")), a)
		wantKind(t, tx.PutApp(sampleApp("app-missing", "x")), failure.ErrNotFound, "app-missing")
		wantKind(t, tx.PutApp(sampleApp("app-0", "alpha")), failure.ErrConflict, "")
		clear := a
		clear.SecretConfig = map[string]string{"TOKEN": "s3cret"}
		wantKind(t, tx.PutApp(clear), failure.ErrInvalid, "app-0")
		must(t, tx.DeleteApp("app-1"))
		wantKind(t, tx.DeleteApp("app-1"), failure.ErrNotFound, "app-1")
		_, err := tx.GetAppByName("Zeta")
		wantKind(t, err, failure.ErrNotFound, "")
		// The name of a deleted app is free again.
		must(t, tx.CreateApp(sampleApp("app-10", "Zeta")))
		return nil
	})
}

// testFns: names are unique within an app, not across apps; lists filter
// by app and name and page by name.
func testFns(t *testing.T, s store.Store) {
	update(t, s, func(tx store.Tx) error {
		_, err := tx.GetFn("fn-missing")
		wantKind(t, err, failure.ErrNotFound, "fn-missing")
		for i, name := range []string{"resize", "Echo", "hello"} {
			must(t, tx.CreateFn(sampleFn(fmt.Sprintf("fn-a%d", i), "app-a", name)))
		}
		must(t, tx.CreateFn(sampleFn("fn-b0", "app-b", "hello")))
		wantKind(t, tx.CreateFn(sampleFn("fn-x", "app-a", "hello")), failure.ErrConflict, "")
		wantKind(t, tx.CreateFn(sampleFn("fn-a0", "app-c", "other")), failure.ErrConflict, "")
		clear := sampleFn("fn-clear", "app-a", "clear")
		clear.SecretConfig = map[string]string{"KEY": "s3cret"}
		wantKind(t, tx.CreateFn(clear), failure.ErrInvalid, "fn-clear")
		return nil
	})
	view(t, s, func(tx store.Tx) error {
		same(t, "GetFn", must1[store.Fn](t)(tx.GetFn("fn-a2")), sampleFn("fn-a2", "app-a", "hello"))
		wantIDs(t, "ListFns(app-a)", fnNames(must1[[]store.Fn](t)(tx.ListFns(store.ListFnOptions{AppID: "app-a"}))),
			[]string{"Echo", "hello", "resize"})
		wantIDs(t, "ListFns(app-a) after Echo", fnNames(must1[[]store.Fn](t)(tx.ListFns(store.ListFnOptions{AppID: "app-a", After: "Echo", Limit: 1}))),
			[]string{"hello"})
		got := must1[[]store.Fn](t)(tx.ListFns(store.ListFnOptions{Name: "hello"}))
		wantIDs(t, "ListFns(name hello)", ids(got, func(f store.Fn) string { return f.ID }), []string{"fn-a2", "fn-b0"})
		wantIDs(t, "ListFns(app-none)", fnNames(must1[[]store.Fn](t)(tx.ListFns(store.ListFnOptions{AppID: "app-none"}))), []string{})
		return nil
	})
	update(t, s, func(tx store.Tx) error {
		f := sampleFn("fn-a0", "app-a", "resize")
		f.Image, f.Memory = "registry.local/f:2", 512
		must(t, tx.PutFn(f))
		same(t, "after PutFn", must1[store.Fn](t)(tx.GetFn("fn-a0")), f)
		wantKind(t, tx.PutFn(sampleFn("fn-a0", "app-a", "hello")), failure.ErrConflict, "")
		clear := f
		clear.SecretConfig = map[string]string{"KEY": "s3cret"}
		wantKind(t, tx.PutFn(clear), failure.ErrInvalid, "fn-a0")
		wantKind(t, tx.PutFn(sampleFn("fn-missing", "app-a", "new")), failure.ErrNotFound, "fn-missing")
		must(t, tx.DeleteFn("fn-a0"))
		wantKind(t, tx.DeleteFn("fn-a0"), failure.ErrNotFound, "fn-a0")
		return nil
	})
}

// testTriggers: a trigger's name and its (type, source) are each unique
// within its app.
func testTriggers(t *testing.T, s store.Store) {
	update(t, s, func(tx store.Tx) error {
		must(t, tx.CreateTrigger(sampleTrigger("tr-1", "app-a", "fn-1", "hello", "/hello")))
		must(t, tx.CreateTrigger(sampleTrigger("tr-2", "app-a", "fn-2", "bye", "/bye")))
		must(t, tx.CreateTrigger(sampleTrigger("tr-3", "app-b", "fn-3", "hello", "/hello")))
		wantKind(t, tx.CreateTrigger(sampleTrigger("tr-4", "app-a", "fn-1", "hello", "/other")), failure.ErrConflict, "")
		wantKind(t, tx.CreateTrigger(sampleTrigger("tr-5", "app-a", "fn-1", "other", "/hello")), failure.ErrConflict, "")
		wantKind(t, tx.CreateTrigger(sampleTrigger("tr-1", "app-c", "fn-1", "x", "/x")), failure.ErrConflict, "")
		return nil
	})
	view(t, s, func(tx store.Tx) error {
		same(t, "GetTrigger", must1[store.Trigger](t)(tx.GetTrigger("tr-2")), sampleTrigger("tr-2", "app-a", "fn-2", "bye", "/bye"))
		same(t, "GetTriggerBySource", must1[store.Trigger](t)(tx.GetTriggerBySource("app-b", "http", "/hello")),
			sampleTrigger("tr-3", "app-b", "fn-3", "hello", "/hello"))
		_, err := tx.GetTriggerBySource("app-b", "http", "/bye")
		wantKind(t, err, failure.ErrNotFound, "")
		wantIDs(t, "ListTriggers(app-a)", triggerNames(must1[[]store.Trigger](t)(tx.ListTriggers(store.ListFnOptions{AppID: "app-a"}))),
			[]string{"bye", "hello"})
		wantIDs(t, "ListTriggers(fn-1)", triggerNames(must1[[]store.Trigger](t)(tx.ListTriggers(store.ListFnOptions{FnID: "fn-1"}))),
			[]string{"hello"})
		return nil
	})
	update(t, s, func(tx store.Tx) error {
		moved := sampleTrigger("tr-2", "app-a", "fn-2", "bye", "/hello")
		wantKind(t, tx.PutTrigger(moved), failure.ErrConflict, "")
		moved.Source = "/goodbye"
		must(t, tx.PutTrigger(moved))
		same(t, "after PutTrigger", must1[store.Trigger](t)(tx.GetTriggerBySource("app-a", "http", "/goodbye")), moved)
		must(t, tx.DeleteTrigger("tr-1"))
		wantKind(t, tx.DeleteTrigger("tr-1"), failure.ErrNotFound, "tr-1")
		// Its source is free again.
		must(t, tx.CreateTrigger(sampleTrigger("tr-6", "app-a", "fn-2", "hi", "/hello")))
		return nil
	})
}

// testCalls: calls list newest first per function; DueCalls returns the
// pending calls due by now, earliest first; a finished call is never due.
func testCalls(t *testing.T, s store.Store) {
	update(t, s, func(tx store.Tx) error {
		_, err := tx.GetCall("call-missing")
		wantKind(t, err, failure.ErrNotFound, "call-missing")
		must(t, tx.CreateCall(sampleCall("call-1", "fn-1", at(0), api.CallQueued, at(0))))
		must(t, tx.CreateCall(sampleCall("call-2", "fn-1", at(time.Second), api.CallRunning, at(time.Minute))))
		must(t, tx.CreateCall(sampleCall("call-3", "fn-2", at(2*time.Second), api.CallQueued, at(-time.Second))))
		must(t, tx.CreateCall(sampleCall("call-4", "fn-1", at(3*time.Second), api.CallSuccess, at(-time.Hour))))
		wantKind(t, tx.CreateCall(sampleCall("call-1", "fn-9", at(0), api.CallQueued, at(0))), failure.ErrConflict, "call-1")
		return nil
	})
	view(t, s, func(tx store.Tx) error {
		same(t, "GetCall", must1[store.Call](t)(tx.GetCall("call-3")), sampleCall("call-3", "fn-2", at(2*time.Second), api.CallQueued, at(-time.Second)))
		wantIDs(t, "ListCalls(fn-1)", callIDs(must1[[]store.Call](t)(tx.ListCalls(store.ListFnOptions{FnID: "fn-1"}))),
			[]string{"call-4", "call-2", "call-1"})
		wantIDs(t, "ListCalls(fn-1) after call-4", callIDs(must1[[]store.Call](t)(tx.ListCalls(store.ListFnOptions{FnID: "fn-1", After: "call-4", Limit: 1}))),
			[]string{"call-2"})
		_, err := tx.ListCalls(store.ListFnOptions{After: "call-missing"})
		wantKind(t, err, failure.ErrNotFound, "call-missing")
		wantIDs(t, "DueCalls(t0)", callIDs(must1[[]store.Call](t)(tx.DueCalls(at(0), 0))), []string{"call-3", "call-1"})
		wantIDs(t, "DueCalls(t0+1m)", callIDs(must1[[]store.Call](t)(tx.DueCalls(at(time.Minute), 0))), []string{"call-3", "call-1", "call-2"})
		wantIDs(t, "DueCalls limit", callIDs(must1[[]store.Call](t)(tx.DueCalls(at(time.Minute), 1))), []string{"call-3"})
		return nil
	})
	update(t, s, func(tx store.Tx) error {
		c := must1[store.Call](t)(tx.GetCall("call-1"))
		c.Status, c.ResponseBody, c.Log = api.CallSuccess, []byte("done"), "log line\n"
		must(t, tx.PutCall(c))
		same(t, "after PutCall", must1[store.Call](t)(tx.GetCall("call-1")), c)
		wantKind(t, tx.PutCall(sampleCall("call-missing", "fn-1", at(0), api.CallQueued, at(0))), failure.ErrNotFound, "call-missing")
		return nil
	})
	view(t, s, func(tx store.Tx) error {
		wantIDs(t, "DueCalls after success", callIDs(must1[[]store.Call](t)(tx.DueCalls(at(time.Hour), 0))), []string{"call-3", "call-2"})
		return nil
	})
	update(t, s, func(tx store.Tx) error {
		invalid := func(what string, err error) {
			t.Helper()
			if !errors.Is(err, failure.ErrInvalid) {
				t.Errorf("%s: error = %v, want ErrInvalid", what, err)
			}
		}
		invalid("CreateApp without name", tx.CreateApp(sampleApp("app-x", "")))
		invalid("CreateFn without app", tx.CreateFn(sampleFn("fn-x", "", "x")))
		invalid("CreateTrigger without source", tx.CreateTrigger(sampleTrigger("tr-x", "app-a", "fn-1", "x", "")))
		invalid("CreateCall without fn", tx.CreateCall(sampleCall("call-x", "", at(0), api.CallQueued, at(0))))
		return nil
	})
}
