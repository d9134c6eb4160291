package nodeproto

import "time"

// Functions on the node protocol (capability version 3).
//
// A function call reaches a node as an invoke command on the node's session
// stream. The agent never listens, so the call's bodies travel over
// requests the agent opens itself, to the control-plane replica that holds
// the caller (InvokeCommand.URL):
//
//	GET  PathCalls+ID             the whole command (when the session carried
//	                              only a reference to it; see InvokeCommand)
//	GET  PathCalls+ID+"/request"  the caller's request body, streamed
//	POST PathCalls+ID+"/response" the function's response, streamed: status
//	                              and headers in HeaderCallStatus and
//	                              HeaderCallHeader+NAME, the body as it is
//	                              written; or HeaderCallError and a message
//	                              when the call ended without a response;
//	                              a failure after the response began comes
//	                              as the trailers HeaderCallError and
//	                              HeaderCallMessage
//	POST PathCalls+ID+"/log"      the call's output, when Logs asks for it
//	POST PathCallAnswers          whole answers of many calls, as frames on
//	                              one long request, in place of …/response
//	                              (callanswers.go)
//
// Every one is authenticated like the rest of the node protocol (session
// credential and HeaderNodeID), and ID is the command's Rendezvous, not the
// call's ID: one call placed on two nodes in turn (a spill after "busy") is
// two rendezvous, and a late answer from the first node finds nothing to
// answer (410 Gone).
//
// None of it is stored: a synchronous call lives as long as its caller's
// request, and a durable (async) call is the control plane's record, which
// it re-places itself when an attempt is lost.

// PathCalls is the prefix of the calls paths; the rendezvous ID follows.
const PathCalls = "/v1/node/calls/"

// Headers of the calls paths.
const (
	// HeaderCallStatus is the function's HTTP status, in decimal.
	HeaderCallStatus = "Mercator-Call-Status"
	// HeaderCallHeader prefixes each of the function's response headers.
	HeaderCallHeader = "Mercator-Call-H-"
	// HeaderCallError is the kind (fnagent.Kind) of a call that ended
	// without a whole response: as a header when nothing of the response
	// was sent, as a trailer when the response was cut off.
	HeaderCallError = "Mercator-Call-Error"
	// HeaderCallMessage is the error's message, as a trailer.
	HeaderCallMessage = "Mercator-Call-Message"
)

// InvokeCommand is one attempt of one function call on one node.
type InvokeCommand struct {
	// CallID is the call's ID, which the function sees as Fn-Call-Id and
	// which its logs are kept under on the node.
	CallID string `json:"call_id"`
	// Rendezvous names this attempt on the control plane (see PathCalls).
	Rendezvous string `json:"rendezvous"`
	// URL is the base URL of the control-plane replica holding the caller,
	// which is where the calls paths must be reached: with several replicas
	// it need not be the one holding the node's session.
	URL string `json:"url"`
	// Function is nil when the session carried a reference only (the
	// command crossed replicas through a signal, which must stay small):
	// the agent then fetches the whole command with GET PathCalls+ID.
	Function *FunctionSpec `json:"function,omitempty"`
	// Header is the request's headers as the function receives them (the
	// control plane has already applied Fn's trigger mapping).
	Header map[string][]string `json:"header,omitempty"`
	// Body is the whole request body when BodyInline is set (small bodies
	// of known length travel with the command, saving a round trip);
	// otherwise the agent streams it with GET PathCalls+ID+"/request" when
	// the function reads it.
	Body       []byte `json:"body,omitempty"`
	BodyInline bool   `json:"body_inline,omitempty"`
	// ContentLength is the body's length, -1 when unknown.
	ContentLength int64 `json:"content_length"`
	// Timeout is what is left of the caller's deadline when the command was
	// sent. A duration rather than a moment, so the node's clock need not
	// agree with the control plane's.
	Timeout time.Duration `json:"timeout_ns"`
	// NoWait asks the node to answer "busy" at once rather than queue the
	// call when no container is free and none can be launched: the control
	// plane has another node to try.
	NoWait bool `json:"no_wait,omitempty"`
	// Logs asks for the call's output with POST PathCalls+ID+"/log" after
	// the response (durable calls keep it).
	Logs bool `json:"logs,omitempty"`
	// AnswerStream says the replica at URL takes this call's whole answer
	// as a frame on its call answers stream (PathCallAnswers,
	// callanswers.go) instead of a POST of its own. An agent that predates
	// it ignores it and posts, which the replica still takes.
	AnswerStream bool `json:"answer_stream,omitempty"`
}

// PathCallLogs is where an agent answers a CallLogCommand; the command's
// Request follows. The body is the call's log as text (what the engine
// kept: bounded, "[truncated]" at the end when it was cut), or, with
// HeaderCallLogUnknown set, empty: the node keeps no log of that call.
// Authenticated like the calls paths; the control plane answers 410 Gone
// to an answer nobody waits for any more.
const PathCallLogs = "/v1/node/call-logs/"

// HeaderCallLogUnknown, on an answer to PathCallLogs, says the node keeps
// no log of the call (it never ran it, or has forgotten it); its value is
// the reason, for the control plane's log.
const HeaderCallLogUnknown = "Mercator-Call-Log-Unknown"

// CallLogCommand asks a node for the log it keeps of one call (capability
// version 4). A durable call's log is stored with the call; a synchronous
// call's stays on the node that ran it (the engine keeps its most recent
// calls' logs), and the control plane asks for it only when someone reads
// it, so that a call costs no store write. Like InvokeCommand it is never
// stored or redelivered and produces no result event: the answer travels
// over the agent's own request to PathCallLogs, and a question that goes
// unanswered is the control plane's to give up on.
type CallLogCommand struct {
	// CallID is the call whose log is wanted.
	CallID string `json:"call_id"`
	// Request names this question on the control plane (see PathCallLogs).
	Request string `json:"request"`
	// URL is the base URL of the replica that asks, where the answer goes
	// (as InvokeCommand.URL).
	URL string `json:"url"`
}

// FunctionSpec is everything a node needs to run a function. Its fields
// mirror the node's engine configuration (fnagent.FunctionConfig), which
// this package cannot import.
type FunctionSpec struct {
	ID      string `json:"id"`
	AppID   string `json:"app_id"`
	Name    string `json:"name"`
	AppName string `json:"app_name"`
	// Image is pinned by manifest digest.
	Image string `json:"image"`
	// RegistryAuth is as in PrepareImageCommand.
	RegistryAuth string `json:"registry_auth,omitempty"`
	MemoryMB     int64  `json:"memory_mb"`
	MilliCPUs    int64  `json:"milli_cpus,omitempty"`
	GPUs         int    `json:"gpus,omitempty"`
	// Config is the container's environment: the app's and the function's
	// configuration, secrets included, in the clear (this command is never
	// stored or logged).
	Config         map[string]string `json:"config,omitempty"`
	Timeout        time.Duration     `json:"timeout_ns"`
	IdleTimeout    time.Duration     `json:"idle_timeout_ns"`
	MaxConcurrency int               `json:"max_concurrency,omitempty"`
	// TargetConcurrency is the calls per container the node's pool aims
	// at before it starts another (fnagent.FunctionConfig); 0 means 1. An
	// agent that predates it ignores it and starts one per call, as at 1.
	TargetConcurrency int `json:"target_concurrency,omitempty"`
	// UnframedLogs has the containers not asked to frame each call's
	// output (fnagent.FunctionConfig). An agent that predates it frames.
	UnframedLogs bool `json:"unframed_logs,omitempty"`
}

// FunctionCapacity is the share of a machine its agent set aside for
// function containers: the control plane places calls only on nodes whose
// share can hold the function, and the scheduler counts the share as taken
// when it places Runs, so the two kinds of work never promise the same
// memory twice.
type FunctionCapacity struct {
	MemoryBytes int64 `json:"memory_bytes"`
	MilliCPUs   int64 `json:"milli_cpus"`
	// GPUs are the UUIDs of the accelerators set aside for functions.
	GPUs []string `json:"gpus,omitempty"`
	// Containers is what runs in the share, per function, when the facts
	// were read; sorted by function ID.
	Containers []FunctionContainers `json:"containers,omitempty"`
	// OutputRelay says the node's function containers' output reaches the
	// agent through the output relay's pipes rather than through the
	// Docker daemon (fnagent/outputrelay); false when the relay is off,
	// was refused by the daemon, or the agent is older than it.
	OutputRelay bool `json:"output_relay,omitempty"`
}

// FunctionContainers counts one function's containers on a node by state.
// Idle includes Paused.
type FunctionContainers struct {
	FnID     string `json:"fn_id"`
	Idle     int    `json:"idle"`
	Paused   int    `json:"paused"`
	Busy     int    `json:"busy"`
	Starting int    `json:"starting"`
	// Prepared counts containers created ahead for the next launch (not
	// started; version 6 agents while a hold stands).
	Prepared int `json:"prepared,omitempty"`
}

// HoldCommand asks a node for warm capacity of one function: pull its image
// now (so a first call never waits for a pull), and keep Count of its
// containers started, idle ones exempt from the function's idle timeout,
// until For has passed since the command arrived (a duration, so the clocks
// need not agree). Count 0 is a prefetch only. The control plane sends it
// when a function is deployed and again, well within For, while its
// policy (min_hot) stands; when it stops, the hold lapses and the
// containers age out as any others. Capability version 6.
type HoldCommand struct {
	Function *FunctionSpec `json:"function"`
	Count    int           `json:"count"`
	For      time.Duration `json:"for"`
	// Release says the function was deleted: the node removes what it
	// keeps of it ahead of calls (prepared and idle containers) and pulls
	// nothing; Count and For are then unused. Sent only to agents at
	// VersionFnSpares or later.
	Release bool `json:"release,omitempty"`
}
