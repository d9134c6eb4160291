package nodeagent

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/mercator/mercator/nodeproto"
)

func TestStateSchemaVersionIsTheMigrationCount(t *testing.T) {
	if SchemaVersion != len(migrations) {
		t.Fatalf("SchemaVersion = %d but there are %d migrations", SchemaVersion, len(migrations))
	}
}

// writeUnversionedState writes a state file the way the agent did before
// the file had a schema version: the six buckets, an enrollment, an applied
// operation and a spooled event, and no schema_version key.
func writeUnversionedState(t *testing.T, dir string) nodeproto.Event {
	t.Helper()
	db, err := bolt.Open(filepath.Join(dir, "agent.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ev := nodeproto.Event{ID: "abc123-0000000000000001", Kind: nodeproto.EventResult, Result: &nodeproto.Result{OperationID: "op-1", Outcome: nodeproto.OutcomeOK}}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, name := range []string{"meta", "applied", "spool", "workloads", "stops", "acked"} {
			if _, err := tx.CreateBucket([]byte(name)); err != nil {
				return err
			}
		}
		meta := tx.Bucket([]byte("meta"))
		session, err := json.Marshal(storedSession{Token: "tok", ExpiresAt: time.Now().Add(time.Hour).UTC()})
		if err != nil {
			return err
		}
		for k, v := range map[string][]byte{"incarnation": []byte("abc123"), "event_ceiling": putUint(1024), "fencing_token": putUint(7),
			"session": session, "node_id": []byte("n1")} {
			if err := meta.Put([]byte(k), v); err != nil {
				return err
			}
		}
		applied, err := json.Marshal(appliedEntry{AppliedAt: time.Now().UTC(), Result: ev})
		if err != nil {
			return err
		}
		if err := tx.Bucket([]byte("applied")).Put([]byte("op-1"), applied); err != nil {
			return err
		}
		spooled, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		if err := tx.Bucket([]byte("spool")).Put(putUint(1), spooled); err != nil {
			return err
		}
		stop := nodeproto.WorkloadKey{RunID: "r", Attempt: 1}
		return tx.Bucket([]byte("stops")).Put(workloadKeyBytes(stop), []byte("timeout"))
	})
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

func schemaVersionIn(t *testing.T, dir string) uint64 {
	t.Helper()
	db, err := bolt.Open(filepath.Join(dir, "agent.db"), 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var v uint64
	if err := db.View(func(tx *bolt.Tx) error {
		v = getUint(tx.Bucket(bucketMeta).Get(keySchemaVersion))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return v
}

func TestStateWrittenBeforeVersionsOpensAndIsStamped(t *testing.T) {
	dir := t.TempDir()
	ev := writeUnversionedState(t, dir)
	s := openTestState(t, dir)
	if s.NodeID() != "n1" || s.FencingToken() != 7 || !s.Applied("op-1") {
		t.Errorf("node %q, fencing %d, op-1 applied %v; want what the old file held", s.NodeID(), s.FencingToken(), s.Applied("op-1"))
	}
	if tok, _, ok := s.Session(); !ok || tok != "tok" {
		t.Errorf("session = %q, %v; want the old file's", tok, ok)
	}
	if got, err := s.Spooled(10); err != nil || len(got) != 1 || got[0].ID != ev.ID {
		t.Errorf("spool = %+v, %v; want the old file's event", got, err)
	}
	if r := s.StopReason(nodeproto.WorkloadKey{RunID: "r", Attempt: 1}); r != "timeout" {
		t.Errorf("stop reason = %q, want the old file's", r)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if v := schemaVersionIn(t, dir); v != SchemaVersion {
		t.Errorf("schema version after opening = %d, want %d", v, SchemaVersion)
	}
	// A fresh file is stamped too.
	fresh := t.TempDir()
	openTestState(t, fresh).Close()
	if v := schemaVersionIn(t, fresh); v != SchemaVersion {
		t.Errorf("schema version of a new file = %d, want %d", v, SchemaVersion)
	}
}

func TestStateFromANewerAgentIsRefused(t *testing.T) {
	dir := t.TempDir()
	openTestState(t, dir).Close()
	db, err := bolt.Open(filepath.Join(dir, "agent.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(keySchemaVersion, putUint(SchemaVersion+1))
	}); err != nil {
		t.Fatal(err)
	}
	db.Close()
	s, err := OpenState(dir)
	if err == nil {
		s.Close()
		t.Fatal("OpenState of a newer agent's file succeeded")
	}
	if !errors.Is(err, ErrNewerState) {
		t.Errorf("OpenState = %v, want ErrNewerState", err)
	}
	t.Logf("error as reported: %v", err)
}
