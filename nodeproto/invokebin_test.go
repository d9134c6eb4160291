package nodeproto

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
	"time"
)

// filled sets every field of the struct v points to to a value that is not
// its zero, recursively, so a codec that forgets a field fails a round
// trip.
func filled(t *testing.T, v reflect.Value, seed int) {
	t.Helper()
	for i := 0; i < v.NumField(); i++ {
		f := v.Field(i)
		n := seed + i + 1
		switch f.Kind() {
		case reflect.String:
			f.SetString("s" + string(rune('a'+n%26)))
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Int, reflect.Int64:
			f.SetInt(int64(n * 1000))
		case reflect.Slice: // []byte
			f.SetBytes([]byte("body bytes\n\x00"))
		case reflect.Map:
			if f.Type().Elem().Kind() == reflect.String {
				f.Set(reflect.ValueOf(map[string]string{"K": "v", "EMPTY": ""}))
			} else {
				f.Set(reflect.ValueOf(map[string][]string{"A": {"1", "2"}, "B": {""}}))
			}
		case reflect.Pointer:
			p := reflect.New(f.Type().Elem())
			filled(t, p.Elem(), n*10)
			f.Set(p)
		default:
			t.Fatalf("field %s of kind %s: teach the invoke frame (and this test) about it", v.Type().Field(i).Name, f.Kind())
		}
	}
}

// TestInvokeFrameCarriesEveryField: every field of InvokeCommand and its
// FunctionSpec survives the binary frame, as it survives JSON.
func TestInvokeFrameCarriesEveryField(t *testing.T) {
	var c InvokeCommand
	filled(t, reflect.ValueOf(&c).Elem(), 0)
	c.Timeout, c.Function.Timeout = 1500*time.Millisecond, 30*time.Second
	c.ContentLength = -1
	prefix := []byte("{\"kind\":\"keep_alive\"}\n") // a JSON line before it, as on a session stream
	frame := AppendInvokeFrame(append([]byte(nil), prefix...), 42, &c)[len(prefix):]
	n, err := InvokeFrameLen(frame)
	if err != nil || n != len(frame) {
		t.Fatalf("InvokeFrameLen = %d, %v; want %d", n, err, len(frame))
	}
	got, err := DecodeInvokeFrame(frame)
	if err != nil {
		t.Fatal(err)
	}
	want := Command{Kind: KindInvoke, FencingToken: 42, Invoke: &c}
	if !reflect.DeepEqual(got, want) {
		g, _ := json.Marshal(got)
		w, _ := json.Marshal(want)
		t.Fatalf("decoded\n%s\nwant\n%s", g, w)
	}
	// A reference (no function) and an empty command too.
	for _, c := range []InvokeCommand{{CallID: "c", Rendezvous: "rv", URL: "u", ContentLength: 3}, {}} {
		got, err := DecodeInvokeFrame(AppendInvokeFrame(nil, 1, &c))
		if err != nil || !reflect.DeepEqual(*got.Invoke, c) {
			t.Fatalf("decoded %+v, %v; want %+v", got.Invoke, err, c)
		}
	}
}

func TestInvokeFrameRefused(t *testing.T) {
	c := InvokeCommand{CallID: "c", Rendezvous: "rv", Function: &FunctionSpec{ID: "f", Config: map[string]string{"A": "b"}}}
	good := AppendInvokeFrame(nil, 1, &c)
	for name, frame := range map[string][]byte{
		"truncated":     good[:len(good)-1],
		"no marker":     append([]byte{'{'}, good[1:]...),
		"trailing byte": append(append([]byte{0, good[1] + 1}, good[2:]...), 0),
	} {
		if _, err := DecodeInvokeFrame(frame); !errors.Is(err, ErrInvokeFrame) {
			t.Errorf("%s: %v, want ErrInvokeFrame", name, err)
		}
	}
	if _, err := InvokeFrameLen([]byte{0, 0xff, 0xff, 0xff, 0xff, 0x7f}); !errors.Is(err, ErrInvokeFrame) {
		t.Errorf("a frame over MaxInvokeFrame: %v", err)
	}
	if n, err := InvokeFrameLen([]byte{0, 0x80}); n != 0 || err != nil {
		t.Errorf("a length cut off: %d, %v; want 0 (more bytes needed)", n, err)
	}
}

// FuzzInvokeFrame feeds arbitrary bytes to the invoke frame decoder: it
// must never panic, and a command it decodes must encode to a frame that
// decodes the same.
func FuzzInvokeFrame(f *testing.F) {
	f.Add(AppendInvokeFrame(nil, 7, &InvokeCommand{CallID: "c", Rendezvous: "rv", URL: "https://cp", Header: map[string][]string{"A": {"b"}},
		Body: []byte("{}"), BodyInline: true, Function: &FunctionSpec{ID: "f", Config: map[string]string{"K": "v"}}}))
	f.Add([]byte{0, 3, 1, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 || data[0] != SessionBinaryMarker {
			return
		}
		if n, err := InvokeFrameLen(data); err != nil || n == 0 || n > len(data) {
			return
		}
		cmd, err := DecodeInvokeFrame(data)
		if err != nil {
			return
		}
		again, err := DecodeInvokeFrame(AppendInvokeFrame(nil, cmd.FencingToken, cmd.Invoke))
		if err != nil {
			t.Fatalf("re-encoded %+v: %v", cmd.Invoke, err)
		}
		if !reflect.DeepEqual(again, cmd) && !bytes.Equal(mustJSON(t, again), mustJSON(t, cmd)) {
			t.Fatalf("re-encoded %+v, decoded %+v", cmd, again)
		}
	})
}

func mustJSON(t *testing.T, v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
