package scheduler

// withheld reports whether a GPU must not be placed on: another node claims
// it (Disputed), or it went bad or was cordoned (Quarantined). The node's
// other GPUs stay placeable: a sick card quarantines the card, not the
// machine.
func (g GPU) withheld() bool { return g.Disputed || g.Quarantined }
