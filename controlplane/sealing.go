package controlplane

import "github.com/mercator/mercator/controlplane/internal/sealing"

// Sealing (package controlplane/internal/sealing) keeps registry
// passwords (registries.go) and functions' secret configuration (package
// controlplane/function) sealed at rest under Config.RegistryKey.

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

// seal and unseal use the key as it is now (Config.RegistryKey), for
// registry credentials here and, through fnHost, for functions' secrets.
func (s *Server) seal(ad []byte, plain string) ([]byte, error) {
	return sealing.Seal(s.cfg.RegistryKey, ad, plain)
}

func (s *Server) unseal(ad, sealed []byte) (string, error) {
	return sealing.Unseal(s.cfg.RegistryKey, ad, sealed)
}
