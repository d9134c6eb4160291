// Package cpuprofile reads what the fleet simulator needs of a Go CPU
// profile: the CPU time by the value of one goroutine label, so that one
// process running a control plane and thousands of simulated agents can
// say how much of its CPU each took. It decodes the few protobuf fields it
// needs itself rather than import a profile library for them.
package cpuprofile

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"time"
)

// ByLabel sums a CPU profile's samples by the value of one goroutine
// label (pprof.Labels), "" for samples without it (the runtime's own
// goroutines: the garbage collector's background workers, timers). The
// profile is the gzipped protobuf runtime/pprof writes; this reads only the
// fields it needs (perftools.profiles.Profile: sample_type 1, sample 2,
// string_table 6; Sample: value 2, label 3; Label: key 1, str 2).
func ByLabel(profile []byte, key string) (map[string]time.Duration, error) {
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
