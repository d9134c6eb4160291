// Command fn-hello is Mercator's sample function, Fn's hello-go: it reads
// {"name": "..."} and answers {"message": "Hello, <name>"} ("World" when
// the body names no one). It is built with Fn's Go FDK
// (github.com/fnproject/fdk-go), unchanged, which is the point: any image
// an Fn FDK produces runs on Mercator's Functions engine as it is.
//
// Build it into an image FROM scratch (the binary is static):
//
//	mkdir -p /tmp/fn-hello
//	CGO_ENABLED=0 go build -o /tmp/fn-hello/fn-hello ./examples/fn-hello
//	cp examples/fn-hello/Dockerfile /tmp/fn-hello/
//	docker build -t 127.0.0.1:5000/fn-hello:1 /tmp/fn-hello
//
// The tests of package fnagent build and push it the same way
// (internal/testimage) and call it cold and hot.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"

	fdk "github.com/fnproject/fdk-go"
)

func main() {
	fdk.Handle(fdk.HandlerFunc(hello))
}

type person struct {
	Name string `json:"name"`
}

func hello(ctx context.Context, in io.Reader, out io.Writer) {
	p := person{Name: "World"}
	// An empty or malformed body greets the world, as hello-go does.
	_ = json.NewDecoder(in).Decode(&p)
	if p.Name == "" {
		p.Name = "World"
	}
	log.Printf("fn-hello: greeting %s (call %s)", p.Name, fdk.GetContext(ctx).CallID())
	fdk.SetHeader(out, "Content-Type", "application/json")
	json.NewEncoder(out).Encode(struct {
		Message string `json:"message"`
	}{Message: fmt.Sprintf("Hello, %s", p.Name)})
}
