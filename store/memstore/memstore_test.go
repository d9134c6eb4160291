package memstore_test

import (
	"testing"

	"github.com/mercator/mercator/store"
	"github.com/mercator/mercator/store/memstore"
	"github.com/mercator/mercator/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(*testing.T) store.Store { return memstore.New() })
}
