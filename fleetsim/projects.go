package fleetsim

import (
	"context"
	"fmt"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/client"
)

// The simulation with teams (Config.Projects, docs/teams.md): the fleet's
// CPU and memory split into that many projects' guaranteed quotas, with
// weights 1, 2 and 3 in turn, and the runs submitted to each project in
// turn, every fourth call's runs at a higher priority. So the control
// plane plans with quotas, borrowing, fair share and priorities, as a
// shared fleet's does; the report's figures then read beside the same
// simulation without projects.

// projectName is project i's name.
func projectName(i int) string { return fmt.Sprintf("team-%02d", i) }

// createProjects creates cfg.Projects projects sharing the fleet's
// capacity as their quotas.
func (s *sim) createProjects(ctx context.Context, c *client.Client) error {
	n := s.cfg.Projects
	cpu := s.cfg.NodeCPUs * float64(s.cfg.Nodes) / float64(n)
	mem := s.cfg.NodeMemory * int64(s.cfg.Nodes) / int64(n)
	for i := range n {
		p := api.Project{Name: projectName(i), Quota: api.Quota{CPU: cpu, MemoryBytes: mem}, Weight: float64(1 + i%3)}
		if _, err := c.CreateProject(ctx, p); err != nil {
			return fmt.Errorf("create project %s: %w", p.Name, err)
		}
	}
	return nil
}

// forCall is spec as submission call k sends it: with projects, call k's
// runs go to project k mod Projects, every fourth call's at priority 10.
func forCall(cfg Config, spec api.RunSpec, k int) api.RunSpec {
	if cfg.Projects <= 0 {
		return spec
	}
	spec.Project = projectName(k % cfg.Projects)
	if k%4 == 0 {
		spec.Priority = 10
	}
	return spec
}
