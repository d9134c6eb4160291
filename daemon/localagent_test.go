package daemon

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

func TestLocalAgentURL(t *testing.T) {
	for in, want := range map[string]string{
		"https://0.0.0.0:7070":      "https://127.0.0.1:7070",
		"https://[::]:7070":         "https://[::1]:7070",
		"https://127.0.0.1:7070":    "https://127.0.0.1:7070",
		"https://10.0.0.5:7070":     "https://10.0.0.5:7070",
		"http://127.0.0.1:41234":    "http://127.0.0.1:41234",
		"https://[2001:db8::1]:443": "https://[2001:db8::1]:443",
	} {
		if got, err := localAgentURL(in); err != nil || got != want {
			t.Errorf("localAgentURL(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := localAgentURL("https://no-port"); err == nil {
		t.Error("a URL without a port was taken")
	}
}

// parseServer parses `mercator server` args through ServerFlags.
func parseServer(t *testing.T, args ...string) (ServerOptions, error) {
	t.Helper()
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	options := ServerFlags(fs, func(string) string { return "" }, time.ParseDuration)
	if err := fs.Parse(args); err != nil {
		return ServerOptions{}, err
	}
	return options()
}

func TestServerLocalAgentFlags(t *testing.T) {
	o, err := parseServer(t)
	if err != nil || o.LocalAgent != nil {
		t.Fatalf("no --local-agent: %+v, %v", o.LocalAgent, err)
	}
	o, err = parseServer(t, "--local-agent", "box-1", "--agent-state", "/srv/agent", "--agent-fn-memory", "2GiB",
		"--agent-label", "pool=a", "--agent-no-functions", "--agent-default-cpu", "0.5")
	if err != nil {
		t.Fatal(err)
	}
	a := o.LocalAgent
	switch {
	case a == nil:
		t.Fatal("--local-agent gave no agent")
	case a.NodeID != "box-1" || a.StateDir != "/srv/agent" || a.ArtifactRoot != "/srv/agent/artifacts":
		t.Errorf("node %q, state %q, artifacts %q", a.NodeID, a.StateDir, a.ArtifactRoot)
	case a.Functions.MemoryBytes != 2<<30 || !a.Functions.Disabled || a.Labels["pool"] != "a" || a.Containment.DefaultCPU != 0.5:
		t.Errorf("agent flags not applied: %+v", a)
	case a.ControlPlaneURL != "" || a.Invitation != "":
		t.Errorf("the server's to fill: URL %q, invitation %q", a.ControlPlaneURL, a.Invitation)
	}
	// The defaults are `mercator agent`'s.
	if o, err = parseServer(t, "--local-agent", "box-1"); err != nil || o.LocalAgent.StateDir != "/var/lib/mercator/agent" || o.LocalAgent.Functions.OutputRelay != OutputRelayAuto {
		t.Errorf("defaults: %+v, %v", o.LocalAgent, err)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--agent-fn-memory", "2GiB"}, "--agent-fn-memory needs --local-agent NODE_ID"},
		{[]string{"--local-agent", "Not A Node"}, `--local-agent "Not A Node"`},
		{[]string{"--local-agent", "b", "--agent-fn-spares", "-1"}, "--agent-fn-spares -1: must be from 0"},
		{[]string{"--local-agent", "b", "--agent-label", "nolabel"}, `--agent-label "nolabel": write KEY=VALUE`},
		{[]string{"--local-agent", "b", "--agent-fn-output-relay", "rel"}, `--agent-fn-output-relay "rel": want an absolute path`},
		{[]string{"--local-agent", "b", "--agent-gpu-sample-every", "1ms"}, "--agent-gpu-sample-every 1ms: must be from 1s"},
	} {
		if _, err := parseServer(t, c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want an error with %q", c.args, err, c.want)
		}
	}
	// `mercator agent`'s own flags keep their names, in what they set and
	// in its errors.
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	options := AgentFlags(fs)
	if err := fs.Parse([]string{"--control-plane", "https://cp:7070", "--node-id", "n", "--fn-spares", "-1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := options(); err == nil || !strings.Contains(err.Error(), "--fn-spares -1") {
		t.Errorf("agent --fn-spares -1: %v", err)
	}
}

// TestLocalAgentFlagsAreTheAgents: the server's --agent-* flags are
// `mercator agent`'s, every one but those that say how to reach and trust
// the control plane, each under the prefix.
func TestLocalAgentFlagsAreTheAgents(t *testing.T) {
	names := func(declare func(fs *flag.FlagSet), prefix string) map[string]bool {
		fs := flag.NewFlagSet("", flag.ContinueOnError)
		declare(fs)
		out := map[string]bool{}
		fs.VisitAll(func(f *flag.Flag) {
			name, ok := strings.CutPrefix(f.Name, prefix)
			if !ok {
				t.Errorf("--%s lacks the prefix %q", f.Name, prefix)
			}
			out[name] = true
		})
		return out
	}
	agent := names(func(fs *flag.FlagSet) { AgentFlags(fs) }, "")
	local := names(func(fs *flag.FlagSet) { LocalAgentFlags(fs) }, LocalAgentPrefix)
	for _, connection := range []string{"control-plane", "ca-file", "node-id", "token-file"} {
		if !agent[connection] || local[connection] {
			t.Errorf("--%s: agent %v, local agent %v", connection, agent[connection], local[connection])
		}
		delete(agent, connection)
	}
	if len(local) != len(agent) || len(local) < 20 {
		t.Errorf("local agent flags %d, agent flags %d", len(local), len(agent))
	}
	for name := range agent {
		if !local[name] {
			t.Errorf("--%s has no --%s%s", name, LocalAgentPrefix, name)
		}
	}
}
