package imageref

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/mercator/mercator/failure"
)

const hex64 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestParseValid(t *testing.T) {
	for _, tc := range []struct {
		in                          string
		registry, repo, tag, digest string
		str                         string
	}{
		{"127.0.0.1:5000/hello:1", "127.0.0.1:5000", "hello", "1", "", "127.0.0.1:5000/hello:1"},
		{"hello", "docker.io", "library/hello", "latest", "", "docker.io/library/hello:latest"},
		{"team/train:V1", "docker.io", "team/train", "V1", "", "docker.io/team/train:V1"},
		{"localhost/hello", "localhost", "hello", "latest", "", "localhost/hello:latest"},
		{"localhost:5000/a/b:v1.2-rc_3", "localhost:5000", "a/b", "v1.2-rc_3", "", "localhost:5000/a/b:v1.2-rc_3"},
		{"[::1]:5000/hello:1", "[::1]:5000", "hello", "1", "", "[::1]:5000/hello:1"},
		{"registry.example.com/team/train@sha256:" + hex64, "registry.example.com", "team/train", "", "sha256:" + hex64,
			"registry.example.com/team/train@sha256:" + hex64},
		{"registry.example.com/x:t@sha256:" + hex64, "registry.example.com", "x", "t", "sha256:" + hex64,
			"registry.example.com/x:t@sha256:" + hex64},
	} {
		r, err := Parse(tc.in)
		if err != nil {
			t.Errorf("Parse(%q): %v", tc.in, err)
			continue
		}
		if r.Registry() != tc.registry || r.Repository() != tc.repo || r.Tag() != tc.tag || r.Digest() != tc.digest {
			t.Errorf("Parse(%q) = registry %q repo %q tag %q digest %q; want %q %q %q %q", tc.in,
				r.Registry(), r.Repository(), r.Tag(), r.Digest(), tc.registry, tc.repo, tc.tag, tc.digest)
		}
		if r.Pinned() != (tc.digest != "") {
			t.Errorf("Parse(%q).Pinned() = %v", tc.in, r.Pinned())
		}
		if r.String() != tc.str {
			t.Errorf("Parse(%q).String() = %q, want %q", tc.in, r.String(), tc.str)
		}
		again, err := Parse(r.String())
		if err != nil || again != r {
			t.Errorf("Parse(String()) of %q = %v, %v; want the same Ref", tc.in, again, err)
		}
	}
}

func TestParseInvalid(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string // part of the message
	}{
		{"", "empty"},
		{" hello:1", "whitespace"},
		{"hello:1 ", "whitespace"},
		{"hello world", "whitespace"},
		{"hello\t:1", "whitespace"},
		{"Hello", "lowercase"},
		{"127.0.0.1:5000/Hello:1", "lowercase"},
		{"127.0.0.1:5000/team/Train:1", "lowercase"},
		{"hello:", "tag"},
		{"hello::1", "repository name"},
		{"hello:-bad", "tag \"-bad\""},
		{"hello:" + strings.Repeat("a", 129), "tag"},
		{"a..b:1", "repository name \"a..b\""},
		{"a//b:1", "repository name"},
		{"/hello:1", "repository name"},
		{"hello@sha256:abc", "digest"},
		{"hello@sha256:" + hex64[:63], "digest"},
		{"hello@sha256:" + strings.ToUpper(hex64), "digest"},
		{"hello@sha256:" + hex64 + "0", "digest"},
		{"hello@md5:" + hex64, "digest"},
		{"hello@sha512:" + hex64 + hex64, "sha256"},
		{"hello@", "digest"},
		{hex64, "image id"},
		{"http://127.0.0.1:5000/hello:1", "url scheme"},
		{"0.0_0/00", "registry host"},
		{"my_registry.example:5000/hello:1", "registry host"},
	} {
		_, err := Parse(tc.in)
		if err == nil {
			t.Errorf("Parse(%q) succeeded, want an error", tc.in)
			continue
		}
		if !errors.Is(err, failure.ErrInvalid) {
			t.Errorf("Parse(%q) = %v, want kind invalid", tc.in, err)
		}
		var fe *failure.Error
		if !errors.As(err, &fe) || fe.Field != "image" {
			t.Errorf("Parse(%q) = %#v, want a failure.Error for field image", tc.in, err)
		}
		msg := err.Error()
		if !strings.Contains(strings.ToLower(msg), tc.want) {
			t.Errorf("Parse(%q) message %q does not mention %q", tc.in, msg, tc.want)
		}
		if !strings.Contains(msg, "127.0.0.1:5000/hello:1") || !strings.Contains(msg, "@sha256:") {
			t.Errorf("Parse(%q) message %q shows no valid example", tc.in, msg)
		}
	}
}

func TestZeroRef(t *testing.T) {
	var r Ref
	if r.String() != "" || r.Name() != "" || r.Pinned() {
		t.Fatalf("zero Ref: String %q Name %q Pinned %v", r.String(), r.Name(), r.Pinned())
	}
}

func TestRefJSON(t *testing.T) {
	in := struct{ Image Ref }{}
	if err := json.Unmarshal([]byte(`{"Image":"127.0.0.1:5000/hello:1"}`), &in); err != nil {
		t.Fatal(err)
	}
	out, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if string(out) != `{"Image":"127.0.0.1:5000/hello:1"}` {
		t.Fatalf("round trip gave %s", out)
	}
	err = json.Unmarshal([]byte(`{"Image":"Bad Ref"}`), &in)
	if !errors.Is(err, failure.ErrInvalid) {
		t.Fatalf("unmarshalling a bad reference: %v, want kind invalid", err)
	}
}
