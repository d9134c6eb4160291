package fnagent

import (
	"fmt"
	"io"
	"testing"
)

// write writes s to w, failing the test on an error.
func write(t *testing.T, w io.Writer, s string) {
	t.Helper()
	if _, err := io.WriteString(w, s); err != nil {
		t.Fatal(err)
	}
}

func TestLogSinkAttributesUnframedOutputToTheLatestCall(t *testing.T) {
	store := newLogStore(1024, 10)
	sink := newLogSink(store)
	sink.setCall(store.open("c1"))
	write(t, sink.writer(0), "one\npart")
	write(t, sink.writer(1), "err one\n")
	write(t, sink.writer(0), "ial\n")
	// Output after the call ends is still c1's until the next call starts.
	write(t, sink.writer(0), "late\n")
	sink.setCall(store.open("c2"))
	write(t, sink.writer(0), "two\n")
	// Interleaved in arrival order, as the streams wrote.
	expectLog(t, store, "c1", "one\nparterr one\nial\nlate\n")
	expectLog(t, store, "c2", "two\n")
}

func TestLogSinkFollowsFDKFrames(t *testing.T) {
	store := newLogStore(1024, 10)
	sink := newLogSink(store)
	store.open("c1")
	store.open("c2")
	out, errw := sink.writer(0), sink.writer(1)
	sink.setCall(store.lookup("c1"))
	// fdk-go writes "\n<name>=<id>\n" on both streams at a call's start.
	write(t, out, fmt.Sprintf("\n%s=c1\n", logFrameName))
	write(t, errw, fmt.Sprintf("\n%s=c1\n", logFrameName))
	write(t, out, "hello from c1\n\nblank above\n")
	write(t, errw, "err from c1\n")
	// The engine moves on to c2 before c1's late output arrives: the frame,
	// not the engine's notion, decides.
	sink.setCall(store.lookup("c2"))
	write(t, out, "late from c1\n")
	// A frame split across writes.
	write(t, out, "\n"+logFrameName[:4])
	write(t, out, logFrameName[4:]+"=c")
	write(t, out, "2\nhello from c2\n")
	write(t, errw, fmt.Sprintf("\n%s=c2\nerr from c2\n", logFrameName))
	expectLog(t, store, "c1", "hello from c1\n\nblank above\nerr from c1\nlate from c1\n")
	expectLog(t, store, "c2", "hello from c2\nerr from c2\n")
	// A line that only starts like a frame is output.
	write(t, out, fmt.Sprintf("%s is not a frame\n", logFrameName))
	expectLog(t, store, "c2", "hello from c2\nerr from c2\n"+logFrameName+" is not a frame\n")
	if tail := sink.Tail(); len(tail) == 0 {
		t.Fatal("no tail kept")
	}
}

func TestLogsAreBounded(t *testing.T) {
	store := newLogStore(8, 2)
	sink := newLogSink(store)
	sink.setCall(store.open("c1"))
	write(t, sink.writer(0), "0123456789\n")
	l, ok := store.get("c1")
	if !ok || string(l.Data) != "01234567" || !l.Truncated {
		t.Fatalf("c1 = %+v, %v; want 8 bytes, truncated", l, ok)
	}
	store.open("c2")
	store.open("c3")
	if _, ok := store.get("c1"); ok {
		t.Fatal("c1 kept beyond retention")
	}
	if _, ok := store.get("c3"); !ok {
		t.Fatal("c3 forgotten")
	}
}

func expectLog(t *testing.T, store *logStore, id, want string) {
	t.Helper()
	l, ok := store.get(id)
	if !ok || string(l.Data) != want {
		t.Fatalf("log of %s = %q (found %v); want %q", id, l.Data, ok, want)
	}
}
