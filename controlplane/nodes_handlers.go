package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/access"
	"github.com/mercator/mercator/controlplane/internal/factcheck"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/controlplane/internal/nodepage"
	"github.com/mercator/mercator/controlplane/internal/placement"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/lifecycle"
	"github.com/mercator/mercator/pki"
	"github.com/mercator/mercator/store"
)

// nodeIDPattern: lowercase letters, digits, '-', '_' and '.', starting with a
// letter or digit, at most 63 characters, so an ID is safe in a container
// label, a file name and a URL path.
var nodeIDPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// ValidateNodeID checks a node ID.
func ValidateNodeID(id string) error {
	if !nodeIDPattern.MatchString(id) {
		return failure.Invalid("node_id", "%q is not a valid node ID: use 1 to 63 lowercase letters, digits, '.', '_' or '-', starting with a letter or digit (for example gpu-node-01)", id)
	}
	return nil
}

// nodeStatus judges a node on the freshest report known, this replica's
// memory or the record, with the grace package liveness explains: unreachable
// only when nothing was heard for Lease + grace.
func (s *Server) nodeStatus(n store.Node) string {
	return s.statusSeen(n, s.live.LastSeen(n), s.now())
}

// statusSeen is nodeStatus with the freshest report known (nil: none)
// given.
func (s *Server) statusSeen(n store.Node, seen *time.Time, now time.Time) string {
	if n.RemovedAt != nil {
		return api.NodeUnreachable // `mercator node rm`: at once, whatever was heard
	}
	if n.EnrolledAt == nil {
		return api.NodeInvited
	}
	if seen == nil || now.Sub(*seen) > s.cfg.Lease+s.live.Grace() {
		return api.NodeUnreachable
	}
	return api.NodeReady
}

// freshest is the later of a record's LastSeenAt and this replica's memory
// (from liveness.snapshot).
func freshest(n store.Node, mem map[string]time.Time) *time.Time {
	t, ok := mem[n.ID]
	if !ok || (n.LastSeenAt != nil && !t.After(*n.LastSeenAt)) {
		return n.LastSeenAt
	}
	return &t
}

// nodeView is n as the API shows it, its status judged at at: the moment
// the caller's reads stand for, taken before its transaction began. A
// record read from a snapshot is as old as the snapshot, so judged by a
// clock read after a long read (every node's, and every active run's, on
// a large fleet under load: tens of seconds) it would show a node
// unreachable that was heard from within its lease.
func (s *Server) nodeView(n store.Node, active nodeWork, at time.Time) api.Node {
	seen := s.live.LastSeen(n)
	out := api.Node{ID: n.ID, Status: s.statusSeen(n, seen, at), FencingToken: n.FencingToken, EnrolledAt: n.EnrolledAt, LastSeenAt: seen,
		Running: active.running, GPUsInUse: active.gpus,
		Cordoned: n.Cordoned || n.Draining, Draining: n.Draining, DrainDeadline: n.DrainDeadline, RemovedAt: n.RemovedAt, Flags: n.Flags, Labels: placement.Labels(n)}
	if n.Facts != nil {
		data, _ := json.Marshal(n.Facts)
		json.Unmarshal(data, &out.Facts)
	}
	out.GPUs = factcheck.GPUs(n) // nodes_gpus.go
	return out
}

// nodeWork is what a node's active attempts are and hold: "RUN/ATTEMPT"
// of each, and the GPUs they hold.
type nodeWork struct {
	running, gpus []string
}

// activeByNode is the work of every node with an active attempt; with
// nodeID, only that node's (read through the store's index of runs by node
// rather than every active run).
func activeByNode(tx store.Tx, nodeID string) (map[string]nodeWork, error) {
	// Every node's: read unsorted and sorted here (store.ListRunsOptions.AnyOrder).
	every := nodeID == ""
	runs, err := tx.ListRuns(store.ListRunsOptions{NodeID: nodeID, Statuses: []string{api.RunPlaced, api.RunPreparing, api.RunRunning}, AnyOrder: every})
	if err != nil {
		return nil, err
	}
	if every {
		slices.SortFunc(runs, store.NewestFirst)
	}
	out := map[string]nodeWork{}
	for _, r := range runs {
		for _, a := range lifecycle.Members(&r.Run) { // a gang's on every node
			if !lifecycle.Active(*a) {
				continue
			}
			w := out[a.NodeID]
			w.running = append(w.running, fmt.Sprintf("%s/%d", r.ID, a.Number))
			w.gpus = append(w.gpus, a.GPUs...)
			out[a.NodeID] = w
		}
	}
	return out, nil
}

// fleetCopyAge is how old the copy of the fleet (every node's record and
// work) a page of nodes is built from may be. Paging and counting the whole
// fleet means reading every node and every active run: at 10,000 nodes and
// 100,000 runs, seconds. A console open on the Fleet page (or several)
// reads them at most this often; a node written on this replica (a
// cordon, a drain) drops the copy at once, so the page shows it; the
// unpaged listing reads afresh.
const fleetCopyAge = 2 * time.Second

// fleetCopy is every node and its work (activeByNode), from the replica's
// copy at most fleetCopyAge old when cached is set. The caller must not
// modify what it gets: it is shared.
func (s *Server) fleetCopy(tx store.Tx, cached bool) ([]store.Node, map[string]nodeWork, error) {
	now := time.Now()
	c, fresh, gen := s.fleetCache.Get("", now, fleetCopyAge)
	if cached && fresh {
		return c.nodes, c.work, nil
	}
	nodes, err := tx.ListNodes()
	if err != nil {
		return nil, nil, err
	}
	work, err := activeByNode(tx, "")
	if err == nil && cached {
		s.fleetCache.Put("", fleet{nodes, work}, gen, now)
	}
	return nodes, work, err
}

// fleet is the copy fleetCopy keeps.
type fleet struct {
	nodes []store.Node
	work  map[string]nodeWork
}

// listNodes lists every node, or with ?limit a page of them and the
// fleet counted (package nodepage).
func (s *Server) listNodes(w http.ResponseWriter, r *http.Request) {
	out := api.NodeList{Nodes: []api.Node{}}
	opts, paged, err := nodepage.Parse(r.URL.Query())
	at := s.now() // before the reads: see nodeView
	if err == nil {
		err = s.store.View(r.Context(), func(tx store.Tx) error {
			nodes, active, err := s.fleetCopy(tx, paged)
			if err != nil {
				return err
			}
			if paged {
				var sum api.FleetSummary
				status := func(n store.Node) string { return s.statusSeen(n, s.live.LastSeen(n), at) }
				nodes, out.Next, sum = nodepage.Page(nodes, opts, status, func(id string) []string { return active[id].gpus })
				out.Summary = &sum
			}
			for _, n := range nodes {
				out.Nodes = append(out.Nodes, s.nodeView(n, active[n.ID], at))
			}
			return err
		})
	}
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

func (s *Server) getNode(w http.ResponseWriter, r *http.Request) {
	var out api.Node
	at := s.now() // before the reads: see nodeView
	err := s.store.View(r.Context(), func(tx store.Tx) error {
		n, err := tx.GetNode(r.PathValue("id"))
		if err != nil {
			return err
		}
		active, err := activeByNode(tx, n.ID)
		out = s.nodeView(n, active[n.ID], at)
		return err
	})
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// inviteNode answers POST /v1/nodes/{id}/invitations (InviteNode).
func (s *Server) inviteNode(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var req api.InvitationRequest
	if r.ContentLength != 0 {
		if err := httpapi.Decode(r, httpapi.MaxBody, &req); err != nil {
			httpapi.WriteError(w, err)
			return
		}
	}
	if req.TTLSeconds < 0 || req.TTLSeconds > 30*24*3600 {
		httpapi.WriteError(w, failure.Invalid("ttl_seconds", "must be from 1 to 2592000 (30 days), or 0 for the default"))
		return
	}
	inv, err := s.InviteNode(r.Context(), id, time.Duration(req.TTLSeconds)*time.Second)
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusCreated, inv)
}

// InviteNode creates the node if it is new and a single-use invitation for
// it, valid for ttl (0: Config.InvitationTTL), revoking the node's older
// unused invitations (so a forgotten one cannot enroll later and cut the
// node off). Inviting an enrolled node again is how an agent that lost its
// credential comes back, and a removed one is brought back; the next
// enrollment fences the old one out. The token is in the answer only: the
// store keeps its hash. `mercator server --local-agent` calls it for the
// agent in its own process, which no operator hands a token to.
func (s *Server) InviteNode(ctx context.Context, id string, ttl time.Duration) (api.Invitation, error) {
	if err := ValidateNodeID(id); err != nil {
		return api.Invitation{}, err
	}
	if ttl <= 0 {
		ttl = s.cfg.InvitationTTL
	}
	now := s.now()
	// The CA fingerprint in front lets an agent given only this token trust
	// exactly this control plane (pki.JoinToken).
	tok := pki.JoinToken(s.cfg.CAFingerprint, "mci_"+httpapi.RandomToken())
	inv := store.Invitation{TokenHash: httpapi.HashToken(tok), NodeID: id, CreatedAt: now, ExpiresAt: now.Add(ttl)}
	err := s.batch(ctx, func(tx store.Tx) error {
		n, err := tx.GetNode(id)
		if errors.Is(err, failure.ErrNotFound) {
			n, err = store.Node{ID: id, CreatedAt: now}, tx.PutNode(store.Node{ID: id, CreatedAt: now})
		} else if err == nil && n.RemovedAt != nil {
			n.RemovedAt = nil // brought back (see removeNode)
			err = tx.PutNode(n)
		}
		if err != nil {
			return err
		}
		if err := access.RevokeUnused(tx, id, ""); err != nil {
			return err
		}
		return tx.CreateInvitation(inv)
	})
	if err != nil {
		return api.Invitation{}, err
	}
	cmd := fmt.Sprintf("mercator agent --control-plane %s --node-id %s --state /var/lib/mercator/agent --token-file TOKEN_FILE  # put the token in TOKEN_FILE (mode 0600) first", s.cfg.PublicURL, id)
	return api.Invitation{NodeID: id, Token: tok, ExpiresAt: inv.ExpiresAt, Command: cmd}, nil
}

// updateNode applies change to a node in one transaction and answers with
// the node as it then is.
func (s *Server) updateNode(w http.ResponseWriter, r *http.Request, change func(n *store.Node) error) {
	var out api.Node
	at := s.now() // before the reads: see nodeView
	err := s.update(r.Context(), func(tx store.Tx) error {
		n, err := tx.GetNode(r.PathValue("id"))
		if err != nil {
			return err
		}
		if err := change(&n); err != nil {
			return err
		}
		if err := tx.PutNode(n); err != nil {
			return err
		}
		active, err := activeByNode(tx, n.ID)
		out = s.nodeView(n, active[n.ID], at)
		return err
	})
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	s.wakeReconcile()
	httpapi.WriteJSON(w, http.StatusOK, out)
}

func (s *Server) cordonNode(w http.ResponseWriter, r *http.Request) {
	s.updateNode(w, r, func(n *store.Node) error { n.Cordoned = true; return nil })
}

// uncordonNode returns a node to service, ending a drain too.
func (s *Server) uncordonNode(w http.ResponseWriter, r *http.Request) {
	s.updateNode(w, r, func(n *store.Node) error {
		n.Cordoned, n.Draining, n.DrainDeadline = false, false, nil
		return nil
	})
}

// drainNode cordons a node and, with a deadline, stops what still runs there
// when it passes (the reconcile loop does the stopping).
func (s *Server) drainNode(w http.ResponseWriter, r *http.Request) {
	var req api.DrainRequest
	if r.ContentLength != 0 {
		if err := httpapi.Decode(r, httpapi.MaxBody, &req); err != nil {
			httpapi.WriteError(w, err)
			return
		}
	}
	if req.DeadlineSeconds < 0 || req.DeadlineSeconds > 30*24*3600 {
		httpapi.WriteError(w, failure.Invalid("deadline_seconds", "must be from 0 (no deadline) to 2592000 (30 days)"))
		return
	}
	s.updateNode(w, r, func(n *store.Node) error {
		n.Draining, n.DrainDeadline = true, nil
		if req.DeadlineSeconds > 0 {
			d := s.now().Add(time.Duration(req.DeadlineSeconds) * time.Second)
			n.DrainDeadline = &d
		}
		return nil
	})
}

// clearGPUDispute is the operator's word that a node's claim to a GPU
// stands (factcheck.Clear): the GPU may be placed on again.
func (s *Server) clearGPUDispute(w http.ResponseWriter, r *http.Request) {
	s.updateNode(w, r, func(n *store.Node) error { return factcheck.Clear(n, r.PathValue("uuid")) })
}
