package memstore

import (
	"cmp"
	"slices"
	"time"

	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/internal/record"
)

// functionTables are the Functions records (store.FunctionsTx), each table
// by ID. Uniqueness by name and source is checked by scanning: this is a
// fake for tests, and a scan is the rule stated plainly.
type functionTables struct {
	apps, fns, triggers, calls map[string][]byte
}

func newFunctionTables() functionTables {
	return functionTables{apps: map[string][]byte{}, fns: map[string][]byte{}, triggers: map[string][]byte{}, calls: map[string][]byte{}}
}

// all decodes every record of a table.
func all[T any](t *tx, m map[string][]byte, what string) ([]T, error) {
	if err := t.readable(); err != nil {
		return nil, err
	}
	out := make([]T, 0, len(m))
	for id, b := range m {
		v, err := decode[T](what, id, b)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// page sorts by name (byte-wise) and then ID, as sqlstore does (names
// repeat across apps), keeps those after the cursor, and cuts at the limit.
func page[T any](items []T, name, id func(T) string, opts store.ListFnOptions) []T {
	slices.SortFunc(items, func(a, b T) int { return cmp.Or(cmp.Compare(name(a), name(b)), cmp.Compare(id(a), id(b))) })
	out := items[:0]
	for _, it := range items {
		if opts.After != "" && name(it) <= opts.After {
			continue
		}
		out = append(out, it)
		if opts.Limit > 0 && len(out) == opts.Limit {
			break
		}
	}
	return out
}

func (t *tx) CreateApp(a store.App) error {
	if err := record.App(a); err != nil {
		return err
	}
	if err := t.writable(); err != nil {
		return err
	}
	if _, err := t.GetAppByName(a.Name); err == nil {
		return failure.Conflict("app named %q already exists", a.Name)
	}
	return put(t, "fn_apps", &t.st.functions.apps, "app", a.ID, a, create)
}

func (t *tx) GetApp(id string) (store.App, error) {
	return get[store.App](t, t.st.functions.apps, "app", id)
}

func (t *tx) GetAppByName(name string) (store.App, error) {
	apps, err := all[store.App](t, t.st.functions.apps, "app")
	if err != nil {
		return store.App{}, err
	}
	for _, a := range apps {
		if a.Name == name {
			return a, nil
		}
	}
	return store.App{}, failure.NotFound("app", name)
}

func (t *tx) PutApp(a store.App) error {
	if err := record.App(a); err != nil {
		return err
	}
	if err := t.writable(); err != nil {
		return err
	}
	if other, err := t.GetAppByName(a.Name); err == nil && other.ID != a.ID {
		return failure.Conflict("app named %q already exists", a.Name)
	}
	return put(t, "fn_apps", &t.st.functions.apps, "app", a.ID, a, replace)
}

func (t *tx) DeleteApp(id string) error {
	return remove(t, "fn_apps", &t.st.functions.apps, "app", id)
}

func (t *tx) ListApps(opts store.ListFnOptions) ([]store.App, error) {
	apps, err := all[store.App](t, t.st.functions.apps, "app")
	if err != nil {
		return nil, err
	}
	apps = slices.DeleteFunc(apps, func(a store.App) bool { return opts.Name != "" && a.Name != opts.Name })
	return page(apps, func(a store.App) string { return a.Name }, func(a store.App) string { return a.ID }, opts), nil
}

func (t *tx) CreateFn(f store.Fn) error {
	if err := record.Fn(f); err != nil {
		return err
	}
	if err := t.writable(); err != nil {
		return err
	}
	if err := t.fnNameFree(f); err != nil {
		return err
	}
	return put(t, "fn_fns", &t.st.functions.fns, "fn", f.ID, f, create)
}

func (t *tx) fnNameFree(f store.Fn) error {
	fns, err := all[store.Fn](t, t.st.functions.fns, "fn")
	if err != nil {
		return err
	}
	for _, o := range fns {
		if o.ID != f.ID && o.AppID == f.AppID && o.Name == f.Name {
			return failure.Conflict("app %q already has a function named %q", f.AppID, f.Name)
		}
	}
	return nil
}

func (t *tx) GetFn(id string) (store.Fn, error) {
	return get[store.Fn](t, t.st.functions.fns, "fn", id)
}

func (t *tx) PutFn(f store.Fn) error {
	if err := record.Fn(f); err != nil {
		return err
	}
	if err := t.writable(); err != nil {
		return err
	}
	if err := t.fnNameFree(f); err != nil {
		return err
	}
	return put(t, "fn_fns", &t.st.functions.fns, "fn", f.ID, f, replace)
}

func (t *tx) DeleteFn(id string) error {
	return remove(t, "fn_fns", &t.st.functions.fns, "fn", id)
}

func (t *tx) ListFns(opts store.ListFnOptions) ([]store.Fn, error) {
	fns, err := all[store.Fn](t, t.st.functions.fns, "fn")
	if err != nil {
		return nil, err
	}
	fns = slices.DeleteFunc(fns, func(f store.Fn) bool {
		return opts.AppID != "" && f.AppID != opts.AppID || opts.Name != "" && f.Name != opts.Name
	})
	return page(fns, func(f store.Fn) string { return f.Name }, func(f store.Fn) string { return f.ID }, opts), nil
}

func (t *tx) CreateTrigger(tr store.Trigger) error {
	if err := record.Trigger(tr); err != nil {
		return err
	}
	if err := t.writable(); err != nil {
		return err
	}
	if err := t.triggerFree(tr); err != nil {
		return err
	}
	return put(t, "fn_triggers", &t.st.functions.triggers, "trigger", tr.ID, tr, create)
}

func (t *tx) triggerFree(tr store.Trigger) error {
	trs, err := all[store.Trigger](t, t.st.functions.triggers, "trigger")
	if err != nil {
		return err
	}
	for _, o := range trs {
		if o.ID == tr.ID || o.AppID != tr.AppID {
			continue
		}
		if o.Name == tr.Name {
			return failure.Conflict("app %q already has a trigger named %q", tr.AppID, tr.Name)
		}
		if o.Type == tr.Type && o.Source == tr.Source {
			return failure.Conflict("app %q already has a %s trigger on %q", tr.AppID, tr.Type, tr.Source)
		}
	}
	return nil
}

func (t *tx) GetTrigger(id string) (store.Trigger, error) {
	return get[store.Trigger](t, t.st.functions.triggers, "trigger", id)
}

func (t *tx) GetTriggerBySource(appID, typ, source string) (store.Trigger, error) {
	trs, err := all[store.Trigger](t, t.st.functions.triggers, "trigger")
	if err != nil {
		return store.Trigger{}, err
	}
	for _, tr := range trs {
		if tr.AppID == appID && tr.Type == typ && tr.Source == source {
			return tr, nil
		}
	}
	return store.Trigger{}, failure.NotFound("trigger", appID+" "+typ+" "+source)
}

func (t *tx) PutTrigger(tr store.Trigger) error {
	if err := record.Trigger(tr); err != nil {
		return err
	}
	if err := t.writable(); err != nil {
		return err
	}
	if err := t.triggerFree(tr); err != nil {
		return err
	}
	return put(t, "fn_triggers", &t.st.functions.triggers, "trigger", tr.ID, tr, replace)
}

func (t *tx) DeleteTrigger(id string) error {
	return remove(t, "fn_triggers", &t.st.functions.triggers, "trigger", id)
}

func (t *tx) ListTriggers(opts store.ListFnOptions) ([]store.Trigger, error) {
	trs, err := all[store.Trigger](t, t.st.functions.triggers, "trigger")
	if err != nil {
		return nil, err
	}
	trs = slices.DeleteFunc(trs, func(tr store.Trigger) bool {
		return opts.AppID != "" && tr.AppID != opts.AppID || opts.FnID != "" && tr.FnID != opts.FnID ||
			opts.Name != "" && tr.Name != opts.Name
	})
	return page(trs, func(tr store.Trigger) string { return tr.Name }, func(tr store.Trigger) string { return tr.ID }, opts), nil
}

func (t *tx) CreateCall(c store.Call) error {
	if err := record.Call(c); err != nil {
		return err
	}
	return put(t, "fn_calls", &t.st.functions.calls, "call", c.ID, c, create)
}

func (t *tx) GetCall(id string) (store.Call, error) {
	return get[store.Call](t, t.st.functions.calls, "call", id)
}

func (t *tx) PutCall(c store.Call) error {
	if err := record.Call(c); err != nil {
		return err
	}
	return put(t, "fn_calls", &t.st.functions.calls, "call", c.ID, c, replace)
}

func (t *tx) ListCalls(opts store.ListFnOptions) ([]store.Call, error) {
	calls, err := all[store.Call](t, t.st.functions.calls, "call")
	if err != nil {
		return nil, err
	}
	newer := func(a, b store.Call) int { // newest first
		return -cmp.Or(a.CreatedAt.Compare(b.CreatedAt), cmp.Compare(a.ID, b.ID))
	}
	var cursor *store.Call
	if opts.After != "" {
		c, err := t.GetCall(opts.After)
		if err != nil {
			return nil, err
		}
		cursor = &c
	}
	out := calls[:0]
	for _, c := range calls {
		if opts.FnID != "" && c.FnID != opts.FnID || opts.AppID != "" && c.AppID != opts.AppID {
			continue
		}
		if cursor != nil && newer(c, *cursor) <= 0 {
			continue
		}
		out = append(out, c)
	}
	slices.SortFunc(out, newer)
	if opts.Limit > 0 && len(out) > opts.Limit {
		out = out[:opts.Limit]
	}
	return out, nil
}

func (t *tx) DueCalls(now time.Time, limit int) ([]store.Call, error) {
	calls, err := all[store.Call](t, t.st.functions.calls, "call")
	if err != nil {
		return nil, err
	}
	calls = slices.DeleteFunc(calls, func(c store.Call) bool { return !c.Pending() || c.Due.After(now) })
	slices.SortFunc(calls, func(a, b store.Call) int { return cmp.Or(a.Due.Compare(b.Due), cmp.Compare(a.ID, b.ID)) })
	if limit > 0 && len(calls) > limit {
		calls = calls[:limit]
	}
	return calls, nil
}

// remove deletes id from the named table; ErrNotFound if it is absent.
func remove(t *tx, name string, m *map[string][]byte, what, id string) error {
	if err := t.writable(); err != nil {
		return err
	}
	if _, ok := (*m)[id]; !ok {
		return failure.NotFound(what, id)
	}
	delete(table(t, name, m), id)
	return nil
}
