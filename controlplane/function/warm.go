package function

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// Warm capacity.
//
// A function's policy says how many of its containers the fleet keeps
// started with no calls: the annotation MinHotAnnotation (`mercator fn
// deploy --min-hot N`, or `fn update function … --annotation
// 'mercator.dev/min-hot=2'`). Each replica's warm loop asks the nodes whose
// sessions it holds, among the first of the function's order (its
// rendezvous ranking, the order calls try them in), to hold their share:
// the hold command (nodeproto.HoldCommand), which lasts holdFor and is
// repeated every holdEvery, so a node that misses one loses nothing and a
// policy that ends (the annotation removed, the function deleted) lapses by
// itself. Above the minimum, containers come and go with calls, the idle
// timeout (`--scale-down`) being the window after which an idle one goes.
//
// Every deploy (a create, or an update that may have changed the image)
// also sends the hold at once to the first prefetchNodes nodes of the
// order, with the minimum or none: the image is pulled there before the
// first call, which then starts a container and never waits for a pull.

// MinHotAnnotation, a whole number on a function, is how many of its
// containers the fleet keeps started with no calls (0, the default: none).
const MinHotAnnotation = api.AnnotationMinHot

const (
	// maxMinHot bounds MinHotAnnotation: a policy, not a reservation of
	// the fleet.
	maxMinHot = 100
	// holdEvery is how often the warm loop repeats the holds; holdFor
	// how long each lasts, long enough to survive two lost rounds.
	holdEvery = 10 * time.Second
	holdFor   = 3 * holdEvery
	// prefetchNodes is how many of a function's first nodes pull its
	// image when it is deployed.
	prefetchNodes = 2
)

// MaxHotAnnotation, a whole number on a function, caps its containers
// across the fleet (0, the default: only capacity and max_concurrency cap
// them). The cap is split over the nodes a call may try, in their order,
// as each one's per-node cap (fnEntry.specFor).
const MaxHotAnnotation = api.AnnotationMaxHot

// maxMaxHot bounds MaxHotAnnotation.
const maxMaxHot = 10000

// TargetConcurrencyAnnotation, a whole number from 1 to maxTarget on a
// function, is how many calls, in flight and waiting, a node's pool of it
// aims at per container before it starts another: the scaling target
// (fnagent/target.go). A container still serves one call at a time, as
// Fn's contract has it; 1, the default, starts one for every call that
// finds none idle.
const TargetConcurrencyAnnotation = api.AnnotationTargetConcurrency

// maxTarget bounds TargetConcurrencyAnnotation (as the agent does).
const maxTarget = 100

// targetConcurrencyOf reads TargetConcurrencyAnnotation: 1 when absent.
func targetConcurrencyOf(ann api.Annotations) (int, error) {
	if _, ok := ann[TargetConcurrencyAnnotation]; !ok {
		return 1, nil
	}
	n, err := wholeAnnotation(ann, TargetConcurrencyAnnotation, maxTarget, "the calls per container to aim at")
	if err == nil && n < 1 {
		return 0, fnError(http.StatusBadRequest, "Invalid annotation %s: 0; want a whole number from 1 to %d, the calls per container to aim at", TargetConcurrencyAnnotation, maxTarget)
	}
	return n, err
}

// LogFramesAnnotation, "false" on a function, has its containers not
// asked to frame each call's output: on the hot path, two writes a call
// fewer for the FDK and the daemon, at the price of output written after
// a call's response counting as the next call's (fnagent.FunctionConfig).
const LogFramesAnnotation = api.AnnotationLogFrames

// logFramesOf reads LogFramesAnnotation: true when absent.
func logFramesOf(ann api.Annotations) (bool, error) {
	raw, ok := ann[LogFramesAnnotation]
	if !ok {
		return true, nil
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		s = string(raw)
	}
	b, err := strconv.ParseBool(strings.TrimSpace(s))
	if err != nil {
		return true, fnError(http.StatusBadRequest, "Invalid annotation %s: %s; want \"true\" or \"false\"", LogFramesAnnotation, raw)
	}
	return b, nil
}

// minHotOf reads MinHotAnnotation.
func minHotOf(ann api.Annotations) (int, error) {
	return wholeAnnotation(ann, MinHotAnnotation, maxMinHot, "the containers kept started with no calls")
}

// warmPolicy reads and checks a function's policy: min_hot and max_hot,
// the first no more than the second when both are set; and the other
// annotations nodes act on, target concurrency and log frames (read
// where they are used).
func warmPolicy(ann api.Annotations) (minHot, maxHot int, err error) {
	if minHot, err = minHotOf(ann); err != nil {
		return 0, 0, err
	}
	if maxHot, err = wholeAnnotation(ann, MaxHotAnnotation, maxMaxHot, "the most containers across the fleet, 0 for no cap"); err != nil {
		return 0, 0, err
	}
	if _, err = targetConcurrencyOf(ann); err != nil {
		return 0, 0, err
	}
	if _, err = logFramesOf(ann); err != nil {
		return 0, 0, err
	}
	if maxHot > 0 && minHot > maxHot {
		return 0, 0, fnError(http.StatusBadRequest, "Invalid annotations: %s %d is above %s %d", MinHotAnnotation, minHot, MaxHotAnnotation, maxHot)
	}
	return minHot, maxHot, nil
}

// wholeAnnotation reads annotation key as a whole number from 0 to most (a
// JSON number or a string holding one); 0 when absent.
func wholeAnnotation(ann api.Annotations, key string, most int, what string) (int, error) {
	raw, ok := ann[key]
	if !ok {
		return 0, nil
	}
	v := strings.TrimSpace(string(raw))
	var s string
	if json.Unmarshal(raw, &s) == nil {
		v = s
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > most {
		return 0, fnError(http.StatusBadRequest, "Invalid annotation %s: %s; want a whole number from 0 to %d, %s", key, raw, most, what)
	}
	return n, nil
}

// tries is how many of its n candidate nodes a call of the function may
// be offered to: at most maxTries, and no more than max_hot, so every
// node tried has a share of it.
func (e *fnEntry) tries(n int) int {
	t := min(n, maxTries)
	if e.maxHot > 0 {
		t = min(t, e.maxHot)
	}
	return t
}

// specFor is the function's spec as the i-th of the k nodes a call may try
// gets it: with max_hot, that node's share of it is its per-node cap
// (within the function's own max_concurrency), so the fleet never runs
// more than max_hot (except while the fleet changes and a node's share
// with it: its old containers age out). Holds send the same spec, so a
// node's held containers and its calls meet in one pool.
func (e *fnEntry) specFor(i, k int) nodeproto.FunctionSpec {
	spec := e.spec
	if e.maxHot > 0 && k > 0 {
		share := e.maxHot / k
		if i < e.maxHot%k {
			share++
		}
		if spec.MaxConcurrency == 0 || share < spec.MaxConcurrency {
			spec.MaxConcurrency = share
		}
	}
	return spec
}

// holdPlan is how many containers each of a function's first nodes holds,
// in its order, for a minimum of count over n nodes: count spread over as
// many nodes as it has containers (at most n), every other of the first
// prefetch nodes holding none (a prefetch of the image alone).
func holdPlan(n, count, prefetch int) []int {
	spread := min(count, n)
	plan := make([]int, min(n, max(spread, prefetch)))
	for i := 0; i < spread; i++ {
		plan[i] = count / spread
		if i < count%spread {
			plan[i]++
		}
	}
	return plan
}

// warmLoop repeats the holds of every function with a minimum until ctx
// ends.
func (s *Service) warmLoop(ctx context.Context) {
	t := time.NewTicker(holdEvery)
	defer t.Stop()
	for {
		s.holdAll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// holdAll sends the holds of every function whose policy keeps containers.
func (s *Service) holdAll(ctx context.Context) {
	var fns []store.Fn
	if err := s.store.View(ctx, func(tx store.Tx) (err error) { fns, err = tx.ListFns(store.ListFnOptions{}); return err }); err != nil {
		if ctx.Err() == nil {
			s.log.Warn("warm capacity: list functions", "err", err)
		}
		return
	}
	for _, f := range fns {
		if n, err := minHotOf(f.Annotations); err == nil && n > 0 {
			s.hold(ctx, f.ID, n)
		}
	}
}

// hold asks the function's first nodes that this replica reaches, among
// those its calls may try, to hold their share of count (holdPlan); count
// 0 is a prefetch. It reports how many nodes it asked.
func (s *Service) hold(ctx context.Context, fnID string, count int) int {
	e, err := s.readFn(ctx, fnID, s.now())
	if err != nil {
		return 0
	}
	return s.holdEntry(ctx, e, count, false)
}

// holdEntry is hold of the function e; with release, it sends every node
// its calls may try a release instead (released), only agents at
// VersionFnSpares understanding one.
func (s *Service) holdEntry(ctx context.Context, e *fnEntry, count int, release bool) int {
	nodes, _, err := s.candidates(ctx, e)
	if err != nil {
		return 0
	}
	versions := s.nodeVersions()
	asked := 0
	k := e.tries(len(nodes)) // calls reach no other node
	plan, need := holdPlan(k, count, prefetchNodes), nodeproto.VersionWarmCapacity
	if release {
		plan, need = make([]int, k), nodeproto.VersionFnSpares
	}
	for i, n := range plan {
		id := nodes[i].ID
		if versions[id] < need || !s.host.Holds(id) {
			continue // an older agent would take the command for an operation, or a release for a prefetch
		}
		spec := e.specFor(i, k)
		if _, _, sent := s.host.Send(id, nodeproto.Command{Kind: nodeproto.KindHold,
			Hold: &nodeproto.HoldCommand{Function: &spec, Count: n, For: holdFor, Release: release}}); sent {
			asked++
		}
	}
	return asked
}

// deployed sends a freshly created or updated function's holds at once:
// its minimum, and the prefetch of its image, before the first call.
func (s *Service) deployed(f store.Fn) {
	n, _ := minHotOf(f.Annotations)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s.hold(ctx, f.ID, n)
}

// released tells the nodes a deleted function's calls may have reached
// (the first of its order that this replica reaches, as hold asks them)
// to drop what they keep of it ahead of calls: its prepared container
// (a spare, fnagent/prepare.go) and its idle ones. A node that misses it
// (another replica holds its session, or it is away) drops the spare when
// it lapses (fnagent.Config.SpareFor) or gives way to another function's.
// Only agents at VersionFnSpares understand it.
func (s *Service) released(e *fnEntry) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s.holdEntry(ctx, e, 0, true)
}
