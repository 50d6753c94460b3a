// Package fairqueue is the reference server's weighted fair request queue.
//
// Requests are queued per owner in FIFO order. Owners are served weighted
// round robin: an owner with weight w gets w turns (requests) per round,
// then goes to the back of the ready list behind the other owners. The queue
// bounds the total number of queued requests and, with a per-owner ceiling,
// the share of one owner, so one owner cannot fill another's share.
//
// Workers call Dequeue. Idle workers park on one coalesced wake signal: an
// enqueue sends a token only when none is outstanding, a woken worker
// re-arms the signal before it re-checks the queue (so an enqueue between
// its check and its park is never lost), and a worker that takes a request
// while more are queued passes the wake on.
//
// Every queued entry is claimed exactly once: by a worker (Dequeue), by
// Cancel or by Stop. A claim returns the entry's queue slot.
//
// The design follows the OPC Foundation .NET server's FairRequestQueue
// (seed 001), with a mutex instead of its lock-free structures; the known
// bugs of that history can be switched on through Options for the chaos
// suites to catch.
package fairqueue

import (
	"context"
	"errors"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// Errors returned by Enqueue and Dequeue.
var (
	// ErrFull: the total queue bound is reached (BadServerTooBusy).
	ErrFull = errors.New("fairqueue: queue full")
	// ErrOwnerFull: the owner's ceiling is reached (BadServerTooBusy).
	ErrOwnerFull = errors.New("fairqueue: owner's share full")
	// ErrStopped: the queue was stopped (BadServerHalted).
	ErrStopped = errors.New("fairqueue: stopped")
)

// Options configure a Queue. The fault fields reproduce known bugs; all are
// off by default.
type Options struct {
	// Limit bounds the number of queued requests (default 10000).
	Limit int
	// OwnerLimit bounds one owner's queued requests (default Limit).
	OwnerLimit int
	// Weight returns an owner's weight (turns per round); nil or a result
	// below 1 means 1.
	Weight func(owner string) int

	// Unweighted is the unweighted fault: every owner gets one turn per
	// round (plain round robin).
	Unweighted bool
	// TurnStall is the turn-stall fault: after taking an owner's last turn
	// token, every StallEvery-th turn sleeps StallFor before the owner's next
	// turn is queued. While it sleeps, other owners are served.
	TurnStall bool
	// StallEvery and StallFor tune TurnStall (default 7 and 1 ms).
	StallEvery int
	StallFor   time.Duration
	// LostWakeup is the lost-wakeup fault: a woken worker checks the queue
	// first and re-arms the wake signal afterwards, then parks without
	// re-checking. A request enqueued in between waits for the next arrival.
	LostWakeup bool
	// CancelLeak is the cancel-leak fault: a cancelled request does not
	// return its queue slot (total and per-owner).
	CancelLeak bool
	// CancelDouble is the cancel-double fault: Cancel reports success but
	// leaves the request queued, so it is dispatched as well.
	CancelDouble bool
	// CancelStrands is the cancel-strands fault: the compaction of an
	// owner's FIFO that a Cancel runs starts one past its head (taken for
	// the entry a worker is about to pop), so the queued request at the
	// head is dropped from the FIFO but stays queued: it holds its slot
	// and is never dispatched.
	CancelStrands bool
}

type state uint8

const (
	queued state = iota
	dispatched
	cancelled
	halted
)

// Entry is one queued request.
type Entry[T any] struct {
	// Value is the caller's request. Cancel clears it (the caller keeps
	// its own reference); Dequeue and Stop hand it over.
	Value T

	owner    *owner[T]
	seq      uint64 // admission order, queue wide
	takeSeq  uint64 // dispatch order, queue wide (0 = not dispatched)
	state    state
	released bool // slot returned
}

// Owner returns the entry's owner.
func (e *Entry[T]) Owner() string { return e.owner.name }

// Seq returns the entry's admission sequence number (1, 2, …).
func (e *Entry[T]) Seq() uint64 { return e.seq }

// TakeSeq returns the entry's dispatch sequence number, 0 if it was never
// dispatched. Entries are dispatched in TakeSeq order.
func (e *Entry[T]) TakeSeq() uint64 { return e.takeSeq }

type owner[T any] struct {
	name    string
	weight  int
	fifo    []*Entry[T] // may hold claimed entries; dropped at the head
	head    int
	live    int  // queued entries in fifo
	charged int  // slots held (live, plus leaked ones under CancelLeak)
	turns   int  // turn tokens left in the current turn
	ready   bool // in the ready list, or its next turn is being published

	enqueued, dispatched, rejected, cancelled int64
	// emptied counts the times the owner's last queued request left the
	// queue (dispatched or cancelled): the owner ran dry and lost its place
	// in the round.
	emptied int64
}

// OwnerStats are one owner's counters.
type OwnerStats struct {
	Owner      string
	Weight     int
	Queued     int   // requests queued now
	Charged    int   // queue slots held now (Queued plus leaked slots)
	Enqueued   int64 // requests admitted
	Dispatched int64 // requests taken by workers
	Rejected   int64 // requests refused (queue or owner share full)
	Cancelled  int64 // queued requests cancelled (Cancel and Stop)
	// Emptied counts the times the owner's queue ran dry (its last queued
	// request dispatched or cancelled). An owner that runs dry is not
	// backlogged: its share says nothing about the weights.
	Emptied int64
}

// Stats are the queue's counters.
type Stats struct {
	Queued     int // requests queued now
	Charged    int // slots held now (Queued plus leaked slots)
	Limit      int
	OwnerLimit int
	Enqueued   int64
	Dispatched int64
	Rejected   int64
	Cancelled  int64
	Waiting    int // workers parked in Dequeue
}

// Queue is a weighted fair request queue. The zero value is not usable; call
// New.
type Queue[T any] struct {
	opts Options

	mu       sync.Mutex
	owners   map[string]*owner[T]
	ready    []*owner[T] // owners with a turn, in service order
	readyAt  int         // head of ready
	live     int
	charged  int
	seq      uint64
	takeSeq  uint64
	turnsPub uint64 // turns published (TurnStall counts them)
	stopped  bool
	stopCh   chan struct{}

	enqueued, dispatched, rejected, cancelled int64

	wake        chan struct{} // cap 1: the coalesced wake signal
	wakePending atomic.Bool   // a token is outstanding
	waiting     atomic.Int32
}

// New returns an empty queue.
func New[T any](opts Options) *Queue[T] {
	if opts.Limit <= 0 {
		opts.Limit = 10000
	}
	if opts.OwnerLimit <= 0 || opts.OwnerLimit > opts.Limit {
		opts.OwnerLimit = opts.Limit
	}
	if opts.StallEvery <= 0 {
		opts.StallEvery = 7
	}
	if opts.StallFor <= 0 {
		opts.StallFor = time.Millisecond
	}
	return &Queue[T]{
		opts:   opts,
		owners: make(map[string]*owner[T]),
		stopCh: make(chan struct{}),
		wake:   make(chan struct{}, 1),
	}
}

func (q *Queue[T]) weight(name string) int {
	if q.opts.Unweighted || q.opts.Weight == nil {
		// Fault unweighted: plain round robin.
		return 1
	}
	return max(1, q.opts.Weight(name))
}

// Enqueue admits v for owner. It fails with ErrFull, ErrOwnerFull or
// ErrStopped.
func (q *Queue[T]) Enqueue(ownerName string, v T) (*Entry[T], error) {
	q.mu.Lock()
	if q.stopped {
		q.mu.Unlock()
		return nil, ErrStopped
	}
	o := q.owners[ownerName]
	if o == nil {
		o = &owner[T]{name: ownerName, weight: q.weight(ownerName)}
		q.owners[ownerName] = o
	}
	if q.charged >= q.opts.Limit {
		o.rejected++
		q.rejected++
		q.mu.Unlock()
		return nil, ErrFull
	}
	if o.charged >= q.opts.OwnerLimit {
		o.rejected++
		q.rejected++
		q.mu.Unlock()
		return nil, ErrOwnerFull
	}
	q.seq++
	e := &Entry[T]{Value: v, owner: o, seq: q.seq}
	o.fifo = append(o.fifo, e)
	o.live++
	o.charged++
	o.enqueued++
	q.live++
	q.charged++
	q.enqueued++
	if !o.ready {
		o.ready = true
		o.turns = o.weight
		q.ready = append(q.ready, o)
	}
	q.mu.Unlock()
	q.signal()
	return e, nil
}

// signal sends the wake token unless one is outstanding.
func (q *Queue[T]) signal() {
	if q.waiting.Load() == 0 {
		// Nobody parked: a worker about to park announces itself in
		// waiting and then re-checks the queue.
		return
	}
	if q.wakePending.CompareAndSwap(false, true) {
		q.wake <- struct{}{} // never blocks: one token at most
	}
}

// Dequeue blocks until it claims the next request in weighted fair order,
// ctx ends, or the queue is stopped (ErrStopped).
func (q *Queue[T]) Dequeue(ctx context.Context) (*Entry[T], error) {
	if e, err := q.take(); e != nil || err != nil {
		return e, err
	}
	for {
		q.waiting.Add(1)
		if !q.opts.LostWakeup {
			// Re-check after announcing ourselves: an enqueue that did not
			// see us waiting is visible here.
			if e, err := q.take(); e != nil || err != nil {
				q.waiting.Add(-1)
				return e, err
			}
		}
		select {
		case <-q.wake:
		case <-q.stopCh:
			q.waiting.Add(-1)
			return nil, ErrStopped
		case <-ctx.Done():
			q.waiting.Add(-1)
			return nil, ctx.Err()
		}
		q.waiting.Add(-1)
		if q.opts.LostWakeup {
			// Fault lost-wakeup: check, then arm, then park again without
			// re-checking. An enqueue between the check and the arm sees
			// the token still pending and sends none.
			e, err := q.take()
			runtime.Gosched() // a preemption point, as in real life
			q.wakePending.Store(false)
			if e != nil || err != nil {
				return e, err
			}
			continue
		}
		q.wakePending.Store(false) // arm: the next enqueue sends a token
		if e, err := q.take(); e != nil || err != nil {
			return e, err
		}
	}
}

// take claims the next entry in weighted fair order, or returns nil.
func (q *Queue[T]) take() (*Entry[T], error) {
	q.mu.Lock()
	if q.stopped {
		q.mu.Unlock()
		return nil, ErrStopped
	}
	for q.readyAt < len(q.ready) {
		o := q.ready[q.readyAt]
		e := o.pop()
		if e == nil {
			// Only cancelled entries were left: retire the owner.
			q.popReady()
			o.ready = false
			o.turns = 0
			continue
		}
		q.takeSeq++
		e.takeSeq = q.takeSeq
		e.state = dispatched
		o.live--
		o.dispatched++
		if o.live == 0 {
			o.emptied++
		}
		q.live--
		q.dispatched++
		q.release(e)
		o.turns--
		if o.turns <= 0 || o.live == 0 {
			// The owner's turn is over: queue its next turn behind the
			// other owners, or retire it when it has nothing queued.
			q.popReady()
			q.publishTurn(o)
		}
		more := q.live > 0
		q.mu.Unlock()
		if more {
			q.signal() // pass the wake on
		}
		return e, nil
	}
	q.ready = q.ready[:0]
	q.readyAt = 0
	q.mu.Unlock()
	return nil, nil
}

// publishTurn queues o's next turn (or retires o). q.mu must be held; under
// TurnStall it is released for the stall.
func (q *Queue[T]) publishTurn(o *owner[T]) {
	q.turnsPub++
	if q.opts.TurnStall && q.turnsPub%uint64(q.opts.StallEvery) == 0 {
		// Fault turn-stall: the worker is preempted between taking the
		// owner's last turn token and queuing its next turn. o.ready stays
		// set, so enqueues do not queue a turn meanwhile; other owners are
		// served during the stall and the share is never made up.
		q.mu.Unlock()
		time.Sleep(q.opts.StallFor)
		q.mu.Lock()
	}
	if o.live > 0 && !q.stopped {
		o.turns = o.weight
		q.ready = append(q.ready, o)
		return
	}
	o.ready = false
	o.turns = 0
}

func (q *Queue[T]) popReady() {
	q.ready = popHead(q.ready, &q.readyAt)
}

// popHead drops the element at *head of a slice consumed from its head and
// returns the slice: it empties once the head reaches its end, and moves its
// rest to the front once the head is past 64 and past half of it.
func popHead[S ~[]E, E any](s S, head *int) S {
	var zero E
	s[*head] = zero
	*head++
	if *head == len(s) {
		s = s[:0]
		*head = 0
	} else if *head > 64 && *head*2 > len(s) {
		n := copy(s, s[*head:])
		clear(s[n:])
		s = s[:n]
		*head = 0
	}
	return s
}

// pop removes and returns the first queued entry of o, dropping claimed
// entries on the way.
func (o *owner[T]) pop() *Entry[T] {
	for o.head < len(o.fifo) {
		e := o.fifo[o.head]
		o.fifo = popHead(o.fifo, &o.head)
		if e.state == queued {
			return e
		}
	}
	return nil
}

// release returns e's queue slot once. q.mu must be held.
func (q *Queue[T]) release(e *Entry[T]) {
	if e.released {
		return
	}
	e.released = true
	e.owner.charged--
	q.charged--
}

// Cancel claims a queued entry for cancellation. It returns true if this
// call claimed it (the caller then completes the request, e.g. with
// BadRequestCancelledByClient); false if it was already dispatched,
// cancelled or stopped.
func (q *Queue[T]) Cancel(e *Entry[T]) bool {
	if e == nil {
		return false
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if e.state != queued {
		return false
	}
	o := e.owner
	o.cancelled++
	q.cancelled++
	if q.opts.CancelDouble {
		// Fault cancel-double: report the cancellation but leave the entry
		// queued; a worker dispatches it too, so it completes twice.
		return true
	}
	e.state = cancelled
	// The caller completes the request from its own reference: the queue
	// drops the value now, so a cancelled entry left in the owner's FIFO
	// (until a worker passes it) does not keep the request alive.
	var zero T
	e.Value = zero
	o.live--
	q.live--
	if q.opts.CancelLeak {
		// Fault cancel-leak: the slot is never returned.
		e.released = true
	} else {
		q.release(e)
	}
	switch {
	case o.live == 0:
		o.emptied++
		// Drop the stale entries now; the owner's turn is retired lazily.
		clear(o.fifo)
		o.fifo = o.fifo[:0]
		o.head = 0
	case o.stale() > max(compactAfter, o.live):
		// Requests cancelled behind busy workers pile up in the FIFO
		// while its head waits: drop them once they outnumber the
		// queued ones (amortised O(1) per Cancel).
		o.compact(q.opts.CancelStrands)
	}
	return true
}

// compactAfter is the number of claimed entries an owner's FIFO may hold
// before Cancel drops them (when they also outnumber the queued ones).
const compactAfter = 64

// stale is the number of claimed entries in o's FIFO.
func (o *owner[T]) stale() int { return len(o.fifo) - o.head - o.live }

// compact drops the claimed entries from o's FIFO, keeping the order of the
// queued ones. strand is the cancel-strands fault: the scan starts one past
// the head, so a queued entry at the head is dropped with the claimed ones.
func (o *owner[T]) compact(strand bool) {
	from := o.head
	if strand && from < len(o.fifo) {
		// Fault cancel-strands: the head is taken for one a worker is
		// about to pop; a queued request there leaves the FIFO still
		// queued (live, charged) and no worker ever finds it.
		from++
	}
	n := 0
	for _, e := range o.fifo[from:] {
		if e.state == queued {
			o.fifo[n] = e
			n++
		}
	}
	clear(o.fifo[n:])
	o.fifo = o.fifo[:n]
	o.head = 0
}

// Stop stops the queue: admissions fail with ErrStopped, parked and future
// Dequeue calls return ErrStopped, and every queued entry is claimed and
// returned in admission order, for the caller to complete (BadServerHalted).
func (q *Queue[T]) Stop() []*Entry[T] {
	q.mu.Lock()
	if q.stopped {
		q.mu.Unlock()
		return nil
	}
	q.stopped = true
	close(q.stopCh)
	var out []*Entry[T]
	for _, o := range q.owners {
		for _, e := range o.fifo[o.head:] {
			if e.state != queued {
				continue
			}
			e.state = halted
			o.live--
			o.cancelled++
			q.live--
			q.cancelled++
			q.release(e)
			out = append(out, e)
		}
		clear(o.fifo)
		o.fifo, o.head, o.ready, o.turns = nil, 0, false, 0
	}
	clear(q.ready)
	q.ready, q.readyAt = nil, 0
	q.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].seq < out[j].seq })
	return out
}

// Stats returns the queue's counters.
func (q *Queue[T]) Stats() Stats {
	q.mu.Lock()
	defer q.mu.Unlock()
	return Stats{
		Queued:     q.live,
		Charged:    q.charged,
		Limit:      q.opts.Limit,
		OwnerLimit: q.opts.OwnerLimit,
		Enqueued:   q.enqueued,
		Dispatched: q.dispatched,
		Rejected:   q.rejected,
		Cancelled:  q.cancelled,
		Waiting:    int(q.waiting.Load()),
	}
}

// Owner returns one owner's counters; ok is false for an owner never seen.
func (q *Queue[T]) Owner(name string) (OwnerStats, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	o := q.owners[name]
	if o == nil {
		return OwnerStats{Owner: name, Weight: q.weight(name)}, false
	}
	return o.stats(), true
}

// Owners returns the counters of every owner seen, sorted by name.
func (q *Queue[T]) Owners() []OwnerStats {
	q.mu.Lock()
	out := make([]OwnerStats, 0, len(q.owners))
	for _, o := range q.owners {
		out = append(out, o.stats())
	}
	q.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Owner < out[j].Owner })
	return out
}

func (o *owner[T]) stats() OwnerStats {
	return OwnerStats{
		Owner: o.name, Weight: o.weight, Queued: o.live, Charged: o.charged,
		Enqueued: o.enqueued, Dispatched: o.dispatched, Rejected: o.rejected, Cancelled: o.cancelled,
		Emptied: o.emptied,
	}
}
