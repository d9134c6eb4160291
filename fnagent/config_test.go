package fnagent

import (
	"errors"
	"fmt"
	"reflect"
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

// TestConfigIdentityCoversEveryField: a change to any field of a
// FunctionConfig but RegistryAuth changes its identity, so the config cache
// never hands one configuration another's pool.
func TestConfigIdentityCoversEveryField(t *testing.T) {
	base := FunctionConfig{ID: "f", Image: "r/fn@" + testDigest, Config: map[string]string{"A": "1"}}
	typ := reflect.TypeOf(base)
	for i := 0; i < typ.NumField(); i++ {
		field := typ.Field(i)
		changed := base
		v := reflect.ValueOf(&changed).Elem().Field(i)
		switch v.Kind() {
		case reflect.String:
			v.SetString(v.String() + "x")
		case reflect.Int, reflect.Int64:
			v.SetInt(v.Int() + 7)
		case reflect.Bool:
			v.SetBool(!v.Bool())
		case reflect.Map:
			v.Set(reflect.ValueOf(map[string]string{"A": "2"}))
		default:
			t.Fatalf("field %s of kind %s: teach this test (and configIdentity) about it", field.Name, v.Kind())
		}
		same := changed.identity() == base.identity()
		if field.Name == "RegistryAuth" {
			if !same {
				t.Error("the credential changed the identity; it is not part of it")
			}
		} else if same {
			t.Errorf("a change to %s kept the identity; add the field to configIdentity", field.Name)
		}
	}
	// Config pairs do not run into each other.
	a := FunctionConfig{Config: map[string]string{"A": "1\x00B=2"}}
	b := FunctionConfig{Config: map[string]string{"A": "1", "B": "2"}}
	if a.identity() == b.identity() {
		t.Error("a value holding a pair separator matched two pairs")
	}
}

// TestConfigCache: the cache answers what normalized and poolKey would,
// with each call's own credential, and refuses what normalized refuses.
func TestConfigCache(t *testing.T) {
	var c configCache
	fn := FunctionConfig{ID: "f", Image: "r/fn@" + testDigest, Config: map[string]string{"A": "1"}, RegistryAuth: "first"}
	want, err := fn.normalized()
	if err != nil {
		t.Fatal(err)
	}
	for i, auth := range []string{"first", "second", ""} {
		fn.RegistryAuth = auth
		got, key, err := c.normalize(fn)
		if err != nil {
			t.Fatal(err)
		}
		if key != want.poolKey() || got.RegistryAuth != auth || got.Timeout != DefaultTimeout || got.Config["A"] != "1" {
			t.Fatalf("call %d: %+v key %s; want the normalized config with credential %q and key %s", i, got, key, auth, want.poolKey())
		}
	}
	fn.Config["A"] = "changed by the caller later"
	if got, _, err := c.normalize(FunctionConfig{ID: "f", Image: "r/fn@" + testDigest, Config: map[string]string{"A": "1"}}); err != nil || got.Config["A"] != "1" {
		t.Fatalf("the cache shares the caller's map: %v, %v", got.Config, err)
	}
	for i := 0; i < 2; i++ {
		if _, _, err := c.normalize(FunctionConfig{ID: "f", Image: "r/fn:latest"}); !errors.Is(err, failure.ErrInvalid) {
			t.Fatalf("a tag, call %d: err = %v; want failure.ErrInvalid", i, err)
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
