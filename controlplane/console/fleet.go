package console

import (
	"cmp"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"net/http"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"
)

// fleetPage is how many nodes one Fleet page lists.
const fleetPage = 100

// GPU states in the allocation picture.
const (
	gpuBusy = "busy"
	gpuIdle = "idle"
	gpuSick = "flagged" // as the API counts them (api.FleetSummary)
)

// nodeRow is one node as the Fleet page lists it.
type nodeRow struct {
	api.Node
	Info      nodeproto.NodeFacts
	GPUs      []gpuCell
	Artifacts int64 // bytes of Artifacts held
	// FnContainers is how many function containers the node last
	// reported (any state): with Running, what a drain waits for.
	FnContainers int
}

// gpuCell is one card: its model, memory, allocation state (busy, idle,
// flagged) and health as the control plane judges it (api.NodeGPU).
type gpuCell struct {
	nodeproto.Accelerator
	State  string
	Health api.NodeGPU
}

// Left is what a draining node still has: "" when it is not draining.
func (n nodeRow) Left() string {
	if !n.Draining {
		return ""
	}
	if len(n.Running) == 0 && n.FnContainers == 0 {
		return "drained: nothing left on it"
	}
	return fmt.Sprintf("draining: %d runs and %d function containers left", len(n.Running), n.FnContainers)
}

// fleetView is the Fleet page: a page of nodes, the whole fleet counted
// (the API's summary), and the next page's cursor.
type fleetView struct {
	Nodes         []nodeRow
	Total         int // nodes the filter keeps
	Status, After string
	Next          string
	ByStatus      map[string]int
	GPUs          map[string]int
	Picture       string
	// Chart is the GPUs over time (nil: this replica has no samples).
	Chart   *chartView
	Queue   *chartView // the queue's depth (nil: this replica did not schedule)
	Sampled bool       // the replica samples (Config.Stats); Chart nil: none yet
}

// rowsOf reads each node's facts and marks each GPU busy (an active
// attempt holds it, api.Node.GPUsInUse), sick (a flag withholds it:
// disputed, quarantined or cordoned) or idle.
func rowsOf(nodes []api.Node) []nodeRow {
	rows := make([]nodeRow, len(nodes))
	for i, n := range nodes {
		rows[i] = nodeRow{Node: n}
		if n.Facts != nil {
			data, _ := json.Marshal(n.Facts)
			json.Unmarshal(data, &rows[i].Info)
		}
		rows[i].Node.Facts = nil
		state := map[string]string{}
		for _, g := range n.GPUsInUse {
			state[g] = gpuBusy
		}
		for _, f := range n.Flags {
			if f.WithholdsGPU() {
				state[f.GPU] = gpuSick
			}
		}
		health := map[string]api.NodeGPU{}
		for _, g := range n.GPUs {
			health[g.UUID] = g
		}
		for _, acc := range rows[i].Info.Accelerators {
			rows[i].GPUs = append(rows[i].GPUs, gpuCell{Accelerator: acc, State: cmp.Or(state[acc.UUID], gpuIdle), Health: health[acc.UUID]})
		}
		if f := rows[i].Info.Functions; f != nil {
			for _, ct := range f.Containers {
				rows[i].FnContainers += ct.Idle + ct.Busy + ct.Starting + ct.Prepared
			}
		}
		for _, held := range rows[i].Info.Artifacts {
			rows[i].Artifacts += held.Size
		}
	}
	return rows
}

// fleet is the Fleet page: one page of nodes from the API, with the
// fleet's counts, so a page of a 10,000-node fleet costs the views of 100.
func (c *Console) fleet(w http.ResponseWriter, r *http.Request, q *request) {
	v := fleetView{Status: r.URL.Query().Get("status"), After: r.URL.Query().Get("after")}
	list, err := q.api.ListNodesPage(r.Context(), client.NodePageOptions{Limit: fleetPage, After: v.After, Status: v.Status})
	if err != nil {
		c.fail(w, r, q, err)
		return
	}
	v.Nodes, v.Next = rowsOf(list.Nodes), list.Next
	if s := list.Summary; s != nil {
		v.ByStatus, v.GPUs, v.Total = s.Nodes, s.GPUs, s.Matching
	}
	if c.cfg.Stats != nil {
		pts, since := c.cfg.Stats.Fleet()
		v.Chart, v.Queue, v.Sampled = fleetChart(c.cfg.Now(), pts, since), queueChart(c.cfg.Now(), pts), true
	}
	v.Picture = fmt.Sprintf("GPU allocation across the fleet: %d busy, %d idle, %d sick (flagged)", v.GPUs[gpuBusy], v.GPUs[gpuIdle], v.GPUs[gpuSick])
	c.render(w, r, http.StatusOK, "fleet", q, v)
}

// The picture's geometry: each GPU a cell×cell square, pitch pixels apart,
// perRow to a row, in node order. 80,000 cards are 320 rows.
const (
	cell   = 3
	pitch  = 4
	perRow = 250
)

var (
	shadeBusy = color.RGBA{0x1f, 0x3a, 0x93, 0xff} // dark: in use
	shadeIdle = color.RGBA{0xd0, 0xd4, 0xdc, 0xff} // light: free
	shadeSick = color.RGBA{0xc0, 0x10, 0x10, 0xff} // drawn as an X, so it reads without colour
	shadeBack = color.RGBA{0xff, 0xff, 0xff, 0xff}
)

// gpuPicture draws every GPU of the fleet as one small square (busy dark,
// idle light, sick an X): a PNG of a few kilobytes whatever the fleet's
// size, where a table of 80,000 cards would be megabytes of HTML. The
// Fleet page states the same counts in text beside it.
func (c *Console) gpuPicture(w http.ResponseWriter, r *http.Request, q *request) {
	nodes, err := q.api.ListNodes(r.Context())
	if err != nil {
		c.fail(w, r, q, err)
		return
	}
	var cells []string
	for _, n := range rowsOf(nodes.Nodes) {
		for _, g := range n.GPUs {
			cells = append(cells, g.State)
		}
	}
	lines := max(1, (len(cells)+perRow-1)/perRow)
	img := image.NewRGBA(image.Rect(0, 0, perRow*pitch, lines*pitch))
	for i := range img.Pix {
		img.Pix[i] = 0xff
	}
	for i, st := range cells {
		x0, y0 := (i%perRow)*pitch, (i/perRow)*pitch
		for dy := range cell {
			for dx := range cell {
				c := shadeIdle
				switch {
				case st == gpuBusy:
					c = shadeBusy
				case st == gpuSick && (dx == dy || dx+dy == cell-1):
					c = shadeSick
				case st == gpuSick:
					c = shadeBack
				}
				img.SetRGBA(x0+dx, y0+dy, c)
			}
		}
	}
	w.Header().Set("Content-Type", "image/png")
	png.Encode(w, img)
}

// nodeAction cordons, drains or uncordons a node (operators).
func (c *Console) nodeAction(r *http.Request, q *request) (string, error) {
	id := r.PathValue("id")
	var err error
	switch r.PathValue("action") {
	case "cordon":
		_, err = q.api.CordonNode(r.Context(), id)
	case "uncordon":
		_, err = q.api.UncordonNode(r.Context(), id)
	case "drain":
		var d time.Duration
		if s := r.PostFormValue("deadline"); s != "" {
			if d, err = time.ParseDuration(s); err != nil {
				return "", failure.Invalid("deadline", "drain deadline %q is not a duration: use one such as 10m", s)
			}
		}
		_, err = q.api.DrainNode(r.Context(), id, d)
	default:
		return "", failure.Invalid("action", "unknown node action %q: use cordon, drain or uncordon", r.PathValue("action"))
	}
	if err != nil {
		return "", err
	}
	if r.PostFormValue("from") == "node" {
		return "/ui/nodes/" + id, nil
	}
	return "/ui/fleet", nil
}
