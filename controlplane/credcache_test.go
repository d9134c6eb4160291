package controlplane

import (
	"testing"
	"time"

	"github.com/mercator/mercator/store"
)

func TestCredCache(t *testing.T) {
	var c credCache
	now := time.Unix(1000, 0)
	if _, _, ok, _ := c.get("reg.example", now); ok {
		t.Fatal("an empty cache answered")
	}
	_, _, _, gen := c.get("reg.example", now)
	c.put("reg.example", store.RegistryCredential{Host: "reg.example", Username: "u"}, true, gen, now)
	if cred, found, ok, _ := c.get("reg.example", now.Add(registryCredTTL-time.Millisecond)); !ok || !found || cred.Username != "u" {
		t.Errorf("fresh entry = %+v found %v ok %v", cred, found, ok)
	}
	if _, _, ok, _ := c.get("reg.example", now.Add(registryCredTTL)); ok {
		t.Error("an entry older than the TTL was answered")
	}

	// Not found is cached too: a fleet without private registries must not
	// read the store per command either.
	_, _, _, gen = c.get("public.example", now)
	c.put("public.example", store.RegistryCredential{}, false, gen, now)
	if _, found, ok, _ := c.get("public.example", now); !ok || found {
		t.Errorf("cached absence: found %v ok %v", found, ok)
	}

	// A read that raced with a change (forget between its get and put)
	// does not put the old value back.
	_, _, _, gen = c.get("reg.example", now)
	c.forget("reg.example")
	c.put("reg.example", store.RegistryCredential{Host: "reg.example", Username: "old"}, true, gen, now)
	if _, _, ok, _ := c.get("reg.example", now); ok {
		t.Error("a value read before forget was cached after it")
	}
}
