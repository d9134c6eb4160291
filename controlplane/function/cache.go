package function

import (
	"context"
	"math"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/placement"
	"github.com/mercator/mercator/controlplane/project"
	"github.com/mercator/mercator/nodeproto"

	"github.com/mercator/mercator/scheduler"
	"github.com/mercator/mercator/store"
)

// Caches.

// fnEntry is a function as the invoke path needs it.
type fnEntry struct {
	fn     store.Fn
	app    store.App
	spec   nodeproto.FunctionSpec
	need   scheduler.FunctionNeed
	maxHot int // MaxHotAnnotation; 0 no cap (warm.go)
	at     time.Time
}

// newFnEntry is f's entry, with config the containers' environment
// (Service.functionEnv, which opens the secrets).
func newFnEntry(f store.Fn, app store.App, config map[string]string, at time.Time) *fnEntry {
	spec := nodeproto.FunctionSpec{
		ID: f.ID, AppID: f.AppID, Name: f.Name, AppName: app.Name, Image: f.PinnedImage,
		MemoryMB: int64(f.Memory), MilliCPUs: int64(math.Round(f.CPU * 1000)), GPUs: f.GPUs, Config: config,
		Timeout: time.Duration(f.Timeout) * time.Second, IdleTimeout: time.Duration(f.IdleTimeout) * time.Second,
		MaxConcurrency: f.MaxConcurrency,
	}
	if spec.MemoryMB == 0 {
		spec.MemoryMB = api.FnDefaultMemoryMB
	}
	if spec.Timeout == 0 {
		spec.Timeout = api.FnDefaultTimeout * time.Second
	}
	_, maxHot, _ := warmPolicy(f.Annotations) // checked when it was set
	spec.TargetConcurrency, _ = targetConcurrencyOf(f.Annotations)
	framed, _ := logFramesOf(f.Annotations)
	spec.UnframedLogs = !framed
	return &fnEntry{fn: f, app: app, spec: spec, at: at, maxHot: maxHot,
		need: scheduler.FunctionNeed{MemoryBytes: spec.MemoryMB << 20, MilliCPUs: spec.MilliCPUs, GPUs: f.GPUs, GPUModel: f.GPUModel}}
}

// lookupFn returns the function and its app, from the cache when fresh.
func (s *Service) lookupFn(ctx context.Context, id string) (*fnEntry, error) {
	now := s.now()
	if v, ok := s.fns.Load(id); ok {
		if e := v.(*fnEntry); now.Sub(e.at) < cacheTTL {
			return e, nil
		}
	}
	e, err := s.readFn(ctx, id, now)
	if err != nil {
		return nil, err
	}
	s.fns.Store(id, e)
	return e, nil
}

// readFn reads the function and its app from the store, leaving the cache
// as it is (the warm loop's reads are no calls).
func (s *Service) readFn(ctx context.Context, id string, now time.Time) (*fnEntry, error) {
	var e *fnEntry
	err := s.store.View(ctx, func(tx store.Tx) error {
		f, err := tx.GetFn(id)
		if err != nil {
			return notFoundAs(err, errFnNotFound)
		}
		app, err := tx.GetApp(f.AppID)
		if err != nil {
			return notFoundAs(err, errFnAppNotFound)
		}
		env, err := s.functionEnv(app, f) // secrets.go
		if err != nil {
			return err
		}
		p, err := project.Get(tx, api.ProjectOf(app.Project))
		if err != nil {
			return err
		}
		e = newFnEntry(f, app, env, now)
		e.need.Pools = p.Pools // placed only there (docs/teams.md)
		return nil
	})
	if err != nil {
		return nil, err
	}
	// The pull credential for the function's registry, when one is stored
	// (Host.RegistryAuth); it travels with each command, never stored on the
	// node, as a Run's does.
	e.spec.RegistryAuth = s.host.RegistryAuth(ctx, e.app.Project, e.spec.Image)
	return e, nil
}

type triggerEntry struct {
	appID, fnID string
	public      bool // callable without a credential (public.go)
	at          time.Time
}

// lookupTrigger finds the function an HTTP trigger of the app names, and
// whether the trigger is public.
func (s *Service) lookupTrigger(ctx context.Context, appName, source string) (*fnEntry, bool, error) {
	key := appName + "\x00" + source
	now := s.now()
	if v, ok := s.triggers.Load(key); ok {
		if t := v.(*triggerEntry); now.Sub(t.at) < cacheTTL {
			e, err := s.lookupFn(ctx, t.fnID)
			return e, t.public, err
		}
	}
	var t triggerEntry
	err := s.store.View(ctx, func(tx store.Tx) error {
		app, err := tx.GetAppByName(appName)
		if err != nil {
			return notFoundAs(err, errFnAppNotFound)
		}
		tr, err := tx.GetTriggerBySource(app.ID, "http", source)
		if err != nil {
			return notFoundAs(err, errTriggerNotFound)
		}
		t = triggerEntry{appID: app.ID, fnID: tr.FnID, public: triggerPublic(tr.Annotations) || appPublic(app.Annotations), at: now}
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	s.triggers.Store(key, &t)
	e, err := s.lookupFn(ctx, t.fnID)
	return e, t.public, err
}

// forgetFn and forgetApp drop cached entries this replica just changed.
func (s *Service) forgetFn(id string) {
	if s == nil {
		return
	}
	s.fns.Delete(id)
	s.triggers.Range(func(k, v any) bool {
		if v.(*triggerEntry).fnID == id {
			s.triggers.Delete(k)
		}
		return true
	})
}

func (s *Service) forgetApp(id string) {
	if s == nil {
		return
	}
	s.fns.Range(func(k, v any) bool {
		if v.(*fnEntry).app.ID == id {
			s.fns.Delete(k)
		}
		return true
	})
	s.triggers.Range(func(k, v any) bool {
		if v.(*triggerEntry).appID == id {
			s.triggers.Delete(k)
		}
		return true
	})
}

type fnNodeList struct {
	at       time.Time
	nodes    []scheduler.FunctionNode
	versions map[string]int // each node's agent capability version
}

// nodeVersions is the capability version of each node the last fleet read
// found taking calls.
func (s *Service) nodeVersions() map[string]int {
	if l := s.nodes.Load(); l != nil {
		return l.versions
	}
	return nil
}

// fleet is the nodes that take calls, read at most every cacheTTL.
func (s *Service) fleet(ctx context.Context) ([]scheduler.FunctionNode, error) {
	now := s.now()
	if l := s.nodes.Load(); l != nil && now.Sub(l.at) < cacheTTL {
		return l.nodes, nil
	}
	s.nodesMu.Lock()
	defer s.nodesMu.Unlock()
	if l := s.nodes.Load(); l != nil && now.Sub(l.at) < cacheTTL {
		return l.nodes, nil
	}
	var nodes []scheduler.FunctionNode
	versions := map[string]int{}
	err := s.store.View(ctx, func(tx store.Tx) error {
		all, err := tx.ListNodes()
		if err != nil {
			return err
		}
		for _, n := range all {
			if fn, ok := fnNodeOf(n, s.host.NodeReady(n)); ok {
				fn.Pool = placement.Labels(n)[project.PoolLabel]
				nodes = append(nodes, fn)
				versions[n.ID] = n.Facts.CapabilityVersion
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.nodes.Store(&fnNodeList{at: now, nodes: nodes, versions: versions})
	return nodes, nil
}

// candidates are the nodes to offer the call to, in order: those in its
// app's project's pools when the project is restricted to some, so that
// its containers, and the secrets and registry credential they start with,
// go only there, as a project's Runs do. With one replica, a node whose
// session this replica does not hold cannot be reached and is left out.
func (s *Service) candidates(ctx context.Context, e *fnEntry) (order []scheduler.FunctionNode, fitting int, err error) {
	nodes, err := s.fleet(ctx)
	if err != nil {
		return nil, 0, err
	}
	order = scheduler.PlaceFunction(e.fn.ID, nodes, e.need)
	fitting = len(order)
	if s.pub == nil {
		reachable := order[:0:0]
		for _, n := range order {
			if s.host.Holds(n.ID) {
				reachable = append(reachable, n)
			}
		}
		order = reachable
	}
	return order, fitting, nil
}

// fnNodeOf is the node as placement sees it, or false when it takes no
// calls: not ready, cordoned or draining, without a function share, or an
// agent too old to speak the invoke command.
func fnNodeOf(n store.Node, ready bool) (scheduler.FunctionNode, bool) {
	f := n.Facts
	if !ready || n.Cordoned || n.Draining || f == nil || f.Functions == nil ||
		f.CapabilityVersion < nodeproto.RequiredVersion(nodeproto.Command{Kind: nodeproto.KindInvoke}) {
		return scheduler.FunctionNode{}, false
	}
	out := scheduler.FunctionNode{ID: n.ID, Share: *f.Functions}
	models := map[string]string{}
	for _, a := range f.Accelerators {
		models[a.UUID] = a.Model
	}
	for _, id := range f.Functions.GPUs {
		out.GPUModels = append(out.GPUModels, models[id])
	}
	return out, true
}
