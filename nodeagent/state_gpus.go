package nodeagent

import (
	"encoding/json"
	"fmt"

	"github.com/mercator/mercator/nodeproto"
	bolt "go.etcd.io/bbolt"
)

// keyGPUInventory holds, in the meta bucket, the GPUs this machine has
// listed since it was enrolled (JSON []nodeproto.Accelerator), so that a
// card that vanished is still known after the agent restarts. It was added
// beside schema version 1 without a new version: an agent that does not
// know the key leaves it alone, and a file without it is an inventory not
// kept yet.
var keyGPUInventory = []byte("gpu_inventory")

// GPUInventory is the GPUs kept by SaveGPUInventory, nil when none are (a
// new file, a machine without GPUs, or one enrolled again since).
func (s *State) GPUInventory() ([]nodeproto.Accelerator, error) {
	var out []nodeproto.Accelerator
	err := s.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketMeta).Get(keyGPUInventory)
		if b == nil {
			return nil
		}
		return json.Unmarshal(b, &out)
	})
	if err != nil {
		return nil, fmt.Errorf("read the GPU inventory from the agent state: %w", err)
	}
	return out, nil
}

// SaveGPUInventory keeps the GPUs this machine lists (with those it listed
// before and no longer does), replacing what was kept; nil forgets them.
func (s *State) SaveGPUInventory(gpus []nodeproto.Accelerator) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.update(func(tx *bolt.Tx) error { return putGPUInventory(tx, gpus) })
}

func putGPUInventory(tx *bolt.Tx, gpus []nodeproto.Accelerator) error {
	meta := tx.Bucket(bucketMeta)
	if len(gpus) == 0 {
		return meta.Delete(keyGPUInventory)
	}
	return putJSON(meta, keyGPUInventory, gpus)
}
