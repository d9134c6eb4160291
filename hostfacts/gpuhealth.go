package hostfacts

// GPU health: reading the vendor tool's and the kernel's reports about each
// GPU's health, in their own formats. Everything here is pure parsing and
// classification over bytes already read; the sampler (gpusampler.go) does
// the I/O and keeps the state between samples.

import (
	"encoding/xml"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/mercator/mercator/nodeproto"
)

// nvidiaHealthQuery is the question asked of nvidia-smi on every sample:
// one line per GPU, these fields, no header, no units. The throttle fields
// use the names every driver since 418 accepts (535 and later also call them
// clocks_event_reasons.*).
var nvidiaHealthQuery = []string{
	"--query-gpu=uuid,pci.bus_id,utilization.gpu,memory.used,power.draw," +
		"ecc.errors.uncorrected.volatile.total,retired_pages.pending," +
		"clocks_throttle_reasons.hw_slowdown,clocks_throttle_reasons.hw_thermal_slowdown,clocks_throttle_reasons.sw_thermal_slowdown",
	"--format=csv,noheader,nounits",
}

// nvidiaDetailQuery is the full report, asked every few samples for what the
// CSV query has no field for: row remapping (pending, failed).
var nvidiaDetailQuery = []string{"-q", "-x"}

// nvidiaExitGPULost is nvidia-smi's documented exit status for "a GPU has
// fallen off the bus or has otherwise become inaccessible".
const nvidiaExitGPULost = 15

// GPUReading is what one sample of the vendor tool said about one GPU. A
// figure the tool did not state ("[N/A]") is -1.
type GPUReading struct {
	UUID     string
	PCIBusID string
	// UtilizationPct, MemoryUsedMiB and PowerWatts are what step 3's
	// per-attempt summary aggregates.
	UtilizationPct float64
	MemoryUsedMiB  float64
	PowerWatts     float64
	// ECCUncorrected is the count of uncorrectable errors since the driver
	// loaded (-1 on cards without ECC).
	ECCUncorrected   int64
	RetirementPend   bool
	Throttled        bool
	ThrottleReasons  []string
	RemapPending     bool
	RemapFailed      bool
	RemapUncorrected int64
}

// LostGPU is a GPU the tool named by bus ID and could not reach, with the
// tool's words.
type LostGPU struct {
	PCIBusID string
	Message  string
}

// healthFields is the number of fields nvidiaHealthQuery asks for.
var healthFields = len(strings.Split(strings.TrimPrefix(nvidiaHealthQuery[0], "--query-gpu="), ","))

// lostPattern is nvidia-smi's sentence for a GPU it cannot reach, printed in
// place of that GPU's line while the others are listed ("Unable to
// determine the device handle for GPU0000:3B:00.0: GPU is lost.  Reboot the
// system to recover this GPU"; some drivers put a space after "GPU").
var lostPattern = regexp.MustCompile(`(?i)Unable to determine the device handle for GPU\s*([0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]):\s*(.*)$`)

// parseHealthQuery reads the answer to nvidiaHealthQuery. Lines naming a
// GPU that cannot be reached are returned as lost; any other line that is
// not the fields asked for is an error naming it (the whole answer is then
// not understood, and the sampler says so rather than guessing).
func parseHealthQuery(out []byte) ([]GPUReading, []LostGPU, error) {
	var readings []GPUReading
	var lost []LostGPU
	for i, line := range strings.Split(string(out), "\n") {
		line = strings.TrimSpace(strings.TrimRight(line, "\r"))
		if line == "" {
			continue
		}
		if m := lostPattern.FindStringSubmatch(line); m != nil {
			lost = append(lost, LostGPU{PCIBusID: normalizeBusID(m[1]), Message: truncate(strings.TrimSpace(m[2]))})
			continue
		}
		fields := strings.Split(line, ",")
		if len(fields) != healthFields {
			return nil, nil, fmt.Errorf("line %d %s: has %d fields, want %d", i+1, strconv.Quote(truncate(line)), len(fields), healthFields)
		}
		for j := range fields {
			fields[j] = strings.TrimSpace(fields[j])
		}
		if !uuidPattern.MatchString(fields[0]) {
			return nil, nil, fmt.Errorf("line %d: %q is not a GPU UUID", i+1, fields[0])
		}
		r := GPUReading{UUID: fields[0], PCIBusID: normalizeBusID(fields[1]),
			UtilizationPct: number(fields[2]), MemoryUsedMiB: number(fields[3]), PowerWatts: number(fields[4]),
			ECCUncorrected: int64(number(fields[5])), RetirementPend: strings.EqualFold(fields[6], "Yes")}
		for k, name := range []string{"hw_slowdown", "hw_thermal_slowdown", "sw_thermal_slowdown"} {
			if strings.EqualFold(fields[7+k], "Active") {
				r.Throttled = true
				r.ThrottleReasons = append(r.ThrottleReasons, name)
			}
		}
		readings = append(readings, r)
	}
	return readings, lost, nil
}

// number is a field's value, or -1 when the tool does not state it
// ("[N/A]", "[Not Supported]") or it is not a number.
func number(field string) float64 {
	v, err := strconv.ParseFloat(field, 64)
	if err != nil || unstated(field) {
		return -1
	}
	return v
}

// normalizeBusID writes a PCI bus ID as the CSV query does: an eight-digit
// domain, upper case. The kernel's Xid lines and old drivers write four
// digits and lower case, and the kernel omits the function ("0000:3b:00").
func normalizeBusID(id string) string {
	id = strings.ToUpper(strings.TrimSpace(id))
	domain, rest, ok := strings.Cut(id, ":")
	if !ok {
		return id
	}
	if len(domain) < 8 {
		domain = strings.Repeat("0", 8-len(domain)) + domain
	}
	if !strings.Contains(rest, ".") {
		rest += ".0"
	}
	return domain + ":" + rest
}

// smiLog is the part of `nvidia-smi -q -x` the sampler reads. Cards without
// a row remapper (before Ampere) print <remapped_rows>N/A</remapped_rows>,
// which leaves the fields empty.
type smiLog struct {
	GPUs []struct {
		ID           string `xml:"id,attr"`
		UUID         string `xml:"uuid"`
		RemappedRows struct {
			Uncorrectable string `xml:"remapped_row_unc"`
			Pending       string `xml:"remapped_row_pending"`
			Failure       string `xml:"remapped_row_failure"`
		} `xml:"remapped_rows"`
		RetiredPages struct {
			Pending string `xml:"pending_retirement"`
		} `xml:"retired_pages"`
	} `xml:"gpu"`
}

// remapState is one GPU's row-remapper state from the full report.
type remapState struct {
	pending, failed, retirementPending bool
	uncorrectable                      int64
}

// parseDetailXML reads `nvidia-smi -q -x` into each GPU's remapper state, by
// UUID. A document that is not the tool's XML is an error.
func parseDetailXML(out []byte) (map[string]remapState, error) {
	var doc smiLog
	if err := xml.Unmarshal(out, &doc); err != nil {
		return nil, fmt.Errorf("not the XML of nvidia-smi -q -x: %v", err)
	}
	states := map[string]remapState{}
	for _, g := range doc.GPUs {
		rr := g.RemappedRows
		unc, _ := strconv.ParseInt(strings.TrimSpace(rr.Uncorrectable), 10, 64)
		states[strings.TrimSpace(g.UUID)] = remapState{
			pending:           strings.EqualFold(strings.TrimSpace(rr.Pending), "Yes"),
			failed:            strings.EqualFold(strings.TrimSpace(rr.Failure), "Yes"),
			retirementPending: strings.EqualFold(strings.TrimSpace(g.RetiredPages.Pending), "Yes"),
			uncorrectable:     unc,
		}
	}
	return states, nil
}

// Xid classes, as nodeproto names them.
const (
	XidFatal       = nodeproto.XidClassFatal
	XidApplication = nodeproto.XidClassApplication
	XidOther       = nodeproto.XidClassOther
)

// fatalXids are the Xids that quarantine a card: 48 double-bit ECC error;
// 63 and 64 ECC page retirement or row remapping recorded / failed; 74
// NVLink error; 79 fallen off the bus; 94 and 95 contained and uncontained
// ECC errors; 119 and 120 GSP timeout and error. An Xid not named here never
// quarantines a card: a card marked unhealthy for ever by any Xid it did not
// know is a fleet that loses cards to application bugs.
var fatalXids = map[int]bool{48: true, 63: true, 64: true, 74: true, 79: true, 94: true, 95: true, 119: true, 120: true}

// applicationXids are faults of the program on the card, not of the card:
// 13 graphics engine exception, 31 memory page fault, 43 GPU stopped
// processing (the process was killed or faulted).
var applicationXids = map[int]bool{13: true, 31: true, 43: true}

// ClassifyXid puts an Xid in its class.
func ClassifyXid(xid int) string {
	switch {
	case fatalXids[xid]:
		return XidFatal
	case applicationXids[xid]:
		return XidApplication
	}
	return XidOther
}

// XidReport is one NVRM Xid line from the kernel log.
type XidReport struct {
	PCIBusID string
	Xid      int
	Line     string
}

// xidPattern is the NVIDIA kernel module's Xid line as the kernel log
// carries it, after whatever prefix the reader adds (a /dev/kmsg record
// header "4,1234,5678,-;", dmesg's "[ 1234.5678] "): "NVRM: Xid
// (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen
// off the bus."
var xidPattern = regexp.MustCompile(`NVRM: Xid \(PCI:([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\): (\d+),?(.*)$`)

// parseXids finds the Xid lines in a stretch of the kernel log.
func parseXids(log []byte) []XidReport {
	var out []XidReport
	for _, line := range strings.Split(string(log), "\n") {
		m := xidPattern.FindStringSubmatch(strings.TrimRight(line, "\r"))
		if m == nil {
			continue
		}
		xid, err := strconv.Atoi(m[2])
		if err != nil {
			continue
		}
		out = append(out, XidReport{PCIBusID: normalizeBusID(m[1]), Xid: xid, Line: truncate(strings.TrimSpace(m[0]))})
	}
	return out
}
