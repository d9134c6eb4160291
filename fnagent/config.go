package fnagent

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/distribution/reference"

	"github.com/mercator/mercator/dockerengine"
	"github.com/mercator/mercator/failure"
)

// Defaults for fields left zero. They follow Fn's where Fn has one.
const (
	DefaultMemoryMB         = 128
	DefaultTimeout          = 30 * time.Second
	DefaultIdleTimeout      = 30 * time.Second
	DefaultInitTimeout      = 10 * time.Second
	DefaultMaxRequestBytes  = 6 << 20
	DefaultMaxResponseBytes = 6 << 20

	DefaultPauseAfter   = time.Second
	DefaultMaxSlotWait  = 10 * time.Second
	DefaultPullTimeout  = 5 * time.Minute
	DefaultMaxLogBytes  = 64 << 10
	DefaultLogRetention = 1024

	// DefaultMaxSpares and DefaultSpareFor bound the prepared containers
	// kept for functions without a standing hold (prepare.go).
	DefaultMaxSpares = 16
	DefaultSpareFor  = time.Hour

	// DefaultNetnsPool is how many network namespaces the engine keeps
	// ready (netnspool.go).
	DefaultNetnsPool = 2
)

// minMemoryMB is the smallest memory limit the Docker daemon accepts.
const minMemoryMB = 6

// Config configures an Engine. The zero value is usable: every zero field
// takes the default its comment names.
type Config struct {
	// DockerHost is the daemon to use ("unix:///…"); empty means what the
	// environment says (DOCKER_HOST, else the local socket).
	DockerHost string
	// Docker, when set, is the client to use instead of connecting to
	// DockerHost: the composition root hands the node's one client to both
	// the agent's runtime and the engine. The engine does not Close it.
	Docker dockerengine.API
	// NodeID is put on every container as the mercator.node label, so a node
	// agent sharing a daemon sees only its own function containers.
	NodeID string
	// SocketRoot is the host directory holding one socket directory per
	// container; default <os.TempDir()>/mercator-fn. It must be on the
	// machine the daemon runs on, because it is bind-mounted.
	SocketRoot string
	// Network is the Docker network mode of function containers; empty is
	// the daemon's default (the bridge). Tests use "none".
	Network string
	// Tracker reserves resources for containers. Nil means a tracker over
	// DetectCapacity(HeadroomBytes). A node agent that also runs Runs passes
	// the tracker it shares with them.
	Tracker *ResourceTracker
	// HeadroomBytes is the memory kept free when the tracker is detected;
	// zero means DefaultHeadroom of the machine's memory.
	HeadroomBytes int64
	// PauseAfter is how long a container stays idle before it is paused
	// (frozen, so it uses no CPU but keeps its memory); default 1s, negative
	// never pauses. Fn pauses after 50ms; a second keeps bursts from paying
	// an unpause round trip on nearly every call.
	PauseAfter time.Duration
	// MaxSlotWait caps how long a call waits for capacity or for another
	// call's container, whatever its deadline; default 10s. A call that
	// waits this long with no launch of its function under way returns
	// ErrCapacityTimeout. A cold start under way is waited for until the
	// deadline.
	MaxSlotWait time.Duration
	// PullTimeout bounds one image pull; default 5m.
	PullTimeout time.Duration
	// MaxLogBytes bounds the logs kept per call; default 64 KiB.
	MaxLogBytes int
	// LogRetention is how many calls' logs are kept; default 1024.
	LogRetention int
	// MaxSpares is how many prepared containers (created, not started;
	// prepare.go) the engine keeps for functions without a standing hold,
	// the least recently called going first when a more recent one needs
	// one; default DefaultMaxSpares, negative none (only held functions
	// are prepared). A prepared container holds no memory or CPU, only a
	// container record and its empty writable layer.
	MaxSpares int
	// NetnsPool is how many network namespace holders (tiny containers,
	// 6 MiB and 8 processes at most each) the engine keeps started for no
	// function yet, so that a container created on a call's path or
	// prepared ahead joins a namespace already made rather than making
	// its own, most of a cold start on a bridge network (netnspool.go);
	// default DefaultNetnsPool, negative none. Only on a network where
	// joining helps (the bridge, a user network).
	NetnsPool int
	// OutputRelay is the path, on the daemon's machine, of a statically
	// linked mercator binary (outputrelay.CheckStatic) that the engine
	// mounts read-only into each function container to carry its stdout
	// and stderr to the engine through pipes, past the container runtime
	// and the daemon (package outputrelay: a framed call's two lines cost
	// the daemons about 150 µs of CPU through Docker); "" for none, the
	// output then coming through the attach stream. Containers of an
	// image that states no command, or with a memory limit under 32 MiB,
	// never use it. A daemon that cannot mount the path (it is on another
	// machine, or the engine runs in a container of its own) turns it off
	// at the first container, said in the log.
	OutputRelay string
	// SpareFor is how long after a function's last call (or hold) its
	// prepared container is kept when no hold stands; default
	// DefaultSpareFor.
	SpareFor time.Duration
	// Metrics receives calls and container state changes; nil for none.
	Metrics Metrics
	// Logger receives the engine's own log; nil discards it.
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Containment is what every function container is held to beyond its
	// function's own limits: capabilities dropped, no-new-privileges, a
	// process limit, and the default CPU quota of a function that states
	// none. Nil means dockerengine.DefaultContainment. Its log size does
	// not apply: function containers keep no log (containerConfig).
	Containment *dockerengine.Containment
}

// FunctionConfig is everything about a function the engine needs to run a
// call to it. All fields but RegistryAuth are the function's identity on
// this node: two calls share containers only if their configurations are
// equal.
type FunctionConfig struct {
	// ID is the function's ID (FN_FN_ID and the mercator.fn label). Required.
	ID string `json:"id"`
	// AppID is its application's ID (FN_APP_ID).
	AppID string `json:"app_id"`
	// Name and AppName are passed as FN_FN_NAME and FN_APP_NAME.
	Name    string `json:"name"`
	AppName string `json:"app_name"`
	// Image is pinned by manifest digest: "repo@sha256:<64 hex>". A tag is
	// refused, because a tag can move and a node runs exactly what it was
	// told to.
	Image string `json:"image"`
	// RegistryAuth is the Engine API's X-Registry-Auth value for the pull,
	// held in memory for the pull only. It is not part of the identity.
	RegistryAuth string `json:"-"`
	// MemoryMB is the container's hard memory limit (swap included) and the
	// memory reserved for it; default 128.
	MemoryMB int64 `json:"memory_mb"`
	// MilliCPUs is the container's CPU quota and reservation in thousandths
	// of a core; zero means no quota and no reservation.
	MilliCPUs int64 `json:"milli_cpus"`
	// GPUs is how many of the tracker's GPUs the container gets, by ID.
	GPUs int `json:"gpus"`
	// Config is set as the container's environment. A name the contract
	// reserves (FN_LISTENER, FN_FORMAT, …) is refused.
	Config map[string]string `json:"config"`
	// Timeout bounds one call from its arrival to its last byte; default 30s.
	Timeout time.Duration `json:"timeout"`
	// IdleTimeout is how long an idle container is kept; default 30s.
	IdleTimeout time.Duration `json:"idle_timeout"`
	// InitTimeout bounds a container's start up to its socket accepting a
	// connection; default 10s.
	InitTimeout time.Duration `json:"init_timeout"`
	// MaxConcurrency caps the containers of this configuration, and so its
	// concurrent calls (one call per container at a time); zero means only
	// the node's capacity limits it.
	MaxConcurrency int `json:"max_concurrency"`
	// TargetConcurrency is how many calls, in flight and waiting, the pool
	// aims at per container before it starts another (target.go); zero
	// means 1, a container started for every call that finds none idle.
	TargetConcurrency int `json:"target_concurrency,omitempty"`
	// UnframedLogs leaves FN_LOGFRAME_NAME unset, so the FDK does not
	// print a frame line to stdout and stderr at every call (two writes
	// the daemon then copies to the engine, on the hot path); the output
	// is attributed to the call dispatched last (logSink), so what a call
	// writes after its response may count as the next call's.
	UnframedLogs bool `json:"unframed_logs,omitempty"`
	// MaxRequestBytes and MaxResponseBytes bound the bodies; default 6 MiB.
	MaxRequestBytes  int64 `json:"max_request_bytes"`
	MaxResponseBytes int64 `json:"max_response_bytes"`
}

// reservedEnv are the environment variables the container contract sets;
// a function's configuration may not set them.
var reservedEnv = []string{"FN_LISTENER", "FN_FORMAT", "FN_FN_ID", "FN_APP_ID", "FN_FN_NAME",
	"FN_APP_NAME", "FN_MEMORY", "FN_TYPE", "FN_LOGFRAME_NAME", "FN_LOGFRAME_HDR"}

// normalized returns fn with defaults filled in, or a failure.ErrInvalid
// error naming the field that is wrong.
func (fn FunctionConfig) normalized() (FunctionConfig, error) {
	if fn.ID == "" {
		return fn, failure.Invalid("id", "a function needs an ID")
	}
	if err := pinnedImage(fn.Image); err != nil {
		return fn, err
	}
	if fn.MemoryMB == 0 {
		fn.MemoryMB = DefaultMemoryMB
	}
	if fn.MemoryMB < minMemoryMB {
		return fn, failure.Invalid("memory_mb", "%d MB is below the %d MB Docker accepts", fn.MemoryMB, minMemoryMB)
	}
	if fn.MilliCPUs < 0 {
		return fn, failure.Invalid("milli_cpus", "%d is negative", fn.MilliCPUs)
	}
	if fn.GPUs < 0 {
		return fn, failure.Invalid("gpus", "%d is negative", fn.GPUs)
	}
	if fn.MaxConcurrency < 0 {
		return fn, failure.Invalid("max_concurrency", "%d is negative", fn.MaxConcurrency)
	}
	if fn.TargetConcurrency < 0 || fn.TargetConcurrency > maxTargetConcurrency {
		return fn, failure.Invalid("target_concurrency", "%d is outside 0–%d", fn.TargetConcurrency, maxTargetConcurrency)
	}
	if fn.TargetConcurrency == 1 {
		fn.TargetConcurrency = 0 // the default, one pool (and key) for both spellings
	}
	for name := range fn.Config {
		if name == "" || strings.ContainsAny(name, "=\x00") {
			return fn, failure.Invalid("config", "%q is not an environment variable name", name)
		}
		for _, reserved := range reservedEnv {
			if name == reserved {
				return fn, failure.Invalid("config", "%s is set by the container contract and cannot be configured", name)
			}
		}
	}
	defaults := []struct {
		d   *time.Duration
		def time.Duration
		f   string
	}{{&fn.Timeout, DefaultTimeout, "timeout"}, {&fn.IdleTimeout, DefaultIdleTimeout, "idle_timeout"}, {&fn.InitTimeout, DefaultInitTimeout, "init_timeout"}}
	for _, d := range defaults {
		if *d.d < 0 {
			return fn, failure.Invalid(d.f, "%v is negative", *d.d)
		}
		if *d.d == 0 {
			*d.d = d.def
		}
	}
	if fn.MaxRequestBytes < 0 || fn.MaxResponseBytes < 0 {
		return fn, failure.Invalid("max_request_bytes", "body limits cannot be negative")
	}
	if fn.MaxRequestBytes == 0 {
		fn.MaxRequestBytes = DefaultMaxRequestBytes
	}
	if fn.MaxResponseBytes == 0 {
		fn.MaxResponseBytes = DefaultMaxResponseBytes
	}
	return fn, nil
}

// resources is what one container of fn reserves.
func (fn FunctionConfig) resources() Resources {
	return Resources{MemoryBytes: fn.MemoryMB << 20, MilliCPUs: fn.MilliCPUs, GPUs: fn.GPUs}
}

// poolKey is the identity of a normalized configuration: a hash of every
// field but the credential. JSON sorts map keys, so equal configurations
// hash equally.
func (fn FunctionConfig) poolKey() string {
	raw, err := json.Marshal(fn)
	if err != nil {
		// A struct of strings, numbers and a string map always marshals.
		panic("fnagent: marshal function config: " + err.Error())
	}
	sum := sha256.Sum256(raw)
	return hex.EncodeToString(sum[:8])
}

// configCache remembers, for each function configuration calls arrived
// with, its normalized form and pool key, so a hot call neither parses the
// image reference nor hashes the configuration again (together a tenth of
// the engine's own CPU per call). Invalid configurations are not kept. It
// holds at most maxCachedConfigs entries and forgets them all when full,
// which costs a few recomputations, never a wrong answer. Safe for
// concurrent use; the zero value is ready.
type configCache struct {
	mu sync.Mutex
	m  map[configIdentity]normalizedConfig
}

const maxCachedConfigs = 4096

type normalizedConfig struct {
	fn  FunctionConfig
	key string
}

// configIdentity is every field of a FunctionConfig but RegistryAuth, in a
// comparable form: Config as its pairs sorted by name. A field added to
// FunctionConfig must be added here (TestConfigIdentityCoversEveryField
// fails otherwise), or two configurations differing in it would share
// containers.
type configIdentity struct {
	id, appID, name, appName, image   string
	memoryMB, milliCPUs               int64
	gpus                              int
	config                            string
	timeout, idleTimeout, initTimeout time.Duration
	maxConcurrency, targetConcurrency int
	unframedLogs                      bool
	maxRequestBytes, maxResponseBytes int64
}

func (fn FunctionConfig) identity() configIdentity {
	id := configIdentity{
		id: fn.ID, appID: fn.AppID, name: fn.Name, appName: fn.AppName, image: fn.Image,
		memoryMB: fn.MemoryMB, milliCPUs: fn.MilliCPUs, gpus: fn.GPUs,
		timeout: fn.Timeout, idleTimeout: fn.IdleTimeout, initTimeout: fn.InitTimeout,
		maxConcurrency: fn.MaxConcurrency, targetConcurrency: fn.TargetConcurrency, unframedLogs: fn.UnframedLogs, maxRequestBytes: fn.MaxRequestBytes, maxResponseBytes: fn.MaxResponseBytes,
	}
	if len(fn.Config) > 0 {
		names := slices.Sorted(maps.Keys(fn.Config))
		var b []byte
		for _, k := range names {
			// Lengths first, so no name or value can pass for another pair.
			v := fn.Config[k]
			b = strconv.AppendInt(b, int64(len(k)), 10)
			b = append(b, ':')
			b = append(b, k...)
			b = strconv.AppendInt(b, int64(len(v)), 10)
			b = append(b, ':')
			b = append(b, v...)
		}
		id.config = string(b)
	}
	return id
}

// normalize is fn.normalized() and its poolKey, with the call's
// RegistryAuth, remembered for the next call of the same configuration.
func (c *configCache) normalize(fn FunctionConfig) (FunctionConfig, string, error) {
	id := fn.identity()
	c.mu.Lock()
	hit, ok := c.m[id]
	c.mu.Unlock()
	if !ok {
		n, err := fn.normalized()
		if err != nil {
			return fn, "", err
		}
		// The cache outlives the call: it keeps a copy of the caller's map
		// and no credential.
		n.RegistryAuth = ""
		n.Config = maps.Clone(n.Config)
		hit = normalizedConfig{fn: n, key: n.poolKey()}
		c.mu.Lock()
		if c.m == nil || len(c.m) >= maxCachedConfigs {
			c.m = map[configIdentity]normalizedConfig{}
		}
		c.m[id] = hit
		c.mu.Unlock()
	}
	n := hit.fn
	n.RegistryAuth = fn.RegistryAuth
	return n, hit.key, nil
}

// pinnedImage checks that ref names an image by a sha256 manifest digest
// alone, the same rule as the node agent's PrepareImage.
func pinnedImage(ref string) error {
	named, err := reference.ParseNormalizedNamed(ref)
	if err != nil {
		return failure.Invalid("image", "%q is not an image reference (%v); want repo@sha256:<64 hex digits>", ref, err)
	}
	if _, tagged := named.(reference.Tagged); tagged {
		return failure.Invalid("image", "%q names a tag as well as a digest; send repo@sha256:<64 hex digits> alone", ref)
	}
	canonical, ok := named.(reference.Canonical)
	if !ok {
		return failure.Invalid("image", "%q is not pinned by a manifest digest; want repo@sha256:<64 hex digits>, because a tag can move", ref)
	}
	if canonical.Digest().Algorithm() != "sha256" {
		return failure.Invalid("image", "%q is pinned by %s; want a sha256 manifest digest", ref, canonical.Digest().Algorithm())
	}
	return nil
}

// Mode says what a call does when no container is free.
type Mode int

const (
	// Wait queues the call for a container, launching one if the function's
	// limits and the node's capacity allow, for at most the call's deadline
	// and Config.MaxSlotWait.
	Wait Mode = iota
	// NoWait takes an idle container or launches one for this call at once,
	// and otherwise returns ErrBusy immediately: the caller would rather try
	// another node than queue here.
	NoWait
)

// CallRequest is one call. The engine reads Body to its end or to the
// first error and does not close it; the caller owns it.
type CallRequest struct {
	// ID is the call's ID (Fn-Call-Id); required, and the key its logs are
	// kept under.
	ID string
	// Header is passed to the function as is, apart from hop-by-hop headers.
	// An HTTP gateway sets Fn-Intent: httprequest, Fn-Http-Method,
	// Fn-Http-Request-Url and the client's headers as Fn-Http-H-*, as Fn's
	// trigger handler does.
	Header http.Header
	// Body is the request body; nil is empty.
	Body io.Reader
	// ContentLength is Body's length if known, else -1 (0 with a nil Body).
	ContentLength int64
	// Deadline, when not zero, ends the call sooner than the function's
	// Timeout would.
	Deadline time.Time
	// Mode chooses waiting or failing fast when no container is free.
	Mode Mode
}

// CallReport describes one call's outcome; Call returns it with or without
// an error.
type CallReport struct {
	CallID string
	FnID   string
	// ContainerID is the container that served the call, empty if none did.
	ContainerID string
	// Cold is true when the call was its container's first.
	Cold bool
	// Launch is where its container's start took the time, on a Cold
	// call; nil otherwise.
	Launch *LaunchTimes
	// Wait is the time from arrival until a container was ready for it.
	Wait time.Duration
	// Duration is the time from arrival until Call returned.
	Duration time.Duration
	// ResponseBytes counts the body bytes written to the caller.
	ResponseBytes int64
	// Kind is empty for a successful call, else the error's kind.
	Kind Kind
}

// LaunchTimes is where a container's start took its time, step by step,
// so a cold start can be explained (and benchmarks can say which step
// dominates).
type LaunchTimes struct {
	// Image is making sure the daemon holds the image: an inspect, or a
	// pull.
	Image time.Duration
	// Create is the container's creation and the attach to its output.
	Create time.Duration
	// Start is the daemon's start of the container.
	Start time.Duration
	// Socket is from the start until the function's socket accepted a
	// connection: the FDK's own start-up.
	Socket time.Duration
	// Prepared says the launch started a container created ahead
	// (prepare.go): Image and Create are then only the hand-over.
	Prepared bool
}
