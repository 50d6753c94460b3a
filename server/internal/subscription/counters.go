package subscription

import (
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gopcua/opcua/ua"
)

// ReadFunc reads the current value of a resolved node for one sample. It is
// called on a sampler goroutine and must not block.
type ReadFunc func(t SampleTime) *ua.DataValue

// Source resolves the nodes monitored items may sample.
type Source interface {
	// Resolve returns the sampling function of a node's attribute, or a Bad
	// status (BadNodeIdUnknown, BadAttributeIdInvalid).
	Resolve(node *ua.NodeID, attribute ua.AttributeID) (ReadFunc, ua.StatusCode)
}

// Sources tries each source in turn; the first that knows the node wins.
type Sources []Source

// Resolve implements Source.
func (ss Sources) Resolve(node *ua.NodeID, attr ua.AttributeID) (ReadFunc, ua.StatusCode) {
	code := ua.StatusBadNodeIDUnknown
	for _, s := range ss {
		if s == nil {
			continue
		}
		f, c := s.Resolve(node, attr)
		if c == ua.StatusOK {
			return f, c
		}
		if c != ua.StatusBadNodeIDUnknown {
			code = c
		}
	}
	return nil, code
}

// Counter node name prefixes in namespace 1.
const (
	// SampledCounterPrefix + i: an Int64 that increments each time the
	// sampler reads it (a Read service does not), so the delta a client sees
	// over a window, divided by window/interval, is the fraction of samples
	// taken.
	SampledCounterPrefix = "SampledCounter."
	// FastCounterPrefix + i: an Int64 equal to the monotonic time since the
	// server started in microseconds (a new value on every sample at any
	// rate up to 1 MHz), with SourceTimestamp equal to the sample time.
	FastCounterPrefix = "FastCounter."
	// DefaultCounters is the default number of nodes of each kind.
	DefaultCounters = 4096
)

// Counters are the measuring nodes ns=1;s=SampledCounter.<i> and
// ns=1;s=FastCounter.<i>, i in [0, N).
type Counters struct {
	ns      uint16
	clock   Clock
	sampled []atomic.Int64
}

// NewCounters returns n counters of each kind in namespace ns. n ≤ 0 means
// DefaultCounters.
func NewCounters(ns uint16, n int, clock Clock) *Counters {
	if n <= 0 {
		n = DefaultCounters
	}
	return &Counters{ns: ns, clock: clock, sampled: make([]atomic.Int64, n)}
}

// N returns the number of counters of each kind.
func (c *Counters) N() int { return len(c.sampled) }

// parse returns the kind (true for sampled) and index of a counter name.
func (c *Counters) parse(name string) (sampled bool, i int, ok bool) {
	rest, sampled := strings.CutPrefix(name, SampledCounterPrefix)
	if !sampled {
		var fast bool
		if rest, fast = strings.CutPrefix(name, FastCounterPrefix); !fast {
			return false, 0, false
		}
	}
	i, err := strconv.Atoi(rest)
	if err != nil || i < 0 || i >= len(c.sampled) || strconv.Itoa(i) != rest {
		return false, 0, false
	}
	return sampled, i, true
}

// Value returns the value of a counter node for a Read service call (name
// is the string id in namespace ns): a SampledCounter's current count (not
// incremented) or a FastCounter's current value, with the source time.
func (c *Counters) Value(name string) (v int64, source time.Time, ok bool) {
	sampled, i, ok := c.parse(name)
	if !ok {
		return 0, time.Time{}, false
	}
	now := c.clock.Now()
	if sampled {
		return c.sampled[i].Load(), c.clock.Wall(now), true
	}
	return int64(now / time.Microsecond), c.clock.Wall(now), true
}

// Sampled returns the current count of SampledCounter.<i> (0 if out of
// range).
func (c *Counters) Sampled(i int) int64 {
	if i < 0 || i >= len(c.sampled) {
		return 0
	}
	return c.sampled[i].Load()
}

// Resolve implements Source for the counter nodes.
func (c *Counters) Resolve(node *ua.NodeID, attr ua.AttributeID) (ReadFunc, ua.StatusCode) {
	if node == nil || node.Namespace() != c.ns || node.Type() != ua.NodeIDTypeString {
		return nil, ua.StatusBadNodeIDUnknown
	}
	sampled, i, ok := c.parse(node.StringID())
	if !ok {
		return nil, ua.StatusBadNodeIDUnknown
	}
	if attr != ua.AttributeIDValue {
		return nil, ua.StatusBadAttributeIDInvalid
	}
	if sampled {
		ctr := &c.sampled[i]
		return func(t SampleTime) *ua.DataValue {
			return int64Value(ctr.Add(1), t.Wall)
		}, ua.StatusOK
	}
	return func(t SampleTime) *ua.DataValue {
		return int64Value(int64(t.Mono/time.Microsecond), t.Wall)
	}, ua.StatusOK
}

func int64Value(v int64, src time.Time) *ua.DataValue {
	return &ua.DataValue{
		EncodingMask:    ua.DataValueValue | ua.DataValueSourceTimestamp,
		Value:           ua.MustVariant(v),
		SourceTimestamp: src,
	}
}
