package fleetsim

import (
	"fmt"
	"io"
)

// WriteComparison writes the report of a run over TLS and of the same run
// in plaintext (`bench fleet --compare-plaintext`), then their figures side
// by side with the ratio TLS / plaintext: what TLS costs, measured on the
// same machine in one invocation.
func WriteComparison(w io.Writer, tls, plain *Report) {
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
