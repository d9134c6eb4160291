package daemon

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/mercator/mercator/controlplane"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeagent"
	"github.com/mercator/mercator/store"
)

// localInvitationTTL bounds the invitation the server mints for its own
// agent: it is spent within seconds, or not at all when the agent resumes
// a stored session, and it never leaves the process.
const localInvitationTTL = 10 * time.Minute

// localAgentRetry is the first wait before an in-process agent that
// stopped is started again; it doubles up to localAgentRetryMax.
const (
	localAgentRetry    = 5 * time.Second
	localAgentRetryMax = 2 * time.Minute
)

// localAgentURL is where an agent in the server's process reaches it: the
// server's own URL, with a wildcard listen address (0.0.0.0, ::) made
// loopback, which the server's own certificate always names.
func localAgentURL(serverURL string) (string, error) {
	u, err := url.Parse(serverURL)
	if err != nil {
		return "", err
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil {
		return "", err
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		loopback := "127.0.0.1"
		if ip.To4() == nil {
			loopback = "::1"
		}
		u.Host = net.JoinHostPort(loopback, port)
	}
	return u.String(), nil
}

// serveWithLocalAgent serves srv on l as RunServer does, with
// o.LocalAgent beside it (runLocalAgent). The agent stops with the
// server, and the return waits for it: closing, it removes its function
// containers, which a process that exited first would leave running.
func serveWithLocalAgent(ctx context.Context, srv *controlplane.Server, st store.Store, l net.Listener, url string, o ServerOptions) error {
	agent := *o.LocalAgent
	if agent.Logger == nil {
		agent.Logger = o.Logger.With("component", "agent")
	}
	ctx, cancel := context.WithCancel(ctx)
	agentDone := make(chan struct{})
	go func() {
		defer close(agentDone)
		runLocalAgent(ctx, srv, st, url, agent)
	}()
	err := srv.Serve(ctx, l)
	cancel()
	<-agentDone
	return err
}

// nodeRemoved says whether node id was removed (`mercator node rm`) and
// not invited since; an unknown node is not removed.
func nodeRemoved(ctx context.Context, st store.Store, id string) (bool, error) {
	var removed bool
	err := st.View(ctx, func(tx store.Tx) error {
		n, err := tx.GetNode(id)
		if errors.Is(err, failure.ErrNotFound) {
			return nil
		}
		removed = err == nil && n.RemovedAt != nil
		return err
	})
	return removed, err
}

// runLocalAgent runs o (`mercator server --local-agent`) in this process
// until ctx ends: the node `mercator agent` would be on this machine, with
// the server enrolling it itself. It never ends the server: an agent that
// stops (Docker gone, its session refused) is logged and started again
// after a growing wait, enrolled anew when its state holds no session, so
// the control plane keeps serving the rest of the fleet meanwhile. A node
// removed with `mercator node rm` is left stopped, across restarts too,
// and is enrolled again once `mercator node invite` brings it back. It
// returns once the agent has stopped, its function containers removed.
func runLocalAgent(ctx context.Context, srv *controlplane.Server, st store.Store, serverURL string, o AgentOptions) {
	log := o.Logger
	var err error
	if o.ControlPlaneURL, err = localAgentURL(serverURL); err != nil {
		log.Error("local agent: the server's URL", "url", serverURL, "err", err)
		return
	}
	o.InProcess = true
	failures, saidRemoved := 0, false
	for ctx.Err() == nil {
		wait := localAgentRetry
		o.Invitation = ""
		removed, err := nodeRemoved(ctx, st, o.NodeID)
		switch {
		case err != nil:
			log.Warn("local agent: read its node", "node", o.NodeID, "err", err)
		case removed:
			// Looked at again every localAgentRetry, said once.
			if !saidRemoved {
				log.Warn("local agent: its node was removed (mercator node rm); `mercator node invite "+o.NodeID+"` brings it back", "node", o.NodeID)
			}
			saidRemoved = true
		default:
			saidRemoved = false
			if !hasSession(o.StateDir, o.NodeID) {
				inv, ierr := srv.InviteNode(ctx, o.NodeID, localInvitationTTL)
				if ierr != nil {
					log.Warn("local agent: invite its node", "node", o.NodeID, "err", ierr)
					break
				}
				o.Invitation = inv.Token
			}
			started := time.Now()
			err = RunAgent(ctx, o)
			if ctx.Err() != nil {
				return
			}
			if errors.Is(err, failure.ErrFenced) {
				// Its session is void (the node was removed, or enrolled
				// again elsewhere): the next start enrolls anew, unless
				// the node is removed then.
				forgetSession(o.StateDir, log)
			}
			if time.Since(started) > localAgentRetryMax {
				failures = 0 // it ran a while: a new failure, not the same one again
			}
			wait = min(localAgentRetry<<min(failures, 5), localAgentRetryMax)
			failures++
			log.Error("local agent stopped; starting it again", "node", o.NodeID, "err", err, "in", wait)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// forgetSession drops the session the agent state in dir holds.
func forgetSession(dir string, log *slog.Logger) {
	st, err := nodeagent.OpenState(dir)
	if err == nil {
		err = st.ForgetSession()
		st.Close()
	}
	if err != nil {
		log.Warn("local agent: forget its removed session", "err", err)
	}
}

// hasSession says whether the agent state in dir holds an unexpired session
// for node, which the agent resumes without an invitation. A state that
// cannot be read says no: the agent, started, reports why.
func hasSession(dir, node string) bool {
	st, err := nodeagent.OpenState(dir)
	if err != nil {
		return false
	}
	defer st.Close()
	_, exp, ok := st.Session()
	return ok && st.NodeID() == node && exp.After(time.Now())
}

// localAgentOptions is --local-agent's agent (nil without it), its node
// checked as an invitation's would be. The --agent-* flags without it are
// refused, naming the first: they would do nothing.
func localAgentOptions(fs *flag.FlagSet, node string, agentOptions func() (AgentOptions, error)) (*AgentOptions, error) {
	if node == "" {
		var set []string
		fs.Visit(func(f *flag.Flag) {
			if strings.HasPrefix(f.Name, LocalAgentPrefix) {
				set = append(set, f.Name)
			}
		})
		if len(set) > 0 {
			return nil, fmt.Errorf("--%s needs --local-agent NODE_ID: it sets the agent run in the server's process", set[0])
		}
		return nil, nil
	}
	if err := controlplane.ValidateNodeID(node); err != nil {
		return nil, fmt.Errorf("--local-agent %q: %w", node, err)
	}
	a, err := agentOptions()
	a.NodeID = node
	return &a, err
}
