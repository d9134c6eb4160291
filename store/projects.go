package store

import "github.com/mercator/mercator/api"

// ProjectsTx is the part of Tx that holds projects: a team's guaranteed
// quota, its weight and its pools (docs/teams.md).
type ProjectsTx interface {
	// CreateProject stores a new project; ErrConflict if the name exists.
	CreateProject(p Project) error
	// GetProject returns a stored project; ErrNotFound if there is none
	// (the default project is "stored" only once someone updates it; the
	// control plane shows a zero one until then).
	GetProject(name string) (Project, error)
	// PutProject replaces an existing project; ErrNotFound if it was
	// removed meanwhile.
	PutProject(p Project) error
	// ListProjects returns every stored project ordered by name.
	ListProjects() ([]Project, error)
	// DeleteProject removes a project; ErrNotFound if there is none.
	DeleteProject(name string) error
}

// Project is a stored project. Retention: a project lives until `mercator
// project rm`, and a control plane keeps at most api.MaxProjects, so the
// table is bounded by that limit rather than by age.
type Project struct {
	api.Project
}
