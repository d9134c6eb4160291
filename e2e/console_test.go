package e2e

import (
	"context"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/mercator/mercator/api"
)

// browser is a headless Debian chromium driven over the DevTools protocol
// (chromedp), with a fresh profile, saving screenshots into dir.
type browser struct {
	t   *testing.T
	ctx context.Context
	dir string
}

// startBrowser starts chromium with the flags this closed network needs
// (no background connections, no sandbox as root). A missing chromium fails
// the test: scripts/test.sh installs it.
func startBrowser(t *testing.T, parent context.Context) *browser {
	t.Helper()
	exec := "/usr/bin/chromium"
	if _, err := os.Stat(exec); err != nil {
		t.Fatalf("the console's browser tests need Debian's chromium at %s (apt-get install -y chromium chromium-driver; scripts/test.sh does): %v", exec, err)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(exec), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 900),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(parent, opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return &browser{t: t, ctx: ctx, dir: t.ArtifactDir()}
}

// hangGuard bounds one browser step: a hang guard, not a performance bound.
const hangGuard = 90 * time.Second

// do runs steps, failing the test on an error (what named).
func (b *browser) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	browserGet(b, what, chromedp.Steps(steps...))
}

// browserGet runs one action and returns its value, failing the test on an error.
func browserGet[T any](b *browser, what string, a chromedp.Action[T]) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, hangGuard)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		b.t.Fatalf("browser: %s: %v", what, err)
	}
	return v
}

// until waits for a JavaScript predicate to hold on the page.
func until(expr string) chromedp.Action[chromedp.Void] {
	return chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(0))
}

// shot saves the page as name.png in the test's artifact directory.
func (b *browser) shot(name string) {
	b.t.Helper()
	png := browserGet(b, "screenshot "+name, chromedp.FullScreenshot(100))
	if err := os.WriteFile(filepath.Join(b.dir, name+".png"), png, 0o644); err != nil {
		b.t.Fatal(err)
	}
}

// signIn signs in on the console's sign-in page with tok.
func (b *browser) signIn(base, tok string) {
	b.t.Helper()
	b.do("sign in", chromedp.Navigate(base+"/ui/"), chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), tok), chromedp.Submit(chromedp.CSS("#token")),
		chromedp.WaitVisible(chromedp.CSS(`nav[aria-label="Console"]`)))
}

// session is the console session cookie the browser holds now.
func (b *browser) session(base string) *http.Cookie {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, hangGuard)
	defer cancel()
	res, err := chromedp.Call(ctx, network.GetCookies, network.GetCookiesParams{URLs: []string{base + "/ui/"}})
	if err != nil {
		b.t.Fatalf("read cookies: %v", err)
	}
	for _, c := range res.Cookies {
		if c.Name == "mercator_session" {
			if !c.HTTPOnly || c.SameSite != network.CookieSameSiteStrict {
				b.t.Errorf("session cookie: HttpOnly %v, SameSite %q; want HttpOnly and Strict", c.HTTPOnly, c.SameSite)
			}
			return &http.Cookie{Name: c.Name, Value: c.Value}
		}
	}
	b.t.Fatal("no console session cookie after sign-in")
	return nil
}

// postAs sends a console form as a session would, outside the browser.
func postAs(t *testing.T, base, path string, cookie *http.Cookie, form url.Values) *http.Response {
	req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.AddCookie(cookie)
	hc := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

// TestConsoleInBrowser drives the web console in headless chromium against
// a real control plane, agent and Docker: sign-in, Fleet, a CLI-submitted
// run on Runs with its log live, cancel from its page, a reader's view and
// a reader's forged cancel, sign-out and a revoked token's session.
func TestConsoleInBrowser(t *testing.T) {
	c := startCluster(t)
	node := c.startAgent("ui")
	b := startBrowser(t, c.ctx)

	b.signIn(c.url, c.token)
	b.do("the node on Fleet", chromedp.Navigate(c.url+"/ui/fleet"), chromedp.WaitVisible(`//th[contains(., "`+node+`")]`))
	b.shot("fleet")

	runID := strings.TrimSpace(c.mercator("run", "submit", "--image", c.workload, "--", "sleep", "300"))
	b.do("the run on Runs", chromedp.Navigate(c.url+"/ui/runs"), chromedp.WaitVisible(`//a[text()="`+runID+`"]`))
	b.shot("runs")
	b.do("open the run", chromedp.Click(`//a[text()="`+runID+`"]`), chromedp.WaitVisible(chromedp.CSS("#log")),
		until(`document.getElementById("log").textContent.includes("sleeping")`))
	if n := runningContainers(t, runID); n != 1 {
		t.Fatalf("run %s has %d running containers before cancel, want 1", runID, n)
	}
	b.do("the run's status followed live", until(`document.getElementById("run-status").textContent === "running"`))
	b.shot("run")
	b.do("cancel from the run page", chromedp.Click(chromedp.CSS("#cancel")))
	if done := c.wait(runID); done.Status != api.RunCancelled {
		t.Fatalf("cancelled from the console: %s %q", done.Status, done.Reason)
	}
	c.waitFor("the cancelled run's container stopped", func() bool { return runningContainers(t, runID) == 0 })
	b.do("the log's end and the status reach the page", chromedp.Navigate(c.url+"/ui/runs/"+runID),
		until(`document.getElementById("log").dataset.done === "true" && document.getElementById("log").textContent.includes("received")`),
		until(`document.getElementById("run-status").textContent === "cancelled"`))

	// A narrow screen (a phone's width): the page itself never scrolls
	// sideways; wide tables scroll in their own boxes.
	for _, p := range []string{"fleet", "runs/" + runID} {
		b.do("the "+p+" page on a narrow screen", chromedp.EmulateViewport(390, 844), chromedp.Navigate(c.url+"/ui/"+p),
			chromedp.WaitVisible(chromedp.CSS("h1")), until(`document.documentElement.scrollWidth <= document.documentElement.clientWidth`))
	}
	b.shot("run-narrow")
	b.do("back to a wide screen", chromedp.ResetViewport())
	for _, p := range []string{"functions", "artifacts", "audit"} {
		b.do("the "+p+" page", chromedp.Navigate(c.url+"/ui/"+p), chromedp.WaitVisible(chromedp.CSS("h1")))
		b.shot(p)
	}

	admin := b.session(c.url)
	b.do("sign out", chromedp.Click(`//button[text()="Sign out"]`), chromedp.WaitVisible(chromedp.CSS("#token")))
	if resp := postAs(t, c.url, "/ui/runs/"+runID+"/resubmit", admin, nil); resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("the signed-out session's cookie still served: %d", resp.StatusCode)
	}
	b.do("signed out: the console asks for a token", chromedp.Navigate(c.url+"/ui/fleet"), chromedp.WaitVisible(chromedp.CSS("#token")))
	b.shot("signin")

	created, err := c.client.CreateToken(c.ctx, api.TokenRequest{Name: "console-reader", Role: "reader"})
	if err != nil {
		t.Fatal(err)
	}
	live := c.submit(api.RunSpec{Command: []string{"sleep", "300"}})
	b.signIn(c.url, created.Secret)
	b.do("a reader's run page", chromedp.Navigate(c.url+"/ui/runs/"+live.ID), chromedp.WaitVisible(chromedp.CSS("#log")))
	cancelButtons := browserGet(b, "count cancel buttons", chromedp.Evaluate[int](`document.querySelectorAll("#cancel").length`))
	csrf := browserGet(b, "read the form's CSRF token", chromedp.Value(chromedp.CSS(`input[name="csrf"]`)))
	if cancelButtons != 0 {
		t.Fatalf("a reader sees %d cancel buttons", cancelButtons)
	}
	b.shot("run-reader")
	reader := b.session(c.url)
	if resp := postAs(t, c.url, "/ui/runs/"+live.ID+"/cancel", reader, url.Values{"csrf": {csrf}}); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("a reader's forged cancel: %d, want 403", resp.StatusCode)
	}
	if resp := postAs(t, c.url, "/ui/runs/"+live.ID+"/cancel", reader, nil); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("a cancel without the CSRF token: %d, want 403", resp.StatusCode)
	}
	if r, _ := c.client.GetRun(c.ctx, live.ID); r.Cancel || api.Terminal(r.Status) {
		t.Fatalf("the reader's refused cancel changed the run: %s cancel=%v", r.Status, r.Cancel)
	}
	// The attempts table follows the run on the open page (the status
	// events carry it): a cancel from the CLI's side shows without a
	// reload (the marker set on the page survives).
	b.do("the attempt running on the open page", until(`document.querySelector("#attempt-rows tr > :nth-child(4)").textContent === "running"`),
		chromedp.Evaluate[chromedp.Void](`window.sameVisit = true`))
	if _, err := c.client.CancelRun(c.ctx, live.ID); err != nil {
		t.Fatal(err)
	}
	b.do("the attempts table updated live", until(`window.sameVisit === true && document.querySelector("#attempt-rows tr > :nth-child(4)").textContent === "cancelled" && document.querySelector("#attempt-rows tr > :nth-child(7)").textContent !== "—"`))
	b.shot("run-attempts-live")
	c.wait(live.ID)
	if err := c.client.RemoveToken(c.ctx, "console-reader"); err != nil {
		t.Fatal(err)
	}
	b.do("a removed token's session ends", chromedp.Navigate(c.url+"/ui/fleet"), chromedp.WaitVisible(chromedp.CSS("#token")))
}
