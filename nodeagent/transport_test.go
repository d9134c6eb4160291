package nodeagent

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"
)

// busyServer answers the first refusals calls with status and Retry-After
// (when not empty), then acknowledges event batches; it counts the calls.
func busyServer(t *testing.T, refusals int32, status int, retryAfter string) (*HTTPTransport, *atomic.Int32) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) <= refusals {
			if retryAfter != "" {
				w.Header().Set("Retry-After", retryAfter)
			}
			w.WriteHeader(status)
			w.Write([]byte(`{"error":{"code":"unavailable","message":"busy"}}`))
			return
		}
		var batch nodeproto.EventBatch
		json.NewDecoder(r.Body).Decode(&batch)
		ack := nodeproto.EventAck{Accepted: []string{}}
		for _, ev := range batch.Events {
			ack.Accepted = append(ack.Accepted, ev.ID)
		}
		json.NewEncoder(w).Encode(ack)
	}))
	t.Cleanup(srv.Close)
	return NewHTTPTransport(srv.URL, nil), &calls
}

// TestTransportWaitsWhatBusyAnswersAsk: a 429 or 503 is retried after the
// Retry-After it carries (at least minRetryWait), and the call succeeds
// once the control plane takes it.
func TestTransportWaitsWhatBusyAnswersAsk(t *testing.T) {
	for _, status := range []int{http.StatusTooManyRequests, http.StatusServiceUnavailable} {
		tr, calls := busyServer(t, 2, status, "0")
		start := time.Now()
		got, err := tr.SendEvents(context.Background(), "n1", "tok", []nodeproto.Event{{ID: "e1", Kind: nodeproto.EventFacts}})
		if err != nil || len(got) != 1 || calls.Load() != 3 {
			t.Fatalf("%d: accepted %v, err %v after %d calls; want e1 accepted on the third call", status, got, err, calls.Load())
		}
		if waited := time.Since(start); waited < 2*minRetryWait {
			t.Errorf("%d: retried twice within %v; want at least %v between tries", status, waited, minRetryWait)
		}
	}
}

// TestTransportGivesUpAfterItsAttempts: a control plane that stays busy
// gets callAttempts tries, then the error (unavailable: the agent's loop
// retries later); other refusals are not retried.
func TestTransportGivesUpAfterItsAttempts(t *testing.T) {
	tr, calls := busyServer(t, 100, http.StatusServiceUnavailable, "0")
	_, err := tr.SendEvents(context.Background(), "n1", "tok", nil)
	if !errors.Is(err, failure.ErrUnavailable) || calls.Load() != callAttempts {
		t.Fatalf("err %v after %d calls; want unavailable after %d", err, calls.Load(), callAttempts)
	}
	tr, calls = busyServer(t, 100, http.StatusBadRequest, "")
	if _, err := tr.SendEvents(context.Background(), "n1", "tok", nil); err == nil || calls.Load() != 1 {
		t.Fatalf("400: err %v after %d calls; want the error after one", err, calls.Load())
	}
}

// TestRetryAfterIsBoundedAndJittered: an hour is cut to maxRetryWait, and
// the wait is Retry-After plus up to half again.
func TestRetryAfterIsBoundedAndJittered(t *testing.T) {
	for _, tc := range []struct {
		header   string
		min, max time.Duration
	}{
		{"3600", maxRetryWait, maxRetryWait * 3 / 2},
		{"2", 2 * time.Second, 3 * time.Second},
		{"", defaultRetryWait, defaultRetryWait * 3 / 2},
		{"soon", defaultRetryWait, defaultRetryWait * 3 / 2},
	} {
		resp := &http.Response{StatusCode: http.StatusTooManyRequests, Header: http.Header{}}
		if tc.header != "" {
			resp.Header.Set("Retry-After", tc.header)
		}
		wait, busy := retryAfter(resp)
		if !busy || wait < tc.min || wait > tc.max {
			t.Errorf("Retry-After %q: wait %v; want %v to %v", tc.header, wait, tc.min, tc.max)
		}
	}
}

// TestEventBodySplitsOversizedBatches: a spool batch whose JSON would be
// over nodeproto.MaxEventBody is cut to a prefix that fits.
func TestEventBodySplitsOversizedBatches(t *testing.T) {
	big := strings.Repeat("x", 64<<10)
	var events []nodeproto.Event
	for i := range 256 {
		events = append(events, nodeproto.Event{ID: string(rune('a'+i%26)) + big[:8], Kind: nodeproto.EventFacts,
			Facts: &nodeproto.NodeFacts{Hostname: big}})
	}
	body, err := eventBody(events, "")
	if err != nil {
		t.Fatal(err)
	}
	var batch nodeproto.EventBatch
	if err := json.Unmarshal(body, &batch); err != nil {
		t.Fatal(err)
	}
	if len(body) > nodeproto.MaxEventBody || len(batch.Events) == 0 || len(batch.Events) == len(events) {
		t.Fatalf("body of %d bytes with %d of %d events; want a prefix within %d bytes", len(body), len(batch.Events), len(events), nodeproto.MaxEventBody)
	}
	t.Logf("a batch of %d events of 64 KiB was cut to %d (%d bytes)", len(events), len(batch.Events), len(body))
}

// TestSessionReadsBinaryInvokes: the agent asks for binary invokes, and
// reads them between JSON lines, whatever bytes they hold (a newline in
// the body, a frame split across writes).
func TestSessionReadsBinaryInvokes(t *testing.T) {
	inv := &nodeproto.InvokeCommand{CallID: "call-1", Rendezvous: "rv-1", URL: "https://cp", Body: []byte("{\n}\n"), BodyInline: true,
		Header: map[string][]string{"Content-Type": {"application/json"}}, ContentLength: 4, AnswerStream: true,
		Function: &nodeproto.FunctionSpec{ID: "fn", Image: "img@sha256:x", Config: map[string]string{"K": "v"}}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(nodeproto.HeaderSessionBinary) != nodeproto.SessionBinaryInvoke {
			http.Error(w, "the agent did not ask for binary invokes", http.StatusBadRequest)
			return
		}
		frame := nodeproto.AppendInvokeFrame(nil, 3, inv)
		w.WriteHeader(http.StatusOK)
		w.Write([]byte(`{"kind":"keep_alive"}` + "\n"))
		w.Write(frame[:3])
		w.(http.Flusher).Flush()
		w.Write(frame[3:])
		w.Write([]byte(`{"kind":"stop_workload","operation_id":"op","stop_workload":{"run_id":"r","attempt":1}}` + "\n"))
	}))
	defer srv.Close()
	commands := make(chan nodeproto.Command, 4)
	err := NewHTTPTransport(srv.URL, nil).Session(context.Background(), "n1", "tok", commands)
	if !errors.Is(err, failure.ErrUnavailable) {
		t.Fatalf("the stream's end: %v", err)
	}
	close(commands)
	var got []nodeproto.Command
	for c := range commands {
		got = append(got, c)
	}
	if len(got) != 2 || got[0].Kind != nodeproto.KindInvoke || got[0].FencingToken != 3 || !reflect.DeepEqual(got[0].Invoke, inv) ||
		got[1].Kind != nodeproto.KindStopWorkload {
		t.Fatalf("commands %+v", got)
	}
}
