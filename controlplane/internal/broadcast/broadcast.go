// Package broadcast wakes every waiter at once: Wait returns a channel
// that the next Notify closes. The control plane wakes with it whoever
// waits on a run changing, a log growing, or a node's new operations.
// Only package controlplane may import it.
package broadcast

import "sync"

// Broadcast is one thing waiters wait on. Use New; safe for concurrent use.
type Broadcast struct {
	mu sync.Mutex
	ch chan struct{}
}

// New returns a Broadcast with no notification pending.
func New() *Broadcast { return &Broadcast{ch: make(chan struct{})} }

// Wait returns a channel closed at the next Notify.
func (b *Broadcast) Wait() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ch
}

// Notify wakes every waiter of the channel Wait returned so far.
func (b *Broadcast) Notify() {
	b.mu.Lock()
	close(b.ch)
	b.ch = make(chan struct{})
	b.mu.Unlock()
}
