package fleetsim

import (
	"fmt"
	"time"

	"github.com/mercator/mercator/internal/cputime"
)

// The reconnect storm (Config.StormAt): every replica closes every
// connection it accepted at the same instant, listeners still open, so the
// whole fleet reconnects at once, as after a network failure between the
// fleet and the control plane. Over TLS each reconnect is a handshake:
// resumed (abbreviated, no certificate, no signature) when the agent's
// session ticket is still good, full otherwise. The storm's window runs
// from the drop until every node that was in session has opened a new
// session, or a lease later if some have not.

// StormReport is how the fleet came back from the reconnect storm.
type StormReport struct {
	At float64 `json:"at_s"` // into the hold
	// Dropped is how many connections the replicas closed; Nodes how many
	// nodes were in session then.
	Dropped int `json:"connections_dropped"`
	Nodes   int `json:"nodes_in_session"`
	// Back is how many of those opened a new session; NotBack how many
	// had not when the window closed.
	Back    int `json:"nodes_back"`
	NotBack int `json:"nodes_not_back"`
	// BackP50MS … are each node's time from the drop to its new session.
	BackP50MS float64 `json:"back_p50_ms"`
	BackP99MS float64 `json:"back_p99_ms"`
	BackMaxMS float64 `json:"back_max_ms"`
	// Window is the storm's window: the drop until every node was back (or
	// a lease, if some were not).
	Window float64 `json:"window_s"`
	// Connections and the CPU figures are over the window.
	Connections Connections `json:"connections"`
	// ProcessCPU is the control plane's process's CPU seconds (the
	// control plane alone when the agents run in child processes, plus
	// the simulator's bookkeeping); AgentsCPU the agent processes'.
	ProcessCPU float64 `json:"process_cpu_s"`
	AgentsCPU  float64 `json:"agent_processes_cpu_s"`
	// LeaseLapses is the control plane's count of lease lapses from the
	// storm to the end of the hold.
	LeaseLapses int `json:"lease_lapses_since"`
	// Commands created during the window, and their delivery.
	Commands      int     `json:"commands_in_window"`
	DeliveryP50MS float64 `json:"command_delivery_p50_ms"`
	DeliveryP99MS float64 `json:"command_delivery_p99_ms"`
	DeliveryMaxMS float64 `json:"command_delivery_max_ms"`
}

// stormState is the storm in progress: its report and what the window's
// figures are measured against.
type stormState struct {
	StormReport
	windowStart, windowEnd time.Time
	cpu0, shardCPU0        time.Duration
	counts0                connCounts
	lapses0                float64
}

// startStorm drops every connection of every live replica, noting what
// the window's figures are measured against: the lease lapses are those
// of the hold's last scrape (at most 5 s before), so that the drop does
// not wait on one.
func (s *sim) startStorm(h *holdState) {
	st := &stormState{lapses0: s.sum("mercator_node_lease_lapses_total")}
	for _, n := range s.rec.nodes {
		n.mu.Lock()
		if !n.sessionAt.IsZero() {
			st.Nodes++
		}
		n.mu.Unlock()
	}
	st.cpu0, st.shardCPU0, st.counts0 = cputime.Self(), s.shardCPU(), s.connCounts()
	st.windowStart = time.Now()
	s.rec.stormAt.Store(st.windowStart.UnixNano())
	for _, r := range s.replicas {
		if !r.killed.Load() {
			st.Dropped += r.dropConnections()
		}
	}
	st.At = st.windowStart.Sub(h.start).Seconds()
	h.storm = st
	s.progress("reconnect storm: dropped %d connections, %d nodes in session", st.Dropped, st.Nodes)
}

// stormOver closes the storm's window once every node is back, or a lease
// after the drop; it reports whether the window is closed.
func (s *sim) stormOver(h *holdState) bool {
	st := h.storm
	if st == nil || !st.windowEnd.IsZero() {
		return true
	}
	back := int(s.rec.reopened.Load())
	if back < st.Nodes && time.Since(st.windowStart) < s.cfg.Lease {
		return false
	}
	st.windowEnd = time.Now()
	st.Window = st.windowEnd.Sub(st.windowStart).Seconds()
	st.ProcessCPU = (cputime.Self() - st.cpu0).Seconds()
	st.AgentsCPU = (s.shardCPU() - st.shardCPU0).Seconds()
	st.Connections = s.connCounts().sub(st.counts0).report()
	s.progress("reconnect storm: %d of %d nodes back in session after %.2fs; %s", back, st.Nodes, st.Window, st.Connections)
	return true
}

// reportStorm fills in the per-node reconnect times, the lease lapses since
// the storm and the delivery of the commands created during its window.
func (s *sim) reportStorm(rep *Report, h *holdState) {
	st := h.storm
	if st == nil {
		return
	}
	s.stormOver(h) // closes a window the hold outlasted
	var back []time.Duration
	for _, n := range s.rec.nodes {
		n.mu.Lock()
		if n.sessionAt.After(st.windowStart) {
			back = append(back, n.sessionAt.Sub(st.windowStart))
		}
		n.mu.Unlock()
	}
	sortDurations(back)
	st.Back, st.NotBack = len(back), max(0, st.Nodes-len(back))
	st.BackP50MS, st.BackP99MS = ms(percentile(back, 0.5)), ms(percentile(back, 0.99))
	if len(back) > 0 {
		st.BackMaxMS = ms(back[len(back)-1])
	}
	st.LeaseLapses = int(s.sum("mercator_node_lease_lapses_total") - st.lapses0)
	during := s.rec.deliveriesCreated(st.windowStart, st.windowEnd)
	st.Commands = len(during)
	st.DeliveryP50MS, st.DeliveryP99MS = ms(percentile(during, 0.5)), ms(percentile(during, 0.99))
	if len(during) > 0 {
		st.DeliveryMaxMS = ms(during[len(during)-1])
	}
	rep.Storm = &st.StormReport
}

func (st *StormReport) String() string {
	return fmt.Sprintf("at %.1fs: %d connections dropped, %d of %d nodes back (p50 %.0f ms, p99 %.0f ms, max %.0f ms), %d not back; window %.2fs: %s, control-plane process %.2f CPU s, agent processes %.2f CPU s; %d lease lapses since; %d commands created in the window, delivery p50 %.0f ms p99 %.0f ms max %.0f ms",
		st.At, st.Dropped, st.Back, st.Nodes, st.BackP50MS, st.BackP99MS, st.BackMaxMS, st.NotBack, st.Window, st.Connections,
		st.ProcessCPU, st.AgentsCPU, st.LeaseLapses, st.Commands, st.DeliveryP50MS, st.DeliveryP99MS, st.DeliveryMaxMS)
}
