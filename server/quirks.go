package server

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
)

// Quirk names one conformant variation the server can switch on
// (OPCUA_QUIRKS): a behaviour the OPC UA specification allows and that
// servers as they ship show (open62541, a C allocator), unlike a Fault,
// which is a bug. A suite that fails a property under a quirk raises a false
// alarm: it checks our server, not the specification.
type Quirk string

// The quirk switches. Each is one small, clearly named code path.
const (
	// QuirkNoCertOnNone makes CreateSession return no ServerCertificate on
	// a channel with SecurityPolicy None when the client sent no client
	// certificate (Part 4, 5.6.2 allows it; open62541 does so).
	QuirkNoCertOnNone Quirk = "no-cert-on-none"
	// QuirkMinSampling50ms revises every requested sampling interval below
	// MinSamplingQuirk up to it (open62541's default minimum sampling
	// interval); Part 4, 5.12.1.2 lets the server revise it.
	QuirkMinSampling50ms Quirk = "min-sampling-50ms"
	// QuirkRetainFreedMemory keeps memory freed after a burst with the
	// process, like a C allocator that keeps its pages: after load the
	// server holds a ballast as large as its peak heap growth so far, and
	// grows it only when a later burst needs more than it ever did.
	QuirkRetainFreedMemory Quirk = "retain-freed-memory"
)

// MinSamplingQuirk is the smallest sampling interval granted under the
// quirk min-sampling-50ms.
const MinSamplingQuirk = 50 * time.Millisecond

// AllQuirks lists every quirk switch. There is no one-event-loop quirk
// (every session served by one loop, as open62541 does): seen from the
// wire it is the fault serial-dispatch, a slow read holding up every other
// session, which the wakeups suite and discovery rightly report.
var AllQuirks = []Quirk{QuirkNoCertOnNone, QuirkMinSampling50ms, QuirkRetainFreedMemory}

// Quirks is a set of enabled quirk switches.
type Quirks map[Quirk]bool

// Has reports whether q is on.
func (qs Quirks) Has(q Quirk) bool { return qs[q] }

// String lists the enabled quirks, sorted, comma separated ("none" if
// empty).
func (qs Quirks) String() string {
	var names []string
	for q, on := range qs {
		if on {
			names = append(names, string(q))
		}
	}
	if len(names) == 0 {
		return "none"
	}
	sort.Strings(names)
	return strings.Join(names, ",")
}

// ParseQuirks parses a comma separated list of quirk names.
func ParseQuirks(s string) (Quirks, error) {
	qs := Quirks{}
	for _, name := range splitList(s) {
		q := Quirk(name)
		if !slices.Contains(AllQuirks, q) {
			valid := make([]string, len(AllQuirks))
			for i, a := range AllQuirks {
				valid[i] = string(a)
			}
			return nil, fmt.Errorf("unknown quirk %q (valid: %s)", name, strings.Join(valid, ", "))
		}
		qs[q] = true
	}
	return qs, nil
}
