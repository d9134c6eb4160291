package nodeproto

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
)

func TestCallAnswerFramesRoundTrip(t *testing.T) {
	answers := []CallAnswer{
		{Rendezvous: "rv-1", Status: 200, Header: map[string][]string{"Content-Type": {"application/json"}, "X-Many": {"a", "b"}}, Body: []byte(`{"ok":true}`)},
		{Rendezvous: "rv-2", Status: 204},
		{Rendezvous: "rv-3", ErrorKind: "busy", ErrorMessage: "no container free"},
		{Rendezvous: "rv-4", Status: 502, Body: bytes.Repeat([]byte("x"), 64<<10)},
	}
	var stream []byte
	for _, a := range answers {
		stream = AppendCallAnswer(stream, a)
	}
	r := bufio.NewReader(bytes.NewReader(stream))
	var buf []byte
	for _, want := range answers {
		var got CallAnswer
		var err error
		got, buf, err = ReadCallAnswer(r, buf)
		if err != nil {
			t.Fatalf("read %s: %v", want.Rendezvous, err)
		}
		if len(want.Body) == 0 {
			want.Body = nil
		}
		if len(got.Body) == 0 {
			got.Body = nil
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("read %+v, want %+v", got, want)
		}
	}
	if _, _, err := ReadCallAnswer(r, buf); err != io.EOF {
		t.Fatalf("after the last frame: %v, want io.EOF", err)
	}
}

func TestCallAnswerFramesRefused(t *testing.T) {
	good := AppendCallAnswer(nil, CallAnswer{Rendezvous: "rv", Status: 200, Body: []byte("hi")})
	cases := map[string][]byte{
		"truncated":        good[:len(good)-1],
		"zero length":      {0},
		"over the maximum": {0xff, 0xff, 0xff, 0x7f},
		"unknown type":     {2, 9, 0},
		"no rendezvous":    AppendCallAnswer(nil, CallAnswer{Status: 200}),
		"bad status":       AppendCallAnswer(nil, CallAnswer{Rendezvous: "rv", Status: 42}),
		"bad header name":  AppendCallAnswer(nil, CallAnswer{Rendezvous: "rv", Status: 200, Header: map[string][]string{"Bad Name": {"v"}}}),
		"header newline":   AppendCallAnswer(nil, CallAnswer{Rendezvous: "rv", Status: 200, Header: map[string][]string{"X": {"a\r\nSet-Cookie: x"}}}),
		"trailing bytes":   append([]byte{byte(good[0] + 1)}, append(good[1:], 0)...),
	}
	for name, frame := range cases {
		_, _, err := ReadCallAnswer(bufio.NewReader(bytes.NewReader(frame)), nil)
		if !errors.Is(err, ErrCallAnswerFrame) {
			t.Errorf("%s: %v, want ErrCallAnswerFrame", name, err)
		}
	}
	// An error frame must name its kind.
	if _, err := DecodeCallAnswer(AppendCallAnswer(nil, CallAnswer{Rendezvous: "rv", ErrorKind: "x"})[1:]); err != nil {
		t.Fatalf("error frame: %v", err)
	}
	frame := appendStr(appendStr([]byte{frameError}, "rv"), "")
	if _, err := DecodeCallAnswer(append(frame, 0)); err == nil || !strings.Contains(err.Error(), "kind") {
		t.Fatalf("error frame without a kind: %v", err)
	}
}

// FuzzCallAnswerFrames feeds arbitrary bytes to the frame reader: it must
// never panic, never return an answer a frame could not carry, and every
// answer it reads must encode back to a frame that reads the same.
func FuzzCallAnswerFrames(f *testing.F) {
	f.Add(AppendCallAnswer(nil, CallAnswer{Rendezvous: "rv-1", Status: 200, Header: map[string][]string{"A": {"b"}}, Body: []byte("body")}))
	f.Add(AppendCallAnswer(nil, CallAnswer{Rendezvous: "rv-2", ErrorKind: "timeout", ErrorMessage: "late"}))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bufio.NewReader(bytes.NewReader(data))
		var buf []byte
		for {
			a, next, err := ReadCallAnswer(r, buf)
			if err != nil {
				return
			}
			buf = next
			if a.Rendezvous == "" || (a.ErrorKind == "" && (a.Status < 100 || a.Status > 999)) {
				t.Fatalf("read an answer no frame may carry: %+v", a)
			}
			again, _, err := ReadCallAnswer(bufio.NewReader(bytes.NewReader(AppendCallAnswer(nil, a))), nil)
			if err != nil {
				t.Fatalf("re-encoded %+v: %v", a, err)
			}
			if len(again.Body) == 0 && len(a.Body) == 0 {
				again.Body, a.Body = nil, nil
			}
			if !reflect.DeepEqual(again, a) {
				t.Fatalf("re-encoded %+v, read %+v", a, again)
			}
		}
	})
}
