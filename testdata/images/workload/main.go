// Command workload is the program inside Mercator's test image. One static
// binary stands in for every kind of workload the tests need, chosen by its
// first argument, so a test launches it with a command that says what it
// expects to see ("exit 3", "sleep 30") instead of building an image per
// behaviour.
//
// It is built from scratch by package internal/testimage (CGO_ENABLED=0, no
// libc, no shell), so it must stay standard-library only. Its behaviours:
//
//	echo ARGS...         print ARGS joined by one space; exit 0
//	exit N               print "exiting N"; exit N
//	sleep SECONDS        print "sleeping"; sleep; exit 0 promptly on SIGTERM or SIGINT
//	env NAME             print the value of the environment variable NAME
//	env-sleep SECONDS NAME...  print NAME=VALUE for each NAME, then sleep as sleep does
//	env-sha256 NAME      print the SHA-256 in hex of NAME's value, never the value itself
//	lines N              print "line 1" … "line N" to stdout and "stderr line" to stderr
//	ignore-term SECONDS  print "ignoring SIGTERM"; ignore SIGTERM; sleep; exit 0
//	cat PATH             print the file's content; exit 1 if it cannot be read
//	sha256 PATH          print the file's SHA-256 in hex and its size in bytes
//	touch PATH           try to create PATH; print "created" or the error, exit 0 either way
//	spew BYTES           write BYTES bytes of text lines to stdout in 64 KiB writes; exit 0
//
// A container's main process is PID 1 in its namespace, and the kernel does
// not deliver a signal to PID 1 that it has no handler for. That is why
// sleep installs a SIGTERM handler explicitly: without one a graceful stop
// would always run to the kill, and a test of the grace period would measure
// nothing.
package main

import (
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) == 0 {
		usage()
		return 2
	}
	verb, rest := args[0], args[1:]
	switch verb {
	case "echo":
		fmt.Println(strings.Join(rest, " "))
		return 0
	case "exit":
		code, ok := intArg(rest)
		if !ok {
			return 2
		}
		fmt.Printf("exiting %d\n", code)
		return code
	case "env-sleep": // a gang member showing its rank variables, then working
		if len(rest) < 2 {
			fmt.Fprintln(os.Stderr, "env-sleep: want SECONDS NAME...")
			return 2
		}
		for _, name := range rest[1:] {
			fmt.Printf("%s=%s\n", name, os.Getenv(name))
		}
		return run([]string{"sleep", rest[0]})
	case "sleep":
		d, ok := secondsArg(rest)
		if !ok {
			return 2
		}
		signals := make(chan os.Signal, 1)
		signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
		fmt.Println("sleeping")
		select {
		case sig := <-signals:
			fmt.Printf("received %v\n", sig)
		case <-time.After(d):
			fmt.Println("slept")
		}
		return 0
	case "env":
		if len(rest) != 1 {
			fmt.Fprintln(os.Stderr, "env: want exactly one NAME")
			return 2
		}
		fmt.Println(os.Getenv(rest[0]))
		return 0
	case "env-sha256":
		if len(rest) != 1 {
			fmt.Fprintln(os.Stderr, "env-sha256: want exactly one NAME")
			return 2
		}
		fmt.Printf("%x\n", sha256.Sum256([]byte(os.Getenv(rest[0]))))
		return 0
	case "lines":
		n, ok := intArg(rest)
		if !ok {
			return 2
		}
		for i := 1; i <= n; i++ {
			fmt.Printf("line %d\n", i)
		}
		fmt.Fprintln(os.Stderr, "stderr line")
		return 0
	case "spew":
		n, ok := intArg(rest)
		if !ok {
			return 2
		}
		return spew(n)
	case "ignore-term":
		d, ok := secondsArg(rest)
		if !ok {
			return 2
		}
		signal.Ignore(syscall.SIGTERM)
		fmt.Println("ignoring SIGTERM")
		time.Sleep(d)
		return 0
	case "cat", "sha256", "touch":
		return fileBehaviour(verb, rest)
	default:
		fmt.Fprintf(os.Stderr, "unknown behaviour %q\n", verb)
		usage()
		return 2
	}
}

func intArg(rest []string) (int, bool) {
	if len(rest) != 1 {
		fmt.Fprintln(os.Stderr, "want exactly one integer argument")
		return 0, false
	}
	n, err := strconv.Atoi(rest[0])
	if err != nil {
		fmt.Fprintf(os.Stderr, "not an integer: %q\n", rest[0])
		return 0, false
	}
	return n, true
}

func secondsArg(rest []string) (time.Duration, bool) {
	if len(rest) != 1 {
		fmt.Fprintln(os.Stderr, "want exactly one SECONDS argument")
		return 0, false
	}
	s, err := strconv.ParseFloat(rest[0], 64)
	if err != nil || s < 0 {
		fmt.Fprintf(os.Stderr, "not a number of seconds: %q\n", rest[0])
		return 0, false
	}
	return time.Duration(s * float64(time.Second)), true
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: workload echo ARGS... | exit N | sleep SECONDS | env NAME | env-sha256 NAME | lines N | ignore-term SECONDS")
}

// fileBehaviour reads or writes one path: cat, sha256 and touch.
func fileBehaviour(verb string, rest []string) int {
	if len(rest) != 1 {
		fmt.Fprintf(os.Stderr, "%s: want exactly one PATH\n", verb)
		return 2
	}
	if verb == "touch" {
		f, err := os.Create(rest[0])
		if err != nil {
			fmt.Println(err)
			return 0
		}
		f.Close()
		fmt.Println("created")
		return 0
	}
	f, err := os.Open(rest[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer f.Close()
	if verb == "cat" {
		if _, err := io.Copy(os.Stdout, f); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return 0
	}
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("%x %d\n", h.Sum(nil), n)
	return 0
}

// spew writes n bytes of 64-byte text lines to stdout, 64 KiB a write:
// output as fast as a chatty program makes it, for the log cap's tests.
func spew(n int) int {
	line := strings.Repeat("0123456789abcdef", 4)[:63] + "\n"
	block := []byte(strings.Repeat(line, (64<<10)/len(line)))
	for n > 0 {
		w := block[:min(n, len(block))]
		if _, err := os.Stdout.Write(w); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		n -= len(w)
	}
	return 0
}
