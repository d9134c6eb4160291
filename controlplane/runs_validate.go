package controlplane

import (
	"github.com/mercator/mercator/api"
)

// ValidateRunSpec checks a run spec with api.RunSpec.Validate, the checks
// the CLI makes before it sends one, and on success replaces *spec with its
// normalized form (api.RunSpec.Normalized), the form that is stored. On
// error *spec is left as it was.
func ValidateRunSpec(spec *api.RunSpec) error {
	n := spec.Normalized()
	if err := n.Validate(); err != nil {
		return err
	}
	*spec = n
	return nil
}
