package imageref

import (
	"errors"
	"strings"
	"testing"

	"github.com/mercator/mercator/failure"
)

// FuzzParse: whatever a user writes as an image, Parse answers a valid
// Ref or an invalid-kind error for the field "image", never a panic; a Ref
// prints as a reference that parses back to the same Ref.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"127.0.0.1:5000/hello:1",
		"hello",
		"registry.example.com/team/train@sha256:" + strings.Repeat("a", 64),
		"localhost:5000/a/b:t@sha256:" + strings.Repeat("0", 64),
		"UPPER/case", "a@sha512:" + strings.Repeat("1", 128), "a:", ":tag", "a b", "[::1]:5000/x", "a//b", "x@sha256:short",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := Parse(s)
		if err != nil {
			if !errors.Is(err, failure.ErrInvalid) {
				t.Fatalf("Parse(%q): %v, not an invalid-kind error", s, err)
			}
			return
		}
		if r.Repository() == "" || r.Registry() == "" || (r.Tag() == "" && r.Digest() == "") {
			t.Fatalf("Parse(%q) = %#v, an incomplete Ref", s, r)
		}
		back, err := Parse(r.String())
		if err != nil || back != r {
			t.Fatalf("Parse(%q) = %q, which parses as %#v, %v", s, r.String(), back, err)
		}
	})
}
