package controlplane

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"github.com/mercator/mercator/api"
)

type openAPIDoc struct {
	Paths      map[string]map[string]any `json:"paths"`
	Components struct {
		Schemas map[string]struct {
			Properties map[string]any   `json:"properties"`
			AllOf      []map[string]any `json:"allOf"`
		} `json:"schemas"`
	} `json:"components"`
}

// TestOpenAPIDocumentsEveryRouteAndField keeps the served OpenAPI document
// honest: every public route is documented, nothing undocumented is served,
// and every JSON field of the request and response types appears in its
// schema.
func TestOpenAPIDocumentsEveryRouteAndField(t *testing.T) {
	var doc openAPIDoc
	if err := json.Unmarshal(openAPI, &doc); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	served := map[string]bool{}
	for _, rt := range (&Server{}).publicRoutes() {
		method, path, _ := strings.Cut(rt.Pattern, " ")
		served[method+" "+path] = true
		op, ok := doc.Paths[path][strings.ToLower(method)]
		if !ok {
			t.Errorf("route %s is served but not documented", rt.Pattern)
			continue
		}
		// The role the access table declares (routes.go) is the one the
		// document states.
		fields, _ := op.(map[string]any)
		invoker, _ := fields["x-mercator-invoker"].(bool)
		public, _ := fields["x-mercator-public"].(bool)
		if fields["x-mercator-role"] != string(rt.Access.Role) || invoker != rt.Access.Invoker || public != rt.Access.Public {
			t.Errorf("route %s: the document states role %v, invoker %v, public %v; routes.go declares %+v",
				rt.Pattern, fields["x-mercator-role"], invoker, public, rt.Access)
		}
	}
	for path, ops := range doc.Paths {
		for method := range ops {
			if method == "parameters" {
				continue
			}
			if !served[strings.ToUpper(method)+" "+path] {
				t.Errorf("%s %s is documented but not served", method, path)
			}
		}
	}
	check := func(schema string, v any) {
		props := map[string]any{}
		s := doc.Components.Schemas[schema]
		for k, p := range s.Properties {
			props[k] = p
		}
		for _, part := range s.AllOf {
			if pp, ok := part["properties"].(map[string]any); ok {
				for k, p := range pp {
					props[k] = p
				}
			}
			if ref, ok := part["$ref"].(string); ok {
				for k, p := range doc.Components.Schemas[strings.TrimPrefix(ref, "#/components/schemas/")].Properties {
					props[k] = p
				}
			}
		}
		walkJSONFields(reflect.TypeOf(v), func(name string) {
			if _, ok := props[name]; !ok {
				t.Errorf("schema %s lacks field %q", schema, name)
			}
		})
	}
	check("RunSpec", api.RunSpec{})
	check("Run", api.Run{})
	check("RunList", api.RunList{})
	check("RunBatch", api.RunBatch{})
	check("Attempt", api.Attempt{})
	check("Node", api.Node{})
	check("Invitation", api.Invitation{})
	check("InvitationRequest", api.InvitationRequest{})
	check("DrainRequest", api.DrainRequest{})
	// Functions (package function): Fn's shapes and Mercator's additions.
	for name, v := range map[string]any{"App": api.App{}, "AppList": api.AppList{}, "Fn": api.Fn{}, "FnList": api.FnList{},
		"Trigger": api.Trigger{}, "TriggerList": api.TriggerList{}, "FnError": api.FnError{}, "FnCall": api.FnCall{},
		"FnCallList": api.FnCallList{}, "CallLog": api.CallLog{}, "CallLogResponse": api.CallLogResponse{}, "DetachedCall": api.DetachedCall{}} {
		check(name, v)
	}
	check("ArtifactVersion", api.ArtifactVersion{})
	check("ArtifactList", api.ArtifactList{})
	check("UploadRequest", api.UploadRequest{})
	check("Upload", api.Upload{})
	check("CommitRequest", api.CommitRequest{})
	check("ArtifactMount", api.ArtifactMount{})
	check("RegistryCredentialRequest", api.RegistryCredentialRequest{})
	check("Registry", api.Registry{})
	check("RegistryList", api.RegistryList{})
	check("TokenRequest", api.TokenRequest{})
	check("Token", api.Token{})
	check("TokenCreated", api.TokenCreated{})
	check("TokenList", api.TokenList{})
	check("AuditEntry", api.AuditEntry{})
	check("AuditList", api.AuditList{})
	check("InvitationInfo", api.InvitationInfo{})
	check("InvitationList", api.InvitationList{})
	check("Project", api.Project{})
	check("Quota", api.Quota{})
	check("ProjectList", api.ProjectList{})
	check("QueuePosition", api.QueuePosition{})
	check("NodeLabelsRequest", api.NodeLabelsRequest{})
	// Agent releases and rollouts (upgrades.go).
	for name, v := range map[string]any{"AgentRelease": api.AgentRelease{}, "AgentReleaseList": api.AgentReleaseList{},
		"RolloutRequest": api.RolloutRequest{}, "Rollout": api.Rollout{}, "RolloutNode": api.RolloutNode{}, "RolloutList": api.RolloutList{}} {
		check(name, v)
	}
}

func walkJSONFields(t reflect.Type, fn func(string)) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if f.Anonymous {
			walkJSONFields(f.Type, fn)
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name != "" && name != "-" {
			fn(name)
		}
	}
}
