package cli

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/cli/command"
	"github.com/mercator/mercator/client"
	"github.com/mercator/mercator/internal/bytesize"
	"github.com/mercator/mercator/internal/termtext"
)

// This file holds `mercator artifact …`: pushing immutable versions and
// reading the catalog, and the --artifact flag of `run submit`.
//
// A directory is pushed as one archive: an uncompressed tar of its regular
// files and directories, sorted by path, with modes kept and owners and
// times zeroed, so the same tree always makes the same bytes, and pushing
// it again is the same version. Symbolic links and special files are
// refused rather than silently dropped.

const artifactSummary = "Push immutable Artifact versions and list them"

func init() {
	registerSub("artifact", artifactSummary, &command.Command{Name: "push", Summary: "Upload a file or directory as an Artifact version and print NAME@VERSION", Run: artifactPush})
	registerSub("artifact", artifactSummary, &command.Command{Name: "ls", Summary: "List Artifact versions", Run: artifactList})
	registerSub("artifact", artifactSummary, &command.Command{Name: "get", Summary: "Show one Artifact version (NAME or NAME@VERSION)", Run: artifactGet})
}

func artifactPush(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("[flags] NAME PATH", `
Upload a file, or a directory (as one deterministic tar archive), as a new
immutable version of the Artifact NAME, and print its reference,
NAME@VERSION, alone on stdout:

    ref=$(mercator artifact push weights ./model.safetensors)

The content is checked here as it is sent (CRC-32C) and again by the control
plane as it arrives, which refuses it unless both agree; the version is known
by the control plane's SHA-256 of it. A file is handed to the kernel to send
(sendfile, over plain HTTP on Linux) and checked by a read alongside; a
directory's tar is generated once per send and checked as it goes. Pushing
content the name already has prints the existing version: when the name has
a version of the same size, the content's SHA-256 is computed first and
nothing is sent if it is that version. An interrupted push resumes where it
stopped, within the run and across runs of this command (the upload's ID is
kept in the CLI's configuration directory). Progress goes to stderr when it
is a terminal. A name belongs to the project its first version was pushed
to; later versions go to the same one.`)
	g := fs.ClientFlags(true)
	project := projectFlag(fs, "the name belongs to")
	pos, err := fs.Parse(args)
	if err != nil {
		return err
	}
	if err := g.Check(); err != nil {
		return err
	}
	if len(pos) != 2 {
		return command.Usagef("want NAME and PATH, got %d argument(s)", len(pos))
	}
	name, src := pos[0], pos[1]
	if strings.ContainsAny(name, "@:/ ") || name == "" {
		return command.Usagef("artifact name %q must not contain '@', ':', '/' or spaces", name)
	}
	fi, err := os.Stat(src)
	if err != nil {
		return err
	}
	var payload client.Payload
	if fi.IsDir() {
		payload, err = dirPayload(src)
	} else if fi.Mode().IsRegular() {
		payload = client.FilePayload(src, fi)
	} else {
		return fmt.Errorf("%s is neither a regular file nor a directory", src)
	}
	if err != nil {
		return err
	}
	c, err := inv.Client(g)
	if err != nil {
		return err
	}
	resume := newUploadMemory(inv)
	key, err := uploadKey(name, src, fi, payload.Size)
	if err != nil {
		return err
	}
	opts := client.PushOptions{
		Project:  projectOr(c, *project),
		UploadID: resume.get(key),
		Started:  func(id string) { resume.put(key, id) },
	}
	if inv.StderrIsTerminal() {
		// The rate is of this run's sending: a resumed push's first report
		// is where it resumed, which this run did not send.
		var from int64
		var start time.Time
		opts.Progress = func(sent, total int64) {
			if start.IsZero() {
				from, start = sent, time.Now()
			}
			rate := ""
			if secs := time.Since(start).Seconds(); secs > 0.05 {
				rate = " " + bytesize.Format(int64(float64(sent-from)/secs)) + "/s"
			}
			pct := 100.0
			if total > 0 {
				pct = 100 * float64(sent) / float64(total)
			}
			termtext.Fprintf(inv.Stderr, "\rpushing %s: %s / %s (%.0f%%)%s   ", name, bytesize.Format(sent), bytesize.Format(total), pct, rate)
		}
	}
	v, err := c.PushArtifact(ctx, name, payload, opts)
	if opts.Progress != nil {
		termtext.Fprintln(inv.Stderr)
	}
	if err != nil {
		return err
	}
	resume.put(key, "")
	if g.JSON() {
		return inv.WriteJSON(v)
	}
	_, err = termtext.Fprintln(inv.Stdout, v.Ref())
	return err
}

// dirPayload describes a directory's deterministic tar: it is generated
// once, without a check, to learn its size, and again for each send (which
// checks it as it goes). Each generation ends by checking that the tree
// still looks as it did before the first (treeState), so a tree changed
// during a push, or between a broken send and its resumption, is refused
// rather than pushed as a mixture of its states.
func dirPayload(dir string) (client.Payload, error) {
	before, err := treeState(dir)
	if err != nil {
		return client.Payload{}, err
	}
	generate := func(w io.Writer) error {
		if err := writeTree(dir, w); err != nil {
			return err
		}
		if now, err := treeState(dir); err != nil || now != before {
			return fmt.Errorf("%s changed while it was pushed; push it again once it is complete", dir)
		}
		return nil
	}
	counter := &countingWriter{w: io.Discard}
	if err := generate(counter); err != nil {
		return client.Payload{}, err
	}
	return client.Payload{Size: counter.n, Format: api.ArtifactTar,
		Open: func(offset int64) (io.ReadCloser, error) {
			pr, pw := io.Pipe()
			go func() { pw.CloseWithError(generate(pw)) }()
			if _, err := io.CopyN(io.Discard, pr, offset); err != nil {
				pr.Close()
				return nil, err
			}
			return pr, nil
		}}, nil
}

// treeState is a digest of what a directory's archive is made from: every
// entry's path, type, mode, size and modification time.
func treeState(dir string) (string, error) {
	h := sha256.New()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%q %v %d %d\n", p, info.Mode(), info.Size(), info.ModTime().UnixNano())
		return nil
	})
	return hex.EncodeToString(h.Sum(nil)), err
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// writeTree writes dir as the deterministic tar described in this file's
// comment.
func writeTree(dir string, w io.Writer) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		name := filepath.ToSlash(rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		h := &tar.Header{Name: name, Mode: int64(info.Mode().Perm()), ModTime: time.Unix(0, 0)}
		switch {
		case d.IsDir():
			h.Typeflag, h.Name = tar.TypeDir, name+"/"
		case info.Mode().IsRegular():
			h.Typeflag, h.Size = tar.TypeReg, info.Size()
		default:
			return fmt.Errorf("%s is a %s; an artifact holds regular files and directories only", p, info.Mode().Type())
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if h.Typeflag != tar.TypeReg {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		n, err := io.Copy(tw, f)
		if err != nil {
			return err
		}
		// A file rewritten in place keeps its size; its time tells.
		after, err := f.Stat()
		if err == nil && (n != h.Size || after.Size() != h.Size || !after.ModTime().Equal(info.ModTime())) {
			err = fmt.Errorf("%s changed while it was read; push again once it is complete", p)
		}
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

func artifactList(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("[flags] [NAME]", `
List Artifact versions, by name and then oldest first; with NAME, only its
versions. Without --project (or a project in the context), every project's
the token may see.`)
	g := fs.ClientFlags(true)
	project := projectFlag(fs, "whose names to list")
	name := ""
	c, err := inv.ConnectWith(fs, g, args, func(pos []string) error {
		if len(pos) > 1 {
			return command.Usagef("want at most one NAME, got %d arguments", len(pos))
		}
		if len(pos) == 1 {
			name = pos[0]
		}
		return nil
	})
	if err != nil {
		return err
	}
	list, err := c.ListArtifactsOf(ctx, projectOr(c, *project), name)
	if err != nil {
		return err
	}
	if g.JSON() {
		return inv.WriteJSON(list)
	}
	tw := tabwriter.NewWriter(inv.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "REFERENCE\tPROJECT\tSIZE\tFORMAT\tSHA256\tCREATED")
	for _, v := range list.Artifacts {
		created := v.CreatedAt
		termtext.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", v.Ref(), api.ProjectOf(v.Project), bytesize.Format(v.Size), v.Format, v.SHA256[:min(12, len(v.SHA256))], command.FormatTime(&created))
	}
	return tw.Flush()
}

func artifactGet(ctx context.Context, inv *command.Invocation, args []string) error {
	fs := inv.Flags("[flags] NAME[@VERSION]", `
Show one Artifact version; without @VERSION, the newest.`)
	g := fs.ClientFlags(true)
	c, ref, err := inv.Connect(fs, g, args, "NAME[@VERSION]")
	if err != nil {
		return err
	}
	name, version, _ := strings.Cut(ref, "@")
	v, err := c.GetArtifact(ctx, name, version)
	if err != nil {
		return err
	}
	if g.JSON() {
		return inv.WriteJSON(v)
	}
	tw := tabwriter.NewWriter(inv.Stdout, 0, 0, 2, ' ', 0)
	created := v.CreatedAt
	termtext.Fprintf(tw, "Reference:\t%s\nProject:\t%s\nSHA256:\t%s\nSize:\t%s (%d bytes)\nFormat:\t%s\nCreated:\t%s\n",
		v.Ref(), api.ProjectOf(v.Project), v.SHA256, bytesize.Format(v.Size), v.Size, v.Format, command.FormatTime(&created))
	return tw.Flush()
}

// parseArtifactFlag reads one --artifact of `run submit`:
// NAME[@VERSION]:/MOUNT/PATH[:min-read=RATE], where RATE is a size per
// second such as 500MB/s or 2GiB/s.
func parseArtifactFlag(s string) (api.ArtifactMount, error) {
	ref, rest, ok := strings.Cut(s, ":")
	if !ok || ref == "" {
		return api.ArtifactMount{}, fmt.Errorf("--artifact %q: want NAME[@VERSION]:/MOUNT/PATH[:min-read=500MB/s]", s)
	}
	var m api.ArtifactMount
	m.Name, m.Version, _ = strings.Cut(ref, "@")
	mountPath, opt, hasOpt := strings.Cut(rest, ":")
	m.MountPath = mountPath
	if !path.IsAbs(mountPath) {
		return api.ArtifactMount{}, fmt.Errorf("--artifact %q: the mount path %q must be absolute, such as /data", s, mountPath)
	}
	if hasOpt {
		k, v, _ := strings.Cut(opt, "=")
		if k != "min-read" || v == "" {
			return api.ArtifactMount{}, fmt.Errorf("--artifact %q: unknown option %q; the one option is min-read=RATE, such as min-read=500MB/s", s, opt)
		}
		rate, err := bytesize.Parse(strings.TrimSuffix(strings.TrimSuffix(v, "/s"), "ps"))
		if err != nil {
			return api.ArtifactMount{}, fmt.Errorf("--artifact %q: min-read: %v (a rate is a size per second, such as 500MB/s)", s, err)
		}
		m.MinReadBytesPerSecond = rate
	}
	return m, nil
}

// uploadKey names a push in the upload memory: the artifact name and the
// source as it stands (absolute path, size, modification time), since the
// content's check is known only once it was sent. A source that changed
// since an interrupted push makes a new key and a new upload; one changed
// without changing these is caught by the check at the commit.
func uploadKey(name, src string, fi os.FileInfo, size int64) (string, error) {
	abs, err := filepath.Abs(src)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s@%s:%d:%d", name, abs, size, fi.ModTime().UnixNano()), nil
}

// uploadMemory remembers, per push (see uploadKey), the upload it started,
// so an interrupted push resumes it when run again. It lives beside the
// CLI's context file; without one, nothing is remembered.
type uploadMemory struct{ path string }

func newUploadMemory(inv *command.Invocation) uploadMemory {
	p := client.ContextPath(inv.Env)
	if p == "" {
		return uploadMemory{}
	}
	return uploadMemory{path: filepath.Join(filepath.Dir(p), "uploads.json")}
}

func (m uploadMemory) load() map[string]string {
	out := map[string]string{}
	if m.path == "" {
		return out
	}
	if raw, err := os.ReadFile(m.path); err == nil {
		_ = json.Unmarshal(raw, &out)
	}
	return out
}

func (m uploadMemory) get(key string) string { return m.load()[key] }

// put records id for key, or forgets key when id is empty. It is best
// effort: a push works the same without it.
func (m uploadMemory) put(key, id string) {
	if m.path == "" {
		return
	}
	all := m.load()
	if id == "" {
		if _, ok := all[key]; !ok {
			return
		}
		delete(all, key)
	} else {
		all[key] = id
	}
	raw, err := json.Marshal(all)
	if err != nil {
		return
	}
	if os.MkdirAll(filepath.Dir(m.path), 0o700) == nil {
		_ = os.WriteFile(m.path, raw, 0o600)
	}
}
