package artifact

import (
	"net/http"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/project"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
)

// An Artifact name belongs to one project (docs/teams.md): the project its
// first version was pushed to. Every later version is pushed to the same
// project; listings show a caller the names of the projects it may see;
// a read of another project's name, or of an upload to it, is refused to
// a confined caller as a run of that project is (403); and a run mounts
// only its own project's Artifacts (package controlplane checks that at
// submit). Names stay unique across projects, so a reference NAME@VERSION
// means one thing everywhere.

// pushProject is the project a push of name goes to: the one named (or
// the caller's), which must exist, be one the caller may use, and own the
// name if any project does.
func (s *Service) pushProject(r *http.Request, name, named string) (string, error) {
	proj, err := project.Named(r, named, "push Artifacts")
	if err != nil {
		return "", err
	}
	err = s.store.View(r.Context(), func(tx store.Tx) error {
		if err := project.Exists(tx, "project", proj); err != nil {
			return err
		}
		vs, err := tx.ListArtifacts(name)
		if err == nil && len(vs) > 0 {
			if err = project.Confine(r, vs[0].Project, "push Artifacts"); err == nil {
				err = ownedBy(vs, name, proj)
			}
		}
		return err
	})
	return proj, err
}

// ownedBy refuses a push to project proj of name, whose versions are vs,
// when the name is another project's.
func ownedBy(vs []store.Artifact, name, proj string) error {
	if len(vs) == 0 || api.ProjectOf(vs[0].Project) == proj {
		return nil
	}
	return failure.Conflict("artifact %s belongs to project %s, not %s: push it with --project %s, or choose another name",
		name, api.ProjectOf(vs[0].Project), proj, api.ProjectOf(vs[0].Project))
}

// scopedUpload is the upload the request's {id} names, refused to a
// confined caller when it is an upload to another project's name.
func (s *Service) scopedUpload(r *http.Request) (*upload, error) {
	u, err := s.loadUpload(r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	return u, project.Confine(r, u.meta.Project, "touch uploads")
}
