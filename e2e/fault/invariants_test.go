package fault

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/nodeproto"
)

// summary is what one test did and found: the faults it injected, by kind,
// and the invariants, each with the details of every violation.
type summary struct {
	test       string
	faults     []string
	faultCount map[string]int
	notes      []string

	runs, attempts int
	containers     int
	maxPerAttempt  int
	disagree       []string // runs whose end disagrees with the daemon
	lost           []string // daemon facts or owed events the control plane lacks
	twice          []string // events applied twice, operations performed twice
	stale          []string // stale-token reports accepted
	staleChecked   bool
	staleRefused   int
	multiple       []string // attempts with more than one container
	blind          []string // what the daemon shows but the wire tap never parsed

	// event accounting
	forwarded, acked, rows, applied, duplicates int
	spoolLeft, spoolFacts                       int
	fencedOwed                                  int // left by a superseded agent, refused by design
}

func newSummary(test string) *summary {
	return &summary{test: test, faultCount: map[string]int{}}
}

// fault counts one injected fault of a kind.
func (s *summary) fault(kind string, n int) {
	if _, ok := s.faultCount[kind]; !ok {
		s.faults = append(s.faults, kind)
	}
	s.faultCount[kind] += n
}

func (s *summary) note(format string, args ...any) {
	s.notes = append(s.notes, fmt.Sprintf(format, args...))
}

// finish brings the cluster to rest and checks every invariant: it waits for
// every run to end, lets the agents deliver what they owe, stops them, and
// compares the control plane's account with the daemon's and with the wire.
// It prints the summary table and fails the test on any violation.
func (c *cluster) finish() {
	c.t.Helper()
	s := c.sum
	runs := c.waitAllTerminal(3 * time.Minute)
	c.quiesce()
	for _, a := range c.agents {
		if a.proc != nil {
			a.proc.stop(c.t, 15*time.Second)
		}
	}
	for _, a := range c.agents {
		a.proxy.Cut() // closes what is left, so the wire parsers finish
		a.wire.settle()
	}
	if runs2, err := c.allRuns(); err == nil {
		runs = runs2
	}
	c.checkRuns(runs)
	c.checkEvents()
	table := s.table()
	summariesMu.Lock()
	summaries = append(summaries, table)
	summariesMu.Unlock()
	c.t.Log("\n" + table)
	for _, v := range s.multiple {
		c.t.Errorf("more than one container for an attempt: %s", v)
	}
	for _, v := range s.disagree {
		c.t.Errorf("disagrees with the daemon: %s", v)
	}
	for _, v := range s.lost {
		c.t.Errorf("lost: %s", v)
	}
	for _, v := range s.twice {
		c.t.Errorf("applied twice: %s", v)
	}
	for _, v := range s.stale {
		c.t.Errorf("stale-token report accepted: %s", v)
	}
	for _, v := range s.blind {
		c.t.Errorf("the wire tap is blind, so the lost and twice checks above prove nothing: %s", v)
	}
}

// quiesce waits until the last observations and results have landed before
// anything is judged: every run's attempts agree with the daemon's facts
// (nothing the daemon knows is missing from the API), and on every running
// agent's wire each forwarded event is acknowledged with no batch awaiting
// its response; and that still holds once each running agent has had an
// exchange answered that began after it first held (the agent flushes at
// once on a change, so a spooled event would have gone out by then). A
// condition that never holds is not a failure here: the checks that follow
// report what is missing, with details.
func (c *cluster) quiesce() {
	c.t.Helper()
	quiet := func() bool {
		for _, a := range c.agents {
			if a.proc == nil || !a.proc.running() || a.fenced {
				continue
			}
			acct := a.wire.events()
			if acct.inFlight > 0 {
				return false
			}
			for id := range acct.forwarded {
				if !acct.acked[id] {
					return false
				}
			}
		}
		runs, err := c.allRuns()
		if err != nil {
			return false
		}
		saved := c.sum
		c.sum = newSummary(saved.test)
		defer func() { c.sum = saved }()
		c.checkRuns(runs)
		return len(c.sum.lost) == 0
	}
	const bound = 60 * time.Second
	if !c.poll(bound, quiet) {
		c.sum.note("the agents were not quiet %v after every run ended", bound)
		return
	}
	since := time.Now()
	if !c.poll(bound, func() bool {
		for _, a := range c.agents {
			if a.proc != nil && a.proc.running() && !a.fenced && a.wire.answeredSince(nodeproto.PathEvents, since) == 0 {
				return false
			}
		}
		return quiet()
	}) {
		c.sum.note("the agents did not stay quiet for one more exchange after every run ended")
	}
}

// checkRuns compares every run with the daemon's containers.
func (c *cluster) checkRuns(runs []api.Run) {
	s := c.sum
	ctrs := c.containers(c.nodes())
	s.runs, s.containers = len(runs), len(ctrs)
	byAttempt := map[string][]daemonContainer{}
	for _, ct := range ctrs {
		k := fmt.Sprintf("%s/%d", ct.run, ct.attempt)
		byAttempt[k] = append(byAttempt[k], ct)
	}
	known := map[string]bool{}
	for _, r := range runs {
		s.attempts += len(r.Attempts)
		if !api.Terminal(r.Status) {
			s.disagree = append(s.disagree, fmt.Sprintf("run %s is %s at the end", r.ID, r.Status))
		}
		for i, a := range r.Attempts {
			k := fmt.Sprintf("%s/%d", r.ID, a.Number)
			known[k] = true
			cs := byAttempt[k]
			s.maxPerAttempt = max(s.maxPerAttempt, len(cs))
			if len(cs) > 1 {
				var names []string
				for _, ct := range cs {
					names = append(names, ct.name+" "+ct.id[:12])
				}
				s.multiple = append(s.multiple, fmt.Sprintf("run %s attempt %d: %s", r.ID, a.Number, strings.Join(names, ", ")))
			}
			last := i == len(r.Attempts)-1
			if len(cs) == 0 {
				if a.ContainerID != "" {
					s.disagree = append(s.disagree, fmt.Sprintf("run %s attempt %d names container %.12s, which the daemon does not have", r.ID, a.Number, a.ContainerID))
				}
				if last && (r.Status == api.RunSucceeded || r.ExitCode != nil) {
					s.disagree = append(s.disagree, fmt.Sprintf("run %s is %s with exit %v but its attempt %d has no container", r.ID, r.Status, show(r.ExitCode), a.Number))
				}
				continue
			}
			c.compareAttempt(r, a, cs[0], last)
		}
	}
	for k, cs := range byAttempt {
		if !known[k] {
			for _, ct := range cs {
				s.disagree = append(s.disagree, fmt.Sprintf("container %s (%s) belongs to no attempt the control plane knows", ct.name, ct.status))
			}
		}
	}
}

// compareAttempt checks one attempt (and, for the last, its run) against its
// container.
func (c *cluster) compareAttempt(r api.Run, a api.Attempt, ct daemonContainer, last bool) {
	s := c.sum
	where := fmt.Sprintf("run %s attempt %d (%s)", r.ID, a.Number, ct.name)
	if a.ContainerID != "" && a.ContainerID != ct.id {
		s.disagree = append(s.disagree, fmt.Sprintf("%s: API container %.12s, daemon %.12s", where, a.ContainerID, ct.id))
	}
	switch ct.status {
	case "exited":
		// The daemon's moments, as the agent reports them: a StartedAt after
		// FinishedAt (Docker < 25 stamps it late) is clamped to FinishedAt.
		wantStart := ct.started
		if ct.finished.Before(wantStart) {
			wantStart = ct.finished
		}
		switch {
		case a.ExitCode == nil:
			s.lost = append(s.lost, fmt.Sprintf("%s: the daemon says it exited %d at %s; the API shows no exit (attempt %s)", where, ct.exit, ct.finished.Format(time.RFC3339Nano), a.Status))
		case *a.ExitCode != ct.exit:
			s.disagree = append(s.disagree, fmt.Sprintf("%s: exit %d in the API, %d in the daemon", where, *a.ExitCode, ct.exit))
		}
		switch {
		case a.FinishedAt == nil:
			s.lost = append(s.lost, fmt.Sprintf("%s: the daemon's FinishedAt %s is not in the API", where, ct.finished.Format(time.RFC3339Nano)))
		case !a.FinishedAt.Equal(ct.finished):
			s.disagree = append(s.disagree, fmt.Sprintf("%s: FinishedAt %s in the API, %s in the daemon", where, a.FinishedAt.Format(time.RFC3339Nano), ct.finished.Format(time.RFC3339Nano)))
		}
		switch {
		case a.StartedAt == nil:
			s.lost = append(s.lost, fmt.Sprintf("%s: the daemon's StartedAt %s is not in the API", where, wantStart.Format(time.RFC3339Nano)))
		case !a.StartedAt.Equal(wantStart):
			s.disagree = append(s.disagree, fmt.Sprintf("%s: StartedAt %s in the API, %s in the daemon", where, a.StartedAt.Format(time.RFC3339Nano), wantStart.Format(time.RFC3339Nano)))
		}
		if !last {
			return
		}
		// The run's end follows from its last attempt's exit (and the stop
		// reason the agent recorded, which the daemon cannot know).
		want := api.RunFailed
		switch {
		case ct.exit == 0 && a.StopReason == "":
			want = api.RunSucceeded
		case a.StopReason == "cancelled" || r.Cancel:
			want = api.RunCancelled
		}
		if r.Status != want {
			s.disagree = append(s.disagree, fmt.Sprintf("%s: run is %s, the daemon's exit %d (stop reason %q) makes it %s", where, r.Status, ct.exit, a.StopReason, want))
		}
		if r.ExitCode == nil || *r.ExitCode != ct.exit {
			s.disagree = append(s.disagree, fmt.Sprintf("%s: run exit %v, daemon exit %d", where, show(r.ExitCode), ct.exit))
		}
	case "created":
		// Never started: nothing may claim it ran.
		if a.ExitCode != nil || a.StartedAt != nil || (last && r.Status == api.RunSucceeded) {
			s.disagree = append(s.disagree, fmt.Sprintf("%s: never started (daemon: created %s), but the API shows attempt %s exit %v started %v", where, ct.stateErr, a.Status, show(a.ExitCode), a.StartedAt))
		}
	default:
		s.disagree = append(s.disagree, fmt.Sprintf("%s: the daemon says %s at the end; the API says attempt %s, run %s", where, ct.status, a.Status, r.Status))
	}
}

func show(p *int) string {
	if p == nil {
		return "none"
	}
	return fmt.Sprint(*p)
}

// checkEvents does the event accounting: what went on the wire, what the
// control plane acknowledged, applied (its counter) and recorded (its
// durable event table), and what the stopped agents still hold in their
// spools.
func (c *cluster) checkEvents() {
	s := c.sum
	forwarded := map[string]string{} // "NODE/ID" → kind
	acked := map[string]bool{}
	resultsBy := map[string]map[string]bool{} // "OP incarnation" → result event IDs
	reported := map[string]bool{}             // runs with a workload event acknowledged
	for _, a := range c.agents {
		acct := a.wire.events()
		for id, run := range acct.runs {
			if acct.acked[id] {
				reported[run] = true
			}
		}
		for id, kind := range acct.forwarded {
			forwarded[a.node+"/"+id] = kind
		}
		for id := range acct.acked {
			acked[a.node+"/"+id] = true
		}
		for id, op := range acct.results {
			k := op + " by agent memory " + incarnationOf(id)
			if resultsBy[k] == nil {
				resultsBy[k] = map[string]bool{}
			}
			resultsBy[k][id] = true
		}
	}
	// Results still in the spools count too: an operation performed twice
	// may not have been reported yet.
	for _, a := range c.agents {
		st := a.openState()
		spooled, err := st.Spooled(0)
		st.Close()
		if err != nil {
			c.t.Fatalf("read the spool of agent %s: %v", a.name, err)
		}
		for _, e := range spooled {
			key := a.node + "/" + e.ID
			if acked[key] {
				continue // delivered; only the acknowledgement was lost
			}
			s.spoolLeft++
			switch {
			case a.fenced:
				s.fencedOwed++
			case e.Kind == nodeproto.EventFacts:
				s.spoolFacts++ // a heartbeat's facts minted in the last moment
			default:
				what := e.Kind
				if e.Workload != nil {
					what = fmt.Sprintf("workload %s/%d %s", e.Workload.RunID, e.Workload.Attempt, e.Workload.Phase)
				}
				if e.Result != nil {
					what = fmt.Sprintf("result of %s (%s)", e.Result.OperationID, e.Result.Outcome)
					k := e.Result.OperationID + " by agent memory " + incarnationOf(e.ID)
					if resultsBy[k] == nil {
						resultsBy[k] = map[string]bool{}
					}
					resultsBy[k][e.ID] = true
				}
				s.lost = append(s.lost, fmt.Sprintf("agent %s still owes event %s (%s) after quiescence", a.name, e.ID, what))
			}
		}
	}
	for k, ids := range resultsBy {
		if len(ids) > 1 {
			s.twice = append(s.twice, fmt.Sprintf("operation %s minted %d result events: it was performed more than once", k, len(ids)))
		}
	}

	c.checkTapSaw(reported)

	rows := c.eventRows()
	ours := map[string]time.Time{}
	for _, n := range c.nodes() {
		for k, at := range rows {
			if strings.HasPrefix(k, n+"/") {
				ours[k] = at
			}
		}
	}
	s.forwarded, s.acked, s.rows = len(forwarded), len(acked), len(ours)
	for k := range acked {
		if _, ok := ours[k]; !ok {
			s.lost = append(s.lost, fmt.Sprintf("event %s was acknowledged but is not in the control plane's event table", k))
		}
	}
	for k := range ours {
		if _, ok := forwarded[k]; !ok {
			s.note("event %s is in the event table but the wire tap never saw it forwarded whole", k)
		}
	}

	// Applied versus recorded. Every first application of an event inserts
	// exactly one row in the same transaction, so within one life of the
	// control plane its applied counter must equal the rows it inserted;
	// anything above is an event applied twice.
	m, err := c.scrape(5 * time.Second)
	if err != nil {
		c.t.Fatalf("scrape the control plane's metrics: %v", err)
	}
	final := c.incarnations[len(c.incarnations)-1]
	s.applied = int(m[`mercator_node_events_total{outcome="applied"}`])
	s.duplicates = int(m[`mercator_node_events_total{outcome="duplicate"}`])
	rowsIn := func(from, to time.Time) int {
		n := 0
		for _, at := range rows { // every node: the counter is not per node
			if !at.Before(from) && (to.IsZero() || at.Before(to)) {
				n++
			}
		}
		return n
	}
	if n := rowsIn(final.start, time.Time{}); s.applied != n {
		s.twice = append(s.twice, fmt.Sprintf("the control plane (life %d) counted %d events applied but recorded %d first sightings", len(c.incarnations), s.applied, n))
	}
	for i, inc := range c.incarnations[:len(c.incarnations)-1] {
		if n := rowsIn(inc.start, inc.end); inc.scraped && int(inc.applied) > n {
			s.twice = append(s.twice, fmt.Sprintf("the control plane (life %d) counted %v events applied before it was killed but recorded only %d first sightings", i+1, inc.applied, n))
		}
	}
	if len(c.incarnations) > 1 {
		s.note("the applied counter restarts with each control-plane life: the exact check covers the last life (%d applied, %d recorded in it); earlier lives are checked against the counter scraped just before each kill", s.applied, rowsIn(final.start, time.Time{}))
	}
}

// checkTapSaw makes the wire's lost and twice checks unable to pass on a
// tap that parsed nothing: every container the daemon has for an attempt
// must have had its launch command parsed off a session stream, and every
// run with a container a workload event of it parsed in an acknowledged
// batch. reported holds the runs with such an event.
func (c *cluster) checkTapSaw(reported map[string]bool) {
	s := c.sum
	for _, ct := range c.containers(c.nodes()) {
		launched := false
		for _, a := range c.agents {
			if _, ok := a.wire.launchFor(ct.run, ct.attempt); ok {
				launched = true
				break
			}
		}
		if !launched {
			s.blind = append(s.blind, fmt.Sprintf("the daemon has container %s of run %s attempt %d, but no session stream parsed carried its launch", ct.name, ct.run, ct.attempt))
		}
		if !reported[ct.run] {
			s.blind = append(s.blind, fmt.Sprintf("the daemon has container %s of run %s, but no acknowledged batch parsed carried a workload event of that run", ct.name, ct.run))
		}
	}
	if s.containers == 0 {
		s.blind = append(s.blind, "the daemon has no container of this test: nothing was exercised")
	}
}

// incarnationOf is the agent-memory part of an event ID ("<incarnation>-<seq>").
func incarnationOf(id string) string {
	if i := strings.LastIndexByte(id, '-'); i > 0 {
		return id[:i]
	}
	return id
}

// table renders the summary.
func (s *summary) table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "=== %s (%s mode, seed %d)\n", s.test, modeName(), seed)
	fmt.Fprintf(&b, "  %-76s %6s\n", "fault injected", "count")
	for _, f := range s.faults {
		fmt.Fprintf(&b, "  %-76s %6d\n", f, s.faultCount[f])
	}
	fmt.Fprintf(&b, "  %-76s %6s %5s\n", "invariant", "value", "want")
	row := func(name string, v any, want string) { fmt.Fprintf(&b, "  %-76s %6v %5s\n", name, v, want) }
	row(fmt.Sprintf("containers per attempt, max (%d runs, %d attempts, %d containers)", s.runs, s.attempts, s.containers), s.maxPerAttempt, "≤ 1")
	row("runs disagreeing with the daemon", len(s.disagree), "0")
	row("daemon facts or owed events lost", len(s.lost), "0")
	row("events applied twice / operations performed twice", len(s.twice), "0")
	row("containers whose launch or report the wire tap never parsed", len(s.blind), "0")
	if s.staleChecked {
		row(fmt.Sprintf("stale-token reports accepted (%d refused)", s.staleRefused), len(s.stale), "0")
	} else {
		row("stale-token reports accepted", "n/a", "0")
	}
	fmt.Fprintf(&b, "  events: %d distinct on the wire, %d acknowledged, %d recorded by the control plane; counter: %d applied, %d duplicates (last life); %d left in spools after quiescence (%d of them heartbeat facts)\n",
		s.forwarded, s.acked, s.rows, s.applied, s.duplicates, s.spoolLeft, s.spoolFacts)
	if s.fencedOwed > 0 {
		fmt.Fprintf(&b, "  %d events left in the superseded agent's spool: refused by design; the new enrollment re-observed its containers\n", s.fencedOwed)
	}
	sort.Strings(s.notes)
	for _, n := range s.notes {
		fmt.Fprintf(&b, "  note: %s\n", n)
	}
	return b.String()
}
