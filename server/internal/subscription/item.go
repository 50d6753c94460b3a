package subscription

import (
	"sync"
	"time"

	"github.com/gopcua/opcua/ua"
)

// statusOverflow is Good with the InfoType DataValue and Overflow info bits:
// set on the oldest value still queued after a value was discarded.
const statusOverflow ua.StatusCode = 0x00000480

// MonitoredItem samples one node attribute into a bounded queue.
type MonitoredItem struct {
	id   uint32
	node *ua.NodeID
	attr ua.AttributeID
	read ReadFunc
	// dupEvery is the duplicate-samples fault's period: every
	// dupEvery-th sample, if reported, is queued twice (0: fault off).
	dupEvery int64

	// Guarded by the session's mutex (changed by services only).
	clientHandle uint32
	interval     time.Duration // the interval the sampler runs it at (its revised sampling interval but under the sample-at-publish fault); sampler group key
	mode         ua.MonitoringMode
	charged      int64 // bytes charged to the manager's budget for the queue and the node
	nodeCharge   int64 // the part of charged for the node (Options.ItemCost), fixed for its life

	mu            sync.Mutex // guards the fields below (sampler vs publisher)
	active        bool       // sampled: false while disabled and once deleted
	handle        uint32     // copy of clientHandle for the sampler path
	ts            ua.TimestampsToReturn
	trigger       ua.DataChangeTrigger
	discardOldest bool
	size          int             // queue size: the most values queued
	buf           []*ua.DataValue // ring of queued values, grown up to size as values arrive
	head, n       int
	last          lastValue // last sampled value (for the trigger)
	hasLast       bool
	samples       int64 // samples taken
	queued        int64 // values queued
	discarded     int64 // values discarded by overflow
}

// ID returns the monitored item id.
func (it *MonitoredItem) ID() uint32 { return it.id }

// Stats returns the item's sample count, queued count and overflow discards.
func (it *MonitoredItem) Stats() (samples, queued, discarded int64) {
	it.mu.Lock()
	defer it.mu.Unlock()
	return it.samples, it.queued, it.discarded
}

// Sample implements Target: read the value and queue it if the trigger says
// it changed. The value is read without it.mu held (reading may take other
// locks); a sample that arrives after the item was disabled or deleted is
// dropped.
func (it *MonitoredItem) Sample(t SampleTime) {
	dv := it.read(t) // a fresh value the item now owns
	if dv == nil {
		return
	}
	it.mu.Lock()
	defer it.mu.Unlock()
	if !it.active {
		return
	}
	it.samples++
	if it.hasLast && !changed(&it.last, dv, it.trigger) {
		return
	}
	it.hasLast = true
	it.last = lastValue{value: dv.Value, status: dv.Status, source: dv.SourceTimestamp}
	switch it.ts {
	case ua.TimestampsToReturnServer, ua.TimestampsToReturnNeither:
		dv.EncodingMask &^= ua.DataValueSourceTimestamp | ua.DataValueSourcePicoseconds
		dv.SourceTimestamp = time.Time{}
	}
	if it.ts == ua.TimestampsToReturnServer || it.ts == ua.TimestampsToReturnBoth {
		dv.EncodingMask |= ua.DataValueServerTimestamp
		dv.ServerTimestamp = t.Wall
	}
	it.push(dv)
	if it.dupEvery > 0 && it.samples%it.dupEvery == 0 {
		// Fault duplicate-samples: the same value, with the same
		// timestamps, is queued once more.
		again := *dv
		it.push(&again)
	}
}

// push queues v, honouring the queue size and discardOldest. it.mu held.
func (it *MonitoredItem) push(v *ua.DataValue) {
	it.queued++
	if it.n < it.size {
		if it.n == len(it.buf) {
			it.grow()
		}
		it.buf[(it.head+it.n)%len(it.buf)] = v
		it.n++
		return
	}
	// Full: the ring has grown to the queue size.
	size := len(it.buf)
	it.discarded++
	if it.discardOldest {
		it.buf[it.head] = v
		it.head = (it.head + 1) % size
		if size > 1 {
			it.markOverflow(it.head)
		}
		return
	}
	// Replace the newest value.
	newest := (it.head + it.n - 1) % size
	it.buf[newest] = v
	if size > 1 {
		it.markOverflow(newest)
	}
}

// minQueueAlloc is the first allocation of a queue that grows.
const minQueueAlloc = 4

// grow doubles the ring (at least minQueueAlloc, at most the queue size),
// keeping the queued values in order from index 0. it.mu held.
func (it *MonitoredItem) grow() {
	buf := make([]*ua.DataValue, min(it.size, max(minQueueAlloc, 2*len(it.buf))))
	for i := range it.n {
		buf[i] = it.buf[(it.head+i)%len(it.buf)]
	}
	it.buf, it.head = buf, 0
}

func (it *MonitoredItem) markOverflow(i int) {
	v := *it.buf[i]
	v.EncodingMask |= ua.DataValueStatusCode
	v.Status |= statusOverflow
	it.buf[i] = &v
}

// resize sets the queue size, keeping the newest values. With eager (the
// item-queues-unbounded fault) the ring is allocated at the full size,
// else just big enough for the values kept. it.mu held.
func (it *MonitoredItem) resize(size int, eager bool) {
	if size == it.size && (!eager || len(it.buf) == size) {
		return
	}
	vals := it.drainLocked(0)
	if len(vals) > size {
		vals = vals[len(vals)-size:]
	}
	it.size = size
	it.buf = nil
	if eager || len(vals) > 0 {
		it.buf = make([]*ua.DataValue, max(len(vals), min(size, minQueueAlloc)))
		if eager {
			it.buf = make([]*ua.DataValue, size)
		}
	}
	it.head = 0
	it.n = copy(it.buf, vals)
}

// drainLocked removes and returns up to max queued values (all if max ≤ 0),
// oldest first. it.mu held.
func (it *MonitoredItem) drainLocked(max int) []*ua.DataValue {
	k := it.n
	if max > 0 && k > max {
		k = max
	}
	if k == 0 {
		return nil
	}
	out := make([]*ua.DataValue, k)
	size := len(it.buf)
	for i := range k {
		j := (it.head + i) % size
		out[i] = it.buf[j]
		it.buf[j] = nil
	}
	it.head = (it.head + k) % size
	it.n -= k
	return out
}

// pending returns the number of queued values.
func (it *MonitoredItem) pending() int {
	it.mu.Lock()
	defer it.mu.Unlock()
	return it.n
}

// setActive starts (true) or stops taking samples.
func (it *MonitoredItem) setActive(on bool) {
	it.mu.Lock()
	it.active = on
	it.mu.Unlock()
}

// clear stops taking samples, drops the queued values and forgets the last
// value, so the next sample is reported (used when the item is disabled).
func (it *MonitoredItem) clear() {
	it.mu.Lock()
	defer it.mu.Unlock()
	it.active = false
	for it.n > 0 {
		it.buf[it.head] = nil
		it.head = (it.head + 1) % len(it.buf)
		it.n--
	}
	it.hasLast = false
}

// lastValue is what the trigger compares with.
type lastValue struct {
	value  *ua.Variant
	status ua.StatusCode
	source time.Time
}

// changed applies a DataChangeFilter trigger.
func changed(last *lastValue, dv *ua.DataValue, trigger ua.DataChangeTrigger) bool {
	if last.status != dv.Status {
		return true
	}
	if trigger == ua.DataChangeTriggerStatus {
		return false
	}
	if !sameValue(last.value, dv.Value) {
		return true
	}
	if trigger == ua.DataChangeTriggerStatusValueTimestamp {
		return !last.source.Equal(dv.SourceTimestamp)
	}
	return false
}

func sameValue(a, b *ua.Variant) bool {
	if a == nil || b == nil {
		return a == b
	}
	if a.Type() != b.Type() || a.ArrayLength() != b.ArrayLength() {
		return false
	}
	if a.ArrayLength() > 0 {
		return false // arrays: always report
	}
	switch av := a.Value().(type) {
	case bool, int8, uint8, int16, uint16, int32, uint32, int64, uint64, float32, float64, string:
		return av == b.Value()
	case time.Time:
		bv, ok := b.Value().(time.Time)
		return ok && av.Equal(bv)
	}
	return false // structures: always report
}
