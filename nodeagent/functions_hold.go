package nodeagent

import (
	"github.com/mercator/mercator/nodeproto"
)

// hold applies a hold command (warm capacity, nodeproto.HoldCommand): the
// engine pulls the function's image and keeps the count of its containers
// started for the command's duration. Like invoke it is no operation (no
// result, never stored): the control plane repeats it while it wants the
// containers, so a lost one costs only warmth. A command fenced below
// this node's token, or one for an agent without functions, is dropped.
// A release (the function deleted) has the engine forget the function.
func (a *Agent) hold(cmd nodeproto.Command) {
	h := cmd.Hold
	if h == nil || h.Function == nil || a.functions == nil {
		return
	}
	if held := a.state.FencingToken(); cmd.FencingToken < held {
		a.logger.Debug("hold command fenced; ignoring it", "fn", h.Function.ID, "token", cmd.FencingToken, "held", held)
		return
	}
	if h.Release {
		n := a.functions.engine.Forget(h.Function.ID)
		a.logger.Debug("function released", "fn", h.Function.ID, "removed", n)
		return
	}
	if err := a.functions.engine.Hold(functionConfig(*h.Function), h.Count, h.For); err != nil {
		a.logger.Warn("hold function containers", "fn", h.Function.ID, "count", h.Count, "err", err)
	}
}
