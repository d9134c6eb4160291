package fnagent

// Target concurrency.
//
// Fn's container contract gives a container one call at a time: until it
// has answered a call, no other call is sent to its listener. So a pool's
// containers can serve at most as many calls at once as it has containers,
// and what a function may choose is not how many calls a container takes
// but how many calls, in flight and waiting, the pool aims to have per
// container before it starts another: its target concurrency, the scaling
// target as Knative's autoscaler and Modal's target inputs define it (the
// hard limit per container staying 1). FunctionConfig.TargetConcurrency:
//
//   - 1, the default (as on Fn): every call that finds no idle container
//     has a container started for it (or waits for one that frees first);
//     with a hold standing, a spare starts when the last idle one is taken.
//   - N > 1: a call that finds no idle container waits for a busy one while
//     the pool's calls (busy and waiting) are at most N per container,
//     starting ones included; only demand beyond that starts a container,
//     and a held pool starts its spare when the demand reaches N per
//     container. For short calls this trades a little queueing for fewer
//     containers (memory, cold starts, CPU of idle runtimes).
//
// The target is a goal, the wait is bounded: a call that has waited
// Config.MaxSlotWait for a busy container with none starting has one
// started for it, capacity and MaxConcurrency allowing (launchOverTarget),
// rather than failing while the node could serve it.
//
// The rules are the pure functions below; slotQueue applies them.

// launchOverTarget starts a container for waiter w of a pool whose target
// concurrency is above 1, beyond the target, when the pool is below its
// max and the node has the capacity; it reports whether it did.
func (e *Engine) launchOverTarget(p *pool, w *slotWaiter[*hotContainer]) bool {
	if p.q.target <= 1 || !p.q.claimBeyondTarget() {
		return false
	}
	res, err := e.reserve(p)
	if err != nil {
		p.q.unclaim()
		return false
	}
	e.startLaunch(p, res, w)
	return true
}

// maxTargetConcurrency bounds FunctionConfig.TargetConcurrency: beyond it
// calls would queue for long behind one container.
const maxTargetConcurrency = 100

// launchNeeded reports whether a pool with the given calls waiting and
// busy, and containers in all (idle, busy and starting; starting of them
// in flight), needs one more container at target calls per container.
func launchNeeded(waiting, busy, containers, starting, target int) bool {
	if target <= 1 {
		return waiting > starting // every waiting call has a launch of its own
	}
	return busy+waiting > target*containers
}

// waitForBusy reports whether a call that found no idle container should
// wait for a busy one rather than have one started for it: the pool has
// containers and, with this call, its demand stays within target per
// container. Never at target 1.
func waitForBusy(waiting, busy, containers, target int) bool {
	return target > 1 && containers > 0 && busy+waiting+1 <= target*containers
}

// spareNeeded reports whether a held pool should start a spare ahead of
// demand: none is starting, and its demand has reached target per
// container (at target 1: no container is idle).
func spareNeeded(idle, waiting, busy, starting, target int) bool {
	if starting > 0 {
		return false
	}
	if target <= 1 {
		return idle == 0
	}
	return busy+waiting >= target*(idle+busy)
}
