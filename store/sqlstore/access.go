package sqlstore

import (
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/internal/record"
)

// accessMigration adds the audit log (tokens have had their table since
// version 1; their new fields live in the document). Entries are ordered
// and pruned by time, and filtered by who.
var accessMigration = []string{
	`CREATE TABLE audit (
		id TEXT PRIMARY KEY,
		at_sec BIGINT NOT NULL,
		at_nsec BIGINT NOT NULL,
		who TEXT NOT NULL,
		doc TEXT NOT NULL
	)`,
	`CREATE INDEX audit_by_time ON audit (at_sec, at_nsec, id)`,
	`CREATE INDEX audit_by_who ON audit (who, at_sec, at_nsec, id)`,
}

func (t *txn) CreateToken(tok store.Token) error {
	if err := record.Token(tok); err != nil {
		return err
	}
	if err := t.writable(); err != nil {
		return err
	}
	doc, err := encode("token", tok.Hash, tok)
	if err != nil {
		return err
	}
	return t.create("token", tok.Hash,
		`INSERT INTO tokens (hash, doc) VALUES ($1, $2) ON CONFLICT (hash) DO NOTHING`, tok.Hash, doc)
}

func (t *txn) GetToken(hash string) (store.Token, error) {
	return getDoc[store.Token](t, "token", hash, `SELECT doc FROM tokens WHERE hash = $1`, hash)
}

func (t *txn) PutToken(tok store.Token) error {
	if err := record.Token(tok); err != nil {
		return err
	}
	if err := t.writable(); err != nil {
		return err
	}
	doc, err := encode("token", tok.Hash, tok)
	if err != nil {
		return err
	}
	return t.replace("token", tok.Hash, `UPDATE tokens SET doc = $2 WHERE hash = $1`, tok.Hash, doc)
}

func (t *txn) ListTokens() ([]store.Token, error) {
	toks, err := listDocs[store.Token](t, "token", `SELECT hash, doc FROM tokens`)
	record.SortTokens(toks)
	return toks, err
}

func (t *txn) DeleteToken(hash string) error {
	return t.deleteByKey("tokens", "hash", "token", hash)
}

func (t *txn) AppendAudit(entries []store.AuditEntry) error {
	if err := t.writable(); err != nil {
		return err
	}
	for _, e := range entries {
		if err := record.AuditEntry(e); err != nil {
			return err
		}
		doc, err := encode("audit entry", e.ID, e)
		if err != nil {
			return err
		}
		at := e.At.UTC()
		if err := t.create("audit entry", e.ID,
			`INSERT INTO audit (id, at_sec, at_nsec, who, doc) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO NOTHING`,
			e.ID, at.Unix(), int64(at.Nanosecond()), e.Who, doc); err != nil {
			return err
		}
	}
	return nil
}

func (t *txn) ListAudit(opts store.ListAuditOptions) ([]store.AuditEntry, error) {
	var where []string
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	if !opts.Since.IsZero() {
		s := opts.Since.UTC()
		where = append(where, fmt.Sprintf("(at_sec, at_nsec) >= (%s, %s)", arg(s.Unix()), arg(int64(s.Nanosecond()))))
	}
	if opts.Who != "" {
		where = append(where, "who = "+arg(opts.Who))
	}
	q := "SELECT id, doc FROM audit"
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY at_sec DESC, at_nsec DESC, id DESC"
	if opts.Limit > 0 {
		q += " LIMIT " + arg(opts.Limit)
	}
	return listDocs[store.AuditEntry](t, "audit entrie", q, args...)
}

func (t *txn) PruneAudit(before time.Time, keep int) (int, error) {
	if err := t.writable(); err != nil {
		return 0, err
	}
	b := before.UTC()
	n, err := t.affected("prune", "audit", "log",
		`DELETE FROM audit WHERE (at_sec, at_nsec) < ($1, $2)`, b.Unix(), int64(b.Nanosecond()))
	if err != nil || keep <= 0 {
		return int(n), err
	}
	// The newest entry past the cap, if any: it and everything older go.
	var sec, nsec int64
	var id string
	err = t.queryRowContext(`SELECT at_sec, at_nsec, id FROM audit ORDER BY at_sec DESC, at_nsec DESC, id DESC LIMIT 1 OFFSET $1`,
		keep).Scan(&sec, &nsec, &id)
	if err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return int(n), nil
		}
		return int(n), t.dbError(err, "prune", "audit", "log")
	}
	m, err := t.affected("prune", "audit", "log",
		`DELETE FROM audit WHERE (at_sec, at_nsec, id) <= ($1, $2, $3)`, sec, nsec, id)
	return int(n + m), err
}
