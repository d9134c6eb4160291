package fnagent

import (
	"fmt"
	"testing"
)

func TestLogSinkAttributesUnframedOutputToTheLatestCall(t *testing.T) {
	store := newLogStore(1024, 10)
	sink := newLogSink(store)
	sink.setCall(store.open("c1"))
	fmt.Fprint(sink.writer(0), "one\npart")
	fmt.Fprint(sink.writer(1), "err one\n")
	fmt.Fprint(sink.writer(0), "ial\n")
	// Output after the call ends is still c1's until the next call starts.
	fmt.Fprint(sink.writer(0), "late\n")
	sink.setCall(store.open("c2"))
	fmt.Fprint(sink.writer(0), "two\n")
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
	fmt.Fprintf(out, "\n%s=c1\n", logFrameName)
	fmt.Fprintf(errw, "\n%s=c1\n", logFrameName)
	fmt.Fprint(out, "hello from c1\n\nblank above\n")
	fmt.Fprint(errw, "err from c1\n")
	// The engine moves on to c2 before c1's late output arrives: the frame,
	// not the engine's notion, decides.
	sink.setCall(store.lookup("c2"))
	fmt.Fprint(out, "late from c1\n")
	// A frame split across writes.
	fmt.Fprint(out, "\n"+logFrameName[:4])
	fmt.Fprint(out, logFrameName[4:]+"=c")
	fmt.Fprint(out, "2\nhello from c2\n")
	fmt.Fprintf(errw, "\n%s=c2\nerr from c2\n", logFrameName)
	expectLog(t, store, "c1", "hello from c1\n\nblank above\nerr from c1\nlate from c1\n")
	expectLog(t, store, "c2", "hello from c2\nerr from c2\n")
	// A line that only starts like a frame is output.
	fmt.Fprintf(out, "%s is not a frame\n", logFrameName)
	expectLog(t, store, "c2", "hello from c2\nerr from c2\n"+logFrameName+" is not a frame\n")
	if tail := sink.Tail(); len(tail) == 0 {
		t.Fatal("no tail kept")
	}
}

func TestLogsAreBounded(t *testing.T) {
	store := newLogStore(8, 2)
	sink := newLogSink(store)
	sink.setCall(store.open("c1"))
	fmt.Fprint(sink.writer(0), "0123456789\n")
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
