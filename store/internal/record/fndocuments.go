package record

import (
	"encoding/json"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/store"
)

// The stored documents of the Functions records (see documents.go).

// appDoc is a store.App as stored. SecretConfig is only read: a Store
// refuses to write it (App), but records of earlier versions hold it.
type appDoc struct {
	ID           string                     `json:"id"`
	Name         string                     `json:"name"`
	Config       map[string]string          `json:"config,omitempty"`
	Annotations  map[string]json.RawMessage `json:"annotations,omitempty"`
	SyslogURL    *string                    `json:"syslog_url,omitempty"`
	SecretConfig map[string]string          `json:"secret_config,omitempty"`
	Shape        string                     `json:"shape,omitempty"`
	CreatedAt    time.Time                  `json:"created_at"`
	UpdatedAt    time.Time                  `json:"updated_at"`
	SealedConfig map[string][]byte          `json:"sealed_config,omitempty"`
	Project      string                     `json:"project,omitempty"`
}

func appDocOf(a store.App) appDoc {
	return appDoc{ID: a.ID, Name: a.Name, Config: a.Config, Annotations: a.Annotations,
		SyslogURL: a.SyslogURL, SecretConfig: a.SecretConfig, Shape: a.Shape, CreatedAt: a.CreatedAt,
		UpdatedAt: a.UpdatedAt, SealedConfig: a.SealedConfig, Project: a.Project}
}

func (d appDoc) record() store.App {
	return store.App{App: api.App{ID: d.ID, Name: d.Name, Config: d.Config, Annotations: d.Annotations,
		SyslogURL: d.SyslogURL, SecretConfig: d.SecretConfig, Shape: d.Shape, CreatedAt: d.CreatedAt,
		UpdatedAt: d.UpdatedAt, Project: d.Project}, SealedConfig: d.SealedConfig}
}

// fnDoc is a store.Fn as stored; SecretConfig as appDoc's.
type fnDoc struct {
	ID             string                     `json:"id"`
	Name           string                     `json:"name"`
	AppID          string                     `json:"app_id"`
	Image          string                     `json:"image"`
	PinnedImage    string                     `json:"pinned_image,omitempty"`
	Memory         uint64                     `json:"memory,omitempty"`
	Timeout        int32                      `json:"timeout,omitempty"`
	IdleTimeout    int32                      `json:"idle_timeout,omitempty"`
	Config         map[string]string          `json:"config,omitempty"`
	Annotations    map[string]json.RawMessage `json:"annotations,omitempty"`
	SecretConfig   map[string]string          `json:"secret_config,omitempty"`
	CPU            float64                    `json:"cpu,omitempty"`
	GPUs           int                        `json:"gpus,omitempty"`
	GPUModel       string                     `json:"gpu_model,omitempty"`
	MaxConcurrency int                        `json:"max_concurrency,omitempty"`
	Shape          string                     `json:"shape,omitempty"`
	CreatedAt      time.Time                  `json:"created_at"`
	UpdatedAt      time.Time                  `json:"updated_at"`
	SealedConfig   map[string][]byte          `json:"sealed_config,omitempty"`
}

func fnDocOf(f store.Fn) fnDoc {
	return fnDoc{ID: f.ID, Name: f.Name, AppID: f.AppID, Image: f.Image, PinnedImage: f.PinnedImage,
		Memory: f.Memory, Timeout: f.Timeout, IdleTimeout: f.IdleTimeout, Config: f.Config,
		Annotations: f.Annotations, SecretConfig: f.SecretConfig, CPU: f.CPU, GPUs: f.GPUs,
		GPUModel: f.GPUModel, MaxConcurrency: f.MaxConcurrency, Shape: f.Shape, CreatedAt: f.CreatedAt,
		UpdatedAt: f.UpdatedAt, SealedConfig: f.SealedConfig}
}

func (d fnDoc) record() store.Fn {
	return store.Fn{Fn: api.Fn{ID: d.ID, Name: d.Name, AppID: d.AppID, Image: d.Image, PinnedImage: d.PinnedImage,
		Memory: d.Memory, Timeout: d.Timeout, IdleTimeout: d.IdleTimeout, Config: d.Config,
		Annotations: d.Annotations, SecretConfig: d.SecretConfig, CPU: d.CPU, GPUs: d.GPUs,
		GPUModel: d.GPUModel, MaxConcurrency: d.MaxConcurrency, Shape: d.Shape, CreatedAt: d.CreatedAt,
		UpdatedAt: d.UpdatedAt}, SealedConfig: d.SealedConfig}
}

// triggerDoc is a store.Trigger as stored.
type triggerDoc struct {
	ID          string                     `json:"id"`
	Name        string                     `json:"name"`
	AppID       string                     `json:"app_id"`
	FnID        string                     `json:"fn_id"`
	Type        string                     `json:"type"`
	Source      string                     `json:"source"`
	Annotations map[string]json.RawMessage `json:"annotations,omitempty"`
	CreatedAt   time.Time                  `json:"created_at"`
	UpdatedAt   time.Time                  `json:"updated_at"`
}

func triggerDocOf(t api.Trigger) triggerDoc {
	return triggerDoc{ID: t.ID, Name: t.Name, AppID: t.AppID, FnID: t.FnID, Type: t.Type,
		Source: t.Source, Annotations: t.Annotations, CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt}
}

func (d triggerDoc) record() api.Trigger {
	return api.Trigger{ID: d.ID, Name: d.Name, AppID: d.AppID, FnID: d.FnID, Type: d.Type,
		Source: d.Source, Annotations: d.Annotations, CreatedAt: d.CreatedAt, UpdatedAt: d.UpdatedAt}
}

// fnCallDoc is an api.FnCall as stored: the same fields, so that a
// conversion between them compiles only while they stay the same.
type fnCallDoc struct {
	ID             string     `json:"id"`
	Status         string     `json:"status"`
	AppID          string     `json:"app_id"`
	FnID           string     `json:"fn_id"`
	Error          string     `json:"error,omitempty"`
	ErrorKind      string     `json:"error_kind,omitempty"`
	Attempts       int        `json:"attempts"`
	NodeID         string     `json:"node_id,omitempty"`
	ResponseStatus int        `json:"response_status,omitempty"`
	CreatedAt      time.Time  `json:"created_at"`
	StartedAt      *time.Time `json:"started_at,omitempty"`
	CompletedAt    *time.Time `json:"completed_at,omitempty"`
}

// callDoc is a store.Call as stored.
type callDoc struct {
	fnCallDoc
	Header         map[string][]string `json:"header,omitempty"`
	Body           []byte              `json:"body,omitempty"`
	ResponseHeader map[string][]string `json:"response_header,omitempty"`
	ResponseBody   []byte              `json:"response_body,omitempty"`
	Log            string              `json:"log,omitempty"`
	Due            time.Time           `json:"due"`
	Claim          string              `json:"claim,omitempty"`
}

func callDocOf(c store.Call) callDoc {
	return callDoc{fnCallDoc: fnCallDoc(c.FnCall), Header: c.Header, Body: c.Body,
		ResponseHeader: c.ResponseHeader, ResponseBody: c.ResponseBody, Log: c.Log, Due: c.Due, Claim: c.Claim}
}

func (d callDoc) record() store.Call {
	return store.Call{FnCall: api.FnCall(d.fnCallDoc), Header: d.Header, Body: d.Body,
		ResponseHeader: d.ResponseHeader, ResponseBody: d.ResponseBody, Log: d.Log, Due: d.Due, Claim: d.Claim}
}
