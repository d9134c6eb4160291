package replica

import (
	"net"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mercator/mercator/internal/faultproxy"
	"github.com/mercator/mercator/internal/pgtest"
)

// These tests run against a real PostgreSQL server (MERCATOR_TEST_POSTGRES,
// which scripts/test.sh sets from scripts/ensure-postgres.sh): LISTEN/NOTIFY
// and advisory locks are the server's, and no fake would say how they fail.
// Each test uses a schema of its own (pgtest.FreshSchema), so its channel
// and lock are its own on a shared server.

// hangGuard bounds every wait: a hang guard, never a performance bound.
const hangGuard = 30 * time.Second

// campaignEvery is campaign's longest period (a held lead is checked this
// often; it is tried for more often).
const campaignEvery = checkEvery

func testDSN(t *testing.T) string { return pgtest.FreshSchema(t) }

func open(t *testing.T, dsn string) *Coordinator {
	t.Helper()
	c, err := Open(t.Context(), dsn, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// proxied returns dsn with its host replaced by a fault proxy in front of
// the server, and the proxy: cutting it is the replica's connections dying.
func proxied(t *testing.T, dsn string) (string, *faultproxy.Proxy) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	host := u.Host
	if _, _, err := net.SplitHostPort(host); err != nil {
		host = net.JoinHostPort(host, "5432")
	}
	p, err := faultproxy.Start(host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	u.Host = p.Addr()
	return u.String(), p
}

// waitUntil polls cond until it holds, failing the test after hangGuard.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(hangGuard)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %v waiting for %s", hangGuard, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// receive waits for topic on ch, skipping others, and returns when it came.
func receive(t *testing.T, ch <-chan string, topic string) time.Time {
	t.Helper()
	timeout := time.After(hangGuard)
	for {
		select {
		case got := <-ch:
			if got == topic {
				return time.Now()
			}
		case <-timeout:
			t.Fatalf("no %q signal within %v", topic, hangGuard)
		}
	}
}

// listening publishes a marker from pub until sub's subscriber hears it:
// Open returns before the listener's LISTEN is in place, and a signal sent
// before it is lost by design (a signal is a hint).
func listening(t *testing.T, pub *Coordinator, ch <-chan string, marker string) {
	t.Helper()
	deadline := time.Now().Add(hangGuard)
	for {
		if err := pub.Publish(t.Context(), marker); err != nil {
			t.Fatal(err)
		}
		select {
		case got := <-ch:
			if got == marker {
				return
			}
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the listener never heard %q within %v", marker, hangGuard)
		}
	}
}

// TestSignalCrossesReplicas: a signal published by one replica reaches the
// other's subscribers through NOTIFY, and no replica of another schema
// hears it. Nothing in this package polls, so a signal that arrives arrived
// by NOTIFY; the control plane's end-to-end test (TestReplicasShareOnePostgres
// in e2e) bounds the crossing against the control plane's own poll.
func TestSignalCrossesReplicas(t *testing.T) {
	dsn := testDSN(t)
	a, b := open(t, dsn), open(t, dsn)
	other := open(t, testDSN(t))
	bs := b.Subscribe(t.Context())
	otherSigs := other.Subscribe(t.Context())
	listening(t, a, bs, "ready")
	listening(t, other, otherSigs, "ready")

	sent := time.Now()
	if err := a.Publish(t.Context(), "runs"); err != nil {
		t.Fatal(err)
	}
	t.Logf("signal crossed replicas in %v", receive(t, bs, "runs").Sub(sent).Round(time.Microsecond))

	// The other schema: its listener gets its own marker, published after
	// a's signal was committed; NOTIFY delivers in commit order, so a "runs"
	// leaking across schemas would arrive first.
	if err := other.Publish(t.Context(), "marker"); err != nil {
		t.Fatal(err)
	}
	for got := range otherSigs {
		if got == "marker" {
			break
		}
		if got != "ready" {
			t.Fatalf("a replica of another schema heard %q", got)
		}
	}
}

// TestListenerReconnects: when the listener's connection dies, signals sent
// meanwhile may be lost, so the replica wakes every subscriber on every
// topic once it is back, and it hears new signals again.
func TestListenerReconnects(t *testing.T) {
	dsn := testDSN(t)
	viaProxy, p := proxied(t, dsn)
	a, b := open(t, dsn), open(t, viaProxy)
	bs := b.Subscribe(t.Context())
	listening(t, a, bs, "ready")

	p.Cut()
	time.Sleep(100 * time.Millisecond) // a moment cut off; the replica retries every second
	p.Restore()
	receive(t, bs, topicAll) // signals may have been missed meanwhile
	listening(t, a, bs, "again")
}

// TestFullSubscriberIsOwedEverything: a subscriber whose buffer is full
// misses signals and gets topicAll, once, with the first fanout that finds
// room, before that fanout's own signal.
func TestFullSubscriberIsOwedEverything(t *testing.T) {
	c := &Coordinator{owed: map[chan string]bool{}}
	ch := make(chan string, 2)
	c.subs = []chan string{ch}
	for _, topic := range []string{"node:a", "node:b", "node:c", "node:d"} {
		c.fanout(topic) // c and d find the buffer full: missed
	}
	next := func(want string) {
		t.Helper()
		select {
		case got := <-ch:
			if got != want {
				t.Fatalf("got %q, want %q", got, want)
			}
		default:
			t.Fatalf("nothing delivered, want %q", want)
		}
	}
	next("node:a")
	next("node:b")
	c.fanout("node:e")
	next(topicAll) // for c and d, once
	next("node:e")
	c.fanout("node:f")
	next("node:f")
	if len(ch) != 0 {
		t.Fatalf("%d more delivered, want none", len(ch))
	}
}

// leaders counts the coordinators that say they lead.
func leaders(cs ...*Coordinator) int {
	n := 0
	for _, c := range cs {
		if c.Leader() {
			n++
		}
	}
	return n
}

// watchBoth records, until the test ends, whether two coordinators ever
// both said they lead at one sample, while on is true.
func watchBoth(t *testing.T, on *atomic.Bool, a, b *Coordinator) *atomic.Int64 {
	var both atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			if on.Load() && a.Leader() && b.Leader() {
				both.Add(1)
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
	return &both
}

// TestLeadershipMovesWhenTheLeaderDies: of two replicas exactly one leads;
// when the leader's connections die and it cannot reconnect, the database
// releases its lock, it stops leading and the other takes over; when it is
// back it does not lead beside the new leader; and when the new leader
// stops, leadership moves back.
func TestLeadershipMovesWhenTheLeaderDies(t *testing.T) {
	dsn := testDSN(t)
	dsnA, pa := proxied(t, dsn)
	dsnB, pb := proxied(t, dsn)
	a, b := open(t, dsnA), open(t, dsnB)
	var steady atomic.Bool
	both := watchBoth(t, &steady, a, b)

	waitUntil(t, "one leader", func() bool { return leaders(a, b) == 1 })
	steady.Store(true)
	// Several campaign periods with both campaigning: still one.
	for end := time.Now().Add(3 * campaignEvery); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if n := leaders(a, b); n != 1 {
			t.Fatalf("%d leaders while both replicas are connected", n)
		}
	}
	leader, follower, leaderProxy := a, b, pa
	if b.Leader() {
		leader, follower, leaderProxy = b, a, pb
	}

	// The leader's connections die. Until its next check it may still
	// believe it leads (the window is at most one campaign period), so the
	// exclusivity watch is off while leadership moves.
	steady.Store(false)
	cutAt := time.Now()
	leaderProxy.Cut()
	waitUntil(t, "the cut-off leader to stop leading", func() bool { return !leader.Leader() })
	waitUntil(t, "the other replica to lead", func() bool { return follower.Leader() })
	t.Logf("leadership moved %v after the leader's connections died", time.Since(cutAt).Round(time.Millisecond))
	if leader.Leader() {
		t.Fatal("the cut-off replica leads again while it cannot reach the database")
	}

	// Back: the lock is the new leader's, so the old one stays a follower.
	leaderProxy.Restore()
	steady.Store(true)
	for end := time.Now().Add(3 * campaignEvery); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if !follower.Leader() || leader.Leader() {
			t.Fatalf("after the old leader came back: old leads %v, new leads %v; want the new one only", leader.Leader(), follower.Leader())
		}
	}

	// The new leader stops: it gives up the lock, and the other takes it.
	steady.Store(false)
	follower.Close()
	waitUntil(t, "the remaining replica to lead after the leader stopped", func() bool { return leader.Leader() })
	if n := both.Load(); n > 0 {
		t.Fatalf("both replicas said they lead at %d samples while both were connected", n)
	}
}

// TestResignHandsLeadershipOver: a leader that resigns (a replica that
// begins to shut down) stops leading when Resign returns and never leads
// again, the other replica takes the lock at its next try rather than
// once the resigned one has closed, and the resigned replica's signals
// still reach the other until it closes.
func TestResignHandsLeadershipOver(t *testing.T) {
	dsn := testDSN(t)
	a, b := open(t, dsn), open(t, dsn)
	waitUntil(t, "one leader", func() bool { return leaders(a, b) == 1 })
	leader, follower := a, b
	if b.Leader() {
		leader, follower = b, a
	}
	sigs := follower.Subscribe(t.Context())
	listening(t, leader, sigs, "ready")

	resignedAt := time.Now()
	leader.Resign()
	if leader.Leader() {
		t.Fatal("a resigned replica still says it leads")
	}
	leader.Resign() // a second time: no effect, no hang
	waitUntil(t, "the other replica to lead after the leader resigned", func() bool { return follower.Leader() })
	t.Logf("leadership moved %v after the leader resigned", time.Since(resignedAt).Round(time.Millisecond))

	if err := leader.Publish(t.Context(), "after-resign"); err != nil {
		t.Fatalf("a resigned replica could not publish: %v", err)
	}
	receive(t, sigs, "after-resign")
	for end := time.Now().Add(2 * campaignEvery); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if leader.Leader() || !follower.Leader() {
			t.Fatalf("after the resignation: resigned leads %v, other leads %v; want the other only", leader.Leader(), follower.Leader())
		}
	}
}

// TestReplicasAgreeWhateverTheirDSN: replicas of one installation whose
// DSNs are written differently (another host:port in front of the same
// server, other connection options) are one group: exactly one leads, and
// each hears the other's signals. When the DSN's text scoped the lock and
// the channel, both led and neither heard the other.
func TestReplicasAgreeWhateverTheirDSN(t *testing.T) {
	dsn := testDSN(t)
	viaProxy, _ := proxied(t, dsn)
	u, err := url.Parse(viaProxy)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("application_name", "replica-b")
	q.Set("connect_timeout", "7")
	u.RawQuery = q.Encode()
	a, b := open(t, dsn), open(t, u.String())
	waitUntil(t, "one leader", func() bool { return leaders(a, b) == 1 })
	for end := time.Now().Add(2 * campaignEvery); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if n := leaders(a, b); n != 1 {
			t.Fatalf("%d leaders among two replicas of one schema reached by different DSNs", n)
		}
	}
	listening(t, a, b.Subscribe(t.Context()), "a-to-b")
	listening(t, b, a.Subscribe(t.Context()), "b-to-a")
}

// TestNoSchemaIsRefused: a DSN whose search_path names no schema that
// exists is refused at Open, saying what to do, rather than coordinating
// under a name no store uses.
func TestNoSchemaIsRefused(t *testing.T) {
	u, err := url.Parse(testDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", "mercator_no_such_schema")
	u.RawQuery = q.Encode()
	c, err := Open(t.Context(), u.String(), nil)
	if err == nil {
		c.Close()
		t.Fatal("Open succeeded with a search_path that names no schema")
	}
	if !strings.Contains(err.Error(), "search_path names no schema that exists") {
		t.Fatalf("Open: %v; want it to say the search_path names no schema", err)
	}
}
