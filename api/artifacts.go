package api

import (
	"fmt"
	"hash"
	"hash/crc32"
	"regexp"
	"time"
)

// Artifact formats: how a version's bytes are laid out when a node mounts
// them.
const (
	// ArtifactFile is one file, mounted at the run's mount path as that
	// file.
	ArtifactFile = "file"
	// ArtifactTar is a directory, pushed as one uncompressed POSIX tar
	// stream of its regular files and directories (sorted by path, with
	// modes kept and owners and times zeroed, so the same tree always
	// makes the same bytes and therefore the same version), and mounted at
	// the run's mount path as that directory.
	ArtifactTar = "tar"
)

// ArtifactVersion is one immutable version of an Artifact: a name, a version
// the control plane assigned (v1, v2, … per name), and the exact content,
// by SHA-256 and size. A version never changes; pushing the same content
// under the same name again returns the existing version.
type ArtifactVersion struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	// SHA256 is the content's digest, 64 lowercase hex digits, computed by
	// the control plane over the bytes it received.
	SHA256 string `json:"sha256"`
	// Size is the content's length in bytes.
	Size int64 `json:"size"`
	// Format is ArtifactFile or ArtifactTar.
	Format    string    `json:"format"`
	CreatedAt time.Time `json:"created_at"`
	// Project is the project the name belongs to (docs/teams.md): the one
	// its first version was pushed to; "" in records written before names
	// belonged to projects, read as DefaultProject.
	Project string `json:"project,omitempty"`
}

// Ref is the version's reference, NAME@VERSION.
func (v ArtifactVersion) Ref() string { return v.Name + "@" + v.Version }

// ArtifactList is the body of GET /v1/artifacts.
type ArtifactList struct {
	Artifacts []ArtifactVersion `json:"artifacts"`
}

// UploadRequest is the body of POST /v1/artifacts/{name}/uploads: the start
// of an upload of one version's content.
type UploadRequest struct {
	// Size is the exact length of the content that will be sent.
	Size int64 `json:"size"`
	// SHA256, when set, is the client's digest of the content, known
	// before it is sent: when the control plane already holds this content
	// under the name, the upload is answered at once with the existing
	// version, and otherwise the commit is refused unless the server's own
	// digest of what it received matches. A client that hashes as it sends
	// leaves it empty and states its check at the commit instead
	// (CommitRequest).
	SHA256 string `json:"sha256,omitempty"`
	// Format is ArtifactFile (the default) or ArtifactTar.
	Format string `json:"format,omitempty"`
	// Project is the project the name belongs to (docs/teams.md): "" is
	// the caller's (its token's first project, or DefaultProject). A name
	// is one project's: its first version decides which.
	Project string `json:"project,omitempty"`
}

// Upload is an upload in progress. Content is sent with
// PUT /v1/uploads/{id}?offset=N, each body appended at N, which must be
// Received; an interrupted upload resumes from Received (GET
// /v1/uploads/{id} says where it stands). POST /v1/uploads/{id}/commit
// (with a CommitRequest) verifies and stores it.
type Upload struct {
	ID       string `json:"id"`
	Name     string `json:"name"`
	Size     int64  `json:"size"`
	Received int64  `json:"received"`
	SHA256   string `json:"sha256,omitempty"`
	Format   string `json:"format"`
	// ExpiresAt is when an upload that was not committed is discarded.
	ExpiresAt time.Time `json:"expires_at"`
	// Existing is set, and nothing needs sending, when the control plane
	// already holds this exact content under this name.
	Existing *ArtifactVersion `json:"existing,omitempty"`
}

// CommitRequest is the body of POST /v1/uploads/{id}/commit: the client's
// check of the content it sent. A client that hashes the bytes as they go
// out knows its check only once the body is done, so it states it here,
// and the control plane compares it with its own over what it received:
// the version is added only when the two agree, and on a mismatch the
// upload is discarded and nothing is created. The body may be omitted
// when the upload was started with UploadRequest.SHA256; whatever is
// stated, there and here, must all match. An upload with no client check
// at all is not committed: no version is stored on the control plane's
// word alone.
//
// The check is either the client's SHA-256 or its CRC-32C. The version's
// identity is always the control plane's own SHA-256 of what it stored
// (ArtifactVersion.SHA256); the client's check exists only to show, end to
// end, that what was stored is what the client read, against accidental
// damage (a broken disk or transfer, a file changed during the push), not
// against a forger. A CRC-32C does that for a fraction of the CPU: with
// the CPU's instruction it runs at many GB/s a core, where SHA-256 runs at
// 1–2 GB/s, and on a machine that is both client and control plane the
// client's SHA-256 was nearly a third of the push's CPU. A client that knows its
// SHA-256 anyway (it hashed the content first to ask whether the name
// already has it) states that instead.
type CommitRequest struct {
	// SHA256 is the client's SHA-256 of the content, 64 lowercase hex
	// digits.
	SHA256 string `json:"sha256,omitempty"`
	// CRC32C is the client's CRC-32C (Castagnoli) of the content it sent:
	// 8 lowercase hex digits, most significant first (FormatCRC32C of
	// NewCRC32C's Sum32).
	CRC32C string `json:"crc32c,omitempty"`
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// NewCRC32C returns a hash computing CommitRequest.CRC32C: CRC-32C, the
// Castagnoli polynomial, which hash/crc32 computes with the CPU's own
// instruction where it has one. Its Sum is the four bytes most significant
// first; its state can be saved and restored (encoding.BinaryMarshaler),
// so a resumed push need not reread everything it sent.
func NewCRC32C() hash.Hash32 { return crc32.New(castagnoli) }

// FormatCRC32C spells a CRC-32C as the API does: 8 lowercase hex digits.
func FormatCRC32C(sum uint32) string { return fmt.Sprintf("%08x", sum) }

var crc32cPattern = regexp.MustCompile(`^[0-9a-f]{8}$`)

// ValidCRC32C reports whether s is spelled as FormatCRC32C spells one.
func ValidCRC32C(s string) bool { return crc32cPattern.MatchString(s) }

// ArtifactMount is one Artifact version a run reads, in RunSpec.
type ArtifactMount struct {
	Name string `json:"name"`
	// Version is v1, v2, …; empty means the newest version at submit, and
	// the stored run names the version it resolved to.
	Version string `json:"version,omitempty"`
	// MountPath is where the content appears, read-only, in the container:
	// an absolute path, not "/", without ".." elements, unique in the run.
	MountPath string `json:"mount_path"`
	// MinReadBytesPerSecond, when positive, is the slowest rate at which
	// the run accepts its node to copy this content: nodes whose measured
	// (or, unmeasured, assumed) artifact-copy floor is lower are not
	// considered.
	MinReadBytesPerSecond int64 `json:"min_read_bytes_per_second,omitempty"`
	// SHA256 is the version's content digest, filled in by the control
	// plane at submit; a client that states one has its run refused unless
	// the version has exactly that content.
	SHA256 string `json:"sha256,omitempty"`
}

// RegistryCredentialRequest is the body of POST /v1/registries: a
// credential for one registry host. The password is stored encrypted and
// never returned by any route.
type RegistryCredentialRequest struct {
	// Host is the registry as image references name it ("ghcr.io",
	// "127.0.0.1:5000"); docker.io's images use "docker.io".
	Host     string `json:"host"`
	Username string `json:"username"`
	Password string `json:"password"`
	// Project is the project whose runs and functions pull with it
	// (docs/teams.md); "" is the caller's (its token's first project, or
	// DefaultProject).
	Project string `json:"project,omitempty"`
}

// Registry is a stored registry credential as the API shows it: never the
// password.
type Registry struct {
	Project   string    `json:"project"`
	Host      string    `json:"host"`
	Username  string    `json:"username"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// RegistryList is the body of GET /v1/registries.
type RegistryList struct {
	Registries []Registry `json:"registries"`
}
