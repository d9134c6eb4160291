package function

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/mercator/mercator/api"
	"github.com/mercator/mercator/controlplane/internal/httpapi"
	"github.com/mercator/mercator/failure"
	"github.com/mercator/mercator/store"
)

// validateFnResources checks the ranges Fn checks (zero meaning the
// default, or unchanged in an update) and Mercator's additions.
func validateFnResources(f api.Fn) error {
	switch {
	case f.Timeout < 0 || f.Timeout > api.FnMaxTimeout:
		return errFnInvalidTimeout
	case f.IdleTimeout < 0 || f.IdleTimeout > api.FnMaxIdleTimeout:
		return errFnInvalidIdle
	case f.Memory > api.FnMaxMemoryMB:
		return errFnInvalidMemory
	case f.Memory != 0 && f.Memory < api.FnMinMemoryMB:
		return errFnMemoryBelowFloor
	case f.CPU < 0 || f.CPU > 1024:
		return fnError(http.StatusBadRequest, "cpu value is out of range. It should be between 0 and 1024 cores")
	case f.GPUs < 0 || f.GPUs > 64:
		return fnError(http.StatusBadRequest, "gpus value is out of range. It should be between 0 and 64")
	case f.MaxConcurrency < 0:
		return fnError(http.StatusBadRequest, "max_concurrency value is out of range. It should be 0 (no cap) or more")
	case f.GPUModel != "" && f.GPUs == 0:
		return fnError(http.StatusBadRequest, "gpu_model is set but gpus is 0")
	}
	return nil
}

func validateFnName(name string) error {
	switch {
	case name == "":
		return errFnMissingFnName
	case len(name) > api.MaxFnNameLength:
		return errFnTooLongName
	case !validName(name):
		return errFnInvalidName
	}
	return nil
}

// pin resolves a function's image to a manifest digest.
func (s *Service) pin(ctx context.Context, image string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pinned, err := s.host.Resolve(ctx, image)
	if err != nil {
		status := http.StatusBadRequest
		if errors.Is(err, failure.ErrUnavailable) {
			status = http.StatusServiceUnavailable
		}
		// Fn resolves the image at the first call, and `fn deploy --local`
		// leaves it in the builder's Docker only; Mercator pins it now
		// (docs/functions.md says why), so say what would do.
		return "", fnError(status, "Invalid image %q: %v (a function's image is pinned by digest when it is set, so it must be pushed to a registry the nodes can reach: `fn deploy` without --local)", image, err)
	}
	return pinned, nil
}

func (s *Service) fnCreateFn(w http.ResponseWriter, r *http.Request) {
	var in api.Fn
	if err := decodeFn(r, &in); err != nil {
		s.fnFail(w, err)
		return
	}
	var err error
	switch {
	// Fn's order: its datastore checks the ID and the app before the
	// model checks the name.
	case in.ID != "":
		err = errFnIDProvided
	case in.AppID == "":
		err = errFnMissingFnAppID
	case validateFnName(in.Name) != nil:
		err = validateFnName(in.Name)
	case in.Image == "":
		err = errFnMissingImage
	default:
		err = validateFnResources(in)
	}
	if err != nil {
		s.fnFail(w, err)
		return
	}
	ann, err := compactAnnotations(in.Annotations, false)
	if err == nil {
		ann, err = mergeAnnotations(nil, ann)
	}
	if err == nil {
		_, _, err = warmPolicy(ann)
	}
	if err != nil {
		s.fnFail(w, err)
		return
	}
	config, err := mergeConfig(nil, in.Config)
	if err != nil {
		s.fnFail(w, err)
		return
	}
	id := httpapi.NewID("fn-")
	sealed, err := s.mergeSecrets(secretOwner{"fn", id}, nil, nil, in.SecretConfig)
	if err != nil {
		s.fnFail(w, err)
		return
	}
	// The app must exist before the image is resolved, so a typo in the
	// app costs no registry round trip.
	if err := s.store.View(r.Context(), func(tx store.Tx) error {
		_, err := tx.GetApp(in.AppID)
		return notFoundAs(err, errFnAppNotFound)
	}); err != nil {
		s.fnFail(w, err)
		return
	}
	pinned, err := s.pin(r.Context(), in.Image)
	if err != nil {
		s.fnFail(w, err)
		return
	}
	now := fnTime(s.now())
	f := store.Fn{Fn: api.Fn{ID: id, Name: in.Name, AppID: in.AppID, Image: in.Image, PinnedImage: pinned,
		Memory: in.Memory, Timeout: in.Timeout, IdleTimeout: in.IdleTimeout, Config: config, Annotations: ann,
		CPU: in.CPU, GPUs: in.GPUs, GPUModel: in.GPUModel, MaxConcurrency: in.MaxConcurrency, Shape: in.Shape, CreatedAt: now, UpdatedAt: now},
		SealedConfig: sealed}
	if f.Memory == 0 {
		f.Memory = api.FnDefaultMemoryMB
	}
	if f.Timeout == 0 {
		f.Timeout = api.FnDefaultTimeout
	}
	if f.IdleTimeout == 0 {
		f.IdleTimeout = api.FnDefaultIdle
	}
	err = s.store.Update(r.Context(), func(tx store.Tx) error {
		if _, err := tx.GetApp(f.AppID); err != nil {
			return notFoundAs(err, errFnAppNotFound)
		}
		if dup, err := tx.ListFns(store.ListFnOptions{AppID: f.AppID, Name: f.Name}); err != nil {
			return err
		} else if len(dup) > 0 {
			return errFnExists
		}
		err := tx.CreateFn(f)
		if errors.Is(err, failure.ErrConflict) {
			return errFnExists
		}
		return err
	})
	if err != nil {
		s.fnFail(w, err)
		return
	}
	s.log.Info("function created", "fn", f.ID, "app", f.AppID, "name", f.Name, "image", pinned)
	go s.deployed(f) // its image prefetched, its minimum held (warm.go)
	writeFnJSON(w, http.StatusOK, s.fnView(f))
}

func (s *Service) fnGetFn(w http.ResponseWriter, r *http.Request) {
	var f store.Fn
	err := s.store.View(r.Context(), func(tx store.Tx) (err error) {
		f, err = tx.GetFn(r.PathValue("fn_id"))
		return notFoundAs(err, errFnNotFound)
	})
	if err != nil {
		s.fnFail(w, err)
		return
	}
	writeFnJSON(w, http.StatusOK, s.fnView(f))
}

func (s *Service) fnListFns(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	appID := q.Get("app_id")
	if appID == "" {
		s.fnFail(w, errFnMissingFnAppID) // Fn's datastore says this, not "Missing App ID"
		return
	}
	after, perPage := httpapi.PageParams(r)
	var fns []store.Fn
	err := s.store.View(r.Context(), func(tx store.Tx) (err error) {
		fns, err = tx.ListFns(store.ListFnOptions{AppID: appID, Name: q.Get("name"), After: after, Limit: perPage})
		return err
	})
	if err != nil {
		s.fnFail(w, err)
		return
	}
	var out api.FnList
	out.Items, out.NextCursor = httpapi.ListPage(fns, perPage, s.fnView, func(f store.Fn) string { return f.Name })
	writeFnJSON(w, http.StatusOK, out)
}

// fnUpdateFn applies a patch as Fn does: zero fields are left as they are,
// config merges (an empty value deletes), annotations merge. An image in
// the patch is pinned again even when it is the same reference, so
// deploying a tag that moved takes the new image.
func (s *Service) fnUpdateFn(w http.ResponseWriter, r *http.Request) {
	var patch api.Fn
	if err := decodeFn(r, &patch); err != nil {
		s.fnFail(w, err)
		return
	}
	id := r.PathValue("fn_id")
	if patch.ID != "" && patch.ID != id {
		s.fnFail(w, errFnIDMismatch)
		return
	}
	ann, err := compactAnnotations(patch.Annotations, true)
	if err == nil {
		err = validateFnResources(api.Fn{Timeout: patch.Timeout, IdleTimeout: patch.IdleTimeout, Memory: patch.Memory,
			CPU: patch.CPU, GPUs: patch.GPUs, MaxConcurrency: patch.MaxConcurrency})
	}
	if err != nil {
		s.fnFail(w, err)
		return
	}
	var pinned string
	if patch.Image != "" {
		if pinned, err = s.pin(r.Context(), patch.Image); err != nil {
			s.fnFail(w, err)
			return
		}
	}
	var f store.Fn
	err = s.store.Update(r.Context(), func(tx store.Tx) error {
		var err error
		f, err = tx.GetFn(id)
		if err != nil {
			return notFoundAs(err, errFnNotFound)
		}
		if patch.Name != "" && patch.Name != f.Name || patch.AppID != "" && patch.AppID != f.AppID {
			return errFnFieldChange
		}
		was, _ := json.Marshal(f)
		if patch.Image != "" {
			f.Image, f.PinnedImage = patch.Image, pinned
		}
		if patch.Memory != 0 {
			f.Memory = patch.Memory
		}
		if patch.Timeout != 0 {
			f.Timeout = patch.Timeout
		}
		if patch.IdleTimeout != 0 {
			f.IdleTimeout = patch.IdleTimeout
		}
		if patch.CPU != 0 {
			f.CPU = patch.CPU
		}
		if patch.GPUs != 0 {
			f.GPUs = patch.GPUs
		}
		if patch.GPUModel != "" {
			f.GPUModel = patch.GPUModel
		}
		if patch.MaxConcurrency != 0 {
			f.MaxConcurrency = patch.MaxConcurrency
		}
		if patch.Shape != "" {
			f.Shape = patch.Shape
		}
		if f.Config, err = mergeConfig(f.Config, patch.Config); err != nil {
			return err
		}
		if f.SealedConfig, err = s.mergeSecrets(fnSecretOwner(f), f.SealedConfig, f.SecretConfig, patch.SecretConfig); err != nil {
			return err
		}
		f.SecretConfig = nil
		if f.Annotations, err = mergeAnnotations(f.Annotations, ann); err != nil {
			return err
		}
		if _, _, err := warmPolicy(f.Annotations); err != nil {
			return err
		}
		if err := validateFnResources(f.Fn); err != nil {
			return err
		}
		if now, _ := json.Marshal(f); !bytes.Equal(was, now) {
			f.UpdatedAt = fnTime(s.now())
		}
		return tx.PutFn(f)
	})
	if err != nil {
		s.fnFail(w, err)
		return
	}
	s.forgetFn(id)
	go s.deployed(f) // a new image prefetched, a new minimum held (warm.go)
	writeFnJSON(w, http.StatusOK, s.fnView(f))
}

// fnDeleteFn deletes a function and its triggers.
func (s *Service) fnDeleteFn(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("fn_id")
	before, _ := s.readFn(r.Context(), id, s.now()) // for released; nil when absent
	err := s.store.Update(r.Context(), func(tx store.Tx) error {
		if _, err := tx.GetFn(id); err != nil {
			return notFoundAs(err, errFnNotFound)
		}
		triggers, err := tx.ListTriggers(store.ListFnOptions{FnID: id})
		if err != nil {
			return err
		}
		for _, t := range triggers {
			if err := tx.DeleteTrigger(t.ID); err != nil {
				return err
			}
		}
		return tx.DeleteFn(id)
	})
	if err != nil {
		s.fnFail(w, err)
		return
	}
	s.forgetFn(id)
	if before != nil {
		go s.released(before) // the nodes drop its spares (warm.go)
	}
	w.WriteHeader(http.StatusNoContent)
}

// Triggers.
