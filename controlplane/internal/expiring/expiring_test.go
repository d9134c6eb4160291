package expiring

import (
	"testing"
	"time"

	"github.com/mercator/mercator/store"
)

// registryLookup has the shape of a registry credential lookup, the
// cache's main user: a record, and whether the store had one.
type registryLookup struct {
	cred  store.RegistryCredential
	found bool
}

func TestExpiring(t *testing.T) {
	var c Map[registryLookup]
	now := time.Unix(1000, 0)
	const ttl = 5 * time.Second
	if _, fresh, _ := c.Get("reg.example", now, ttl); fresh {
		t.Fatal("an empty cache answered")
	}
	_, _, gen := c.Get("reg.example", now, ttl)
	c.Put("reg.example", registryLookup{store.RegistryCredential{Host: "reg.example", Username: "u"}, true}, gen, now)
	if v, fresh, _ := c.Get("reg.example", now.Add(ttl-time.Millisecond), ttl); !fresh || !v.found || v.cred.Username != "u" {
		t.Errorf("fresh entry = %+v fresh %v", v, fresh)
	}
	if _, fresh, _ := c.Get("reg.example", now.Add(ttl), ttl); fresh {
		t.Error("an entry as old as the TTL was answered as fresh")
	}

	// Absence is cached too: a fleet without private registries must not
	// read the store per command either.
	_, _, gen = c.Get("public.example", now, ttl)
	c.Put("public.example", registryLookup{}, gen, now)
	if v, fresh, _ := c.Get("public.example", now, ttl); !fresh || v.found {
		t.Errorf("cached absence: found %v fresh %v", v.found, fresh)
	}

	// A read that raced with a change (forget between its get and put)
	// does not put the old value back.
	_, _, gen = c.Get("reg.example", now, ttl)
	c.Forget("reg.example")
	c.Put("reg.example", registryLookup{store.RegistryCredential{Host: "reg.example", Username: "old"}, true}, gen, now)
	if _, fresh, _ := c.Get("reg.example", now, ttl); fresh {
		t.Error("a value read before forget was cached after it")
	}
}

// TestForgetAll: every value is dropped, and a read begun before
// ForgetAll cannot put its value back, even for a key never forgotten or
// cached before; a read begun after can.
func TestForgetAll(t *testing.T) {
	var c Map[int]
	now := time.Unix(1_700_000_000, 0)
	_, _, gen := c.Get("a", now, time.Minute)
	c.Put("a", 1, gen, now)
	_, _, genB := c.Get("b", now, time.Minute) // a read in flight, of a key never seen
	c.ForgetAll()
	if _, fresh, _ := c.Get("a", now, time.Minute); fresh {
		t.Error("a value survived ForgetAll")
	}
	c.Put("b", 2, genB, now)
	if _, fresh, _ := c.Get("b", now, time.Minute); fresh {
		t.Error("a value read before ForgetAll was cached after it")
	}
	_, _, gen = c.Get("b", now, time.Minute)
	c.Put("b", 3, gen, now)
	if v, fresh, _ := c.Get("b", now, time.Minute); !fresh || v != 3 {
		t.Errorf("a value read after ForgetAll: %d, fresh %v", v, fresh)
	}
}
