package function

import (
	"context"
	"strings"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
)

// Public invocation.
//
// Fn's invoke and trigger endpoints need no credential (Fn leaves
// authentication to extensions), and the Fn CLI sends none when it
// invokes; web hooks cannot send one either. Mercator keeps every route
// behind a credential unless an app or a trigger is opened explicitly:
//
//   - PublicInvokeAnnotation "true" on an app: every function of the app
//     may be invoked (/invoke/{fn_id}, detached included) and every
//     trigger of the app called, by callers without a credential;
//   - the same annotation on a trigger (or its earlier name,
//     PublicAnnotation): that trigger only.
//
// It is an annotation so that Fn's clients can set it (`fn update app a
// --annotation 'mercator.dev/public-invoke="true"'`), and so every read of
// the app or trigger shows it; `mercator app update APP --public-invoke`
// sets it too. Turning it on or off is recorded in the audit log's entry
// for the change (httpapi.NoteDetail). Invoke-only keys (role invoker)
// remain the way to give a caller one app and nothing else.

// PublicInvokeAnnotation, "true" on an app or a trigger, lets callers
// without a credential invoke it (see above). Off by default.
const PublicInvokeAnnotation = api.AnnotationPublicInvoke

// PublicAnnotation is PublicInvokeAnnotation's earlier name, on triggers
// only; still honoured.
const PublicAnnotation = "mercator.dev/public"

// annotatedTrue reports whether an annotation holds true, as a JSON
// string ("true") or a JSON boolean (true).
func annotatedTrue(ann api.Annotations, key string) bool {
	v := strings.TrimSpace(string(ann[key]))
	return v == `"true"` || v == "true"
}

// appPublic reports whether the app lets callers without a credential
// invoke its functions and triggers.
func appPublic(ann api.Annotations) bool { return annotatedTrue(ann, PublicInvokeAnnotation) }

// triggerPublic reports whether a trigger is public by its own
// annotations (its app may open it too: appPublic).
func triggerPublic(ann api.Annotations) bool {
	return annotatedTrue(ann, PublicInvokeAnnotation) || annotatedTrue(ann, PublicAnnotation)
}

// notePublicChange records in the request's audit entry that what of an
// object was opened to, or closed to, callers without a credential.
func notePublicChange(ctx context.Context, what string, was, now bool) {
	switch {
	case now && !was:
		httpapi.NoteDetail(ctx, what+" public invoke on")
	case was && !now:
		httpapi.NoteDetail(ctx, what+" public invoke off")
	}
}
