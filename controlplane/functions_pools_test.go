package controlplane

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/nodeproto"
	"github.com/mercator/mercator/scheduler"
	"github.com/mercator/mercator/store"
)

// TestFunctionsStayInTheirProjectsPools: a function whose app belongs to a
// project restricted to pools is called only on nodes in them, so its
// containers and the secrets they start with go nowhere else; with no
// ready node in them, a call is refused saying which pools.
func TestFunctionsStayInTheirProjectsPools(t *testing.T) {
	f := newFnFixture(t)
	f.startNode("n1", echo)
	f.startNode("n2", echo)
	if err := f.st.Update(context.Background(), func(tx store.Tx) error {
		n, err := tx.GetNode("n2")
		if err != nil {
			return err
		}
		n.Labels = map[string]string{"pool": "secure"}
		return tx.PutNode(n)
	}); err != nil {
		t.Fatal(err)
	}
	f.want(201, nil, "POST", "/v1/projects", api.Project{Name: "vault", Pools: []string{"secure"}})
	f.want(201, nil, "POST", "/v1/projects", api.Project{Name: "nowhere", Pools: []string{"empty"}})
	f.want(200, nil, "POST", "/v2/apps", api.App{Name: "vaultapp", Project: "vault"})
	f.want(200, nil, "POST", "/v2/apps", api.App{Name: "lostapp", Project: "nowhere"})
	// A function the rendezvous order would put on n1 first, were the
	// pools not applied: the test then fails without them.
	share := nodeproto.FunctionCapacity{MemoryBytes: 2 << 30, MilliCPUs: 1000}
	var fn api.Fn
	for i := 0; ; i++ {
		_, fn = f.deploy("vaultapp", api.Fn{Name: fmt.Sprintf("echo-%d", i), SecretConfig: map[string]string{"TOKEN": "s3"}})
		order := scheduler.PlaceFunction(fn.ID, []scheduler.FunctionNode{{ID: "n1", Share: share}, {ID: "n2", Share: share}}, scheduler.FunctionNeed{MemoryBytes: 128 << 20})
		if order[0].ID == "n1" {
			break
		}
		if i == 20 {
			t.Fatal("no function of 20 ranks n1 first")
		}
	}
	for i := range 6 {
		status, h, body := f.do("POST", "/invoke/"+fn.ID, "ping")
		if status != 201 || h.Get("X-Node") != "n2" {
			t.Fatalf("call %d = %d %q on %q, want it on n2, the only node in pool secure", i, status, body, h.Get("X-Node"))
		}
	}
	_, lost := f.deploy("lostapp", api.Fn{Name: "echo"})
	status, _, body := f.do("POST", "/invoke/"+lost.ID, "ping")
	if status != 503 || !strings.Contains(string(body), "project nowhere's pools (empty)") {
		t.Fatalf("a call with no node in its project's pools = %d %s", status, body)
	}
}
