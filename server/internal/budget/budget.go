// Package budget is the reference server's memory budget: one byte limit
// shared by the classes of memory an unauthenticated or anonymous peer can
// make the server hold (unfinished chunks, queued requests, held logins,
// monitored-item queues, per-session strings, responses waiting to be
// sent, parked Publish requests, retransmission queues). Each class may use at most a
// share of the limit, so one kind of flood cannot take the memory the others
// need, and all classes together at most the limit.
//
// A charge that does not fit is refused: the caller answers with the Part 4
// status of its service (BadTcpNotEnoughResources, BadResourceUnavailable,
// BadTooManyOperations ...) instead of holding the memory. A nil *Budget is
// unbounded: every charge succeeds (the no-byte-budget fault and tests).
package budget

import (
	"fmt"
	"sync/atomic"
)

// Class is one kind of memory charged to the budget.
type Class int

// The classes and their shares of the limit.
const (
	// Chunks are unfinished request chunks of all channels (¼).
	Chunks Class = iota
	// Queue are requests admitted and not yet answered, by size (½).
	Queue
	// Logins are ActivateSession requests held by the login throttle (1/16).
	Logins
	// Items are monitored-item queues: queue size × value size (½).
	Items
	// Sessions are per-session strings and certificates (1/16).
	Sessions
	// Responses are encoded responses waiting in the channels' send
	// queues (½).
	Responses
	// Publish are parked Publish requests: what each keeps to answer
	// (its acknowledgement results) (1/16).
	Publish
	// Retransmit are the notification messages subscriptions keep for
	// Republish until they are acknowledged, by an estimate of what each
	// holds (1/8).
	Retransmit
	numClasses
)

var (
	names  = [numClasses]string{"chunks", "queue", "logins", "items", "sessions", "responses", "publish", "retransmit"}
	shares = [numClasses]int64{4, 2, 16, 2, 16, 2, 16, 8} // limit / share
)

// String names the class.
func (c Class) String() string {
	if c < 0 || c >= numClasses {
		return fmt.Sprintf("class(%d)", int(c))
	}
	return names[c]
}

// Classes lists every class.
func Classes() []Class {
	out := make([]Class, numClasses)
	for i := range out {
		out[i] = Class(i)
	}
	return out
}

// DefaultLimit is the budget of a server that sets none (256 MiB): far below
// the 1 GiB and more a container of the suites has, with room left for the
// Go runtime's overhead and the memory no class accounts (goroutines,
// responses being written).
const DefaultLimit = 256 << 20

// Budget is a byte budget shared by the classes. Its methods are safe for
// concurrent use; a nil *Budget is unbounded.
type Budget struct {
	limit int64
	used  atomic.Int64
	class [numClasses]atomic.Int64
	// refused counts refused charges per class.
	refused [numClasses]atomic.Int64
}

// New returns a budget of limit bytes (DefaultLimit if limit ≤ 0).
func New(limit int64) *Budget {
	if limit <= 0 {
		limit = DefaultLimit
	}
	return &Budget{limit: limit}
}

// Limit is the budget's byte limit (0 for a nil budget: unbounded).
func (b *Budget) Limit() int64 {
	if b == nil {
		return 0
	}
	return b.limit
}

// ClassLimit is the most class c may hold (0 for a nil budget).
func (b *Budget) ClassLimit(c Class) int64 {
	if b == nil {
		return 0
	}
	return b.limit / shares[c]
}

// Charge reserves n bytes for class c. It reports false, reserving nothing,
// if the class's share or the whole limit would be exceeded. n ≤ 0 always
// fits.
func (b *Budget) Charge(c Class, n int64) bool {
	if b == nil || n <= 0 {
		return true
	}
	if !reserve(&b.class[c], n, b.limit/shares[c]) {
		b.refused[c].Add(1)
		return false
	}
	if !reserve(&b.used, n, b.limit) {
		b.class[c].Add(-n)
		b.refused[c].Add(1)
		return false
	}
	return true
}

// Force charges n bytes to class c whatever the limits: for memory the
// server must hold anyway (a small response it has to send), so that the
// class's reading stays true. It may take the class and the budget over
// their limits; Charge refuses until they are back under.
func (b *Budget) Force(c Class, n int64) {
	if b == nil || n <= 0 {
		return
	}
	b.class[c].Add(n)
	b.used.Add(n)
}

// Refuse counts a refusal of class c decided outside Charge (a share of
// the class smaller than its limit, e.g. one channel's).
func (b *Budget) Refuse(c Class) {
	if b == nil {
		return
	}
	b.refused[c].Add(1)
}

// reserve adds n to v unless that would take it over limit; v never reads
// above limit.
func reserve(v *atomic.Int64, n, limit int64) bool {
	for {
		cur := v.Load()
		if cur+n > limit {
			return false
		}
		if v.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

// Release returns n bytes charged to class c.
func (b *Budget) Release(c Class, n int64) {
	if b == nil || n <= 0 {
		return
	}
	b.class[c].Add(-n)
	b.used.Add(-n)
}

// Used is the bytes charged now, all classes.
func (b *Budget) Used() int64 {
	if b == nil {
		return 0
	}
	return b.used.Load()
}

// UsedBy is the bytes class c holds now.
func (b *Budget) UsedBy(c Class) int64 {
	if b == nil {
		return 0
	}
	return b.class[c].Load()
}

// Refused is the number of charges of class c refused so far.
func (b *Budget) Refused(c Class) int64 {
	if b == nil {
		return 0
	}
	return b.refused[c].Load()
}
