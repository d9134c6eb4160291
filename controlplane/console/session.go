package console

import (
	"container/list"
	"crypto/subtle"
	"sync"
	"time"

	"github.com/mercator/mercator/controlplane/internal/httpapi"
)

// DefaultSessions bounds the console sessions one replica holds: signing
// in past it ends the least recently used session.
const DefaultSessions = 10000

// The session's lifetimes: idle ends a session nobody used for that long;
// maxAge ends every session that long after its sign-in, whatever its use.
const (
	sessionIdle   = 8 * time.Hour
	sessionMaxAge = 24 * time.Hour
)

// cookieName is the session cookie's. Its value is the session's secret;
// the server keeps only its hash, as it does every credential.
const cookieName = "mercator_session"

// session is one signed-in browser. Token is the credential it signed in
// with, kept on the server only: every page calls the API as it, and
// checks it first, so removing the token ends the session.
type session struct {
	hash     string
	token    string
	csrf     string
	created  time.Time
	lastSeen time.Time
	elem     *list.Element
}

// sessions holds the sessions of one replica, at most max, in a map by the
// hash of their secret and a list by last use (for eviction). Sessions are
// in memory: a replica restarting signs its browsers out, and a browser
// must reach the replica it signed in on (a load balancer's affinity). Safe
// for concurrent use.
type sessions struct {
	mu     sync.Mutex
	max    int
	now    func() time.Time
	byHash map[string]*session
	lru    *list.List // front: most recently used
}

func newSessions(max int, now func() time.Time) *sessions {
	return &sessions{max: max, now: now, byHash: map[string]*session{}, lru: list.New()}
}

// create starts a session for token and returns its secret (the cookie's
// value) and CSRF token. Expired sessions are dropped first; past the
// bound, the least recently used one ends.
func (s *sessions) create(token string) (secret string, sess *session) {
	secret = httpapi.RandomToken()
	now := s.now()
	sess = &session{hash: httpapi.HashToken(secret), token: token, csrf: httpapi.RandomToken(), created: now, lastSeen: now}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked(now)
	for len(s.byHash) >= s.max {
		s.removeLocked(s.lru.Back().Value.(*session))
	}
	sess.elem = s.lru.PushFront(sess)
	s.byHash[sess.hash] = sess
	return secret, sess
}

// get returns the live session of secret, noting its use; nil when there
// is none or it expired (which ends it).
func (s *sessions) get(secret string) *session {
	h := httpapi.HashToken(secret)
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	sess := s.byHash[h]
	if sess == nil {
		return nil
	}
	if expired(sess, now) {
		s.removeLocked(sess)
		return nil
	}
	sess.lastSeen = now
	s.lru.MoveToFront(sess.elem)
	copy := *sess
	return &copy
}

// end ends the session of hash (sign-out, or a credential the control
// plane no longer accepts).
func (s *sessions) end(hash string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if sess := s.byHash[hash]; sess != nil {
		s.removeLocked(sess)
	}
}

// count is how many sessions are held.
func (s *sessions) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byHash)
}

// expireLocked drops the sessions past their lifetime, from the least
// recently used end, stopping at the first idle-live one that is also
// within its maximum age.
func (s *sessions) expireLocked(now time.Time) {
	for e := s.lru.Back(); e != nil; {
		prev := e.Prev()
		sess := e.Value.(*session)
		if expired(sess, now) {
			s.removeLocked(sess)
		} else if now.Sub(sess.lastSeen) < sessionIdle/2 {
			break // the rest were used more recently still
		}
		e = prev
	}
}

func (s *sessions) removeLocked(sess *session) {
	s.lru.Remove(sess.elem)
	delete(s.byHash, sess.hash)
}

func expired(sess *session, now time.Time) bool {
	return now.Sub(sess.lastSeen) >= sessionIdle || now.Sub(sess.created) >= sessionMaxAge
}

// validCSRF reports whether got is the session's CSRF token, in constant
// time.
func (sess *session) validCSRF(got string) bool {
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(sess.csrf)) == 1
}
