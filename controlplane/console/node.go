package console

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/mercator/mercator/api"
)

// nodeRuns bounds the runs a node's page reads for its GPUs' use: a node
// holds a few runs per GPU at most, and the page's cost stays bounded
// whatever it holds.
const nodeRuns = 64

// nodeView is a node's page: the node as the Fleet page lists it, each
// GPU with the run holding it and that run's last sample of its use, and
// what its drain waits for.
type nodeView struct {
	nodeRow
	Cards []cardView
	// Unread is how many of its runs were not read (past nodeRuns).
	Unread int
}

// cardView is one GPU on a node's page.
type cardView struct {
	gpuCell
	Run   string        // "RUN/ATTEMPT" holding it, if any
	Usage *api.GPUUsage // its holder's last sample of it, if any
}

// node is a node's page: its GPUs' health and current use (the last
// sample each running attempt's usage summary carries), its runs, and
// what a drain still waits for.
func (c *Console) node(w http.ResponseWriter, r *http.Request, q *request) {
	n, err := q.api.GetNode(r.Context(), r.PathValue("id"))
	if err != nil {
		c.fail(w, r, q, err)
		return
	}
	v := nodeView{nodeRow: rowsOf([]api.Node{n})[0]}
	holder := map[string]string{}
	usage := map[string]api.GPUUsage{}
	for i, ra := range n.Running {
		if i >= nodeRuns {
			v.Unread = len(n.Running) - nodeRuns
			break
		}
		runID, num, _ := strings.Cut(ra, "/")
		run, err := q.api.GetRun(r.Context(), runID)
		if err != nil {
			continue // ended or removed since the node was read
		}
		for _, a := range run.Attempts {
			if strconv.Itoa(a.Number) != num {
				continue
			}
			for _, g := range a.GPUs {
				holder[g] = ra
			}
			for _, u := range a.GPUUsage {
				usage[u.UUID] = u
			}
		}
	}
	for _, g := range v.GPUs {
		card := cardView{gpuCell: g, Run: holder[g.UUID]}
		if u, ok := usage[g.UUID]; ok && card.Run != "" {
			card.Usage = &u
		}
		v.Cards = append(v.Cards, card)
	}
	c.render(w, r, http.StatusOK, "node", q, v)
}
