package server

import (
	"bytes"
	"encoding/pem"
	"os"
	"path/filepath"
	"time"

	"github.com/opcua-chaos/opcua-chaos/server/catalog"
	"github.com/opcua-chaos/opcua-chaos/server/internal/subscription"
)

// MinSamplingQuirk is the smallest sampling interval granted under the
// quirk min-sampling-50ms.
const MinSamplingQuirk = 50 * time.Millisecond

// TrustedCertsDir is the folder of the client certificates trusted under
// the quirk trusted-certs-only.
const TrustedCertsDir = "/pki/trusted"

// trustList reports whether the DER certificate cert is one of the files
// in dir (DER or PEM), read at each call: a certificate copied there
// while the server runs is trusted from the next OpenSecureChannel on.
func trustList(dir string) func(cert []byte) bool {
	return func(cert []byte) bool {
		entries, err := os.ReadDir(dir)
		if err != nil {
			return false
		}
		for _, e := range entries {
			if e.IsDir() {
				continue
			}
			b, err := os.ReadFile(filepath.Join(dir, e.Name()))
			if err != nil {
				continue
			}
			if blk, _ := pem.Decode(b); blk != nil && blk.Type == "CERTIFICATE" {
				b = blk.Bytes
			}
			if bytes.Equal(b, cert) {
				return true
			}
		}
		return false
	}
}

// trusts is the client certificate check of a secure channel: nil (every
// well-formed certificate) unless the quirk trusted-certs-only is on, then
// the files of Config.TrustDir (TrustedCertsDir by default).
func (s *Server) trusts() func(cert []byte) bool {
	if !s.cfg.Quirks.Has(catalog.QuirkTrustedCertsOnly) {
		return nil
	}
	dir := s.cfg.TrustDir
	if dir == "" {
		dir = TrustedCertsDir
	}
	return trustList(dir)
}

// testNodes reports whether the server offers its test nodes a client can
// drive (service-time nodes, sampled counters): not under no-test-nodes.
func (s *Server) testNodes() bool { return !s.cfg.Quirks.Has(catalog.QuirkNoTestNodes) }

// serviceTimeNodes reports whether the Slow.<ms> and Busy.<µs> nodes
// exist: test nodes on (testNodes) and not removed by
// Config.NoServiceTimeNodes.
func (s *Server) serviceTimeNodes() bool { return s.testNodes() && !s.cfg.NoServiceTimeNodes }

// counterSource is the monitored-item source of the counter nodes: none
// under no-test-nodes.
func (s *Server) counterSource() subscription.Source {
	if !s.testNodes() {
		return nil
	}
	return s.counters
}

// MaxSessionsQuirk is the session table's size under the quirk
// max-sessions-20 (S2OPC's demo server's MaxSessions), whatever
// OPCUA_MAX_SESSIONS asks for above it.
const MaxSessionsQuirk = 20

// Quirks is a set of enabled quirk switches.
type Quirks map[catalog.Quirk]bool

// Has reports whether q is on.
func (qs Quirks) Has(q catalog.Quirk) bool { return qs[q] }

// String lists the enabled quirks, sorted, comma separated ("none" if
// empty).
func (qs Quirks) String() string { return switchList(qs) }

// ParseQuirks parses a comma separated list of quirk names.
func ParseQuirks(s string) (Quirks, error) {
	return parseSwitches[Quirks](s, "quirk", catalog.AllQuirks())
}
