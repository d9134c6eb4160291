package fleetsim

import (
	"context"
	"fmt"
	"io"
)

// Comparison is one simulation run over TLS and then, the same, in
// plaintext (`bench fleet --compare-plaintext`): what TLS costs, measured
// on the same machine in one invocation.
type Comparison struct {
	TLS       *Report `json:"tls"`
	Plaintext *Report `json:"plaintext"`
}

// Compare runs cfg over TLS and then in plaintext, one after the other
// (cfg.Plaintext is ignored).
func Compare(ctx context.Context, cfg Config) (*Comparison, error) {
	var c Comparison
	for _, mode := range []struct {
		plaintext bool
		rep       **Report
	}{{false, &c.TLS}, {true, &c.Plaintext}} {
		cfg.Plaintext = mode.plaintext
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "fleet simulation, plaintext %v:\n", mode.plaintext)
		}
		var err error
		if *mode.rep, err = Run(ctx, cfg); err != nil {
			return nil, err
		}
	}
	return &c, nil
}

// WriteText writes both reports, then their figures side by side with the
// ratio TLS / plaintext.
func (c *Comparison) WriteText(w io.Writer) {
	tls, plain := c.TLS, c.Plaintext
	tls.WriteText(w)
	fmt.Fprintln(w)
	plain.WriteText(w)
	fmt.Fprintf(w, "\nTLS beside plaintext, %d nodes (ratio TLS / plaintext):\n", tls.Nodes)
	row := func(name string, a, b float64, unit string) {
		ratio := "—"
		if b != 0 {
			ratio = fmt.Sprintf("%.2f", a/b)
		}
		fmt.Fprintf(w, "  %-44s %12.2f %12.2f  %6s  %s\n", name, a, b, ratio, unit)
	}
	fmt.Fprintf(w, "  %-44s %12s %12s  %6s\n", "", "TLS", "plaintext", "ratio")
	row("enrollments a second", tls.EnrollmentsPerS, plain.EnrollmentsPerS, "/s")
	row("fleet up (every node in session)", tls.FleetUp, plain.FleetUp, "s")
	row("CPU while coming up, control plane process", tls.UpProcessCPU, plain.UpProcessCPU, "CPU s")
	row("full TLS handshakes coming up", float64(tls.UpConnections.FullHandshakes), float64(plain.UpConnections.FullHandshakes), "")
	row("missed leases", float64(tls.MissedLeases), float64(plain.MissedLeases), "")
	row("command delivery p50", tls.CommandDeliveryP50MS, plain.CommandDeliveryP50MS, "ms")
	row("command delivery p99", tls.CommandDeliveryP99MS, plain.CommandDeliveryP99MS, "ms")
	row("control plane CPU in the hold", tls.ControlPlaneCPUCores, plain.ControlPlaneCPUCores, "cores")
	row("control plane process CPU in the hold", tls.ProcessCPUCores, plain.ProcessCPUCores, "cores")
	row("connections accepted in the hold", float64(tls.HoldConnections.Accepted), float64(plain.HoldConnections.Accepted), "")
	a, b := tls.Storm, plain.Storm
	if a == nil || b == nil {
		return
	}
	row("storm: nodes back", float64(a.Back), float64(b.Back), fmt.Sprintf("of %d, %d", a.Nodes, b.Nodes))
	row("storm: back p50", a.BackP50MS, b.BackP50MS, "ms")
	row("storm: back p99", a.BackP99MS, b.BackP99MS, "ms")
	row("storm: back max", a.BackMaxMS, b.BackMaxMS, "ms")
	row("storm: control plane process CPU", a.ProcessCPU, b.ProcessCPU, "CPU s")
	row("storm: connections accepted", float64(a.Connections.Accepted), float64(b.Connections.Accepted), "")
	row("storm: TLS handshakes full", float64(a.Connections.FullHandshakes), float64(b.Connections.FullHandshakes), "")
	row("storm: TLS handshakes resumed", float64(a.Connections.ResumedHandshakes), float64(b.Connections.ResumedHandshakes), "")
	row("storm: lease lapses", float64(a.LeaseLapses), float64(b.LeaseLapses), "")
}
