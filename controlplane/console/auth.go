package console

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/failure"
)

// maxTokenField bounds the sign-in form: a Mercator token is under 100
// characters; the form is refused well before anything large is read.
const maxTokenField = 4096

// request is what a signed-in page has: its session, the caller its
// credential proves now, and the API as that caller.
type request struct {
	sess *session
	who  httpapi.Caller
	api  API
}

// may reports whether the caller's role allows what role allows; the
// templates hide the controls it does not.
func (q *request) may(role httpapi.Role) bool {
	return httpapi.Access{Role: role}.Allows(q.who.Role)
}

type requestKey struct{}

// requireSession serves h only within a session whose credential the
// control plane still accepts with at least role; a browser without one
// is sent to the sign-in page, a change without the session's CSRF token
// or with too small a role is refused. The credential is checked on every
// request (briefly cached by the Authenticator), so a removed token ends
// its console sessions.
func (c *Console) requireSession(role httpapi.Role, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ck, err := r.Cookie(cookieName)
		var sess *session
		if err == nil {
			sess = c.sessions.get(ck.Value)
		}
		if sess == nil {
			c.toSignin(w, r, "")
			return
		}
		who, err := c.cfg.Auth.Check(r.Context(), sess.token)
		if err != nil {
			if errors.Is(err, failure.ErrUnauthorized) {
				c.sessions.end(sess.hash)
				c.toSignin(w, r, "Your session ended: "+err.Error())
				return
			}
			c.fail(w, r, nil, err)
			return
		}
		q := &request{sess: sess, who: who, api: c.cfg.APIFor(sess.token, r)}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			r.Body = http.MaxBytesReader(w, r.Body, maxTokenField)
			if !sess.validCSRF(r.PostFormValue("csrf")) {
				c.fail(w, r, q, failure.Forbidden("the form's CSRF token is missing or not this session's: reload the page and try again"))
				return
			}
		}
		if !q.may(role) {
			c.fail(w, r, q, failure.Forbidden("%s may not %s; it needs %s", who.Role, r.Method+" "+r.URL.Path, role))
			return
		}
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), requestKey{}, q)))
	})
}

// page adapts a page's handler to the request requireSession proved.
func (c *Console) page(f func(http.ResponseWriter, *http.Request, *request)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f(w, r, r.Context().Value(requestKey{}).(*request))
	})
}

// action is page for a change: f returns where to go next (a
// post-redirect-get, so a reload does not repeat the change) or an error,
// which is shown.
func (c *Console) action(f func(*http.Request, *request) (string, error)) http.Handler {
	return c.page(func(w http.ResponseWriter, r *http.Request, q *request) {
		next, err := f(r, q)
		if err != nil {
			c.fail(w, r, q, err)
			return
		}
		http.Redirect(w, r, next, http.StatusSeeOther)
	})
}

// toSignin sends a browser to the sign-in page, back to where it was
// going once signed in; a script's request (the log stream) gets 401.
func (c *Console) toSignin(w http.ResponseWriter, r *http.Request, why string) {
	if r.Method != http.MethodGet || strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
		c.fail(w, r, nil, failure.Unauthorized("sign in again: no console session (it ended or expired)"))
		return
	}
	v := url.Values{"next": {r.URL.RequestURI()}}
	if why != "" {
		v.Set("why", why)
	}
	http.Redirect(w, r, "/ui/signin?"+v.Encode(), http.StatusSeeOther)
}

func (c *Console) signinPage(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, http.StatusOK, "signin", nil, map[string]any{"Next": safeNext(r.URL.Query().Get("next")), "Why": r.URL.Query().Get("why")})
}

// signin checks the token of the sign-in form and starts a session with it.
// The cookie is HttpOnly (no script reads it), SameSite=Strict (no other
// site's page sends it) and Secure when the console is served over TLS.
func (c *Console) signin(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxTokenField)
	tok := strings.TrimSpace(r.PostFormValue("token"))
	next := safeNext(r.PostFormValue("next"))
	if !sameOrigin(r) {
		c.fail(w, r, nil, failure.Forbidden("sign-in from another site's page is refused"))
		return
	}
	data := map[string]any{"Next": next}
	if tok == "" {
		data["Why"] = "Enter a Mercator token (mercator token create, or the one the control plane printed at its first start)."
		c.render(w, r, http.StatusBadRequest, "signin", nil, data)
		return
	}
	who, err := c.cfg.Auth.Check(r.Context(), tok)
	if err == nil && who.Role == httpapi.RoleInvoker {
		err = failure.Forbidden("an invoker key calls one app's functions; it cannot sign in to the console")
	}
	if err != nil {
		data["Why"] = "Sign-in refused: " + err.Error()
		c.render(w, r, api.StatusOf(err), "signin", nil, data)
		return
	}
	secret, _ := c.sessions.create(tok)
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: secret, Path: "/ui/", HttpOnly: true, Secure: r.TLS != nil,
		SameSite: http.SameSiteStrictMode, MaxAge: int(sessionMaxAge.Seconds())})
	c.cfg.Log.Info("console sign-in", "who", who.Name, "role", who.Role)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// signout ends the session and clears its cookie, so the browser forgets
// the session's secret too.
func (c *Console) signout(w http.ResponseWriter, r *http.Request, q *request) {
	c.sessions.end(q.sess.hash)
	http.SetCookie(w, &http.Cookie{Name: cookieName, Value: "", Path: "/ui/", HttpOnly: true, SameSite: http.SameSiteStrictMode, MaxAge: -1})
	http.Redirect(w, r, "/ui/signin?why="+url.QueryEscape("Signed out."), http.StatusSeeOther)
}

// safeNext keeps a post-sign-in destination inside the console (no open
// redirect).
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/ui/") || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\r\n") {
		return "/ui/fleet"
	}
	return next
}

// sameOrigin refuses a form posted from another origin, where the browser
// says so (Origin or Sec-Fetch-Site): the sign-in form has no session and
// so no CSRF token yet.
func sameOrigin(r *http.Request) bool {
	if s := r.Header.Get("Sec-Fetch-Site"); s != "" && s != "same-origin" && s != "none" {
		return false
	}
	if o := r.Header.Get("Origin"); o != "" && o != "null" {
		u, err := url.Parse(o)
		return err == nil && u.Host == r.Host
	}
	return true
}
