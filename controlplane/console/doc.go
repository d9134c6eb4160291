// Package console is the control plane's web console, served at /ui/: a
// sign-in page, the Fleet, Runs, Functions, Artifacts and Audit pages,
// a run's live log, and the actions an operator or submitter takes from
// them (cancel, resubmit, cordon, drain, uncordon).
//
// The pages are rendered on the server from html/templates embedded in
// the binary (nothing is fetched at run time, and every replica serves
// the same console); one small script follows a run's log over
// server-sent events. The console holds no data of its own: it reads and
// changes the control plane through the public API, as the signed-in
// credential (API, a narrow interface the control plane satisfies with an
// in-process client), so roles, limits and the audit log apply to a click
// exactly as to the CLI. Only package controlplane imports it.
package console
