package fault

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/mercator/mercator/internal/faultproxy"
	"github.com/mercator/mercator/nodeproto"
)

// wire is a faultproxy.Tap that parses the node protocol between one
// proxy's agents and the control plane: every HTTP exchange (path,
// credential, the event IDs a batch carried, the status and the IDs the
// control plane acknowledged) and every command sent down a session stream.
// It only ever sees bytes the proxy forwarded, so "on the wire" means
// "delivered to the other end's socket".
//
// Parsing runs on goroutines of its own, fed by unbounded buffers, so it
// never holds up forwarding; queries may lag the traffic by a moment, and
// settle waits for the parsers of closed connections to finish.
type wire struct {
	mu        sync.Mutex
	conns     map[uint64]*wireConn
	exchanges []*exchange
	commands  []wireCommand
	sessions  []time.Time // when each session stream was answered 200
	parsers   sync.WaitGroup

	// filter, when set, decides on each client→server chunk before it is
	// forwarded.
	filter func(p []byte) faultproxy.Verdict
	// onCommand, when set, is called (on a parser goroutine) for each
	// command seen going down a session stream.
	onCommand func(conn uint64, cmd nodeproto.Command)
}

type wireConn struct {
	up, down *stream
	queue    chan *exchange // requests awaiting their response, in order
}

// exchange is one HTTP request on the wire and, when seen, its response.
type exchange struct {
	conn     uint64
	at       time.Time // first byte of the request forwarded
	method   string
	path     string
	token    string
	complete bool     // the whole request was forwarded
	events   []string // IDs of the events a batch carried
	kinds    map[string]string
	results  map[string]string // event ID → operation ID, for result events
	runs     map[string]string // event ID → run ID, for workload events
	status   int               // 0: no response seen
	respAt   time.Time         // first byte of the response forwarded
	acked    []string
}

type wireCommand struct {
	at   time.Time
	conn uint64
	cmd  nodeproto.Command
}

func newWire() *wire { return &wire{conns: map[uint64]*wireConn{}} }

func (w *wire) setFilter(f func(p []byte) faultproxy.Verdict) {
	w.mu.Lock()
	w.filter = f
	w.mu.Unlock()
}

func (w *wire) setOnCommand(f func(conn uint64, cmd nodeproto.Command)) {
	w.mu.Lock()
	w.onCommand = f
	w.mu.Unlock()
}

// Data implements faultproxy.Tap.
func (w *wire) Data(id uint64, dir faultproxy.Direction, p []byte) faultproxy.Verdict {
	now := time.Now()
	w.mu.Lock()
	c := w.conns[id]
	if c == nil {
		c = &wireConn{up: newStream(), down: newStream(), queue: make(chan *exchange, 1024)}
		w.conns[id] = c
		w.parsers.Add(2)
		go func() { defer w.parsers.Done(); w.parseRequests(id, c) }()
		go func() { defer w.parsers.Done(); w.parseResponses(id, c) }()
	}
	filter := w.filter
	w.mu.Unlock()
	if dir == faultproxy.ClientToServer {
		if filter != nil {
			if v := filter(p); v == faultproxy.Close {
				return v
			}
		}
		c.up.write(p, now)
		return faultproxy.Forward
	}
	c.down.write(p, now)
	return faultproxy.Forward
}

// Closed implements faultproxy.Tap.
func (w *wire) Closed(id uint64) {
	w.mu.Lock()
	c := w.conns[id]
	delete(w.conns, id)
	w.mu.Unlock()
	if c != nil {
		c.up.close()
		c.down.close()
	}
}

// settle waits (bounded) until the parsers of every closed connection
// finished, so queries see everything forwarded on them.
func (w *wire) settle() {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		w.mu.Lock()
		n := len(w.conns)
		w.mu.Unlock()
		if n == 0 {
			done := make(chan struct{})
			go func() { w.parsers.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(time.Until(deadline)):
			}
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (w *wire) parseRequests(id uint64, c *wireConn) {
	defer close(c.queue)
	cr := &countingReader{r: c.up}
	br := bufio.NewReader(cr)
	for {
		pos := cr.n - int64(br.Buffered())
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		ex := &exchange{conn: id, at: c.up.timeAt(pos), method: req.Method, path: req.URL.Path}
		ex.token, _ = strings.CutPrefix(req.Header.Get("Authorization"), "Bearer ")
		body, err := io.ReadAll(req.Body)
		ex.complete = err == nil
		if ex.complete && ex.path == nodeproto.PathEvents {
			var batch nodeproto.EventBatch
			if json.Unmarshal(body, &batch) == nil {
				ex.kinds = map[string]string{}
				ex.results = map[string]string{}
				ex.runs = map[string]string{}
				for _, e := range batch.Events {
					ex.events = append(ex.events, e.ID)
					ex.kinds[e.ID] = e.Kind
					if e.Result != nil {
						ex.results[e.ID] = e.Result.OperationID
					}
					if e.Workload != nil {
						ex.runs[e.ID] = e.Workload.RunID
					}
				}
			}
		}
		w.mu.Lock()
		w.exchanges = append(w.exchanges, ex)
		w.mu.Unlock()
		c.queue <- ex
		if !ex.complete {
			return
		}
	}
}

func (w *wire) parseResponses(id uint64, c *wireConn) {
	// Drain the stream and the queue whatever happens, so the buffer does
	// not grow and the request parser never blocks.
	defer func() {
		io.Copy(io.Discard, c.down)
		for range c.queue {
		}
	}()
	cr := &countingReader{r: c.down}
	br := bufio.NewReader(cr)
	for ex := range c.queue {
		pos := cr.n - int64(br.Buffered())
		resp, err := http.ReadResponse(br, &http.Request{Method: ex.method})
		if err != nil {
			return
		}
		w.mu.Lock()
		ex.status, ex.respAt = resp.StatusCode, c.down.timeAt(pos)
		w.mu.Unlock()
		if ex.path == nodeproto.PathSession && resp.StatusCode == http.StatusOK {
			w.mu.Lock()
			w.sessions = append(w.sessions, ex.respAt)
			w.mu.Unlock()
			s := bufio.NewScanner(resp.Body)
			s.Buffer(make([]byte, 64<<10), 16<<20)
			for s.Scan() {
				line := bytes.TrimSpace(s.Bytes())
				var cmd nodeproto.Command
				if len(line) == 0 || json.Unmarshal(line, &cmd) != nil || cmd.Kind == nodeproto.KindKeepAlive {
					continue
				}
				w.mu.Lock()
				w.commands = append(w.commands, wireCommand{at: time.Now(), conn: id, cmd: cmd})
				hook := w.onCommand
				w.mu.Unlock()
				if hook != nil {
					hook(id, cmd)
				}
			}
			return
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			return
		}
		if ex.path == nodeproto.PathEvents && resp.StatusCode == http.StatusOK {
			var ack nodeproto.EventAck
			if json.Unmarshal(body, &ack) == nil {
				w.mu.Lock()
				ex.acked = ack.Accepted
				w.mu.Unlock()
			}
		}
	}
}

// eventAccount is what the wire says about events.
type eventAccount struct {
	forwarded map[string]string // ID → kind, every event in a wholly forwarded batch
	acked     map[string]bool   // IDs the control plane acknowledged
	results   map[string]string // result event ID → operation ID
	runs      map[string]string // workload event ID → run ID
	// inFlight counts event batches forwarded whole, on connections still
	// open, whose response the tap has not seen yet.
	inFlight int
}

func (w *wire) events() eventAccount {
	w.mu.Lock()
	defer w.mu.Unlock()
	a := eventAccount{forwarded: map[string]string{}, acked: map[string]bool{}, results: map[string]string{}, runs: map[string]string{}}
	for _, ex := range w.exchanges {
		if !ex.complete || ex.path != nodeproto.PathEvents {
			continue
		}
		if _, open := w.conns[ex.conn]; open && ex.status == 0 && len(ex.events) > 0 {
			a.inFlight++
		}
		for _, id := range ex.events {
			a.forwarded[id] = ex.kinds[id]
		}
		for id, op := range ex.results {
			a.results[id] = op
		}
		for id, run := range ex.runs {
			a.runs[id] = run
		}
		for _, id := range ex.acked {
			a.acked[id] = true
		}
	}
	return a
}

// launchFor returns the first launch command seen for a run's attempt.
func (w *wire) launchFor(runID string, attempt int) (wireCommand, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, c := range w.commands {
		if l := c.cmd.LaunchWorkload; l != nil && l.RunID == runID && l.Attempt == attempt {
			return c, true
		}
	}
	return wireCommand{}, false
}

// deliveries counts, per operation ID, how many times a command went down a
// session stream.
func (w *wire) deliveries() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]int{}
	for _, c := range w.commands {
		out[c.cmd.OperationID]++
	}
	return out
}

// commandKinds maps operation IDs to their command kinds.
func (w *wire) commandKinds() map[string]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]string{}
	for _, c := range w.commands {
		out[c.cmd.OperationID] = c.cmd.Kind
	}
	return out
}

// sessionsSince counts session streams answered 200 at or after t.
func (w *wire) sessionsSince(t time.Time) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, at := range w.sessions {
		if !at.Before(t) {
			n++
		}
	}
	return n
}

// answeredSince counts exchanges on path whose request began at or after t
// and whose response has been seen.
func (w *wire) answeredSince(path string, t time.Time) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, ex := range w.exchanges {
		if ex.path == path && ex.status != 0 && !ex.at.Before(t) {
			n++
		}
	}
	return n
}

// connsByUse returns the open connections that carry a session stream, and
// those idle between requests (every request on them answered): the ones
// an HTTP client keeps for reuse.
func (w *wire) connsByUse() (session, idle []uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	last := map[uint64]*exchange{}
	for _, ex := range w.exchanges {
		last[ex.conn] = ex
	}
	for id := range w.conns {
		ex := last[id]
		switch {
		case ex == nil:
		case ex.path == nodeproto.PathSession && ex.status == http.StatusOK:
			session = append(session, id)
		case ex.status != 0 && ex.complete:
			idle = append(idle, id)
		}
	}
	return session, idle
}

// exchangesWithToken returns copies of the exchanges made with a credential.
func (w *wire) exchangesWithToken(token string) []exchange {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []exchange
	for _, ex := range w.exchanges {
		if ex.token == token {
			out = append(out, *ex)
		}
	}
	return out
}

// stream is an unbounded in-memory pipe that remembers when each byte
// arrived. Writes never block; Read blocks until data or close.
type stream struct {
	mu     sync.Mutex
	cond   *sync.Cond
	buf    []byte
	base   int64 // offset of buf[0]
	marks  []mark
	closed bool
}

type mark struct {
	off int64
	at  time.Time
}

func newStream() *stream {
	s := &stream{}
	s.cond = sync.NewCond(&s.mu)
	return s
}

func (s *stream) write(p []byte, at time.Time) {
	s.mu.Lock()
	s.marks = append(s.marks, mark{off: s.base + int64(len(s.buf)), at: at})
	s.buf = append(s.buf, p...)
	s.mu.Unlock()
	s.cond.Broadcast()
}

func (s *stream) close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cond.Broadcast()
}

func (s *stream) Read(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.buf) == 0 && !s.closed {
		s.cond.Wait()
	}
	if len(s.buf) == 0 {
		return 0, io.EOF
	}
	n := copy(p, s.buf)
	s.buf = s.buf[n:]
	s.base += int64(n)
	return n, nil
}

// timeAt is when the byte at offset off arrived.
func (s *stream) timeAt(off int64) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	var at time.Time
	for i := len(s.marks) - 1; i >= 0; i-- {
		if s.marks[i].off <= off {
			at = s.marks[i].at
			// Older marks can no longer be asked about (offsets only grow).
			s.marks = s.marks[i:]
			break
		}
	}
	return at
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
