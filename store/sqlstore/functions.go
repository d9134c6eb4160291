package sqlstore

import (
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/internal/record"
)

// Functions: apps, fns, triggers and durable calls (schema version 3, see
// migrate.go). Names are ordered and paged through name_key (record.NameKey)
// rather than the name itself, because PostgreSQL compares TEXT by the
// database's collation and SQLite byte-wise; hex orders the same in both.
//
// Uniqueness is the schema's (UNIQUE constraints), and a Create is an
// INSERT … ON CONFLICT DO NOTHING that reports a conflict when it inserted
// nothing, which keeps a PostgreSQL transaction usable after it. A Put
// checks the rules with a SELECT first, for the same reason.

// functionsMigration is the Functions schema.
var functionsMigration = []string{
	`CREATE TABLE fn_apps (
		id TEXT PRIMARY KEY,
		name TEXT NOT NULL UNIQUE,
		name_key TEXT NOT NULL,
		doc TEXT NOT NULL
	)`,
	`CREATE INDEX fn_apps_by_name ON fn_apps (name_key)`,
	`CREATE TABLE fn_fns (
		id TEXT PRIMARY KEY,
		app_id TEXT NOT NULL,
		name TEXT NOT NULL,
		name_key TEXT NOT NULL,
		doc TEXT NOT NULL,
		UNIQUE (app_id, name)
	)`,
	`CREATE INDEX fn_fns_by_name ON fn_fns (app_id, name_key)`,
	`CREATE TABLE fn_triggers (
		id TEXT PRIMARY KEY,
		app_id TEXT NOT NULL,
		fn_id TEXT NOT NULL,
		name TEXT NOT NULL,
		name_key TEXT NOT NULL,
		type TEXT NOT NULL,
		source TEXT NOT NULL,
		doc TEXT NOT NULL,
		UNIQUE (app_id, name),
		UNIQUE (app_id, type, source)
	)`,
	`CREATE INDEX fn_triggers_by_name ON fn_triggers (app_id, name_key)`,
	`CREATE INDEX fn_triggers_by_fn ON fn_triggers (fn_id, name_key)`,
	// pending is 1 while the call may still be delivered (queued or
	// running); due orders the dispatcher's work.
	`CREATE TABLE fn_calls (
		id TEXT PRIMARY KEY,
		fn_id TEXT NOT NULL,
		app_id TEXT NOT NULL,
		created_sec BIGINT NOT NULL,
		created_nsec BIGINT NOT NULL,
		pending INTEGER NOT NULL,
		due_sec BIGINT NOT NULL,
		due_nsec BIGINT NOT NULL,
		doc TEXT NOT NULL
	)`,
	`CREATE INDEX fn_calls_due ON fn_calls (pending, due_sec, due_nsec, id)`,
	`CREATE INDEX fn_calls_by_fn ON fn_calls (fn_id, created_sec, created_nsec, id)`,
}

// listQuery builds a SELECT id, doc over table with the filters given as
// column → value (empty values skipped), names after opts.After, ordered by
// name_key, limited to opts.Limit.
func listQuery(table string, filters [][2]string, opts store.ListFnOptions) (string, []any) {
	var where []string
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	for _, f := range filters {
		if f[1] != "" {
			where = append(where, f[0]+" = "+arg(f[1]))
		}
	}
	if opts.After != "" {
		where = append(where, "name_key > "+arg(record.NameKey(opts.After)))
	}
	q := "SELECT id, doc FROM " + table
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY name_key, id"
	if opts.Limit > 0 {
		q += " LIMIT " + arg(opts.Limit)
	}
	return q, args
}

// taken reports whether query (SELECT id … with the args) finds a row
// whose id is not self.
func (t *txn) taken(self, query string, args ...any) (bool, error) {
	if _, bad := t.unstorable(args); bad {
		return false, nil
	}
	rows, err := t.queryContext(query, args...)
	if err != nil {
		return false, fmt.Errorf("sqlstore: check uniqueness: %w", t.note(err))
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return false, fmt.Errorf("sqlstore: check uniqueness: %w", t.note(err))
		}
		if id != self {
			return true, nil
		}
	}
	return false, t.note(rows.Err())
}

func (t *txn) CreateApp(a store.App) error {
	if err := record.App(a); err != nil {
		return err
	}
	if err := t.writable(); err != nil {
		return err
	}
	doc, err := encode("app", a.ID, a)
	if err != nil {
		return err
	}
	return t.create("app", a.ID,
		`INSERT INTO fn_apps (id, name, name_key, doc) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING`,
		a.ID, a.Name, record.NameKey(a.Name), doc)
}

func (t *txn) GetApp(id string) (store.App, error) {
	return getDoc[store.App](t, "app", id, `SELECT doc FROM fn_apps WHERE id = $1`, id)
}

func (t *txn) GetAppByName(name string) (store.App, error) {
	return getDoc[store.App](t, "app", name, `SELECT doc FROM fn_apps WHERE name = $1`, name)
}

func (t *txn) PutApp(a store.App) error {
	if err := record.App(a); err != nil {
		return err
	}
	if err := t.writable(); err != nil {
		return err
	}
	if dup, err := t.taken(a.ID, `SELECT id FROM fn_apps WHERE name = $1`, a.Name); err != nil || dup {
		if dup {
			return failure.Conflict("app named %q already exists", a.Name)
		}
		return err
	}
	doc, err := encode("app", a.ID, a)
	if err != nil {
		return err
	}
	return t.replace("app", a.ID, `UPDATE fn_apps SET name = $2, name_key = $3, doc = $4 WHERE id = $1`,
		a.ID, a.Name, record.NameKey(a.Name), doc)
}

func (t *txn) DeleteApp(id string) error { return t.deleteByID("fn_apps", "app", id) }

func (t *txn) ListApps(opts store.ListFnOptions) ([]store.App, error) {
	q, args := listQuery("fn_apps", [][2]string{{"name", opts.Name}}, opts)
	return listDocs[store.App](t, "app", q, args...)
}

func (t *txn) CreateFn(f store.Fn) error {
	if err := record.Fn(f); err != nil {
		return err
	}
	if err := t.writable(); err != nil {
		return err
	}
	doc, err := encode("fn", f.ID, f)
	if err != nil {
		return err
	}
	return t.create("fn", f.ID,
		`INSERT INTO fn_fns (id, app_id, name, name_key, doc) VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING`,
		f.ID, f.AppID, f.Name, record.NameKey(f.Name), doc)
}

func (t *txn) GetFn(id string) (store.Fn, error) {
	return getDoc[store.Fn](t, "fn", id, `SELECT doc FROM fn_fns WHERE id = $1`, id)
}

func (t *txn) PutFn(f store.Fn) error {
	if err := record.Fn(f); err != nil {
		return err
	}
	if err := t.writable(); err != nil {
		return err
	}
	if dup, err := t.taken(f.ID, `SELECT id FROM fn_fns WHERE app_id = $1 AND name = $2`, f.AppID, f.Name); err != nil || dup {
		if dup {
			return failure.Conflict("app %q already has a function named %q", f.AppID, f.Name)
		}
		return err
	}
	doc, err := encode("fn", f.ID, f)
	if err != nil {
		return err
	}
	return t.replace("fn", f.ID, `UPDATE fn_fns SET app_id = $2, name = $3, name_key = $4, doc = $5 WHERE id = $1`,
		f.ID, f.AppID, f.Name, record.NameKey(f.Name), doc)
}

func (t *txn) DeleteFn(id string) error { return t.deleteByID("fn_fns", "fn", id) }

func (t *txn) ListFns(opts store.ListFnOptions) ([]store.Fn, error) {
	q, args := listQuery("fn_fns", [][2]string{{"app_id", opts.AppID}, {"name", opts.Name}}, opts)
	return listDocs[store.Fn](t, "fn", q, args...)
}

func (t *txn) CreateTrigger(tr store.Trigger) error {
	if err := record.Trigger(tr); err != nil {
		return err
	}
	if err := t.writable(); err != nil {
		return err
	}
	doc, err := encode("trigger", tr.ID, tr)
	if err != nil {
		return err
	}
	return t.create("trigger", tr.ID,
		`INSERT INTO fn_triggers (id, app_id, fn_id, name, name_key, type, source, doc) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
		 ON CONFLICT DO NOTHING`,
		tr.ID, tr.AppID, tr.FnID, tr.Name, record.NameKey(tr.Name), tr.Type, tr.Source, doc)
}

func (t *txn) GetTrigger(id string) (store.Trigger, error) {
	return getDoc[store.Trigger](t, "trigger", id, `SELECT doc FROM fn_triggers WHERE id = $1`, id)
}

func (t *txn) GetTriggerBySource(appID, typ, source string) (store.Trigger, error) {
	return getDoc[store.Trigger](t, "trigger", appID+" "+typ+" "+source,
		`SELECT doc FROM fn_triggers WHERE app_id = $1 AND type = $2 AND source = $3`, appID, typ, source)
}

func (t *txn) PutTrigger(tr store.Trigger) error {
	if err := record.Trigger(tr); err != nil {
		return err
	}
	if err := t.writable(); err != nil {
		return err
	}
	dup, err := t.taken(tr.ID, `SELECT id FROM fn_triggers WHERE app_id = $1 AND name = $2`, tr.AppID, tr.Name)
	if err != nil {
		return err
	}
	if dup {
		return failure.Conflict("app %q already has a trigger named %q", tr.AppID, tr.Name)
	}
	if dup, err = t.taken(tr.ID, `SELECT id FROM fn_triggers WHERE app_id = $1 AND type = $2 AND source = $3`, tr.AppID, tr.Type, tr.Source); err != nil {
		return err
	}
	if dup {
		return failure.Conflict("app %q already has a %s trigger on %q", tr.AppID, tr.Type, tr.Source)
	}
	doc, err := encode("trigger", tr.ID, tr)
	if err != nil {
		return err
	}
	return t.replace("trigger", tr.ID,
		`UPDATE fn_triggers SET app_id = $2, fn_id = $3, name = $4, name_key = $5, type = $6, source = $7, doc = $8 WHERE id = $1`,
		tr.ID, tr.AppID, tr.FnID, tr.Name, record.NameKey(tr.Name), tr.Type, tr.Source, doc)
}

func (t *txn) DeleteTrigger(id string) error { return t.deleteByID("fn_triggers", "trigger", id) }

func (t *txn) ListTriggers(opts store.ListFnOptions) ([]store.Trigger, error) {
	q, args := listQuery("fn_triggers", [][2]string{{"app_id", opts.AppID}, {"fn_id", opts.FnID}, {"name", opts.Name}}, opts)
	return listDocs[store.Trigger](t, "trigger", q, args...)
}

func callPending(c store.Call) int {
	if c.Pending() {
		return 1
	}
	return 0
}

func (t *txn) CreateCall(c store.Call) error {
	if err := record.Call(c); err != nil {
		return err
	}
	if err := t.writable(); err != nil {
		return err
	}
	doc, err := encode("call", c.ID, c)
	if err != nil {
		return err
	}
	return t.create("call", c.ID,
		`INSERT INTO fn_calls (id, fn_id, app_id, created_sec, created_nsec, pending, due_sec, due_nsec, doc)
		 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT DO NOTHING`,
		c.ID, c.FnID, c.AppID, c.CreatedAt.Unix(), c.CreatedAt.Nanosecond(), callPending(c), c.Due.Unix(), c.Due.Nanosecond(), doc)
}

func (t *txn) GetCall(id string) (store.Call, error) {
	return getDoc[store.Call](t, "call", id, `SELECT doc FROM fn_calls WHERE id = $1`, id)
}

func (t *txn) PutCall(c store.Call) error {
	if err := record.Call(c); err != nil {
		return err
	}
	if err := t.writable(); err != nil {
		return err
	}
	doc, err := encode("call", c.ID, c)
	if err != nil {
		return err
	}
	return t.replace("call", c.ID,
		`UPDATE fn_calls SET fn_id = $2, app_id = $3, created_sec = $4, created_nsec = $5, pending = $6, due_sec = $7, due_nsec = $8, doc = $9
		 WHERE id = $1`,
		c.ID, c.FnID, c.AppID, c.CreatedAt.Unix(), c.CreatedAt.Nanosecond(), callPending(c), c.Due.Unix(), c.Due.Nanosecond(), doc)
}

func (t *txn) ListCalls(opts store.ListFnOptions) ([]store.Call, error) {
	if err := t.readable(); err != nil {
		return nil, err
	}
	var where []string
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	if opts.FnID != "" {
		where = append(where, "fn_id = "+arg(opts.FnID))
	}
	if opts.AppID != "" {
		where = append(where, "app_id = "+arg(opts.AppID))
	}
	if opts.After != "" {
		if _, bad := t.unstorable([]any{opts.After}); bad {
			return nil, failure.NotFound("call", opts.After)
		}
		var sec, nsec int64
		err := t.queryRowContext(`SELECT created_sec, created_nsec FROM fn_calls WHERE id = $1`, opts.After).Scan(&sec, &nsec)
		if errors.Is(err, sql.ErrNoRows) {
			return nil, failure.NotFound("call", opts.After)
		}
		if err != nil {
			return nil, t.dbError(err, "list calls after", "call", opts.After)
		}
		where = append(where, fmt.Sprintf("(created_sec, created_nsec, id) < (%s, %s, %s)", arg(sec), arg(nsec), arg(opts.After)))
	}
	q := "SELECT id, doc FROM fn_calls"
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY created_sec DESC, created_nsec DESC, id DESC"
	if opts.Limit > 0 {
		q += " LIMIT " + arg(opts.Limit)
	}
	return listDocs[store.Call](t, "call", q, args...)
}

func (t *txn) DueCalls(now time.Time, limit int) ([]store.Call, error) {
	q := `SELECT id, doc FROM fn_calls WHERE pending = 1 AND (due_sec, due_nsec) <= ($1, $2)
	      ORDER BY due_sec, due_nsec, id`
	args := []any{now.Unix(), now.Nanosecond()}
	if limit > 0 {
		q += " LIMIT $3"
		args = append(args, limit)
	}
	return listDocs[store.Call](t, "call", q, args...)
}

// deleteByID removes the row of table with id; ErrNotFound if none.
func (t *txn) deleteByID(table, what, id string) error { return t.deleteByKey(table, "id", what, id) }

// deleteByKey removes the row of table whose column is key; ErrNotFound if
// none.
func (t *txn) deleteByKey(table, column, what, key string) error {
	id := key
	if err := t.writable(); err != nil {
		return err
	}
	if _, bad := t.unstorable([]any{id}); bad {
		return failure.NotFound(what, id)
	}
	n, err := t.affected("delete", what, id, `DELETE FROM `+table+` WHERE `+column+` = $1`, id)
	if err != nil {
		return err
	}
	if n == 0 {
		return failure.NotFound(what, id)
	}
	return nil
}
