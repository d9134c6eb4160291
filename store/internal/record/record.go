// Package record holds the rules every Store implementation applies the same
// way: which keys a record must have, which nodes a run touches, how a log
// append treats bytes the store already holds, and how a record is written
// as a stored document and read back (Encode and Decode, documents.go): the
// stored format is spelled out here, apart from the api wire types, so the
// public API can change without the data on disk changing. Keeping them in
// one place is what keeps memstore (the fake) and sqlstore from drifting
// apart in ways the conformance suite might not catch.
//
// Only the store implementations under store/ import record.
package record

import (
	"slices"
	"strings"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/store"
)

// Node checks that n can be stored: it needs an ID.
func Node(n store.Node) error {
	return required("id", n.ID)
}

// Invitation checks that inv can be stored: it needs a token hash.
func Invitation(inv store.Invitation) error {
	return required("token_hash", inv.TokenHash)
}

// Session checks that s can be stored: it needs a token hash and a node,
// because DeleteSessions finds sessions by node.
func Session(s store.Session) error {
	if err := required("token_hash", s.TokenHash); err != nil {
		return err
	}
	return required("node_id", s.NodeID)
}

// Run checks that r can be stored: it needs an ID, and its secrets only
// sealed (store.Run.SealedSecrets): Secrets may only show, redacted, the
// names sealed.
func Run(r store.Run) error {
	if err := required("id", r.ID); err != nil {
		return err
	}
	for name, v := range r.Secrets {
		if _, sealed := r.SealedSecrets[name]; v != api.SecretRedacted || !sealed {
			return failure.Invalid("secrets", "run %s: secret %s must be sealed before it is stored (SealedSecrets); a store never holds a secret in the clear", r.ID, name)
		}
	}
	return nil
}

// Operation checks that op can be stored: it needs an ID and a node, because
// PendingOperations finds operations by node.
func Operation(op store.Operation) error {
	if err := required("id", op.ID); err != nil {
		return err
	}
	return required("node_id", op.NodeID)
}

// Token checks that t can be stored: it needs a hash.
func Token(t store.Token) error {
	return required("hash", t.Hash)
}

// AuditEntry checks that e can be stored: it needs an ID.
func AuditEntry(e store.AuditEntry) error {
	return required("id", e.ID)
}

// Artifact checks that a can be stored: it needs a name and a version.
func Artifact(a store.Artifact) error {
	if err := required("name", a.Name); err != nil {
		return err
	}
	return required("version", a.Version)
}

// RegistryCredential checks that c can be stored: it needs a host.
func RegistryCredential(c store.RegistryCredential) error {
	return required("host", c.Host)
}

// ArtifactKey is the one key memstore files an Artifact version under.
func ArtifactKey(name, version string) string { return name + "\x00" + version }

// Event checks the key of SeeEvent.
func Event(nodeID, eventID string) error {
	if err := required("node_id", nodeID); err != nil {
		return err
	}
	return required("event_id", eventID)
}

// LogKey checks the key and offset of AppendLog and ReadLog.
func LogKey(key nodeproto.WorkloadKey, offset int64) error {
	if err := required("run_id", key.RunID); err != nil {
		return err
	}
	if offset < 0 {
		return failure.Invalid("offset", "log offset %d of run %q attempt %d is negative", offset, key.RunID, key.Attempt)
	}
	return nil
}

// ReadMax checks the max argument of ReadLog.
func ReadMax(key nodeproto.WorkloadKey, max int) error {
	if max < 0 {
		return failure.Invalid("max", "log read of run %q attempt %d asks for %d bytes", key.RunID, key.Attempt, max)
	}
	return nil
}

// NodeIDs returns the distinct nodes r has attempts on, sorted: what
// ListRunsOptions.NodeID matches against.
func NodeIDs(r store.Run) []string {
	var ids []string
	for _, a := range r.Attempts {
		if a.NodeID != "" {
			ids = append(ids, a.NodeID)
		}
	}
	slices.Sort(ids)
	return slices.Compact(ids)
}

// LogTail returns the part of data, written at offset, that lies beyond a
// log of the given size: nil when the log already holds all of it. A chunk
// that starts beyond the size (a gap) is returned whole, to be appended as if
// it were contiguous, as the AppendLog contract says.
func LogTail(size, offset int64, data []byte) []byte {
	if offset >= size {
		return data
	}
	held := size - offset
	if held >= int64(len(data)) {
		return nil
	}
	return data[held:]
}

func required(field, v string) error {
	if v == "" {
		return failure.Invalid(field, "%s is required", field)
	}
	return nil
}

// SortInvitations orders a node's invitations as ListInvitations returns
// them: oldest first, then by hash.
func SortInvitations(invs []store.Invitation) {
	slices.SortFunc(invs, func(a, b store.Invitation) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.TokenHash, b.TokenHash)
	})
}

// SortTokens orders tokens as ListTokens returns them: by name, then hash.
func SortTokens(toks []store.Token) {
	slices.SortFunc(toks, func(a, b store.Token) int {
		if c := strings.Compare(a.Name, b.Name); c != 0 {
			return c
		}
		return strings.Compare(a.Hash, b.Hash)
	})
}

// AuditNewer orders audit entries as ListAudit returns them: newest first
// (by At, then ID).
func AuditNewer(a, b store.AuditEntry) int {
	if c := b.At.Compare(a.At); c != 0 {
		return c
	}
	return strings.Compare(b.ID, a.ID)
}

// Project checks that p can be stored: it needs a name.
func Project(p store.Project) error {
	return required("name", p.Name)
}

// RunProject is the project a run counts against, as ListRunsOptions.Project
// filters it: api.DefaultProject for a run stored without one.
func RunProject(r store.Run) string {
	return api.ProjectOf(r.Project)
}
