package content

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
)

// signedReads is what the stores the control plane serves itself (Local,
// Postgres) share: reads minted as URLs under the control plane's public
// URL that carry an expiry and an HMAC-SHA256 of the digest and the expiry
// under a key only the control plane holds, and the handler that checks
// them before touching any content.
type signedReads struct {
	key     []byte
	baseURL string
	now     func() time.Time
}

func newSignedReads(key []byte, baseURL string, now func() time.Time) signedReads {
	if now == nil {
		now = time.Now
	}
	return signedReads{key: key, baseURL: strings.TrimRight(baseURL, "/"), now: now}
}

// ReadURL implements Store: BASE/v1/content/DIGEST?expires=UNIX&sig=SIG.
// The expiry is whole seconds, rounded up.
func (s signedReads) ReadURL(ctx context.Context, digest string, ttl time.Duration) (string, time.Time, error) {
	if err := checkDigest(digest); err != nil {
		return "", time.Time{}, err
	}
	if ttl <= 0 {
		return "", time.Time{}, failure.Invalid("ttl", "a read must live a positive time, not %s", ttl)
	}
	exp := s.now().Add(ttl + time.Second - 1).Truncate(time.Second).UTC()
	q := url.Values{"expires": {strconv.FormatInt(exp.Unix(), 10)}, "sig": {s.sign(digest, exp.Unix())}}
	return s.baseURL + ReadPath + digest + "?" + q.Encode(), exp, nil
}

func (s signedReads) sign(digest string, expires int64) string {
	mac := hmac.New(sha256.New, s.key)
	fmt.Fprintf(mac, "mercator content read\n%s\n%d", digest, expires)
	return base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// verify checks a read's signature and expiry, in Mercator's words.
func (s signedReads) verify(digest, expires, sig string) error {
	exp, err := strconv.ParseInt(expires, 10, 64)
	if err != nil || sig == "" {
		return failure.Unauthorized("this content read carries no valid signature and expiry; content is read only through a location the control plane minted for one fetch")
	}
	if !hmac.Equal([]byte(sig), []byte(s.sign(digest, exp))) {
		return failure.Unauthorized("the signature of this content read does not match: it was not minted by this control plane for content %s", digest)
	}
	if !s.now().Before(time.Unix(exp, 0)) {
		return failure.Unauthorized("this content read of %s expired at %s; a node must be sent a freshly minted one", digest, time.Unix(exp, 0).UTC().Format(time.RFC3339))
	}
	return nil
}

// serve serves GET ReadPath+DIGEST with the content open gives. It checks
// the signature and expiry before calling open, so a refused read learns
// nothing about what is stored. Range requests are honoured
// (http.ServeContent), which lets an interrupted fetch resume within its
// read's life.
func (s signedReads) serve(w http.ResponseWriter, r *http.Request, open func(digest string) (io.ReadSeekCloser, time.Time, error)) {
	digest := strings.TrimPrefix(r.URL.Path, ReadPath)
	if !ValidDigest(digest) {
		writeError(w, failure.NotFound("content", digest))
		return
	}
	q := r.URL.Query()
	if err := s.verify(digest, q.Get("expires"), q.Get("sig")); err != nil {
		writeError(w, err)
		return
	}
	f, modTime, err := open(digest)
	if err != nil {
		writeError(w, err)
		return
	}
	defer f.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Cache-Control", "private, max-age=0, no-store")
	w.Header().Set("ETag", `"`+digest+`"`)
	http.ServeContent(w, r, "", modTime, f)
}

func writeError(w http.ResponseWriter, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(api.StatusOf(err))
	_ = json.NewEncoder(w).Encode(api.ErrorOf(err))
}
