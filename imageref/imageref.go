// Package imageref parses, validates and pins container image references.
//
// Images are pulled by manifest digest, never by tag (docs/design.md,
// promise 5). The control plane therefore turns whatever a user submits
// ("hello:1", "127.0.0.1:5000/team/train:v3") into a pinned reference
// ("127.0.0.1:5000/team/train@sha256:…") once, at submit time, with a
// [Resolver], and from then on only the pinned form travels to nodes.
//
// Parsing uses the grammar of github.com/distribution/reference, the same
// package the Docker daemon uses, so a reference Parse accepts is one the
// daemon parses identically (go-containerregistry's name package is looser:
// it would read "localhost/hello" as a Docker Hub repository and accepts
// repository paths such as "a..b"). Resolving uses go-containerregistry's
// remote package, which speaks the registry protocol, token auth included.
//
// Short names are normalised the way Docker does it: "hello" is
// "docker.io/library/hello:latest". That is fine for parsing, but note that
// Mercator machines often have no route to Docker Hub; the examples in error
// messages point at a registry by host.
//
// The control plane (API validation, submit) and the node agent (to check what
// it was told to pull) import this package; it imports nothing of Mercator's
// but package failure.
package imageref

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"unicode"

	"github.com/distribution/reference"
	"github.com/mercator/mercator/failure"
	"github.com/opencontainers/go-digest"
)

// Field is the request field errors from this package concern.
const Field = "image"

// The examples shown in error messages: one by tag, one pinned.
const (
	exampleTagged = "127.0.0.1:5000/hello:1"
	examplePinned = "registry.example.com/team/train@sha256:<64 hex digits>"
)

// Ref is a parsed, valid image reference. The zero Ref is not valid; every
// accessor returns "" for it and Pinned reports false. Ref is a small value,
// comparable with ==, and safe to copy and share.
type Ref struct {
	registry   string
	repository string
	tag        string
	digest     string
}

// Parse validates s and returns it as a Ref.
//
// s must be a reference the Docker daemon accepts: [registry/]repository
// followed by ":tag", "@sha256:<64 lowercase hex digits>", or both. A missing
// registry means Docker Hub ("docker.io", with "library/" prefixed to one-part
// names); a missing tag and digest means the tag "latest". Only sha256 digests
// are accepted, because that is what registries and the daemon use for
// manifests. Leading or trailing spaces are not trimmed: they are an error.
//
// A bad s yields a failure.Invalid error for the field "image" whose message
// says what is wrong and shows a valid example.
func Parse(s string) (Ref, error) {
	if s == "" {
		return Ref{}, invalid(s, "the reference is empty")
	}
	if i := strings.IndexFunc(s, unicode.IsSpace); i >= 0 {
		return Ref{}, invalid(s, "it contains whitespace at byte %d", i)
	}
	named, err := reference.ParseNormalizedNamed(s)
	if err != nil {
		return Ref{}, invalid(s, "%s", explain(s, err))
	}
	r := Ref{
		registry:   reference.Domain(named),
		repository: reference.Path(named),
	}
	if r.registry == "" {
		// The reference package reads a first part with a '.' or ':' as a
		// registry host, and one that is no valid host name then parses
		// as a path without a registry (found by FuzzParse: "0.0_0/00").
		host, _, _ := strings.Cut(s, "/")
		return Ref{}, invalid(s, "%q reads as a registry host (it has a '.' or ':') but is not a valid host name", host)
	}
	if t, ok := named.(reference.Tagged); ok {
		r.tag = t.Tag()
	}
	if d, ok := named.(reference.Digested); ok {
		dg := d.Digest()
		if dg.Algorithm() != digest.SHA256 {
			return Ref{}, invalid(s, "the digest uses %q; only sha256 manifest digests are supported", dg.Algorithm())
		}
		r.digest = dg.String()
	}
	if r.tag == "" && r.digest == "" {
		r.tag = "latest"
	}
	return r, nil
}

// explain turns a reference package error into a sentence for a person.
func explain(s string, err error) string {
	switch {
	case errors.Is(err, reference.ErrNameContainsUppercase) || strings.Contains(err.Error(), "must be lowercase"):
		return "the repository name must be lowercase (tags may contain uppercase letters)"
	case errors.Is(err, digest.ErrDigestInvalidFormat) || errors.Is(err, digest.ErrDigestInvalidLength) ||
		errors.Is(err, digest.ErrDigestUnsupported) || errors.Is(err, reference.ErrDigestInvalidFormat):
		return "the digest is malformed (" + err.Error() + "); a digest is \"sha256:\" followed by 64 lowercase hex digits"
	case errors.Is(err, reference.ErrTagInvalidFormat):
		return "the tag is malformed; a tag is up to 128 letters, digits, '_', '.' or '-', not starting with '.' or '-'"
	case errors.Is(err, reference.ErrNameTooLong):
		return "the repository name is longer than 255 characters"
	case errors.Is(err, reference.ErrNameEmpty):
		return "the repository name is missing"
	}
	return diagnose(s, err)
}

// diagnose finds the part of s that the grammar rejected, for errors the
// reference package reports only as "invalid reference format".
func diagnose(s string, err error) string {
	if anchoredHex64.MatchString(s) {
		return "a bare 64-hex-digit string is an image ID, not a reference; name the image by repository and digest instead"
	}
	if strings.Contains(s, "://") {
		return "drop the URL scheme: a reference starts with the registry host, not with http:// or https://"
	}
	rest := s
	if i := strings.LastIndex(rest, "@"); i >= 0 {
		if _, derr := digest.Parse(rest[i+1:]); derr != nil {
			return "the digest is malformed (" + derr.Error() + "); a digest is \"sha256:\" followed by 64 lowercase hex digits"
		}
		rest = rest[:i]
	}
	if i := strings.LastIndex(rest, ":"); i >= 0 && !strings.Contains(rest[i+1:], "/") {
		tag := rest[i+1:]
		if !anchoredTag.MatchString(tag) {
			return fmt.Sprintf("the tag %q is malformed; a tag is 1 to 128 letters, digits, '_', '.' or '-', not starting with '.' or '-'", tag)
		}
		rest = rest[:i]
	}
	if _, nerr := reference.ParseNormalizedNamed(rest); nerr != nil || rest == "" {
		return fmt.Sprintf("the repository name %q is malformed; it is path components of lowercase letters and digits, "+
			"joined inside by single '.', '_', '__' or '-', separated by '/', after an optional registry host[:port]", rest)
	}
	return err.Error()
}

var (
	anchoredTag   = regexp.MustCompile(`^` + reference.TagRegexp.String() + `$`)
	anchoredHex64 = regexp.MustCompile(`^[a-f0-9]{64}$`)
)

func invalid(s, format string, args ...any) error {
	args = append([]any{s}, args...)
	return failure.Invalid(Field, "%q is not a valid image reference: "+format+
		"; write it as registry/repository:tag or registry/repository@sha256:<digest>, for example "+
		exampleTagged+" or "+examplePinned, args...)
}

// Registry is the registry host, with its port when one was given:
// "127.0.0.1:5000", "registry.example.com", or "docker.io" for Docker Hub.
// It is the key credential lookups use.
func (r Ref) Registry() string { return r.registry }

// Repository is the repository path within the registry: "hello",
// "team/train", or "library/ubuntu" for Docker Hub's official images.
func (r Ref) Repository() string { return r.repository }

// Name is Registry()/Repository(), the reference without tag or digest.
func (r Ref) Name() string {
	if r.registry == "" {
		return ""
	}
	return r.registry + "/" + r.repository
}

// Tag is the tag, or "" when the reference has only a digest. A reference
// written with neither has the tag "latest".
func (r Ref) Tag() string { return r.tag }

// Digest is the manifest digest ("sha256:…"), or "" when the reference is not
// pinned.
func (r Ref) Digest() string { return r.digest }

// Pinned reports whether the reference names a manifest by digest. A pinned
// reference may also carry a tag; the digest is what counts (the daemon
// ignores the tag of such a reference too).
func (r Ref) Pinned() bool { return r.digest != "" }

// String is the fully qualified reference, registry always included:
// "127.0.0.1:5000/hello:1", "docker.io/library/ubuntu:latest",
// "127.0.0.1:5000/hello@sha256:…", or with both tag and digest when both were
// given. Parse(r.String()) returns r. The zero Ref gives "".
func (r Ref) String() string {
	s := r.Name()
	if s == "" {
		return ""
	}
	if r.tag != "" {
		s += ":" + r.tag
	}
	if r.digest != "" {
		s += "@" + r.digest
	}
	return s
}

// MarshalText returns String(), so a Ref travels in JSON as a string.
func (r Ref) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalText parses text with Parse and fails the same way.
func (r *Ref) UnmarshalText(text []byte) error {
	p, err := Parse(string(text))
	if err != nil {
		return err
	}
	*r = p
	return nil
}

// withDigest is r pinned to d, tag dropped.
func (r Ref) withDigest(d string) Ref {
	return Ref{registry: r.registry, repository: r.repository, digest: d}
}
