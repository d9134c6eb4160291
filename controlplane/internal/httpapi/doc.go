// Package httpapi is the control plane's HTTP plumbing, kept in one place so
// every resource's handlers read, answer and authenticate requests alike:
// decoding a JSON body within a size limit, writing a JSON answer, writing
// an error (failure kinds become HTTP status here and in api.StatusOf, and
// nowhere else), Fn's paging parameters, API credentials (hashing, minting,
// roles, and the brief cache of named tokens every public route checks,
// access.go), the audit log's queue (audit.go), the identity of the node a
// node-protocol call comes from, and recovering a handler's panic as a 500.
//
// It knows no resource. Only package controlplane and its subpackages may
// import it (it is internal to controlplane).
package httpapi
