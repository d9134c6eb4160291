package api

import (
	"encoding/json"
	"time"
)

// Functions: the Fn Project's v2 API (apps, fns, triggers, invoke), served
// by the control plane beside Mercator's own /v1 routes. Field names, paths,
// status codes and error bodies are Fn's, so the Fn CLI and Fn's client
// libraries work unchanged; what Mercator adds is marked as such, and
// docs/functions.md lists every difference and why.

// FnPrefix is the version prefix of the Fn-compatible management routes.
const FnPrefix = "/v2"

// The annotations the control plane sets on what it returns, as Fn does.
const (
	// AnnotationInvokeEndpoint is a function's invoke URL.
	AnnotationInvokeEndpoint = "fnproject.io/fn/invokeEndpoint"
	// AnnotationTriggerEndpoint is an HTTP trigger's URL.
	AnnotationTriggerEndpoint = "fnproject.io/trigger/httpEndpoint"
	// AnnotationPublicInvoke (Mercator), "true" on an app, lets callers
	// without a credential invoke its functions and call its triggers; on
	// a trigger, that trigger (docs/functions.md). Off by default.
	AnnotationPublicInvoke = "mercator.dev/public-invoke"
	// AnnotationMinHot (Mercator), a whole number from 0 to 100 on a
	// function, is how many of its containers the fleet keeps started
	// with no calls (docs/functions.md, warm capacity). Default 0.
	AnnotationMinHot = "mercator.dev/min-hot"
	// AnnotationMaxHot (Mercator), a whole number on a function, caps its
	// containers across the fleet; 0 or absent, no cap.
	AnnotationMaxHot = "mercator.dev/max-hot"
	// AnnotationTargetConcurrency (Mercator), a whole number from 1 to 100
	// on a function, is how many calls, in flight and waiting, a node aims
	// at per container before it starts another (each container still
	// serves one call at a time, as Fn's contract has it). Default 1.
	AnnotationTargetConcurrency = "mercator.dev/target-concurrency"
	// AnnotationLogFrames (Mercator), "false" on a function, has its
	// containers not asked to frame each call's output (FN_LOGFRAME_NAME):
	// two writes a call fewer for the FDK and the daemon, and output
	// attributed to the call dispatched last instead. Default "true".
	AnnotationLogFrames = "mercator.dev/log-frames"
)

// Limits, Fn's unless marked.
const (
	MaxFnNameLength  = 255
	MaxAnnotationKey = 128 // bytes
	MaxAnnotationVal = 512 // bytes of the value's compact JSON
	MaxAnnotations   = 100
	// FnMaxMemoryMB is Fn's 8 GB; FnMinMemoryMB is Docker's floor (Fn
	// allows 1, which Docker refuses).
	FnMaxMemoryMB      = 8 * 1024
	FnMinMemoryMB      = 6
	FnDefaultMemoryMB  = 128
	FnMaxTimeout       = 300  // seconds
	FnMaxIdleTimeout   = 3600 // seconds
	FnDefaultTimeout   = 30
	FnDefaultIdle      = 30
	DefaultFnPerPage   = 30
	MaxFnPerPage       = 100
	FnMaxRequestBytes  = 6 << 20
	FnMaxResponseBytes = 6 << 20
)

// Annotations are an object's annotations: keys of printable ASCII, values
// any non-empty JSON, kept as sent (compacted).
type Annotations map[string]json.RawMessage

// SecretRedacted is what a read shows in place of a secret configuration
// value. Sending it back in an update leaves the secret as it was, so a
// client that reads an object, edits it and writes it back keeps its
// secrets.
const SecretRedacted = "<redacted>"

// App is an application: a named group of functions with shared
// configuration.
type App struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	// Config is set in every function's environment (a function's own
	// config wins on a clash).
	Config      map[string]string `json:"config,omitempty"`
	Annotations Annotations       `json:"annotations,omitempty"`
	// SyslogURL is accepted and kept for compatibility; Mercator keeps
	// function output itself (see docs/functions.md).
	SyslogURL *string `json:"syslog_url,omitempty"`
	// SecretConfig (Mercator) is configuration whose values are never
	// returned: reads show SecretRedacted.
	SecretConfig map[string]string `json:"secret_config,omitempty"`
	// Shape is Fn's architecture of the app's images (AppShapes; empty
	// means unspecified): set at create, kept and returned, as Fn does.
	// Mercator places calls by the nodes' facts, not by it.
	Shape     string    `json:"shape,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// Project (Mercator, docs/teams.md) is the project the app and its
	// functions belong to: set at creation ("" is DefaultProject), then
	// kept.
	Project string `json:"project,omitempty"`
}

// AppShapes are the shapes Fn accepts for an app.
var AppShapes = []string{"GENERIC_X86", "GENERIC_ARM", "GENERIC_X86_ARM"}

// Fn is a function.
type Fn struct {
	ID    string `json:"id"`
	Name  string `json:"name"`
	AppID string `json:"app_id"`
	// Image is the reference as given (a tag or a digest).
	Image string `json:"image"`
	// PinnedImage (Mercator) is Image resolved to repo@sha256:… when the
	// function was created or its image changed: the only reference a
	// node pulls, so a tag that moves later changes nothing until the
	// function is deployed again.
	PinnedImage string `json:"pinned_image,omitempty"`
	// Memory in MB (MiB, as Fn means it); default 128.
	Memory uint64 `json:"memory,omitempty"`
	// Timeout and IdleTimeout in seconds; default 30 each.
	Timeout     int32             `json:"timeout,omitempty"`
	IdleTimeout int32             `json:"idle_timeout,omitempty"`
	Config      map[string]string `json:"config,omitempty"`
	Annotations Annotations       `json:"annotations,omitempty"`
	// SecretConfig (Mercator): as App.SecretConfig.
	SecretConfig map[string]string `json:"secret_config,omitempty"`
	// CPU (Mercator) is the container's CPU quota and reservation in
	// cores; 0 means no quota.
	CPU float64 `json:"cpu,omitempty"`
	// GPUs (Mercator) is the number of whole GPUs each container gets;
	// GPUModel, when set, restricts the nodes to those whose function GPUs
	// are of a model containing it (case-insensitive).
	GPUs     int    `json:"gpus,omitempty"`
	GPUModel string `json:"gpu_model,omitempty"`
	// MaxConcurrency (Mercator) caps the function's containers, and so its
	// concurrent calls, per node; 0 means only capacity limits it.
	MaxConcurrency int `json:"max_concurrency,omitempty"`
	// Shape is Fn's architecture of the function's image, kept and
	// returned as Fn keeps it (unvalidated, as there).
	Shape     string    `json:"shape,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Trigger binds a function to an event source; the only type is "http",
// whose Source is a path under /t/{app_name}.
type Trigger struct {
	ID          string      `json:"id"`
	Name        string      `json:"name"`
	AppID       string      `json:"app_id"`
	FnID        string      `json:"fn_id"`
	Type        string      `json:"type"`
	Source      string      `json:"source"`
	Annotations Annotations `json:"annotations,omitempty"`
	CreatedAt   time.Time   `json:"created_at"`
	UpdatedAt   time.Time   `json:"updated_at"`
}

// AppList, FnList and TriggerList are Fn's list bodies: a page of items
// and, when there may be more, the cursor of the next page.
type AppList struct {
	Items      []App  `json:"items"`
	NextCursor string `json:"next_cursor,omitempty"`
}

// FnList is a page of functions.
type FnList struct {
	Items      []Fn   `json:"items"`
	NextCursor string `json:"next_cursor,omitempty"`
}

// TriggerList is a page of triggers.
type TriggerList struct {
	Items      []Trigger `json:"items"`
	NextCursor string    `json:"next_cursor,omitempty"`
}

// FnError is Fn's error body. Kind (Mercator) is the machine-readable way
// a call ended (fnagent's kinds, plus "node_lost" and "no_capacity"), and
// Detail says what happened, where Message is Fn's own wording.
type FnError struct {
	Message string `json:"message"`
	Kind    string `json:"kind,omitempty"`
	Detail  string `json:"detail,omitempty"`
}

// Call statuses, Fn's.
const (
	CallQueued  = "queued"
	CallRunning = "running"
	CallSuccess = "success"
	CallError   = "error"
)

// FnCall is a durable (detached or async) call, as GET
// /v2/fns/{fn_id}/calls/{call_id} shows it. Synchronous calls are not
// stored.
type FnCall struct {
	ID     string `json:"id"`
	Status string `json:"status"`
	AppID  string `json:"app_id"`
	FnID   string `json:"fn_id"`
	// Error says why a call ended in error; ErrorKind (Mercator) is its
	// machine-readable kind.
	Error     string `json:"error,omitempty"`
	ErrorKind string `json:"error_kind,omitempty"`
	// Attempts (Mercator) counts the deliveries so far: more than one
	// means an attempt was lost (a node or a control plane went away) and
	// the call was delivered again, with the same ID.
	Attempts int `json:"attempts"`
	// NodeID (Mercator) is the node of the latest attempt.
	NodeID string `json:"node_id,omitempty"`
	// ResponseStatus (Mercator) is the function's HTTP status, once it
	// answered; the body is at .../result.
	ResponseStatus int        `json:"response_status,omitempty"`
	CreatedAt      time.Time  `json:"created_at"`
	StartedAt      *time.Time `json:"started_at,omitempty"`
	CompletedAt    *time.Time `json:"completed_at,omitempty"`
}

// FnCallList is a page of calls.
type FnCallList struct {
	Items      []FnCall `json:"items"`
	NextCursor string   `json:"next_cursor,omitempty"`
}

// CallLog is Fn's JSON log body (GET …/log with Accept: application/json).
type CallLog struct {
	CallID string `json:"call_id"`
	Log    string `json:"log"`
}

// CallLogResponse wraps CallLog as Fn does.
type CallLogResponse struct {
	Message string  `json:"message"`
	Log     CallLog `json:"log"`
}

// DetachedCall is the body of a 202 answer to a detached or async invoke.
type DetachedCall struct {
	CallID string `json:"call_id"`
}
