package server

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/opcua-chaos/opcua-chaos/server/catalog"
)

// MinSamplingQuirk is the smallest sampling interval granted under the
// quirk min-sampling-50ms.
const MinSamplingQuirk = 50 * time.Millisecond

// Quirks is a set of enabled quirk switches.
type Quirks map[catalog.Quirk]bool

// Has reports whether q is on.
func (qs Quirks) Has(q catalog.Quirk) bool { return qs[q] }

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
		q := catalog.Quirk(name)
		if !slices.Contains(catalog.AllQuirks, q) {
			valid := make([]string, len(catalog.AllQuirks))
			for i, a := range catalog.AllQuirks {
				valid[i] = string(a)
			}
			return nil, fmt.Errorf("unknown quirk %q (valid: %s)", name, strings.Join(valid, ", "))
		}
		qs[q] = true
	}
	return qs, nil
}
