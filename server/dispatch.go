package server

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gopcua/opcua/ua"

	"github.com/opcua-chaos/opcua-chaos/server/catalog"
	"github.com/opcua-chaos/opcua-chaos/server/internal/budget"
	"github.com/opcua-chaos/opcua-chaos/server/internal/channel"
	"github.com/opcua-chaos/opcua-chaos/server/internal/fairqueue"
	"github.com/opcua-chaos/opcua-chaos/server/internal/session"
)

// StatusBadServerTooBusy (Bad_ServerTooBusy, 0x80EE0000) answers a request
// the fair queue refuses: total bound or the owner's ceiling reached.
// gopcua v0.8.0 does not define it.
const StatusBadServerTooBusy ua.StatusCode = 0x80EE0000

// job is one admitted service request waiting in the fair queue.
type job struct {
	conn     *conn
	ch       *channel.Channel
	sess     *session.Session
	reqID    uint32
	req      ua.Request
	handle   uint32
	owner    string
	received time.Time
	entry    *fairqueue.Entry[*job]
	slot     bool // holds one of s.slots (crypto-in-gate)
	// size is the request's encoded size (channel.Message.Size, 0 if
	// unknown); charge is what admit charged to budget.Queue for it,
	// given back once by releaseCharge.
	size     int
	charge   int64
	released atomic.Bool
}

// Costs of a queued request in memory, beyond its encoded bytes: the
// decoded request is several times larger than its encoding (a 10 000-node
// Read of 210 kB decodes into 1.1-1.3 MB live, 2.8 MB before the decoder's
// garbage is collected, with gopcua v0.8.0), so a budget of encoded bytes
// alone would let many times the budget be queued. Measured in-process:
// 300 such Reads behind two pinned workers peaked at 807 MB of heap
// unbudgeted, 187 MB with the default budget (41 queued, 259 refused).
const (
	// jobOverhead is a queued request's fixed cost: its job, queue entry,
	// bookkeeping and decoded request header.
	jobOverhead = 1024
	// readValueCost is one decoded ReadValueID (its NodeId, QualifiedName
	// and pointer) with its share of the decoder's garbage: 107-128 bytes
	// live, 280 allocated; the heap grows to about twice the live data
	// (GOGC=100), so the larger figure is charged.
	readValueCost = 288
	// browseDescriptionCost is one decoded BrowseDescription (two NodeIds
	// and its pointer) likewise: measured against a ReadValueID with
	// gopcua v0.8.0's ua.Decode of 10 000 of each, 125 bytes live and 576
	// allocated against 106 and 518, so about 1.1 readValueCost.
	browseDescriptionCost = 320
)

// queueCost is the bytes charged to budget.Queue while j is admitted and
// not yet answered.
func queueCost(j *job) int64 {
	n := int64(j.size) + jobOverhead
	switch r := j.req.(type) {
	case *ua.ReadRequest:
		n += int64(len(r.NodesToRead)) * readValueCost
	case *ua.BrowseRequest:
		n += int64(len(r.NodesToBrowse)) * browseDescriptionCost
	}
	return n
}

// tooManyOperations reports whether req asks for more operations than one
// request may: over MaxNodesPerRead nodes to read or MaxNodesPerBrowse to
// browse.
func tooManyOperations(req ua.Request) bool {
	switch r := req.(type) {
	case *ua.ReadRequest:
		return len(r.NodesToRead) > MaxNodesPerRead
	case *ua.BrowseRequest:
		return len(r.NodesToBrowse) > MaxNodesPerBrowse
	}
	return false
}

// releaseCharge gives back j's budget.Queue charge, once however many
// paths complete it (a worker and Cancel both do under cancel-double).
func (s *Server) releaseCharge(j *job) {
	if j.charge > 0 && j.released.CompareAndSwap(false, true) {
		s.budget.Release(budget.Queue, j.charge)
	}
}

// takeSlot is the crypto-in-gate fault's worker admission on secured
// channels (None channels are left as they are): a Read is handed over
// only when a worker is free for it (a slot of s.slots, one per
// worker, held until its response is written), and the reader waits for
// one, holding a secured channel's send gate. It reports false when the
// channel closed while waiting.
func (s *Server) takeSlot(cn *conn) bool {
	select {
	case s.slots <- struct{}{}:
		return true
	case <-cn.ctx.Done():
		return false
	}
}

// releaseSlot gives back j's slot, if it holds one.
func (s *Server) releaseSlot(j *job) {
	if j.slot {
		j.slot = false
		<-s.slots
	}
}

// deadline is the request's TimeoutHint deadline, zero if none.
func (j *job) deadline() time.Time {
	if hint := j.req.Header().TimeoutHint; hint > 0 {
		return j.received.Add(time.Duration(hint) * time.Millisecond)
	}
	return time.Time{}
}

// queued tracks a channel's requests that sit in the fair queue, so Cancel,
// CloseSession and a lost connection can find and cancel them.
type queued struct {
	mu   sync.Mutex
	jobs map[*job]struct{}
}

func newQueue(cfg Config) *fairqueue.Queue[*job] {
	weights := cfg.OwnerWeights
	return fairqueue.New[*job](fairqueue.Options{
		Limit:         cfg.QueueSize,
		OwnerLimit:    cfg.OwnerQueueSize,
		Weight:        func(owner string) int { return weights[owner] },
		Unweighted:    cfg.Faults.Has(catalog.FaultUnweighted),
		TurnStall:     cfg.Faults.Has(catalog.FaultTurnStall),
		LostWakeup:    cfg.Faults.Has(catalog.FaultLostWakeup),
		CancelLeak:    cfg.Faults.Has(catalog.FaultCancelLeak),
		CancelDouble:  cfg.Faults.Has(catalog.FaultCancelDouble),
		CancelStrands: cfg.Faults.Has(catalog.FaultCancelStrands),
	})
}

// workers returns the size of the worker pool.
func (s *Server) workers() int {
	if s.cfg.Faults.Has(catalog.FaultSerialDispatch) {
		// Fault serial-dispatch: one goroutine serves every request of
		// every session, like gopcua's stock server.
		return 1
	}
	return s.cfg.Workers
}

// admit puts a job into the fair queue; it answers it at once when the queue
// refuses it. A Read of more than MaxNodesPerRead nodes (a Browse of more
// than MaxNodesPerBrowse) is answered BadTooManyOperations on arrival, and a
// request whose cost (queueCost) does not fit in the budget's Queue share is
// answered BadResourceUnavailable: neither is queued. An admitted request
// holds its charge until it is answered, cancelled, halted or its channel
// goes away.
func (s *Server) admit(j *job) {
	if tooManyOperations(j.req) {
		s.releaseSlot(j)
		j.ch.Respond(j.reqID, s.fault(j.req, ua.StatusBadTooManyOperations))
		return
	}
	// s.budget is nil under the no-byte-budget fault: every charge fits.
	cost := queueCost(j)
	if !s.budget.Charge(budget.Queue, cost) {
		s.releaseSlot(j)
		s.log.Debug("request refused: queue budget exhausted", "channel", j.conn.id, "bytes", cost,
			"queued_bytes", s.budget.UsedBy(budget.Queue), "limit", s.budget.ClassLimit(budget.Queue))
		j.ch.Respond(j.reqID, s.fault(j.req, ua.StatusBadResourceUnavailable))
		return
	}
	j.charge = cost
	q := &j.conn.queued
	q.mu.Lock()
	e, err := s.queue.Enqueue(j.owner, j)
	if err == nil {
		j.entry = e
		q.jobs[j] = struct{}{}
	}
	q.mu.Unlock()
	switch {
	case err == nil:
	case errors.Is(err, fairqueue.ErrStopped):
		s.releaseSlot(j)
		s.releaseCharge(j)
		j.ch.Respond(j.reqID, s.fault(j.req, ua.StatusBadServerHalted))
	default: // ErrFull, ErrOwnerFull
		s.releaseSlot(j)
		s.releaseCharge(j)
		s.stats.tooBusy.Add(1)
		j.ch.Respond(j.reqID, s.fault(j.req, StatusBadServerTooBusy))
	}
}

// yieldAfter is how long a worker runs requests back to back before it
// lets the channel readers and writers run (see work).
const yieldAfter = time.Millisecond

// work is one worker: it takes requests in weighted fair order until the
// queue stops.
func (s *Server) work() {
	ctx := context.Background() // the queue's Stop ends Dequeue
	ran := time.Now()           // when this worker last yielded
	for {
		e, err := s.queue.Dequeue(ctx)
		if err != nil {
			return
		}
		j := e.Value
		j.conn.queued.mu.Lock()
		delete(j.conn.queued.jobs, j)
		j.conn.queued.mu.Unlock()
		s.busyWorkers.Add(1)
		s.runJob(j)
		s.busyWorkers.Add(-1)
		// Yield after yieldAfter of work. A worker whose requests burn CPU
		// never blocks while the queue is full, so without this the
		// channel readers and writers woken by the network wait for
		// sysmon's 10 ms preemption (far longer under a CPU quota): intake
		// starves, owners' queues run dry and weights stop holding.
		// Yielding after every request instead costs cheap requests their
		// throughput (a single worker under 0.5 CPU lost half of it).
		if now := time.Now(); now.Sub(ran) >= yieldAfter {
			runtime.Gosched()
			ran = time.Now()
		}
	}
}

// runJob executes j. A panic answers the request with a ServiceFault
// BadInternalError and closes its channel; the worker lives on.
func (s *Server) runJob(j *job) {
	defer s.releaseCharge(j) // answered (or forgotten, or failed) by now
	defer s.releaseSlot(j)
	defer func() {
		if p := recover(); p != nil {
			s.stats.panics.Add(1)
			s.log.Error("panic in worker: closing the channel", "channel", j.conn.id,
				"request", fmt.Sprintf("%T", j.req), "panic", p, "stack", string(debug.Stack()))
			j.ch.Fail(j.reqID, s.fault(j.req, ua.StatusBadInternalError), ua.StatusBadInternalError)
		}
	}()
	if s.testHook != nil {
		s.testHook(j.req)
	}
	s.execute(j)
}

// execute runs a dispatched job and queues its response.
func (s *Server) execute(j *job) {
	if j.conn.ctx.Err() != nil {
		// The channel is gone; the response would be dropped.
		j.ch.Respond(j.reqID, s.fault(j.req, ua.StatusBadSecureChannelClosed))
		return
	}
	if j.sess.Closed() && !s.cfg.Faults.Has(catalog.FaultCloseRunsQueued) {
		// (Fault close-runs-queued skips this: a closed session's request
		// runs and is answered as if the session were open.)
		j.ch.Respond(j.reqID, s.fault(j.req, ua.StatusBadSessionClosed))
		return
	}
	ctx := j.conn.ctx
	if dl := j.deadline(); !dl.IsZero() {
		if time.Now().After(dl) {
			// Expired while queued: do not run it.
			s.stats.timeouts.Add(1)
			j.ch.Respond(j.reqID, s.fault(j.req, ua.StatusBadTimeout))
			return
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, dl)
		defer cancel()
	}
	if j.ch.OverShare() {
		// Its channel holds its share of unsent answers (a client that
		// does not read them): the answer would be refused once built,
		// so it is not built.
		j.ch.Respond(j.reqID, s.fault(j.req, ua.StatusBadResourceUnavailable))
		return
	}
	var resp ua.Response
	switch r := j.req.(type) {
	case *ua.ReadRequest:
		resp = s.read(ctx, r)
		if s.slowRead != nil {
			s.slowRead.read()
		}
		if s.cfg.Faults.Has(catalog.FaultRetainMemory) {
			s.leak.retain(RetainPerRequest)
		}
		if s.cfg.Faults.Has(catalog.FaultSlowLeak) {
			s.leak.retain(SlowLeakPerRequest)
		}
		if s.cfg.Faults.Has(catalog.FaultLostResponse) && j.conn.reads.Add(1)%LostResponseEvery == 0 {
			// Fault lost-response: no answer to this Read; its pending
			// slot is released so the channel goes on (open, flowing).
			s.log.Debug("dropping a response", "fault", catalog.FaultLostResponse, "channel", j.conn.id, "handle", j.handle)
			j.ch.Forget()
			return
		}
	case *ua.BrowseRequest:
		// (The memory and lost-response faults stay with Read.)
		resp = s.browse(ctx, r)
	default:
		resp = s.fault(r, ua.StatusBadServiceUnsupported)
	}
	if j.slot {
		// Fault crypto-in-gate (secured channels): the worker sends its
		// response itself and waits for the channel's send gate.
		j.ch.SendNow(j.reqID, resp)
		return
	}
	j.ch.Respond(j.reqID, resp)
}

// leak is the memory the retain-memory fault keeps: blocks that are never
// freed.
type leak struct {
	mu     sync.Mutex
	blocks [][]byte
	bytes  int64
}

// retain allocates n bytes, writes every page of them (so that they are
// resident, not just reserved) and keeps them for the server's lifetime.
func (l *leak) retain(n int) {
	b := make([]byte, n)
	for i := 0; i < n; i += 4096 {
		b[i] = 0xA5
	}
	l.mu.Lock()
	l.blocks = append(l.blocks, b)
	l.bytes += int64(n)
	l.mu.Unlock()
}

// size returns the bytes retained so far.
func (l *leak) size() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.bytes
}

// cancelQueued cancels the queued jobs of a channel that match and answers
// each with code. It returns how many it cancelled.
func (s *Server) cancelQueued(cn *conn, match func(*job) bool, code ua.StatusCode) int {
	var hits []*job
	cn.queued.mu.Lock()
	for j := range cn.queued.jobs {
		if match(j) && s.queue.Cancel(j.entry) {
			delete(cn.queued.jobs, j)
			hits = append(hits, j)
		}
	}
	cn.queued.mu.Unlock()
	for _, j := range hits {
		s.releaseSlot(j)
		s.releaseCharge(j)
		j.ch.Respond(j.reqID, s.fault(j.req, code))
	}
	return len(hits)
}

// haltQueued stops the queue and answers every queued job BadServerHalted.
func (s *Server) haltQueued() {
	for _, e := range s.queue.Stop() {
		j := e.Value
		j.conn.queued.mu.Lock()
		delete(j.conn.queued.jobs, j)
		j.conn.queued.mu.Unlock()
		s.releaseSlot(j)
		s.releaseCharge(j)
		j.ch.Respond(j.reqID, s.fault(j.req, ua.StatusBadServerHalted))
	}
}
