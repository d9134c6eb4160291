package nodeagent

import (
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// The state file's layout, schema version 1. Buckets are at the top level;
// under each, its keys and what their values hold. Integers are 8-byte
// big-endian, so a bucket's keys sort in numeric order.
//
//	meta
//	├── schema_version          uint: the layout of this file (SchemaVersion)
//	├── incarnation             random hex fixed when the file is created:
//	│                           the prefix of every event ID
//	├── event_ceiling           uint: the last event sequence reserved
//	├── fencing_token           uint: the token of the latest enrollment
//	├── session                 JSON storedSession: the session credential
//	│                           and when it expires
//	├── node_id                 the node this file belongs to
//	└── gpu_inventory           JSON []nodeproto.Accelerator: the GPUs listed
//	                            since enrollment (state_gpus.go; added
//	                            without a version: older agents ignore it)
//	applied
//	└── <operation ID>          JSON appliedEntry: when it was applied and
//	                            its result event (and, in entries written
//	                            before bucket acked, AckedAt)
//	acked
//	└── <operation ID>          uint: Unix nanoseconds its result was
//	                            acknowledged
//	spool
//	└── <event sequence>        JSON nodeproto.Event owed to the control plane
//	workloads
//	└── <run ID>/<attempt>      JSON nodeproto.WorkloadObservation: what the
//	                            control plane was last told of the workload
//	stops
//	└── <run ID>/<attempt>      why a stop was asked for ("cancelled",
//	                            "timeout"), read back into observations
//
// Changing a name, a key's encoding or a value's shape is a new schema
// version and a migration below, never an edit in place: a machine's file
// outlives the agent binary that wrote it.
var (
	bucketMeta      = []byte("meta")
	bucketApplied   = []byte("applied")
	bucketSpool     = []byte("spool")
	bucketWorkloads = []byte("workloads")
	bucketStops     = []byte("stops")
	// bucketAcked is beside the applied entries rather than in them, so
	// that acknowledging is not a rewrite of the entry.
	bucketAcked = []byte("acked")

	keySchemaVersion = []byte("schema_version")
	keyIncarnation   = []byte("incarnation")
	keyEventCeil     = []byte("event_ceiling")
	keyFencing       = []byte("fencing_token")
	keySession       = []byte("session")
	keyNodeID        = []byte("node_id")
)

// SchemaVersion is the layout this agent reads and writes. It is the number
// of migrations below (TestStateSchemaVersionIsTheMigrationCount).
const SchemaVersion = 1

// ErrNewerState is what OpenState returns for a file whose schema version is
// newer than SchemaVersion: one written by a newer agent. Reading it anyway
// could misread or drop what that agent recorded (applied operations,
// events owed), which is the memory this file exists to keep, so the way
// back is to run the newer agent again.
var ErrNewerState = errors.New("the agent state was written by a newer agent")

// migration brings the file from its index in migrations to the next
// version, inside the transaction that opens the file, so a crash leaves it
// at the old version or the new one.
type migration struct {
	what  string
	apply func(tx *bolt.Tx) error
}

// migrations, in order: migrations[v] takes version v to v+1. Version 0 is
// a file with no schema_version key: one written before the file had a
// version (whose layout is version 1's), or a new, empty one.
var migrations = []migration{
	{what: "the layout drawn above", apply: createBuckets(bucketMeta, bucketApplied, bucketSpool, bucketWorkloads, bucketStops, bucketAcked)},
}

func createBuckets(names ...[]byte) func(tx *bolt.Tx) error {
	return func(tx *bolt.Tx) error {
		for _, name := range names {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		return nil
	}
}

// migrate brings the file to SchemaVersion and stamps it, or refuses a
// file newer than that with ErrNewerState.
func migrate(tx *bolt.Tx) error {
	var version uint64
	if meta := tx.Bucket(bucketMeta); meta != nil {
		version = getUint(meta.Get(keySchemaVersion))
	}
	if version > SchemaVersion {
		return fmt.Errorf("%w: it is schema version %d and this agent knows versions up to %d; run the agent that wrote it", ErrNewerState, version, SchemaVersion)
	}
	if version == SchemaVersion {
		return nil
	}
	for v := version; v < SchemaVersion; v++ {
		if err := migrations[v].apply(tx); err != nil {
			return fmt.Errorf("migrate the agent state from schema version %d (%s): %w", v, migrations[v].what, err)
		}
	}
	return tx.Bucket(bucketMeta).Put(keySchemaVersion, putUint(SchemaVersion))
}
