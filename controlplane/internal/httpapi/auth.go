package httpapi

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
)

var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// NewID returns prefix + 16 random base32 characters (80 bits): the
// identifiers the control plane mints (runs, nodes, calls, attempts).
func NewID(prefix string) string {
	var b [10]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // the kernel's random source failing is not recoverable
	}
	return prefix + idEncoding.EncodeToString(b[:])
}

// RandomToken returns 256 random bits in base32: the secret part of every
// credential the control plane mints (callers add the kind's prefix).
func RandomToken() string {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return idEncoding.EncodeToString(b[:])
}

// HashToken is how every credential is stored: a leaked database holds no
// usable token.
func HashToken(tok string) string {
	h := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(h[:])
}

// adminTTL is how long a positive answer about an API credential is
// reused: no API credential can be revoked today, so only the cost of a
// database read per call is saved (the invoke path's matters most).
const adminTTL = 10 * time.Second

// Admin authenticates API credentials for every public route. It caches
// positive answers only, for adminTTL. Node sessions are authenticated
// elsewhere (package controlplane), with their own cache. The zero value
// is not usable: set Store and Now. Safe for concurrent use.
type Admin struct {
	Store store.Store
	Now   func() time.Time

	trusted sync.Map // token hash → time.Time it is trusted until
}

// Check reports whether tok is an API credential: nil, or a failure kind
// (failure.ErrNotFound for an unknown one).
func (a *Admin) Check(ctx context.Context, tok string) error {
	hash := HashToken(tok)
	if v, ok := a.trusted.Load(hash); ok && a.Now().Before(v.(time.Time)) {
		return nil
	}
	err := a.Store.View(ctx, func(tx store.Tx) error { _, err := tx.GetToken(hash); return err })
	if err == nil {
		a.trusted.Store(hash, a.Now().Add(adminTTL))
	}
	return err
}

// Require wraps h to require an API credential; fail writes a refusal in
// the shape of the route's API (the /v1 error, or Fn's).
func (a *Admin) Require(h func(http.ResponseWriter, *http.Request), fail func(http.ResponseWriter, *http.Request, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, ok := Bearer(r)
		if !ok {
			fail(w, r, failure.Unauthorized("this API needs a credential: send `Authorization: Bearer <token>` (the CLI reads MERCATOR_TOKEN or --token-file)"))
			return
		}
		err := a.Check(r.Context(), tok)
		if errors.Is(err, failure.ErrNotFound) {
			fail(w, r, failure.Unauthorized("the credential is not valid for this control plane"))
			return
		}
		if err != nil {
			fail(w, r, err)
			return
		}
		h(w, r)
	})
}
