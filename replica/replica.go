// Package replica lets several control-plane replicas share one PostgreSQL
// database: it carries signals between them with LISTEN/NOTIFY and elects
// the one replica that schedules with a session-level advisory lock. It
// implements controlplane.Coordinator; the control plane's wiring (package
// controlplane's Run) imports it for postgres:// stores.
//
// Everything durable stays in the store. A signal only says "look again";
// leadership only decides who runs the scheduler, and it is fenced by the
// database itself: the lock is held by one connection, and it is released
// by PostgreSQL when that connection dies, so a replica that lost its
// connection cannot keep scheduling on a stale belief (it checks the
// connection before every claim of leadership it makes).
package replica

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Coordinator is one replica's membership.
type Coordinator struct {
	dsn     string
	channel string
	lockKey int64
	pool    *pgxpool.Pool
	log     *slog.Logger

	leader atomic.Bool
	term   atomic.Uint64 // leaderships taken (see Term)
	subsMu sync.Mutex
	subs   []chan string
	owed   map[chan string]bool // subscribers that missed a signal (fanout)
	cancel context.CancelFunc
	done   sync.WaitGroup

	resign     context.CancelFunc // ends the campaign alone (Resign)
	campaigned chan struct{}      // closed once the campaign has ended
}

// Open connects to the database at dsn and starts listening and campaigning
// for leadership. The database and schema the store uses, as the server
// names them (current_database, current_schema), scope both the channel and
// the lock, so several Mercator installations on one PostgreSQL server do
// not hear or block each other, and replicas of one installation agree
// however their DSNs are written. (They were once scoped by the DSN's own
// text: two replicas reaching one database by two host names, or with
// different connection options, both led and never heard each other.)
func Open(ctx context.Context, dsn string, log *slog.Logger) (*Coordinator, error) {
	if log == nil {
		log = slog.Default()
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("replica coordination: %w", err)
	}
	namespace, err := storeNamespace(ctx, pool)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("replica coordination: %w", err)
	}
	sum := sha256.Sum256([]byte("mercator/" + namespace))
	c := &Coordinator{dsn: dsn, pool: pool, log: log, owed: map[chan string]bool{},
		channel: "mercator_" + hex.EncodeToString(sum[:6]),
		lockKey: int64(binary.BigEndian.Uint64(sum[8:16]) &^ (1 << 63))}
	runCtx, cancel := context.WithCancel(context.Background())
	campaignCtx, resign := context.WithCancel(runCtx)
	c.cancel, c.resign, c.campaigned = cancel, resign, make(chan struct{})
	c.done.Add(2)
	go func() { defer c.done.Done(); c.listen(runCtx) }()
	go func() { defer c.done.Done(); defer close(c.campaigned); c.campaign(campaignCtx) }()
	return c, nil
}

// storeNamespace names the database and schema the DSN's connections use,
// as the server resolves them (the search_path's first schema that
// exists).
func storeNamespace(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	var db string
	var schema *string
	if err := pool.QueryRow(ctx, "SELECT current_database(), current_schema()").Scan(&db, &schema); err != nil {
		return "", err
	}
	if schema == nil {
		return "", fmt.Errorf("database %q: the connection's search_path names no schema that exists; create the schema, or set search_path in the DSN to one", db)
	}
	return db + "/" + *schema, nil
}

// Resign gives up leadership for good and at once: the campaign stops and
// the lock's connection closes (releasing the lock), so another replica
// leads from its next try, while signals keep flowing until Close. A
// replica shutting down resigns first: the rest of its shutdown (requests
// and streams drained) can take many seconds, and while it held the lock
// through them no replica scheduled. Safe to call more than once, and
// from any goroutine; it returns once Leader reports false.
func (c *Coordinator) Resign() {
	c.resign()
	<-c.campaigned
}

// Close stops listening, gives up leadership and closes the connections.
func (c *Coordinator) Close() {
	c.Resign()
	c.cancel()
	c.done.Wait()
	c.pool.Close()
}

// Publish implements controlplane.Coordinator with pg_notify.
func (c *Coordinator) Publish(ctx context.Context, topic string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := c.pool.Exec(ctx, "SELECT pg_notify($1, $2)", c.channel, topic)
	return err
}

// Subscribe implements controlplane.Coordinator. Slow subscribers lose
// signals rather than block the listener (a signal is a hint).
func (c *Coordinator) Subscribe(ctx context.Context) <-chan string {
	ch := make(chan string, 256)
	c.subsMu.Lock()
	c.subs = append(c.subs, ch)
	c.subsMu.Unlock()
	go func() {
		<-ctx.Done()
		c.subsMu.Lock()
		defer c.subsMu.Unlock()
		for i, s := range c.subs {
			if s == ch {
				c.subs = append(c.subs[:i], c.subs[i+1:]...)
				delete(c.owed, ch)
				close(ch)
				return
			}
		}
	}()
	return ch
}

// Leader implements controlplane.Coordinator.
func (c *Coordinator) Leader() bool { return c.leader.Load() }

// Term implements controlplane.Coordinator.
func (c *Coordinator) Term() uint64 { return c.term.Load() }

// listen holds one connection in LISTEN and fans notifications out,
// reconnecting after a failure. Its own notifications come back too; a
// replica acting on its own signal twice only looks again.
func (c *Coordinator) listen(ctx context.Context) {
	for ctx.Err() == nil {
		err := c.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		c.log.Warn("replica signal listener lost its connection; reconnecting", "err", err)
		c.fanout(topicAll) // signals may have been missed: wake everyone
		sleep(ctx, time.Second)
	}
}

// topicAll stands for every signal (the control plane's signals.Lost):
// it is delivered after a reconnection, and after a subscriber's buffer was
// full and a notification had to be dropped, so the subscriber looks at
// everything again instead of waiting for its timers.
const topicAll = "*"

func (c *Coordinator) listenOnce(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, c.dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{c.channel}.Sanitize()); err != nil {
		return err
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		c.fanout(n.Payload)
	}
}

// fanout hands topic to every subscriber without blocking. One whose buffer
// is full misses it, and is owed topicAll, which it gets with the next
// fanout that finds room.
func (c *Coordinator) fanout(topic string) {
	c.subsMu.Lock()
	defer c.subsMu.Unlock()
	for _, s := range c.subs {
		if c.owed[s] {
			select {
			case s <- topicAll:
				delete(c.owed, s)
			default:
				continue // still full: topicAll stands for this one too
			}
		}
		select {
		case s <- topic:
		default:
			c.owed[s] = true
		}
	}
}

// How often campaign tries for the lock while another replica holds it,
// and how often it checks the lock's connection while it holds it. A try
// is a trivial query, so followers try often: when the leader dies or
// resigns, the next one leads within tryEvery. A check is what bounds how
// long a leader whose connection died still believes it leads (its
// placements are fenced by the scheduling epoch meanwhile).
const (
	tryEvery   = 500 * time.Millisecond
	checkEvery = 2 * time.Second
)

// campaign tries to take the advisory lock on a dedicated connection every
// tryEvery and, while holding it, checks the connection every checkEvery;
// a failed check drops leadership at once.
func (c *Coordinator) campaign(ctx context.Context) {
	var conn *pgx.Conn
	defer func() {
		c.leader.Store(false)
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	for ctx.Err() == nil {
		if conn == nil {
			var err error
			if conn, err = pgx.Connect(ctx, c.dsn); err != nil {
				c.leader.Store(false)
				sleep(ctx, checkEvery)
				continue
			}
		}
		if c.leader.Load() {
			if err := conn.Ping(ctx); err != nil {
				c.log.Warn("lost the scheduler leadership's connection", "err", err)
				c.leader.Store(false)
				conn.Close(context.Background())
				conn = nil
				continue
			}
		} else {
			var got bool
			if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", c.lockKey).Scan(&got); err != nil {
				conn.Close(context.Background())
				conn = nil
				continue
			}
			if got {
				c.log.Info("this replica now schedules")
				c.term.Add(1)
				c.leader.Store(true)
			}
		}
		if c.leader.Load() {
			sleep(ctx, checkEvery)
		} else {
			sleep(ctx, tryEvery)
		}
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
