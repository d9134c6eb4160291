package retention

import (
	"sync"

	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// Event de-duplication rows are pruned by watermark. Each event a node
// sends carries an ID "<incarnation>-<seq>" minted by its agent, and
// store.Tx.SeeEvent keeps a row per applied event so that a redelivery
// (an acknowledgement lost on the wire, a crash before the agent wrote
// it down) is applied once. Those rows were never deleted.
//
// Why pruning below the watermark is safe: with a batch the agent sends
// Through, an ID such that every event of its incarnation at or below it
// was acknowledged by the control plane or will never be sent (see
// nodeagent's state_watermark.go). An acknowledged event was applied: the
// control plane acknowledges an event only once the transaction that
// applied it (or found it applied) committed. The store raises the
// node's watermark to Through, and from then on SeeEvent answers "seen"
// for any event at or below it by its sequence alone, row or no row. So
// the rows below it carry nothing SeeEvent needs, and PruneEvents deletes
// them (StoreTasks). A redelivery below the watermark, however late,
// and from whichever replica, is still recognised; one above it still has
// its row. Only the node's own declaration moves its watermark, and only
// up, so a node can at worst make its own new events look old; events
// without a sequence, or from agents that send no Through, keep their
// rows as before.

// watermarkStride is how far a node's watermark must move before it is
// written again: one write per this many events at most, rather than one
// per batch. Writing it late only keeps some rows a little longer.
const watermarkStride = 256

// Watermarks remembers, per node, the watermark this replica last wrote,
// so that the control plane's events handler writes one only now and then.
// The zero value is ready to use.
type Watermarks struct {
	mu   sync.Mutex
	last map[string]string // node → Through last written
}

// Advance writes through as the node's watermark in tx when it is worth
// writing: another incarnation than last written, or watermarkStride
// further on. It is noted as written at once: if tx is then rolled back,
// the stored watermark lags one stride more, which only keeps some rows a
// little longer.
func (w *Watermarks) Advance(tx store.Tx, nodeID, through string) error {
	if through == "" || !w.due(nodeID, through) {
		return nil
	}
	return tx.AdvanceEventWatermark(nodeID, through)
}

// due reports whether through is worth writing, and notes it written.
func (w *Watermarks) due(nodeID, through string) bool {
	inc, seq, ok := nodeproto.ParseEventID(through)
	if !ok {
		return true // the store says what is wrong with it
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	lastInc, lastSeq, ok := nodeproto.ParseEventID(w.last[nodeID])
	if ok && lastInc == inc && seq < lastSeq+watermarkStride {
		return false
	}
	if w.last == nil {
		w.last = map[string]string{}
	}
	w.last[nodeID] = through
	return true
}
