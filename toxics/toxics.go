// Package toxics names the network and resource conditions the suites run
// under. A Condition is data only: a set of Toxiproxy toxics and an optional
// CPU limit for the server container. Package fixtures/nemesis injects them
// (nemesis.Condition, nemesis.RunSchedule), so the same names appear in spec
// text, labels, histories and summary rows.
package toxics

import (
	"cmp"
	"fmt"
	"sort"
	"strings"
)

// Stream directions, as Toxiproxy names them.
const (
	// Upstream is client → server.
	Upstream = "upstream"
	// Downstream is server → client.
	Downstream = "downstream"
)

// Toxic is one Toxiproxy toxic to add to the target's proxy.
type Toxic struct {
	// Name is unique within a proxy; it is how the toxic is removed.
	Name string
	// Type is a Toxiproxy toxic type: latency, bandwidth, slow_close,
	// timeout, reset_peer, slicer, limit_data, or this project's corrupt.
	Type string
	// Stream is Upstream or Downstream.
	Stream string
	// Attributes are the toxic's parameters (e.g. latency, jitter in ms).
	Attributes map[string]any
}

// Message security modes of the security axis, by the names of their
// labels (security:<mode>) and of package fixtures/secure.
const (
	// SecurityNone is MessageSecurityMode None, the default.
	SecurityNone = "none"
	// SecuritySign is MessageSecurityMode Sign.
	SecuritySign = "sign"
	// SecuritySignEncrypt is MessageSecurityMode SignAndEncrypt.
	SecuritySignEncrypt = "sign-encrypt"
)

// Condition is a named set of toxics plus an optional CPU limit, and the
// message security mode of every client of a spec under it.
type Condition struct {
	// Name is the condition's stable identifier, e.g. "latency+cpu", or
	// "baseline+sign-encrypt" for a secured one (WithSecurity): unique
	// among the rows of a property, as summary rows, histories and report
	// paths name it.
	Name string
	// Toxics are added to the target proxy while the condition holds.
	Toxics []Toxic
	// NanoCPUs limits the server container's CPU (1e9 = one CPU) while the
	// condition holds; 0 leaves the limit alone.
	NanoCPUs int64
	// Security is the MessageSecurityMode of the spec's clients by its
	// name (SecuritySign, SecuritySignEncrypt); "" is SecurityNone.
	Security string
}

// String returns the condition's name.
func (c Condition) String() string { return c.Name }

// WithSecurity returns c with every client under it on channels of the
// message security mode named mode (SecuritySign, SecuritySignEncrypt),
// named "<name>+<mode>" ("baseline+sign-encrypt"), so that its rows stay
// apart from c's. SecurityNone (or "") returns c without security, named
// Base(): conditions without security keep their names.
func (c Condition) WithSecurity(mode string) Condition {
	c.Name = c.Base()
	if mode == "" || mode == SecurityNone {
		c.Security = ""
		return c
	}
	c.Name += "+" + mode
	c.Security = mode
	return c
}

// SecurityMode returns the name of c's message security mode:
// SecurityNone when c sets none.
func (c Condition) SecurityMode() string { return cmp.Or(c.Security, SecurityNone) }

// Base returns the name of c's toxics and CPU limit without its security:
// "baseline" for "baseline+sign-encrypt", Name for a condition without
// security.
func (c Condition) Base() string {
	if c.Security == "" || c.Security == SecurityNone {
		return c.Name
	}
	return strings.TrimSuffix(c.Name, "+"+c.Security)
}

// newToxic returns a toxic of type typ on one stream, named after both.
func newToxic(typ, stream string, attrs map[string]any) Toxic {
	return Toxic{Name: typ + "_" + stream, Type: typ, Stream: stream, Attributes: attrs}
}

// Latency returns a toxic that delays one direction by ms ± jitter ms.
func Latency(stream string, ms, jitter int) Toxic {
	return newToxic("latency", stream, map[string]any{"latency": ms, "jitter": jitter})
}

// Bandwidth returns a toxic that limits one direction to kbps KB/s.
func Bandwidth(stream string, kbps int) Toxic {
	return newToxic("bandwidth", stream, map[string]any{"rate": kbps})
}

// ResetPeer returns a toxic that resets connections (TCP RST) after
// timeoutMS milliseconds of data (0: at once).
func ResetPeer(stream string, timeoutMS int) Toxic {
	return newToxic("reset_peer", stream, map[string]any{"timeout": timeoutMS})
}

// Timeout returns a toxic that stops all data and closes the connection
// after timeoutMS milliseconds (0: holds data until the toxic is removed).
func Timeout(stream string, timeoutMS int) Toxic {
	return newToxic("timeout", stream, map[string]any{"timeout": timeoutMS})
}

// Corrupt returns a toxic that flips bits in a probability fraction of the
// chunks of one direction, the choices drawn from seed (the custom
// "corrupt" toxic of toxics/corrupt, registered in the project's
// toxiproxy image only).
func Corrupt(stream string, probability float64, bits int, seed int64) Toxic {
	return newToxic("corrupt", stream, map[string]any{"probability": probability, "bits": bits, "seed": seed})
}

// The named conditions of the CI profile.
var (
	// Baseline injects nothing.
	Baseline = Condition{Name: "baseline"}
	// Scheduled names the runs under a nemesis schedule (Schedule): it
	// injects nothing itself, the schedule's steps do.
	Scheduled = Condition{Name: "nemesis"}
	// LatencyJitter delays both directions by 20 ± 5 ms.
	LatencyJitter = Condition{Name: "latency", Toxics: []Toxic{
		Latency(Upstream, 20, 5), Latency(Downstream, 20, 5),
	}}
	// HalfCPU limits the server container to 0.5 CPU.
	HalfCPU = Condition{Name: "cpu", NanoCPUs: 500_000_000}
	// LatencyHalfCPU combines LatencyJitter and HalfCPU.
	LatencyHalfCPU = Condition{Name: "latency+cpu", Toxics: LatencyJitter.Toxics, NanoCPUs: HalfCPU.NanoCPUs}
)

// CI returns the conditions every property spec runs under in the CI profile.
func CI() []Condition {
	return []Condition{Baseline, LatencyJitter, HalfCPU, LatencyHalfCPU}
}

// Secured returns conds under the message security mode named mode
// (WithSecurity of each): e.g. Secured(SecuritySignEncrypt, Baseline) is
// the baseline under SignAndEncrypt.
func Secured(mode string, conds ...Condition) []Condition {
	out := make([]Condition, len(conds))
	for i, c := range conds {
		out[i] = c.WithSecurity(mode)
	}
	return out
}

// Lookup returns the named condition of the CI profile, also under a
// security mode ("baseline+sign-encrypt", see WithSecurity), or an error
// naming the known ones.
func Lookup(name string) (Condition, error) {
	known := make([]string, 0, 4)
	for _, c := range CI() {
		if c.Name == name {
			return c, nil
		}
		for _, mode := range []string{SecuritySign, SecuritySignEncrypt} {
			if name == c.Name+"+"+mode {
				return c.WithSecurity(mode), nil
			}
		}
		known = append(known, c.Name)
	}
	sort.Strings(known)
	return Condition{}, fmt.Errorf("unknown condition %q (known: %s)", name, strings.Join(known, ", "))
}
