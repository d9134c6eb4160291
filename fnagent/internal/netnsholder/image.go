package netnsholder

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/api/types/image"
	"github.com/docker/docker/client"

	"github.com/mercator/mercator/dockerengine"
)

// Repository is the holder image's name; its tag is the first 12 hex
// digits of the SHA-256 of its root filesystem and its entry point, so a
// changed program is a new tag and an unchanged one is reused.
const Repository = "mercator/netns-holder"

// entrypoint is the image's one configuration change (a Dockerfile
// instruction, as the Engine API's import takes them).
const entrypoint = `ENTRYPOINT ["/hold"]`

// Rootfs is a root filesystem of one file, /hold, the executable program,
// as a tar stream. The same program always gives the same bytes (no
// timestamps of now, no owner of this machine), so Ref is stable.
func Rootfs(program []byte) []byte {
	var b bytes.Buffer
	w := tar.NewWriter(&b)
	// Writes to a bytes.Buffer cannot fail, nor a header of these fields.
	_ = w.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "hold", Mode: 0o555, Size: int64(len(program)),
		ModTime: time.Unix(0, 0), Format: tar.FormatUSTAR})
	_, _ = w.Write(program)
	_ = w.Close()
	return b.Bytes()
}

// Ref is the image reference, Repository:<hash>, of rootfs with the
// holder's entry point.
func Ref(rootfs []byte) string {
	h := sha256.New()
	h.Write(rootfs)
	h.Write([]byte(entrypoint))
	return Repository + ":" + hex.EncodeToString(h.Sum(nil))[:12]
}

// ImageAPI is what Ensure asks of the daemon.
type ImageAPI interface {
	dockerengine.Importer
	ImageInspect(ctx context.Context, imageID string, options ...client.ImageInspectOption) (image.InspectResponse, error)
	ImageList(ctx context.Context, options image.ListOptions) ([]image.Summary, error)
	ImageRemove(ctx context.Context, imageID string, options image.RemoveOptions) ([]image.DeleteResponse, error)
}

// Ensure makes the daemon hold the holder image for goarch and returns its
// reference. An image already there under the reference is used as it is;
// otherwise it is imported (nothing is pulled: a node may reach no
// registry), and other tags of Repository, which earlier programs left,
// are removed where no container uses them: that is the image's retention,
// one per program, the current one kept. Errors are ErrUnsupportedArch,
// and the daemon's, wrapped. Callers serialize their calls: two imports
// at once would each make an image and leave one untagged.
func Ensure(ctx context.Context, api ImageAPI, goarch string) (string, error) {
	program, err := Program(goarch)
	if err != nil {
		return "", err
	}
	rootfs := Rootfs(program)
	ref := Ref(rootfs)
	if _, err := api.ImageInspect(ctx, ref); err == nil {
		return ref, nil
	} else if !cerrdefs.IsNotFound(err) {
		return "", fmt.Errorf("inspect the holder image %s: %w", ref, err)
	}
	if err := dockerengine.Import(ctx, api, bytes.NewReader(rootfs), ref, []string{entrypoint}); err != nil {
		return "", fmt.Errorf("import the holder image %s: %w", ref, err)
	}
	if _, err := api.ImageInspect(ctx, ref); err != nil {
		return "", fmt.Errorf("the daemon reported the holder image %s imported but does not hold it: %w", ref, err)
	}
	removeStale(ctx, api, ref)
	return ref, nil
}

// removeStale removes the tags of Repository other than ref. It is best
// effort: an image a container still uses stays, to go at a later import.
func removeStale(ctx context.Context, api ImageAPI, ref string) {
	list, err := api.ImageList(ctx, image.ListOptions{Filters: filters.NewArgs(filters.Arg("reference", Repository))})
	if err != nil {
		return
	}
	for _, img := range list {
		for _, tag := range img.RepoTags {
			if tag != ref && strings.HasPrefix(tag, Repository+":") {
				_, _ = api.ImageRemove(ctx, tag, image.RemoveOptions{})
			}
		}
	}
}
