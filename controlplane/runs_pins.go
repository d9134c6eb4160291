package controlplane

import (
	"context"
	"strings"
	"sync"
	"time"
)

// pinTTL is how long a reference already pinned by digest, once verified
// against its registry, is taken as verified. A manifest digest names
// immutable content, so what a second verification could learn is only
// that the registry has since deleted it, which a node's pull would report
// anyway; asking the registry twice for every one of a hundred thousand
// submissions of the same image only costs two round trips each. References
// by tag are resolved every time: a tag moves.
const pinTTL = time.Minute

// pinCache remembers digest-pinned references recently verified.
type pinCache struct {
	mu   sync.Mutex
	refs map[string]pinned
}

type pinned struct {
	ref string
	at  time.Time
}

// resolve pins ref through r, answering from the cache for a reference
// already pinned by digest and verified within pinTTL.
func (c *pinCache) resolve(ctx context.Context, r ImageResolver, ref string, now time.Time) (string, error) {
	byDigest := strings.Contains(ref, "@sha256:")
	if byDigest {
		c.mu.Lock()
		p, ok := c.refs[ref]
		c.mu.Unlock()
		if ok && now.Sub(p.at) < pinTTL {
			return p.ref, nil
		}
	}
	out, err := r.Resolve(ctx, ref)
	if err != nil || !byDigest {
		return out, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.refs == nil || len(c.refs) > 10000 {
		c.refs = map[string]pinned{}
	}
	c.refs[ref] = pinned{ref: out, at: now}
	return out, nil
}
