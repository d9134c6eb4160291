package memstore

import (
	"context"
	"errors"
	"time"

	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
)

// Lead implements store.Store. Update has one writer at a time, so every
// transaction that checked the old epoch has committed when it returns.
func (s *Store) Lead(ctx context.Context) (int64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, ErrClosed
	}
	next := *s.cur
	next.epoch++
	s.cur = &next
	return next.epoch, nil
}

// CheckEpoch implements store.Tx.
func (t *tx) CheckEpoch(epoch int64) error {
	if err := t.readable(); err != nil {
		return err
	}
	if t.st.epoch != epoch {
		return failure.Fenced("scheduling epoch %d is over: another replica has scheduled since, under epoch %d", epoch, t.st.epoch)
	}
	return nil
}

// NodesSeen implements store.Tx. The fake decodes and rewrites the record
// (what the SQL store's column spares it); the contract is the same.
func (t *tx) NodesSeen(seen map[string]time.Time) (map[string]time.Time, error) {
	if err := t.writable(); err != nil {
		return nil, err
	}
	before := map[string]time.Time{}
	for id, at := range seen {
		n, err := t.GetNode(id)
		if errors.Is(err, failure.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		before[id] = time.Time{}
		if heard := t.st.nodeSeen[id]; at.After(heard) {
			table(t, "nodeSeen", &t.st.nodeSeen)[id] = at
		}
		if n.LastSeenAt != nil {
			before[id] = *n.LastSeenAt
			if !at.After(*n.LastSeenAt) {
				continue
			}
		}
		n.LastSeenAt = &at
		// The record alone, not PutNode: a node's version stays.
		if err := put(t, "nodes", &t.st.nodes, "node", n.ID, n, upsert); err != nil {
			return nil, err
		}
	}
	return before, nil
}

// LockNode implements store.Tx: a memstore has one writer at a time.
func (t *tx) LockNode(id string) (store.Node, error) {
	if err := t.writable(); err != nil {
		return store.Node{}, err
	}
	return t.GetNode(id)
}

// GetNodes implements store.Tx.
func (t *tx) GetNodes(ids []string) ([]store.Node, error) { return store.GetEach(ids, t.GetNode) }

// GetRuns implements store.Tx.
func (t *tx) GetRuns(ids []string) ([]store.Run, error) { return store.GetEach(ids, t.GetRun) }

// PutRuns implements store.Tx: all or nothing, as the transaction is.
func (t *tx) PutRuns(runs []store.Run) error { return store.Each(runs, t.PutRun) }

// PutOperations implements store.Tx.
func (t *tx) PutOperations(ops []store.Operation) error { return store.Each(ops, t.PutOperation) }
