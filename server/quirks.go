package server

import (
	"time"

	"github.com/opcua-chaos/opcua-chaos/server/catalog"
)

// MinSamplingQuirk is the smallest sampling interval granted under the
// quirk min-sampling-50ms.
const MinSamplingQuirk = 50 * time.Millisecond

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
	return parseSwitches[Quirks](s, "quirk", catalog.AllQuirks)
}
