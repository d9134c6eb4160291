package controlplane

import (
	"net/http"

	"github.com/mercator/mercator/controlplane/console"
)

// newConsole returns the web console (package console) over the public API
// served by *root, which the caller sets once the handler is built: every
// page calls the API in process as the signed-in credential, through the
// same credential check, roles, limits and audit log as a remote caller.
// Its charts and hot containers come from this replica (console_stats.go).
func (s *Server) newConsole(root *http.Handler) *console.Console {
	return console.New(console.Config{Auth: s.tokens, Now: s.cfg.Now, Log: s.log, APIFor: console.InProcess(root), Stats: consoleStats{s}})
}
