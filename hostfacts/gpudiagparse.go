package hostfacts

// DCGM's active diagnostic (`dcgmi diag -r 1`): reading its answer, in the
// formats dcgmi prints. Pure parsing over bytes already read; gpudiag.go
// runs the tool and applies the findings to the sampler.
//
// Formats (testdata/gpu/dcgm/README.md says where each fixture comes from):
//   - JSON (`-j`), DCGM 4: {"DCGM Diagnostic": {"test_categories": [{"category",
//     "tests": [{"name", "results": [{"entity_group": "GPU", "entity_id",
//     "status", "warnings": [{"warning", "error_id", "error_category",
//     "error_severity"}]}]}]}]}, "metadata": {...}}.
//   - JSON, DCGM 3: the root is "DCGM GPU Diagnostic", a result names its GPU
//     as "gpu_id" (a number in the Deployment tests, a string in the others),
//     and a Deployment test's warning text is under "warnings" rather than
//     "warning".
//   - Either: {"DCGM Diagnostic": {"runtime_error": "..."}} when the
//     diagnostic could not run.
//   - The text table both print without -j: "| name | result |" rows under
//     category rulers, per-GPU rows "GPU0: Fail" and "Warning: GPU0" (DCGM 4),
//     or "Error"/"Warning" rows naming the GPU in their text (DCGM 3).

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// DiagFinding is what one diagnostic test said about one GPU (by DCGM's GPU
// ID, which follows the driver's enumeration: the order nvidia-smi lists
// the GPUs in), or about the machine (GPU -1).
type DiagFinding struct {
	GPU  int
	Test string
	// Status is "pass", "fail" or "warn": fail quarantines the card, warn
	// is recorded. A test DCGM skipped or did not run is not a finding.
	Status  string
	Message string
}

// Diag statuses.
const (
	DiagPass = "pass"
	DiagFail = "fail"
	DiagWarn = "warn"
)

// DCGM's error severities (dcgmErrorSeverity_t, dcgm_errors.h). A test DCGM
// reports failed whose every error is of a severity that says the card can
// still do its work (monitor it, or fix a setting) is recorded as a
// warning: DCGM's JSON writes a warning result as "Fail" (its
// HelperDisplayDiagResult folds Warn into Fail), and its severities are
// what tell them apart. Persistence mode being off is a setting (CONFIG),
// pending row remaps need a reset (RESET).
const (
	dcgmSeverityNone    = 0
	dcgmSeverityMonitor = 1
	dcgmSeverityConfig  = 5
)

// diagJSON is both versions' JSON answer, as far as it is read.
type diagJSON struct {
	V4 *diagRoot `json:"DCGM Diagnostic"`
	V3 *diagRoot `json:"DCGM GPU Diagnostic"`
}

type diagRoot struct {
	Categories []struct {
		Category string `json:"category"`
		Tests    []struct {
			Name    string       `json:"name"`
			Results []diagResult `json:"results"`
		} `json:"tests"`
	} `json:"test_categories"`
	RuntimeError string `json:"runtime_error"`
}

type diagResult struct {
	EntityGroup   string      `json:"entity_group"`
	EntityGroupID *int        `json:"entity_group_id"`
	EntityID      *int        `json:"entity_id"`
	GPUID         json.Number `json:"gpu_id"`
	Status        string      `json:"status"`
	Warnings      []struct {
		Warning  string `json:"warning"`
		Warnings string `json:"warnings"` // DCGM 3's Deployment tests
		Severity *int   `json:"error_severity"`
		ID       int    `json:"error_id"`
	} `json:"warnings"`
}

// dcgmEntityGPU is DCGM_FE_GPU, the entity group of a GPU.
const dcgmEntityGPU = 1

// gpu is the GPU a result is about, or -1 (the machine, or another kind of
// entity such as a CPU).
func (r diagResult) gpu() int {
	switch {
	case r.EntityID != nil && (r.EntityGroup == "GPU" || r.EntityGroupID != nil && *r.EntityGroupID == dcgmEntityGPU):
		return *r.EntityID
	case r.EntityID != nil:
		return -1
	case r.GPUID != "":
		if n, err := strconv.Atoi(r.GPUID.String()); err == nil {
			return n
		}
	}
	return -1
}

// ParseDiag reads what `dcgmi diag` printed: JSON when it starts with "{"
// (after anything dcgmi printed before it), the text table otherwise. An
// answer that is neither, or a diagnostic that says it could not run
// (runtime_error), is an error: it says nothing about any card.
func ParseDiag(out []byte) ([]DiagFinding, error) {
	if i := bytes.IndexByte(out, '{'); i >= 0 && len(bytes.TrimSpace(out[:i])) == 0 {
		return parseDiagJSON(out[i:])
	}
	return parseDiagText(out)
}

func parseDiagJSON(out []byte) ([]DiagFinding, error) {
	var doc diagJSON
	dec := json.NewDecoder(bytes.NewReader(out))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("not the JSON of dcgmi diag -j: %v", err)
	}
	root := doc.V4
	if root == nil {
		root = doc.V3
	}
	switch {
	case root == nil:
		return nil, fmt.Errorf(`not the JSON of dcgmi diag -j: no "DCGM Diagnostic" object`)
	case root.RuntimeError != "":
		return nil, fmt.Errorf("the diagnostic did not run: %s", truncate(strings.TrimSpace(root.RuntimeError)))
	}
	var out2 []DiagFinding
	for _, c := range root.Categories {
		for _, t := range c.Tests {
			for _, r := range t.Results {
				if f, ok := jsonFinding(t.Name, r); ok {
					out2 = append(out2, f)
				}
			}
		}
	}
	if len(out2) == 0 {
		return nil, fmt.Errorf("dcgmi diag -j reported no test results")
	}
	return out2, nil
}

// jsonFinding is one JSON result as a finding; false for a test skipped or
// not run.
func jsonFinding(test string, r diagResult) (DiagFinding, bool) {
	f := DiagFinding{GPU: r.gpu(), Test: test}
	var msgs []string
	quiet := len(r.Warnings) > 0 // every error one a card can work with
	for _, w := range r.Warnings {
		msg := w.Warning
		if msg == "" {
			msg = w.Warnings
		}
		if msg = strings.TrimSpace(msg); msg != "" {
			msgs = append(msgs, msg)
		}
		if w.Severity == nil || (*w.Severity != dcgmSeverityNone && *w.Severity != dcgmSeverityMonitor && *w.Severity != dcgmSeverityConfig) {
			quiet = false
		}
	}
	f.Message = truncate(strings.Join(msgs, "; "))
	switch strings.ToLower(strings.TrimSpace(r.Status)) {
	case "pass":
		f.Status = DiagPass
	case "warn":
		f.Status = DiagWarn
	case "fail":
		f.Status = DiagFail
		if quiet {
			f.Status = DiagWarn
		}
	default: // Skip, Not Run, or what a later DCGM may add
		return f, false
	}
	if f.GPU < 0 && f.Status != DiagPass {
		f.GPU = gpuNamed(f.Message) // DCGM 3's Deployment results may omit gpu_id
	}
	return f, true
}

// gpuInText finds the GPU a DCGM message names ("GPU 1 had memory errors…",
// "for GPU 3 is disabled").
var gpuInText = regexp.MustCompile(`\bGPU ?(\d+)\b`)

func gpuNamed(msg string) int {
	if m := gpuInText.FindStringSubmatch(msg); m != nil {
		if n, err := strconv.Atoi(m[1]); err == nil {
			return n
		}
	}
	return -1
}

// The text table: every row is "| NAME(25) | INFO(45) |" (dcgmi's DIAG_DATA
// stencil), a message longer than the info column is cut into 45-character
// pieces on rows of their own with an empty name, and categories are rulers
// ("|-----  Deployment  ----…" or "+-----  Hardware  ----…").
var (
	diagRuler      = regexp.MustCompile(`^[|+]-----\s+(\S.*?)\s+-+[+|]`)
	diagEntityRow  = regexp.MustCompile(`^GPU(\d+): (\w[\w ]*)$`)
	diagEntityWarn = regexp.MustCompile(`^(Warning|Error): GPU(\d+)$`)
)

const (
	diagInfoAt    = 30 // where the info column starts in a row
	diagInfoWidth = 45
)

// textTest is one test's rows as the table prints them.
type textTest struct {
	name, status string
	entities     map[int]string // GPU: its row's status (DCGM 4)
	order        []int
	messages     map[int][]string // GPU (-1: none named in the row): messages
}

func parseDiagText(out []byte) ([]DiagFinding, error) {
	var tests []*textTest
	var cur *textTest
	inResults := false
	msgGPU, msgIndex := 0, -1 // the message the continuation rows extend
	for _, raw := range strings.Split(string(out), "\n") {
		line := strings.TrimRight(raw, "\r ")
		if m := diagRuler.FindStringSubmatch(line); m != nil {
			inResults = m[1] != "Metadata"
			continue
		}
		if !inResults || !strings.HasPrefix(line, "|") || strings.HasPrefix(line, "|=") {
			continue
		}
		cells := strings.Split(line, "|")
		if len(cells) != 4 {
			continue
		}
		name, info := strings.TrimSpace(cells[1]), strings.TrimSpace(cells[2])
		chunk := info
		if len(line) >= diagInfoAt+diagInfoWidth {
			chunk = line[diagInfoAt : diagInfoAt+diagInfoWidth] // keeps a space a cut fell on
		}
		switch m, w := diagEntityRow.FindStringSubmatch(info), diagEntityWarn.FindStringSubmatch(name); {
		case name == "" && m != nil && cur != nil:
			gpu, _ := strconv.Atoi(m[1])
			cur.entities[gpu] = strings.ToLower(m[2])
			cur.order = append(cur.order, gpu)
			msgIndex = -1
		case name == "" && cur != nil && msgIndex >= 0:
			cur.messages[msgGPU][msgIndex] += chunk
		case w != nil && cur != nil:
			msgGPU, _ = strconv.Atoi(w[2])
			cur.messages[msgGPU] = append(cur.messages[msgGPU], chunk)
			msgIndex = len(cur.messages[msgGPU]) - 1
		case (name == "Warning" || name == "Error") && cur != nil:
			msgGPU = -1
			cur.messages[-1] = append(cur.messages[-1], chunk)
			msgIndex = len(cur.messages[-1]) - 1
		case name == "Info" || strings.HasPrefix(name, "Info: "):
			msgIndex = -1
		case name != "":
			cur = &textTest{name: name, status: strings.ToLower(info), entities: map[int]string{}, messages: map[int][]string{}}
			tests = append(tests, cur)
			msgIndex = -1
		}
	}
	if len(tests) == 0 {
		return nil, fmt.Errorf("not the table of dcgmi diag: no test results in %d bytes", len(out))
	}
	var findings []DiagFinding
	for _, t := range tests {
		findings = append(findings, t.findings()...)
	}
	return findings, nil
}

// findings are one text test's findings. DCGM 4 prints a row per GPU under
// the test; its status there folds a warning into "Fail", so the test's own
// row ("Warn" or "Fail") says which it was. DCGM 3 prints only the test's
// row, and its messages name the GPU ("GPU 1 had …"); a failure naming no
// GPU is the machine's.
func (t *textTest) findings() []DiagFinding {
	status := func(s string) string {
		switch {
		case s == "pass":
			return DiagPass
		case s == "warn" || s == "fail" && t.status == "warn":
			return DiagWarn
		case s == "fail":
			return DiagFail
		}
		return ""
	}
	msg := func(gpu int) string {
		var ms []string
		for _, m := range t.messages[gpu] {
			ms = append(ms, strings.TrimSpace(m))
		}
		return truncate(strings.Join(ms, "; "))
	}
	var out []DiagFinding
	if len(t.order) > 0 {
		for _, gpu := range t.order {
			if s := status(t.entities[gpu]); s != "" {
				out = append(out, DiagFinding{GPU: gpu, Test: t.name, Status: s, Message: msg(gpu)})
			}
		}
		return out
	}
	s := status(t.status)
	if s == "" || s == DiagPass {
		return nil // a pass names no GPU in DCGM 3's table: it is every GPU's, and says nothing new
	}
	for _, m := range t.messages[-1] {
		m = strings.TrimSpace(m)
		out = append(out, DiagFinding{GPU: gpuNamed(m), Test: t.name, Status: s, Message: truncate(m)})
	}
	if len(out) == 0 {
		out = append(out, DiagFinding{GPU: -1, Test: t.name, Status: s})
	}
	return out
}
