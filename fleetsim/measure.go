package fleetsim

import (
	"bufio"
	"context"
	"log/slog"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// percentile returns the p-th percentile (0..1) of sorted, by the nearest
// rank; 0 for no samples.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*p+0.999999) - 1
	i = max(0, min(i, len(sorted)-1))
	return sorted[i]
}

func sortDurations(d []time.Duration) {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// procStatus reads a "Name: N kB" line of /proc/self/status, in bytes.
func procStatus(name string) int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	return statusField(string(data), name)
}

// statusField reads a "Name: N kB" line of a /proc/PID/status text, in
// bytes.
func statusField(status, name string) int64 {
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				n, _ := strconv.ParseInt(f[0], 10, 64)
				return n << 10
			}
		}
	}
	return 0
}

// raiseOpenFileLimit lifts RLIMIT_NOFILE to want (or as far as allowed):
// every simulated agent holds its state file and a session connection, and
// the control plane the other end of each connection, all in this process.
func raiseOpenFileLimit(want uint64) (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	if lim.Cur >= want {
		return lim.Cur, nil
	}
	if lim.Max < want {
		// Raising the hard limit needs CAP_SYS_RESOURCE; the kernel caps
		// it at fs.nr_open.
		if data, err := os.ReadFile("/proc/sys/fs/nr_open"); err == nil {
			if n, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64); err == nil && n < want {
				want = n
			}
		}
		try := syscall.Rlimit{Cur: want, Max: want}
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &try); err == nil {
			return want, nil
		}
		want = lim.Max
	}
	lim.Cur = want
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return lim.Cur, err
	}
	return want, nil
}

// scrape reads the named series (name or name{labels} exactly as the text
// exposition writes them) from a Prometheus endpoint.
func scrape(ctx context.Context, hc *http.Client, url, token string) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token) // /metrics needs a reader's credential
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "mercator_") && !strings.HasPrefix(line, "go_") && !strings.HasPrefix(line, "process_") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		out[line[:i]] = v
	}
	return out, sc.Err()
}

// countingHandler is a slog.Handler that keeps count of records at or above
// its level and the first few messages of each level, and writes nothing:
// ten thousand agents logging every reconnection would drown the figures.
type countingHandler struct {
	level slog.Level
	mu    *sync.Mutex
	count map[slog.Level]int
	first map[slog.Level][]string
}

func newCountingHandler(level slog.Level) *countingHandler {
	return &countingHandler{level: level, mu: &sync.Mutex{}, count: map[slog.Level]int{}, first: map[slog.Level][]string{}}
}

func (h *countingHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }

func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.count[r.Level]++
	if len(h.first[r.Level]) < 5 {
		msg := r.Message
		r.Attrs(func(a slog.Attr) bool {
			msg += " " + a.String()
			return len(msg) < 400
		})
		h.first[r.Level] = append(h.first[r.Level], msg)
	}
	return nil
}

func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }

func (h *countingHandler) counts() (warn, errs int, samples []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	samples = append(samples, h.first[slog.LevelError]...)
	samples = append(samples, h.first[slog.LevelWarn]...)
	return h.count[slog.LevelWarn], h.count[slog.LevelError], samples
}
