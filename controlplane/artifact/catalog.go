package artifact

import (
	"context"
	"errors"
	"net/http"
	"strconv"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/controlplane/project"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
)

// findVersion returns the version of name whose content is digest, or nil.
func (s *Service) findVersion(ctx context.Context, name, digest string) (*api.ArtifactVersion, error) {
	var out *api.ArtifactVersion
	err := s.store.View(ctx, func(tx store.Tx) error {
		out = nil
		vs, err := tx.ListArtifacts(name)
		for _, v := range vs {
			if v.SHA256 == digest {
				out = &v.ArtifactVersion
			}
		}
		return err
	})
	return out, err
}

// addVersion adds the next version of name for content digest, in
// project proj, unless a version of name already has that content;
// created says which. A name of another project is refused (a conflict:
// pushProject checked it as the upload began, but it may have been taken
// since).
func (s *Service) addVersion(ctx context.Context, proj, name, digest string, size int64, format string) (api.ArtifactVersion, bool, error) {
	var out store.Artifact
	var created bool
	var err error
	for range 3 { // a concurrent push of another content may take the number
		err = s.store.Update(ctx, func(tx store.Tx) error {
			created = false
			vs, err := tx.ListArtifacts(name)
			if err != nil {
				return err
			}
			seq := 1
			if err := ownedBy(vs, name, proj); err != nil {
				return err
			}
			for _, v := range vs {
				if v.SHA256 == digest {
					out = v
					return nil
				}
				seq = max(seq, v.Seq+1)
			}
			out = store.Artifact{Seq: seq, ArtifactVersion: api.ArtifactVersion{Name: name, Version: "v" + strconv.Itoa(seq),
				SHA256: digest, Size: size, Format: format, CreatedAt: s.now(), Project: proj}}
			created = true
			return tx.CreateArtifact(out)
		})
		if !errors.Is(err, failure.ErrConflict) {
			break
		}
	}
	return out.ArtifactVersion, created, err
}

// listArtifacts answers GET /v1/artifacts: every version of every name,
// ordered by name and then oldest first; ?name= keeps one name.
func (s *Service) listArtifacts(w http.ResponseWriter, r *http.Request) {
	s.writeArtifacts(w, r, r.URL.Query().Get("name"), false)
}

// listArtifactVersions answers GET /v1/artifacts/{name}; an unknown name is
// not found.
func (s *Service) listArtifactVersions(w http.ResponseWriter, r *http.Request) {
	s.writeArtifacts(w, r, r.PathValue("name"), true)
}

// writeArtifacts answers with the versions of name (every name when
// it is ""), of the projects the caller may see (?project= keeps one); a
// name that must exist and is another project's is refused as a run of
// that project is.
func (s *Service) writeArtifacts(w http.ResponseWriter, r *http.Request, name string, must bool) {
	out := api.ArtifactList{Artifacts: []api.ArtifactVersion{}}
	keep, err := project.Filter(r, "list Artifacts")
	var vs []store.Artifact
	if err == nil {
		err = s.store.View(r.Context(), func(tx store.Tx) (err error) { vs, err = tx.ListArtifacts(name); return err })
	}
	if err == nil && must && len(vs) > 0 {
		err = project.Confine(r, vs[0].Project, "read Artifacts")
	}
	for _, v := range vs {
		if keep(v.Project) {
			out.Artifacts = append(out.Artifacts, v.ArtifactVersion)
		}
	}
	if err == nil && must && len(out.Artifacts) == 0 {
		err = failure.NotFound("artifact", name)
	}
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, out)
}

// getArtifactVersion answers GET /v1/artifacts/{name}/versions/{version};
// the version "latest" is the newest.
func (s *Service) getArtifactVersion(w http.ResponseWriter, r *http.Request) {
	var out store.Artifact
	err := s.store.View(r.Context(), func(tx store.Tx) error {
		var err error
		out, err = LookupVersion(tx, r.PathValue("name"), r.PathValue("version"))
		return err
	})
	if err == nil {
		err = project.Confine(r, out.Project, "read Artifacts")
	}
	if err != nil {
		httpapi.WriteError(w, err)
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, out.ArtifactVersion)
}

// LookupVersion finds name@version; "" and "latest" are the newest.
func LookupVersion(tx store.Tx, name, version string) (store.Artifact, error) {
	if version != "" && version != "latest" {
		return tx.GetArtifact(name, version)
	}
	vs, err := tx.ListArtifacts(name)
	if err != nil {
		return store.Artifact{}, err
	}
	if len(vs) == 0 {
		return store.Artifact{}, failure.NotFound("artifact", name)
	}
	return vs[len(vs)-1], nil
}

// ServeContent serves the signed reads of a content store the control
// plane serves itself (the local directory, PostgreSQL). With S3, content
// is never served here: nodes read it from the bucket.
func (s *Service) ServeContent(w http.ResponseWriter, r *http.Request) {
	if l, ok := s.cfg.Content.(interface {
		ServeRead(http.ResponseWriter, *http.Request)
	}); ok {
		l.ServeRead(w, r)
		return
	}
	httpapi.WriteError(w, failure.NotFound("content", r.PathValue("digest")))
}
