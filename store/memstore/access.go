package memstore

import (
	"slices"
	"time"

	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/internal/record"
)

func (t *tx) CreateToken(tok store.Token) error {
	if err := record.Token(tok); err != nil {
		return err
	}
	return put(t, "tokens", &t.st.tokens, "token", tok.Hash, tok, create)
}

func (t *tx) GetToken(hash string) (store.Token, error) {
	return get[store.Token](t, t.st.tokens, "token", hash)
}

func (t *tx) PutToken(tok store.Token) error {
	if err := record.Token(tok); err != nil {
		return err
	}
	return put(t, "tokens", &t.st.tokens, "token", tok.Hash, tok, replace)
}

func (t *tx) ListTokens() ([]store.Token, error) {
	toks, err := list(t, t.st.tokens, "token", func(store.Token) bool { return true })
	record.SortTokens(toks)
	return toks, err
}

func (t *tx) DeleteToken(hash string) error {
	return remove(t, "tokens", &t.st.tokens, "token", hash)
}

func (t *tx) AppendAudit(entries []store.AuditEntry) error {
	for _, e := range entries {
		if err := record.AuditEntry(e); err != nil {
			return err
		}
		if err := put(t, "audit", &t.st.audit, "audit entry", e.ID, e, create); err != nil {
			return err
		}
	}
	return nil
}

func (t *tx) ListAudit(opts store.ListAuditOptions) ([]store.AuditEntry, error) {
	out, err := list(t, t.st.audit, "audit entry", func(e store.AuditEntry) bool {
		return !e.At.Before(opts.Since) && (opts.Who == "" || e.Who == opts.Who)
	})
	slices.SortFunc(out, record.AuditNewer)
	if opts.Limit > 0 && len(out) > opts.Limit {
		out = out[:opts.Limit]
	}
	return out, err
}

func (t *tx) PruneAudit(before time.Time, keep int) (int, error) {
	if err := t.writable(); err != nil {
		return 0, err
	}
	all, err := t.ListAudit(store.ListAuditOptions{})
	if err != nil {
		return 0, err
	}
	pruned := 0
	for i, e := range all {
		if e.At.Before(before) || (keep > 0 && i >= keep) {
			delete(table(t, "audit", &t.st.audit), e.ID)
			pruned++
		}
	}
	return pruned, nil
}
