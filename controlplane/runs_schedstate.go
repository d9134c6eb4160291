package controlplane

import (
	"context"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/schedcopy"
	"github.com/mercator/mercator/scheduler"
	"github.com/mercator/mercator/store"
)

// schedView is the scheduler's view of the nodes (status, capacity,
// inventory; nothing about active attempts), built from the copy of the
// nodes' records (schedcopy.Copy.Nodes) once per liveness flush period or
// when the records changed; a pass copies it and adds what active
// attempts hold. Only the reconcile loop touches it.
type schedView struct {
	view  []scheduler.Node
	index map[string]int
	from  []store.Node // the records it was built from
	at    time.Time
}

// resyncEvery is how often the copy of active attempts is rebuilt from the
// store whole. With one replica the copy misses nothing (this one writes
// every run); with several, a run another replica wrote is read again when
// its "runs:" signal arrives, and a signal dropped on the way is said
// afterwards (signals.Lost), which invalidates the copy at once. So the
// rebuild is the last cover, for a signal lost without a word and for the
// cost of a bug. With replicas it was a minute before Lost invalidated
// the copy: at 50,000 active runs on PostgreSQL, 5 s of the database's time
// a read.
const resyncEvery = 10 * time.Minute

// nodeListAge is how old a copy of the nodes' records may be for the
// scheduler and the metrics: the copy follows this replica's own writes
// (schedcopy.Copy.PatchNodes), so alone it is refreshed once a minute; other
// replicas' writes, their liveness flushes included, are read once per flush
// period (every node's version and moment, and the records that changed).
func (s *Server) nodeListAge() time.Duration {
	if s.coord != nil {
		return s.live.FlushPeriod()
	}
	return time.Minute
}

// nodeList returns the copy of the nodes' records (schedcopy.Copy.Nodes):
// refreshed from the store when older than maxAge. The caller must not modify
// the slice or the records.
func (s *Server) nodeList(ctx context.Context, maxAge time.Duration) ([]store.Node, error) {
	return s.sched.Nodes(maxAge, schedcopy.NodeReads{
		Versions: func() ([]store.NodeVersion, error) { return viewRead(ctx, s.store, store.Tx.NodeVersions) },
		Records: func(ids []string) ([]store.Node, error) {
			return viewRead(ctx, s.store, func(tx store.Tx) ([]store.Node, error) { return tx.GetNodes(ids) })
		},
		All: func() ([]store.Node, error) { return viewRead(ctx, s.store, store.Tx.ListNodes) },
	})
}

// viewRead is read's answer, read in a transaction of its own.
func viewRead[T any](ctx context.Context, st store.Store, read func(store.Tx) (T, error)) (out T, err error) {
	err = st.View(ctx, func(tx store.Tx) error {
		out, err = read(tx)
		return err
	})
	return out, err
}

// refreshUsage brings the copy of active attempts up to date
// (schedcopy.Copy.Refresh): rebuilt from the store when it is missing or
// due, otherwise with the runs other replicas wrote read again.
func (s *Server) refreshUsage(ctx context.Context) error {
	active := func() (runs []store.Run, err error) {
		err = s.store.View(ctx, func(tx store.Tx) error {
			runs, err = tx.ListRuns(store.ListRunsOptions{Statuses: []string{api.RunPlaced, api.RunPreparing, api.RunRunning}, AnyOrder: true})
			return err
		})
		return runs, err
	}
	// The runs other replicas wrote, in one read (one statement on
	// PostgreSQL): with replicas, every run the other replica's reports
	// touch is read here again, thousands between two console samples,
	// and a GetRun each was 4% of a replica's CPU in a 100,000-run hold.
	byID := func(ids []string) (runs []store.Run, err error) {
		err = s.store.View(ctx, func(tx store.Tx) error {
			runs, err = tx.GetRuns(ids)
			return err
		})
		return runs, err
	}
	return s.sched.Refresh(resyncEvery, active, byID)
}

// queuedRuns returns the queued runs, newest first, from the leader's copy
// (schedcopy.Queue), which reads the store only for what changed elsewhere
// and, whole, once per resyncQueueEvery or after a lost signal.
func (s *Server) queuedRuns(ctx context.Context) ([]store.Run, error) {
	queued := func() (runs []store.Run, err error) {
		err = s.store.View(ctx, func(tx store.Tx) error {
			runs, err = tx.ListRuns(store.ListRunsOptions{Statuses: []string{api.RunQueued}, AnyOrder: true}) // the copy keeps its own order
			return err
		})
		return runs, err
	}
	byID := func(ids []string) (runs []store.Run, err error) {
		err = s.store.View(ctx, func(tx store.Tx) error {
			runs, err = tx.GetRuns(ids)
			return err
		})
		return runs, err
	}
	return s.queued.Runs(resyncQueueEvery, queued, byID)
}

// resyncQueueEvery is how often the copy of the queued runs is read again
// whole. Alone, this replica writes every run and the copy misses nothing;
// the rebuild only bounds the cost of a bug. With other replicas, a run
// submitted through another is read when its signal arrives, and a dropped
// signal is said afterwards (signals.Lost, which invalidates the copy), so
// the rebuild bounds how long a run whose signal was lost without a word
// can wait to be seen. It was 5 s with replicas before Lost invalidated
// the copy.
const resyncQueueEvery = time.Minute

// runsWritten is called once a transaction that wrote runs committed on
// this replica: the scheduler's copy follows, and other replicas hear which
// runs changed.
func (s *Server) runsWritten(runs map[string]store.Run) {
	s.sched.NoteRuns(runs)
	s.queued.Note(runs)
	if s.coord == nil {
		return
	}
	ids := make([]string, 0, len(runs))
	for id := range runs {
		ids = append(ids, id)
	}
	s.publishIDs(topicRunIDs, ids)
}
