package controlplane

import (
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/mercator/mercator/controlplane/internal/limits"
	"github.com/mercator/mercator/store/memstore"
)

// TestEveryLimitClassNamesARoute: every pattern package limits gives a
// class other than the default is a route this server serves (a renamed
// route would otherwise fall back to the default class without a word).
func TestEveryLimitClassNamesARoute(t *testing.T) {
	h := New(Config{}, memstore.New(), nil, nil).Handler()
	wildcard := regexp.MustCompile(`\{[^}]*\}`)
	for _, p := range limits.Classified() {
		method, path, _ := strings.Cut(p, " ")
		req := httptest.NewRequest(method, wildcard.ReplaceAllString(path, "x"), nil)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code == http.StatusNotFound && strings.Contains(rec.Body.String(), "no route") {
			t.Errorf("limits classify %q, which this server does not serve", p)
		}
	}
}
