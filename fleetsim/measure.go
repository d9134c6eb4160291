package fleetsim

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
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

// cpuByLabel sums a CPU profile's samples by the value of one goroutine
// label (pprof.Labels), "" for samples without it (the runtime's own
// goroutines: the garbage collector's background workers, timers). The
// profile is the gzipped protobuf runtime/pprof writes; this reads only the
// fields it needs (perftools.profiles.Profile: sample_type 1, sample 2,
// string_table 6; Sample: value 2, label 3; Label: key 1, str 2).
func cpuByLabel(profile []byte, key string) (map[string]time.Duration, error) {
	zr, err := gzip.NewReader(bytes.NewReader(profile))
	if err != nil {
		return nil, err
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		return nil, err
	}
	type sample struct {
		values []int64
		labels [][2]int64
	}
	var samples []sample
	var strs []string
	var types []int64 // string index of each sample type's name
	err = pbFields(raw, func(field int, wire int, v uint64, b []byte) error {
		switch {
		case field == 1 && wire == 2:
			return pbFields(b, func(f, w int, v uint64, _ []byte) error {
				if f == 1 && w == 0 {
					types = append(types, int64(v))
				}
				return nil
			})
		case field == 2 && wire == 2:
			var s sample
			err := pbFields(b, func(f, w int, v uint64, b []byte) error {
				switch {
				case f == 2 && w == 0:
					s.values = append(s.values, int64(v))
				case f == 2 && w == 2:
					for len(b) > 0 {
						x, n := uvarint(b)
						if n <= 0 {
							return errors.New("bad packed value")
						}
						s.values = append(s.values, int64(x))
						b = b[n:]
					}
				case f == 3 && w == 2:
					var l [2]int64
					if err := pbFields(b, func(f, w int, v uint64, _ []byte) error {
						if w == 0 && (f == 1 || f == 2) {
							l[f-1] = int64(v)
						}
						return nil
					}); err != nil {
						return err
					}
					s.labels = append(s.labels, l)
				}
				return nil
			})
			samples = append(samples, s)
			return err
		case field == 6 && wire == 2:
			strs = append(strs, string(b))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	str := func(i int64) string {
		if i >= 0 && int(i) < len(strs) {
			return strs[i]
		}
		return ""
	}
	col := len(types) - 1
	for i, t := range types {
		if str(t) == "cpu" {
			col = i
		}
	}
	out := map[string]time.Duration{}
	for _, s := range samples {
		if col < 0 || col >= len(s.values) {
			continue
		}
		label := ""
		for _, l := range s.labels {
			if str(l[0]) == key {
				label = str(l[1])
			}
		}
		out[label] += time.Duration(s.values[col])
	}
	return out, nil
}

func uvarint(b []byte) (uint64, int) {
	var x uint64
	for i, c := range b {
		if i == 10 {
			return 0, -1
		}
		x |= uint64(c&0x7f) << (7 * i)
		if c < 0x80 {
			return x, i + 1
		}
	}
	return 0, 0
}

// pbFields calls fn for each field of one protobuf message: varints with v,
// length-delimited fields with b; fixed-width fields are skipped.
func pbFields(b []byte, fn func(field, wire int, v uint64, b []byte) error) error {
	for len(b) > 0 {
		tag, n := uvarint(b)
		if n <= 0 {
			return errors.New("bad tag")
		}
		b = b[n:]
		field, wire := int(tag>>3), int(tag&7)
		switch wire {
		case 0:
			v, n := uvarint(b)
			if n <= 0 {
				return errors.New("bad varint")
			}
			b = b[n:]
			if err := fn(field, wire, v, nil); err != nil {
				return err
			}
		case 1:
			if len(b) < 8 {
				return errors.New("short fixed64")
			}
			b = b[8:]
		case 2:
			l, n := uvarint(b)
			if n <= 0 || uint64(len(b)-n) < l {
				return errors.New("bad length")
			}
			body := b[n : n+int(l)]
			b = b[n+int(l):]
			if err := fn(field, wire, 0, body); err != nil {
				return err
			}
		case 5:
			if len(b) < 4 {
				return errors.New("short fixed32")
			}
			b = b[4:]
		default:
			return fmt.Errorf("wire type %d", wire)
		}
	}
	return nil
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
