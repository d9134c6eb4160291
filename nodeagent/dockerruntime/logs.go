package dockerruntime

import (
	"context"
	"fmt"
	"io"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"
)

// Logs returns one attempt's stdout and stderr as one stream, demultiplexed
// from the daemon's framing, in the order the daemon recorded the lines. See
// LogSource for the contract. A container that is not this attempt on this
// node is failure.ErrNotFound, like a missing one: it is not this runtime's
// to read.
func (docker *Runtime) Logs(ctx context.Context, key nodeproto.WorkloadKey, follow bool) (io.ReadCloser, error) {
	name := ContainerName(key)
	info, err := docker.api.ContainerInspect(ctx, name)
	if cerrdefs.IsNotFound(err) {
		return nil, failure.NotFound("workload container", name)
	}
	if err != nil {
		return nil, daemonError(err, "inspect container %s", name)
	}
	if !docker.owns(info, key) {
		return nil, failure.NotFound("workload container", name)
	}
	if follow && info.State != nil && info.State.Status == "created" {
		// The daemon follows only a running container's log; asked to follow
		// one not yet started it answers with what is recorded (nothing) and
		// ends, which would read as "exited, everything delivered".
		return nil, failure.Unavailable("container %s has not started yet; its output can be followed once it runs", name)
	}
	raw, err := docker.api.ContainerLogs(ctx, info.ID, container.LogsOptions{ShowStdout: true, ShowStderr: true, Follow: follow})
	if err != nil {
		return nil, daemonError(err, "logs of container %s", name)
	}
	if info.Config != nil && info.Config.Tty {
		// A terminal has one stream and the daemon sends it unframed.
		return raw, nil
	}
	reader, writer := io.Pipe()
	go func() {
		_, err := stdcopy.StdCopy(writer, writer, raw)
		raw.Close()
		if err != nil {
			// Not wrapped: a stream that broke must not read as one that
			// ended (io.EOF, io.ErrUnexpectedEOF) to a caller deciding
			// whether it has everything.
			err = fmt.Errorf("logs of container %s broke off: %v", name, err)
		}
		writer.CloseWithError(err)
	}()
	return &logStream{PipeReader: reader, raw: raw}, nil
}

// logStream closes both ends, so a reader that stops early also ends the
// daemon's request and the goroutine copying it.
type logStream struct {
	*io.PipeReader
	raw io.Closer
}

func (s *logStream) Close() error {
	s.PipeReader.Close()
	return s.raw.Close()
}
