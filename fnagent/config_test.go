package fnagent

import (
	"errors"
	"fmt"
	"testing"

	"github.com/mercator/mercator/failure"
)

const testDigest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestFunctionConfigNormalized(t *testing.T) {
	fn, err := FunctionConfig{ID: "f", Image: "127.0.0.1:5000/fn@" + testDigest}.normalized()
	if err != nil {
		t.Fatal(err)
	}
	if fn.MemoryMB != DefaultMemoryMB || fn.Timeout != DefaultTimeout || fn.IdleTimeout != DefaultIdleTimeout ||
		fn.InitTimeout != DefaultInitTimeout || fn.MaxRequestBytes != DefaultMaxRequestBytes || fn.MaxResponseBytes != DefaultMaxResponseBytes {
		t.Fatalf("defaults not applied: %+v", fn)
	}
	bad := []FunctionConfig{
		{Image: "r/fn@" + testDigest},
		{ID: "f", Image: "r/fn:latest"},
		{ID: "f", Image: "r/fn:1@" + testDigest},
		{ID: "f", Image: "r/fn@" + testDigest, MemoryMB: 2},
		{ID: "f", Image: "r/fn@" + testDigest, Config: map[string]string{"FN_LISTENER": "unix:/x"}},
		{ID: "f", Image: "r/fn@" + testDigest, Config: map[string]string{"A=B": "x"}},
		{ID: "f", Image: "r/fn@" + testDigest, MaxConcurrency: -1},
		{ID: "f", Image: "r/fn@" + testDigest, Timeout: -1},
	}
	for _, fn := range bad {
		if _, err := fn.normalized(); !errors.Is(err, failure.ErrInvalid) {
			t.Errorf("%+v: err = %v; want failure.ErrInvalid", fn, err)
		}
	}
}

func TestPoolKey(t *testing.T) {
	base := FunctionConfig{ID: "f", Image: "r/fn@" + testDigest, Config: map[string]string{"A": "1", "B": "2"}}
	key := func(fn FunctionConfig) string {
		n, err := fn.normalized()
		if err != nil {
			t.Fatal(err)
		}
		return n.poolKey()
	}
	k := key(base)
	same := base
	same.Config = map[string]string{"B": "2", "A": "1"}
	same.RegistryAuth = "secret"
	if key(same) != k {
		t.Fatal("map order or the credential changed the key")
	}
	for name, change := range map[string]func(*FunctionConfig){
		"image":  func(f *FunctionConfig) { f.Image = "r/other@" + testDigest },
		"memory": func(f *FunctionConfig) { f.MemoryMB = 256 },
		"config": func(f *FunctionConfig) { f.Config = map[string]string{"A": "1", "B": "3"} },
		"cpu":    func(f *FunctionConfig) { f.MilliCPUs = 100 },
	} {
		c := base
		change(&c)
		if key(c) == k {
			t.Errorf("a %s change kept the pool", name)
		}
	}
}

func TestCallErrorKinds(t *testing.T) {
	err := fmt.Errorf("wrapped: %w", &CallError{Kind: KindBusy, FnID: "f", CallID: "c", Message: "full"})
	if !errors.Is(err, ErrBusy) || errors.Is(err, ErrTimeout) {
		t.Fatal("Is by kind is wrong")
	}
	if !errors.Is(err, failure.ErrUnavailable) {
		t.Fatal("busy should match failure.ErrUnavailable")
	}
	if KindOf(err) != KindBusy || KindOf(errors.New("x")) != "" || KindOf(nil) != "" {
		t.Fatal("KindOf is wrong")
	}
	if got := err.Error(); got != "wrapped: fn f call c: busy: full" {
		t.Fatalf("Error() = %q", got)
	}
}
