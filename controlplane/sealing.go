package controlplane

import "github.com/mercator/mercator/controlplane/internal/sealing"

// Sealing (package controlplane/internal/sealing) keeps registry
// passwords (package registry), functions' secret configuration (package
// controlplane/function) and Runs' secrets (package
// controlplane/internal/runsecrets) sealed at rest under Config.RegistryKey.

// RegistryKeySize is the length of the key that seals registry credentials
// and secret configuration.
const RegistryKeySize = sealing.KeySize

// LoadRegistryKey returns the key that seals registry credentials and
// secret configuration: provided (64 hex digits, or 44 base64 characters)
// when not empty, else the key in keyFile, generated there with mode 0600
// on first start. A key file others can read is refused.
func LoadRegistryKey(provided, keyFile string) ([]byte, error) {
	return sealing.LoadKey(provided, keyFile)
}

// serverKey seals with the key as it is now (Config.RegistryKey, held in
// Server.sealKey so that replacing it, as tests do, races no reader), for
// registry credentials (registry.Sealer) and functions' secrets
// (function.Sealer).
type serverKey struct{ s *Server }

func (k serverKey) key() []byte {
	if p := k.s.sealKey.Load(); p != nil {
		return *p
	}
	return nil
}

func (k serverKey) Seal(ad []byte, plain string) ([]byte, error) {
	return sealing.Seal(k.key(), ad, plain)
}

func (k serverKey) Unseal(ad, sealed []byte) (string, error) {
	return sealing.Unseal(k.key(), ad, sealed)
}
