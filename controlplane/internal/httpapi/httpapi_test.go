package httpapi

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/memstore"
)

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
		t.Run(tc.name, func(t *testing.T) {
			var v body
			err := Decode(httptest.NewRequest("POST", "/", strings.NewReader(tc.body)), tc.limit, &v)
			if tc.ok {
				if err != nil {
					t.Fatalf("Decode = %v", err)
				}
				return
			}
			var fe *failure.Error
			if !errors.As(err, &fe) || !errors.Is(err, failure.ErrInvalid) || fe.Field != tc.field {
				t.Fatalf("Decode = %#v, want invalid on field %q", err, tc.field)
			}
		})
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

func TestAdminCachesPositiveAnswers(t *testing.T) {
	st := &countingStore{Store: memstore.New()}
	now := time.Unix(1000, 0)
	a := &Admin{Store: st, Now: func() time.Time { return now }}
	tok := "mca_" + RandomToken()
	if err := st.Update(context.Background(), func(tx store.Tx) error {
		return tx.CreateToken(store.Token{Hash: HashToken(tok), Name: "admin", CreatedAt: now})
	}); err != nil {
		t.Fatal(err)
	}
	h := a.Require(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) },
		func(w http.ResponseWriter, r *http.Request, err error) { WriteError(w, err) })
	call := func(auth string) int {
		r := httptest.NewRequest("GET", "/", nil)
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec.Code
	}
	if code := call(""); code != http.StatusUnauthorized {
		t.Errorf("no credential = %d", code)
	}
	if code := call("Bearer mca_unknown"); code != http.StatusUnauthorized {
		t.Errorf("unknown credential = %d", code)
	}
	before := st.views
	for range 3 {
		if code := call("Bearer " + tok); code != http.StatusNoContent {
			t.Fatalf("admin credential = %d", code)
		}
	}
	if st.views-before != 1 {
		t.Errorf("three calls read the store %d times, want once", st.views-before)
	}
	now = now.Add(adminTTL)
	call("Bearer " + tok)
	if st.views-before != 2 {
		t.Errorf("a cached answer outlived its %v", adminTTL)
	}
}
