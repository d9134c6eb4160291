package store

import (
	"time"

	"github.com/mercator/mercator/api"
)

// FunctionsTx is the part of Tx that holds Functions: Fn-compatible apps,
// functions and triggers, and the durable (detached or async) calls.
// Synchronous calls are never stored.
//
// Uniqueness: an app's ID and its name; a function's ID and its name within
// its app; a trigger's ID, its name within its app, and its (type, source)
// within its app. A Create that would break one fails with ErrConflict and
// changes nothing; a Put that would is refused with ErrConflict too (the
// control plane checks first and says which rule, so this is a backstop).
//
// Lists are ordered by name, byte-wise (not by the database's collation),
// so a cursor (ListFnOptions.After, a name) pages the same way on every
// store. Deleting an app or a function does not delete what belongs to it:
// the control plane deletes the triggers and functions first, in the same
// transaction, and keeps the calls as history.
type FunctionsTx interface {
	// CreateApp stores a new app; ErrConflict if its ID or name is taken.
	CreateApp(a App) error
	GetApp(id string) (App, error)
	// GetAppByName finds an app by its name; ErrNotFound if none.
	GetAppByName(name string) (App, error)
	// PutApp replaces an existing app; ErrNotFound if it does not exist.
	PutApp(a App) error
	// DeleteApp removes an app; ErrNotFound if it does not exist.
	DeleteApp(id string) error
	// ListApps returns apps by name; opts.Name keeps the one of that name.
	ListApps(opts ListFnOptions) ([]App, error)

	// CreateFn stores a new function; ErrConflict if its ID, or its name
	// within its app, is taken.
	CreateFn(f Fn) error
	GetFn(id string) (Fn, error)
	// PutFn replaces an existing function; ErrNotFound if it does not exist.
	PutFn(f Fn) error
	DeleteFn(id string) error
	// ListFns returns functions by name, of opts.AppID when set, named
	// opts.Name when set.
	ListFns(opts ListFnOptions) ([]Fn, error)

	// CreateTrigger stores a new trigger; ErrConflict if its ID, its name
	// within its app, or its type and source within its app are taken.
	CreateTrigger(t Trigger) error
	GetTrigger(id string) (Trigger, error)
	// GetTriggerBySource finds the app's trigger of that type and source.
	GetTriggerBySource(appID, typ, source string) (Trigger, error)
	PutTrigger(t Trigger) error
	DeleteTrigger(id string) error
	// ListTriggers returns triggers by name, filtered by opts.AppID,
	// opts.FnID and opts.Name when set.
	ListTriggers(opts ListFnOptions) ([]Trigger, error)

	// CreateCall stores a new durable call; ErrConflict if the ID exists.
	CreateCall(c Call) error
	GetCall(id string) (Call, error)
	// PutCall replaces an existing call; ErrNotFound if it does not exist.
	PutCall(c Call) error
	// ListCalls returns a function's calls newest first (by CreatedAt, then
	// ID); opts.After is the ID of the last call of the previous page.
	ListCalls(opts ListFnOptions) ([]Call, error)
	// DueCalls returns up to limit calls that are queued or running with
	// Due at or before now, earliest Due first (then ID): the queued calls
	// to deliver and the running ones whose claim lapsed.
	DueCalls(now time.Time, limit int) ([]Call, error)
}

// ListFnOptions filters and pages the Functions lists. Zero values mean no
// filter; Limit 0 means no limit.
type ListFnOptions struct {
	AppID string
	FnID  string
	Name  string
	// After is the cursor: the name (the ID, for calls) of the last item
	// of the previous page; only items strictly after it are returned.
	After string
	Limit int
}

// App is an application.
//
// Its secret configuration is SealedConfig: each value sealed by the
// control plane, which alone holds the key, bound to the app and the key
// name; the store never sees a secret in the clear. The embedded
// api.App.SecretConfig is only what earlier versions stored in the clear,
// read back from old records so the control plane can seal it: every
// store refuses to write a record whose SecretConfig is not empty
// (failure.ErrInvalid).
type App struct {
	api.App
	SealedConfig map[string][]byte `json:"sealed_config,omitempty"`
}

// Fn is a function. Its SealedConfig and SecretConfig are as App's.
type Fn struct {
	api.Fn
	SealedConfig map[string][]byte `json:"sealed_config,omitempty"`
}

// Trigger is a trigger.
type Trigger struct {
	api.Trigger
}

// Call is a durable call: what the API shows, the request to deliver, and
// the result once there is one.
type Call struct {
	api.FnCall
	// Header and Body are the request as the function will see it.
	Header map[string][]string `json:"header,omitempty"`
	Body   []byte              `json:"body,omitempty"`
	// ResponseHeader and ResponseBody are the function's answer.
	ResponseHeader map[string][]string `json:"response_header,omitempty"`
	ResponseBody   []byte              `json:"response_body,omitempty"`
	// Log is the call's output, as the node kept it.
	Log string `json:"log,omitempty"`
	// Due is when a dispatcher should next take the call: for a queued
	// call, when to deliver it (now, or after a retry's backoff); for a
	// running one, when its claim lapses, after which it is delivered
	// again (at least once).
	Due time.Time `json:"due"`
	// Claim names the dispatcher holding a running call, so only its
	// outcome is recorded: a dispatcher whose claim lapsed and was taken
	// over finds another Claim and drops its result.
	Claim string `json:"claim,omitempty"`
}

// Pending reports whether the call may still be delivered.
func (c Call) Pending() bool {
	return c.Status == api.CallQueued || c.Status == api.CallRunning
}
