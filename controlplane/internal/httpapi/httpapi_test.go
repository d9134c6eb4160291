package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/memstore"
)

// TestDecode holds Decode and DecodeBuffered to the same answers: each
// accepts a body the other accepts, and refuses it with the same error.
func TestDecode(t *testing.T) {
	type body struct {
		Name string `json:"name"`
		N    int    `json:"n"`
	}
	for _, tc := range []struct {
		name, body string
		limit      int64
		field      string // the refused field; "" for none or the whole body
		ok         bool
	}{
		{"one object", `{"name":"a","n":1}`, 100, "", true},
		{"empty", "  ", 100, "", false},
		{"unknown field", `{"nme":"a"}`, 100, "nme", false},
		{"wrong type", `{"n":"x"}`, 100, "n", false},
		{"trailing data", `{"n":1} {}`, 100, "", false},
		{"malformed", `{"n":`, 100, "", false},
		{"over the limit", `{"name":"` + strings.Repeat("x", 100) + `"}`, 100, "", false},
	} {
		for _, decode := range []struct {
			name string
			f    func(*http.Request, int64, any) error
		}{{"Decode", Decode}, {"DecodeBuffered", DecodeBuffered}} {
			t.Run(tc.name+"/"+decode.name, func(t *testing.T) {
				var v body
				err := decode.f(httptest.NewRequest("POST", "/", strings.NewReader(tc.body)), tc.limit, &v)
				if tc.ok {
					if err != nil || v != (body{Name: "a", N: 1}) {
						t.Fatalf("%s = %v, %+v", decode.name, err, v)
					}
					return
				}
				var fe *failure.Error
				if !errors.As(err, &fe) || !errors.Is(err, failure.ErrInvalid) || fe.Field != tc.field {
					t.Fatalf("%s = %#v, want invalid on field %q", decode.name, err, tc.field)
				}
				streamed := Decode(httptest.NewRequest("POST", "/", strings.NewReader(tc.body)), tc.limit, &v)
				if err.Error() != streamed.Error() {
					t.Fatalf("%s = %q, Decode = %q", decode.name, err, streamed)
				}
			})
		}
	}
}

func TestWriteErrorMapsKinds(t *testing.T) {
	for err, status := range map[error]int{
		failure.Invalid("x", "bad"):   http.StatusBadRequest,
		failure.NotFound("run", "r1"): http.StatusNotFound,
		failure.Unauthorized("who"):   http.StatusUnauthorized,
		errors.New("anything else"):   http.StatusInternalServerError,
	} {
		rec := httptest.NewRecorder()
		WriteError(rec, err)
		if rec.Code != status || rec.Header().Get("Content-Type") != "application/json" {
			t.Errorf("WriteError(%v) = %d %q, want %d", err, rec.Code, rec.Header().Get("Content-Type"), status)
		}
	}
}

func TestPaging(t *testing.T) {
	after, per := PageParams(httptest.NewRequest("GET", "/?per_page=1000&cursor="+NextCursor(2, 2, "app-b"), nil))
	if after != "app-b" || per != 100 {
		t.Errorf("PageParams = %q, %d; want app-b, 100 (the most a page holds)", after, per)
	}
	if after, per := PageParams(httptest.NewRequest("GET", "/?cursor=%%%", nil)); after != "" || per != 30 {
		t.Errorf("PageParams without a valid cursor = %q, %d; want the first page of 30", after, per)
	}
	items, next := ListPage([]string{"a", "b"}, 2, strings.ToUpper, func(s string) string { return s })
	if strings.Join(items, ",") != "A,B" || next != NextCursor(2, 2, "b") || next == "" {
		t.Errorf("a full page = %v, next %q", items, next)
	}
	if _, next := ListPage([]string{"a"}, 2, strings.ToUpper, func(s string) string { return s }); next != "" {
		t.Errorf("a short page has a next cursor %q", next)
	}
}

// countingStore counts read transactions.
type countingStore struct {
	store.Store
	views int
}

func (c *countingStore) View(ctx context.Context, fn func(store.Tx) error) error {
	c.views++
	return c.Store.View(ctx, fn)
}

func TestTokensCacheRolesAndRevocation(t *testing.T) {
	st := &countingStore{Store: memstore.New()}
	now := time.Unix(1000, 0)
	a := &Tokens{Store: st, Now: func() time.Time { return now }}
	mint := func(name string, role Role, expires *time.Time) string {
		tok := "mca_" + RandomToken()
		if err := st.Update(context.Background(), func(tx store.Tx) error {
			return tx.CreateToken(store.Token{Hash: HashToken(tok), Name: name, Role: string(role), CreatedAt: now, ExpiresAt: expires})
		}); err != nil {
			t.Fatal(err)
		}
		return tok
	}
	admin, reader := mint("root", RoleAdmin, nil), mint("ci", RoleReader, nil)
	soon := now.Add(time.Hour)
	expiring := mint("temp", RoleAdmin, &soon)
	route := Route{Pattern: "POST /v1/things", Access: Access{Role: RoleOperator}}
	h := a.Require(route, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) }),
		func(w http.ResponseWriter, r *http.Request, err error) { WriteError(w, err) })
	call := func(auth string) (int, string) {
		r := httptest.NewRequest("POST", "/v1/things", nil)
		if auth != "" {
			r.Header.Set("Authorization", "Bearer "+auth)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec.Code, rec.Body.String()
	}
	if code, _ := call(""); code != http.StatusUnauthorized {
		t.Errorf("no credential = %d", code)
	}
	if code, _ := call("mca_unknown"); code != http.StatusUnauthorized {
		t.Errorf("unknown credential = %d", code)
	}
	code, body := call(reader)
	var refusal api.Error
	json.Unmarshal([]byte(body), &refusal)
	if want := (api.ErrorBody{Code: "forbidden", Message: "reader may not POST /v1/things; it needs operator"}); code != http.StatusForbidden || refusal.Error != want {
		t.Errorf("reader = %d %s, want 403 %+v", code, body, want)
	}
	before := st.views
	for range 3 {
		if code, _ := call(admin); code != http.StatusNoContent {
			t.Fatalf("admin credential = %d", code)
		}
	}
	if st.views-before != 1 {
		t.Errorf("three calls read the store %d times, want once", st.views-before)
	}
	now = now.Add(tokenTTL)
	call(admin)
	if st.views-before != 2 {
		t.Errorf("a cached record outlived its %v", tokenTTL)
	}
	// Removal: once the store has forgotten it and the cache is told, the
	// very next call is refused.
	if err := st.Update(context.Background(), func(tx store.Tx) error { return tx.DeleteToken(HashToken(admin)) }); err != nil {
		t.Fatal(err)
	}
	a.Forget(HashToken(admin))
	if code, _ := call(admin); code != http.StatusUnauthorized {
		t.Errorf("removed credential = %d, want 401", code)
	}
	if code, _ := call(expiring); code != http.StatusNoContent {
		t.Errorf("unexpired credential = %d", code)
	}
	now = soon
	if code, _ := call(expiring); code != http.StatusUnauthorized {
		t.Errorf("expired credential = %d, want 401", code)
	}
}

func TestAccessAllows(t *testing.T) {
	for _, tc := range []struct {
		access Access
		role   Role
		want   bool
	}{
		{Access{Role: RoleReader}, RoleReader, true},
		{Access{Role: RoleSubmitter}, RoleReader, false},
		{Access{Role: RoleOperator}, RoleAdmin, true},
		{Access{Role: RoleAdmin}, RoleOperator, false},
		{Access{Role: RoleReader}, RoleInvoker, false},
		{Access{Role: RoleSubmitter, Invoker: true}, RoleInvoker, true},
		{Access{Role: RoleSubmitter, Invoker: true}, RoleSubmitter, true},
		{Access{Role: RoleSubmitter, Invoker: true}, RoleReader, false},
	} {
		if got := tc.access.Allows(tc.role); got != tc.want {
			t.Errorf("%+v allows %s = %v, want %v", tc.access, tc.role, got, tc.want)
		}
	}
}

func TestConfineToApp(t *testing.T) {
	ctx := func(c Caller) context.Context { return context.WithValue(context.Background(), callerKey{}, c) }
	if err := ConfineToApp(ctx(Caller{Name: "bot", Role: RoleInvoker, App: "demo"}), "demo", false, "invoke"); err != nil {
		t.Errorf("invoker of its own app: %v", err)
	}
	if err := ConfineToApp(ctx(Caller{Name: "bot", Role: RoleInvoker, App: "demo"}), "other", false, "invoke"); !errors.Is(err, failure.ErrForbidden) {
		t.Errorf("invoker of another app: %v, want forbidden", err)
	}
	if err := ConfineToApp(ctx(Caller{}), "demo", false, "invoke"); !errors.Is(err, failure.ErrUnauthorized) {
		t.Errorf("no credential, private trigger: %v, want unauthorized", err)
	}
	if err := ConfineToApp(ctx(Caller{}), "demo", true, "invoke"); err != nil {
		t.Errorf("no credential, public trigger: %v", err)
	}
	if err := ConfineToApp(ctx(Caller{Name: "ci", Role: RoleSubmitter}), "other", false, "invoke"); err != nil {
		t.Errorf("submitter: %v", err)
	}
}

// TestAuditRecordsMutationsAndRefusals: a mutation and a refusal are
// written with who, where and what; a read and a skipped mutation are
// not; a full queue drops and counts.
func TestAuditRecordsMutationsAndRefusals(t *testing.T) {
	st := memstore.New()
	dropped := 0
	a := &Auditor{Store: st, Now: time.Now, Log: slog.New(slog.DiscardHandler), Dropped: func() { dropped++ }}
	mux := http.NewServeMux()
	handle := func(pattern string, code int, skip bool) {
		mux.Handle(pattern, a.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			NoteWho(r.Context(), "ci", "submitter")
			w.WriteHeader(code)
		}), skip))
	}
	handle("POST /v1/runs/{id}/cancel", http.StatusOK, false)
	handle("GET /v1/runs", http.StatusOK, false)
	handle("POST /invoke/{fn_id}", http.StatusOK, true)
	handle("POST /v1/nodes/{id}/drain", http.StatusForbidden, false)
	for _, c := range []struct{ method, path string }{{"POST", "/v1/runs/run-1/cancel"}, {"GET", "/v1/runs"}, {"POST", "/invoke/fn-1"}, {"POST", "/v1/nodes/n1/drain"}} {
		r := httptest.NewRequest(c.method, c.path, strings.NewReader(`{"secret":"s3cret"}`))
		r.RemoteAddr = "192.0.2.7:4000"
		mux.ServeHTTP(httptest.NewRecorder(), r)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	a.Run(ctx) // flushes what is queued
	var got []store.AuditEntry
	st.View(context.Background(), func(tx store.Tx) error { var err error; got, err = tx.ListAudit(store.ListAuditOptions{}); return err })
	if len(got) != 2 {
		t.Fatalf("audit = %+v, want the cancel and the refused drain", got)
	}
	seen := map[string]store.AuditEntry{}
	for _, e := range got {
		seen[e.Route] = e
		if e.Who != "ci" || e.Remote != "192.0.2.7:4000" || strings.Contains(fmt.Sprint(e), "s3cret") {
			t.Errorf("entry %+v", e)
		}
	}
	if e := seen["POST /v1/runs/{id}/cancel"]; e.Object != "run-1" || e.Status != 200 {
		t.Errorf("cancel entry %+v", e)
	}
	if e := seen["POST /v1/nodes/{id}/drain"]; e.Object != "n1" || e.Status != 403 {
		t.Errorf("refused entry %+v", e)
	}
	for range auditQueue + 3 {
		a.Record(store.AuditEntry{Method: "POST"})
	}
	if dropped != 3 {
		t.Errorf("dropped %d, want 3", dropped)
	}
}

// BenchmarkRequireAndAudit is what every public call pays for its
// credential and the audit wrapper: a cached token, a role check, and (for
// an invocation) no audit entry.
func BenchmarkRequireAndAudit(b *testing.B) {
	st := memstore.New()
	now := time.Now()
	a := &Tokens{Store: st, Now: time.Now}
	tok := "mca_" + RandomToken()
	st.Update(context.Background(), func(tx store.Tx) error {
		return tx.CreateToken(store.Token{Hash: HashToken(tok), Name: "ci", Role: string(RoleSubmitter), CreatedAt: now, LastUsedAt: &now})
	})
	aud := &Auditor{Store: st, Now: time.Now, Log: slog.New(slog.DiscardHandler)}
	route := Route{Pattern: "POST /invoke/{fn_id}", Access: Access{Role: RoleSubmitter, Invoker: true}}
	h := aud.Wrap(a.Require(route, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}), func(w http.ResponseWriter, r *http.Request, err error) {}), true)
	r := httptest.NewRequest("POST", "/invoke/fn-1", nil)
	r.Header.Set("Authorization", "Bearer "+tok)
	w := httptest.NewRecorder()
	b.ReportAllocs()
	for b.Loop() {
		h.ServeHTTP(w, r)
	}
}
