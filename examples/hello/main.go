// Command hello is the smallest Mercator workload: it greets its arguments,
// says which container it ran in, and exits 0. The README builds it into an
// image FROM scratch and pushes it to the dev registry:
//
//	CGO_ENABLED=0 go build -o examples/hello/hello ./examples/hello
//	docker build -t 127.0.0.1:5000/hello:1 examples/hello
//
// An argument @PATH stands for the content of the file at PATH, which is
// how the demo shows an Artifact mounted into a Run:
//
//	mercator run submit --image … --artifact greeting@v1:/data/greeting.txt -- /hello @/data/greeting.txt
//
// It is standard-library only so the static binary is the whole image.
package main

import (
	"fmt"
	"os"
	"strings"
)

func main() {
	who := "world"
	if len(os.Args) > 1 {
		words := make([]string, 0, len(os.Args)-1)
		for _, a := range os.Args[1:] {
			if path, ok := strings.CutPrefix(a, "@"); ok {
				b, err := os.ReadFile(path)
				if err != nil {
					fmt.Fprintf(os.Stderr, "hello: %v\n", err)
					os.Exit(1)
				}
				a = strings.TrimSpace(string(b))
			}
			words = append(words, a)
		}
		who = strings.Join(words, " ")
	}
	fmt.Printf("hello, %s\n", who)
	host, err := os.Hostname()
	if err != nil {
		host = "unknown (" + err.Error() + ")"
	}
	fmt.Printf("hostname: %s\n", host)
}
