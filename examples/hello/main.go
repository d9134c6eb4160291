// Command hello is the smallest Mercator workload: it greets its arguments,
// says which container it ran in, and exits 0. The README builds it into an
// image FROM scratch and pushes it to the dev registry:
//
//	CGO_ENABLED=0 go build -o examples/hello/hello ./examples/hello
//	docker build -t 127.0.0.1:5000/hello:1 examples/hello
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
		who = strings.Join(os.Args[1:], " ")
	}
	fmt.Printf("hello, %s\n", who)
	host, err := os.Hostname()
	if err != nil {
		host = "unknown (" + err.Error() + ")"
	}
	fmt.Printf("hostname: %s\n", host)
}
