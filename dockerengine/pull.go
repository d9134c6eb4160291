package dockerengine

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"sync"

	"github.com/docker/docker/api/types/image"
)

// Pulls shares one pull among the callers that want the same reference at
// the same time, so a burst of launches of one image makes one pull. The
// zero value is ready to use; it is safe for concurrent use.
type Pulls struct {
	// Keep, when true, lets a pull run to its end even after every caller
	// waiting on it left: the function engine's choice, because the next
	// call wants the image too and its pull bounds itself. When false (the
	// node agent's), the pull is cancelled once the last waiting caller
	// gives up, and a caller arriving after that starts afresh.
	Keep bool
	// Background, when set, counts each pull's goroutine, so the owner can
	// wait for pulls under way when it closes.
	Background *sync.WaitGroup

	mu    sync.Mutex
	calls map[string]*pullCall
}

// pullCall is one pull in flight.
type pullCall struct {
	done    chan struct{}
	err     error // written before done is closed
	waiters int   // guarded by Pulls.mu
	cancel  context.CancelFunc
}

// Do returns the outcome of pull(ctx, ref), run once for all the callers
// asking for ref while it runs. The pull runs under a context detached from
// any one caller's (carrying its values, not its end), made with the
// credential of the caller that started it. A caller whose ctx ends first
// gets ctx.Err() itself, unwrapped, so it can tell leaving from a failed
// pull; pull should wrap its own errors.
func (p *Pulls) Do(ctx context.Context, ref string, pull func(ctx context.Context) error) error {
	p.mu.Lock()
	if p.calls == nil {
		p.calls = map[string]*pullCall{}
	}
	call := p.calls[ref]
	if call == nil {
		pullCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		call = &pullCall{done: make(chan struct{}), cancel: cancel}
		p.calls[ref] = call
		if p.Background != nil {
			p.Background.Add(1)
		}
		go func() {
			if p.Background != nil {
				defer p.Background.Done()
			}
			err := pull(pullCtx)
			cancel()
			p.mu.Lock()
			if p.calls[ref] == call {
				delete(p.calls, ref)
			}
			p.mu.Unlock()
			call.err = err
			close(call.done)
		}()
	}
	call.waiters++
	p.mu.Unlock()

	select {
	case <-call.done:
		return call.err
	case <-ctx.Done():
		p.mu.Lock()
		call.waiters--
		if call.waiters == 0 && !p.Keep {
			call.cancel()
			if p.calls[ref] == call {
				// A caller arriving now starts afresh rather than joining
				// a pull that is being abandoned.
				delete(p.calls, ref)
			}
		}
		p.mu.Unlock()
		return ctx.Err()
	}
}

// RefusedError is a pull the daemon or the registry refused. Message is
// what it said; Cause is the request's error when the daemon refused the
// request itself, nil when the refusal came inside the progress stream
// (where a registry's "manifest unknown" or "unauthorized" arrives).
type RefusedError struct {
	Message string
	Cause   error
}

func (e *RefusedError) Error() string { return e.Message }
func (e *RefusedError) Unwrap() error { return e.Cause }

// StreamError is a progress stream that broke off before the daemon said
// how the pull ended.
type StreamError struct{ Err error }

func (e *StreamError) Error() string { return "reading the daemon's progress: " + e.Err.Error() }
func (e *StreamError) Unwrap() error { return e.Err }

// Pull asks the daemon to pull ref with the registry credential auth (the
// Engine API's X-Registry-Auth, "" for none) and reads its progress stream
// to the end. The daemon answers a pull with 200 before it has talked to the
// registry, so a registry's refusal arrives as an error message inside the
// stream, and a caller that only checked the HTTP status would believe the
// image was pulled.
//
// A refusal is a *RefusedError, a broken stream a *StreamError, and ctx
// ending ctx.Err(). Success is the daemon's word only; callers that must
// know the image is held inspect it afterwards.
//
// A progress function ctx carries (WithPullProgress) is called with the
// bytes downloaded so far after each message that moved them.
func Pull(ctx context.Context, api API, ref, auth string) error {
	stream, err := api.ImagePull(ctx, ref, image.PullOptions{RegistryAuth: auth})
	if err != nil {
		return &RefusedError{Message: err.Error(), Cause: err}
	}
	defer stream.Close()
	progress, _ := ctx.Value(progressKey{}).(PullProgress)
	var layers layerBytes
	return readProgress(ctx, stream, func(message pullProgress) {
		if progress != nil && layers.note(message) {
			progress(layers.sum())
		}
	})
}

// readProgress reads the daemon's progress stream of a pull or an import
// to its end, handing each message to note, and returns the first error
// the stream reports (a *RefusedError), a *StreamError when it breaks off,
// ctx.Err() when ctx ended, or nil.
func readProgress(ctx context.Context, stream io.Reader, note func(pullProgress)) error {
	decoder := json.NewDecoder(stream)
	for {
		var message pullProgress
		if err := decoder.Decode(&message); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return &StreamError{Err: err}
		}
		if message.Error != nil && message.Error.Message != "" {
			return &RefusedError{Message: message.Error.Message}
		}
		if message.ErrorMessage != "" {
			return &RefusedError{Message: message.ErrorMessage}
		}
		note(message)
	}
}

// Importer is the daemon's image import.
type Importer interface {
	ImageImport(ctx context.Context, source image.ImportSource, ref string, options image.ImportOptions) (io.ReadCloser, error)
}

// Import asks the daemon to make image ref from rootfs, a tar stream of a
// root filesystem, with changes (Dockerfile instructions such as
// `ENTRYPOINT ["/x"]`) applied, and reads its answer to the end: as with a
// pull, the daemon can answer 200 and report a failure inside the stream.
// Errors are as Pull's. Nothing is pulled.
func Import(ctx context.Context, api Importer, rootfs io.Reader, ref string, changes []string) error {
	stream, err := api.ImageImport(ctx, image.ImportSource{Source: rootfs, SourceName: "-"}, ref, image.ImportOptions{Changes: changes})
	if err != nil {
		return &RefusedError{Message: err.Error(), Cause: err}
	}
	defer stream.Close()
	return readProgress(ctx, stream, func(pullProgress) {})
}

// PullProgress is told the bytes of a pull's layers downloaded so far and
// the bytes of the layers whose size the daemon has stated (a layer's size
// is known once its download starts, so total grows early in a pull).
// Layers the daemon already held count neither way.
type PullProgress func(done, total int64)

type progressKey struct{}

// WithPullProgress returns ctx carrying f, which Pull calls as the pull
// moves. Pulls.Do runs a shared pull under the context of the caller that
// started it, so that caller's f is the one told.
func WithPullProgress(ctx context.Context, f PullProgress) context.Context {
	return context.WithValue(ctx, progressKey{}, f)
}

// layerBytes is each layer's downloaded and total bytes, by layer ID.
type layerBytes map[string][2]int64

// note takes one message of the stream; it reports whether the bytes moved.
func (l *layerBytes) note(m pullProgress) bool {
	if m.ID == "" {
		return false
	}
	if *l == nil {
		*l = layerBytes{}
	}
	cur := (*l)[m.ID]
	switch m.Status {
	case "Downloading":
		if m.Detail == nil || m.Detail.Total <= 0 {
			return false
		}
		cur = [2]int64{min(m.Detail.Current, m.Detail.Total), m.Detail.Total}
	case "Download complete", "Verifying Checksum", "Pull complete":
		if cur[1] == 0 || cur[0] == cur[1] {
			return false
		}
		cur[0] = cur[1]
	default:
		return false
	}
	(*l)[m.ID] = cur
	return true
}

func (l layerBytes) sum() (done, total int64) {
	for _, b := range l {
		done += b[0]
		total += b[1]
	}
	return done, total
}

// pullProgress is the part of one message of the daemon's pull stream that
// is read (the Engine API's JSONMessage): the error fields, and a layer's
// status and bytes. It is declared here rather than imported from the
// client's jsonmessage package, which would bring a terminal library in for
// a few fields.
type pullProgress struct {
	ID     string `json:"id,omitempty"`
	Status string `json:"status,omitempty"`
	Detail *struct {
		Current int64 `json:"current"`
		Total   int64 `json:"total"`
	} `json:"progressDetail,omitempty"`
	Error *struct {
		Message string `json:"message"`
	} `json:"errorDetail,omitempty"`
	ErrorMessage string `json:"error,omitempty"`
}
