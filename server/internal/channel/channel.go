// Package channel runs one secure channel of the reference server: a reader
// that hands service requests to a handler, and a writer goroutine that writes
// the responses, so that no worker ever blocks on a slow socket.
//
// The channel counts responses that were admitted (their request was read)
// but not yet written. Above Options.HighMark it stops reading from the
// transport, so the peer's TCP window fills instead of our memory; it resumes
// once the count drops to Options.LowMark. Being busy never faults the channel
// (unless the fault-on-overflow switch asks for the old .NET behaviour).
//
// Responses are budgeted by bytes too, when the transport can encode them
// ahead of writing (an Encoder, as SecureTransport is): Respond encodes
// the response on the worker that answers, charges the bytes to the memory
// budget (class budget.Responses) until they are written, and stops the
// reader while Options.MaxUnsent bytes or more wait (resuming at half of
// it). A response that comes when the channel already holds its share, or
// that does not fit in the budget, is answered BadResourceUnavailable
// instead (a channel goes over its share by one response at most); a
// small one (the channel's unsent bytes stay within smallUnsent) is always
// sent, so a client that reads its answers is never refused for another's.
// A peer that does not read at all is closed by the transport's write
// deadline.
//
// A request that waits for an event rather than for work (a Publish queued
// until its subscription has something to send) is parked: Park takes it out
// of the pending count, so that a client's parked requests never stop the
// reader. Whoever parks requests bounds them (the subscription layer keeps
// at most MaxPublishRequests per session).
package channel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"github.com/gopcua/opcua/ua"

	"github.com/opcua-chaos/opcua-chaos/server/internal/budget"
)

// Message is one service request read from a transport.
type Message struct {
	// RequestID is the secure channel's request id; the response must carry it.
	RequestID uint32
	// Request is the decoded service request; nil when Err is set.
	Request ua.Request
	// Err is set when the message was read completely but could not be
	// decoded; it must be answered with a ServiceFault.
	Err error
	// Handle is the RequestHandle of a message with Err set, when its
	// request header could be decoded (else 0).
	Handle uint32
	// Size is the encoded size of the request's body in bytes (0 when the
	// transport does not know it).
	Size int
}

// Transport is the message stream of one secure channel.
type Transport interface {
	// Receive blocks until the next service request arrives. It returns an
	// error when the transport is closed or broken.
	Receive(ctx context.Context) (Message, error)
	// Send encodes and writes one response. It may block on a slow peer.
	Send(ctx context.Context, requestID uint32, resp ua.Response) error
	// Abort sends a transport error with code (if possible) and closes.
	Abort(code ua.StatusCode) error
	// Close closes the transport; a blocked Receive or Send returns.
	Close() error
}

// Encoder is a Transport that encodes a response ahead of writing it, so
// that the channel can queue and budget the bytes rather than the decoded
// response.
type Encoder interface {
	// Encode encodes resp, the answer to request reqID, as SendEncoded
	// writes it (a response the peer cannot take may be replaced by a
	// ServiceFault). It must be safe for concurrent use.
	Encode(reqID uint32, resp ua.Response) []byte
	// SendEncoded writes the encoded response body to request reqID.
	SendEncoded(ctx context.Context, reqID uint32, body []byte) error
}

// smallUnsent is what a channel may always hold unsent: a response that
// keeps the channel's unsent bytes within it is sent whatever the budget,
// so a client that reads its answers gets them while others exhaust the
// budget.
const smallUnsent = 64 << 10

// DefaultMaxUnsent is the default of Options.MaxUnsent (8 MiB).
const DefaultMaxUnsent = 8 << 20

// Handler handles one request. It must arrange for exactly one call of
// Channel.Respond (or Fail) with msg.RequestID, from any goroutine, at any
// later time. A handler that panics before answering is recovered: the
// request is answered with a ServiceFault BadInternalError and the channel
// closes (ERR BadInternalError) once that is written.
type Handler func(ch *Channel, msg Message)

// Options configure a Channel.
type Options struct {
	// HighMark is the number of pending responses at which reading stops.
	// Zero means 100.
	HighMark int
	// LowMark is the number of pending responses at which reading resumes.
	// Zero means 50.
	LowMark int
	// NoBackpressure is the no-backpressure fault: never stop reading.
	NoBackpressure bool
	// FaultOnOverflow is the fault-on-overflow fault (the old .NET
	// behaviour): never stop reading, and close the channel with
	// BadTcpNotEnoughResources when more than HighMark responses are pending.
	FaultOnOverflow bool
	// LateResume is the late-resume fault: a paused reader resumes only
	// when no response is pending, not at LowMark (the pipeline drains
	// empty before the server reads again).
	LateResume bool
	// WriterDropsKick is the writer-lost-wakeup fault: after writing a
	// batch the writer drains its wake-up signal, taking a wake-up that
	// arrived during the write for one of the batch, and waits again:
	// a response queued during a write goes out only when a later
	// response on the channel wakes the writer.
	WriterDropsKick bool
	// ParkHoldsSlot is the publish-blocks-reader fault: Park counts the
	// request as parked but leaves it in the pending count, so parked
	// Publish requests hold the reader's backpressure slots: at HighMark
	// of them the reader stops, with only Publishes outstanding.
	ParkHoldsSlot bool
	// Budget is charged (class budget.Responses) for the encoded
	// responses waiting to be written; nil charges nothing (the
	// per-channel share still holds).
	Budget *budget.Budget
	// MaxUnsent is the channel's share of unsent response bytes: the
	// reader stops while that many or more wait and resumes at half of
	// it, and a response that comes while the channel holds its share is
	// answered BadResourceUnavailable. Zero means DefaultMaxUnsent.
	MaxUnsent int64
	// UnbudgetedResponses is the responses-unbudgeted fault: responses
	// wait decoded, uncharged, however many bytes they take; only their
	// count stops the reader.
	UnbudgetedResponses bool
	// Logger receives channel events; nil means slog.Default().
	Logger *slog.Logger
	// OnPanic, if set, is called after a panic of a handler or of the
	// writer was recovered (for counting).
	OnPanic func()
}

// Stats is a snapshot of a channel's counters.
type Stats struct {
	Received   int64 // requests read
	Written    int64 // responses written
	Dropped    int64 // responses dropped because the channel closed
	Pending    int   // responses admitted but not yet written or dropped, parked ones excluded
	Parked     int   // requests parked (see Park) and not yet answered
	MaxPending int   // highest Pending seen
	Pauses     int64 // times reading stopped for backpressure (pending responses)
	// Unsent is the encoded bytes waiting to be written, MaxUnsent the
	// most seen; BytePauses counts the times reading stopped for them,
	// Refused the responses answered BadResourceUnavailable for want of
	// budget or share.
	Unsent, MaxUnsent int64
	BytePauses        int64
	Refused           int64
	Resumes           int64 // times a paused reader was resumed
	// LowestResume is the lowest pending count at which a paused reader
	// was resumed (-1 before the first resume); a server that resumes by
	// its low mark keeps it at LowMark or just below.
	LowestResume int
}

// ErrOverflow is returned by Run when the fault-on-overflow switch closed the
// channel.
var ErrOverflow = errors.New("channel: too many pending responses (fault-on-overflow)")

// ErrFailed is returned by Run when Fail (or a panic) closed the channel.
var ErrFailed = errors.New("channel: failed")

// failFlushTimeout bounds how long a failed channel waits for its last
// responses to be written.
const failFlushTimeout = 5 * time.Second

// outgoing is a response waiting for the writer: decoded (resp), or
// encoded and charged (body, on a budgeted channel).
type outgoing struct {
	reqID uint32
	resp  ua.Response
	body  []byte
}

// Channel is one running secure channel.
type Channel struct {
	t    Transport
	opts Options
	log  *slog.Logger

	mu     sync.Mutex
	queue  []outgoing    // responses waiting for the writer
	kick   chan struct{} // cap 1: wakes the writer
	resume chan struct{} // non-nil while the reader is paused
	// byBytes: the reader paused for unsent bytes, not for its count
	byBytes bool
	enc     Encoder // the transport, when it encodes ahead and the channel budgets responses
	closed  bool
	failed  ua.StatusCode // set by Fail: ERR code sent once the queue is written
	done    chan struct{} // closed when the channel is closed
	stats   Stats
	closeMu sync.Once

	gate gated           // the transport's gate, if it has one
	ctx  context.Context // Run's; SendNow writes with it
}

// gated is a transport whose reader may hold its send gate for the request
// it returned (the crypto-in-gate fault): the channel releases it once the
// request's handler returned.
type gated interface {
	ReleaseGate()
}

// New returns a channel over t. Call Run to serve it.
func New(t Transport, opts Options) *Channel {
	if opts.HighMark <= 0 {
		opts.HighMark = 100
	}
	if opts.LowMark <= 0 || opts.LowMark > opts.HighMark {
		opts.LowMark = opts.HighMark / 2
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	g, _ := t.(gated)
	if opts.MaxUnsent <= 0 {
		opts.MaxUnsent = DefaultMaxUnsent
	}
	var enc Encoder
	if !opts.UnbudgetedResponses {
		// Fault responses-unbudgeted: responses wait decoded, uncharged.
		enc, _ = t.(Encoder)
	}
	return &Channel{
		enc:   enc,
		gate:  g,
		ctx:   context.Background(), // replaced by Run's
		stats: Stats{LowestResume: -1},
		t:     t,
		opts:  opts,
		log:   opts.Logger,
		kick:  make(chan struct{}, 1),
		done:  make(chan struct{}),
	}
}

// Done is closed when the channel has closed (peer gone, error or shutdown).
func (c *Channel) Done() <-chan struct{} { return c.done }

// Stats returns a snapshot of the channel's counters.
func (c *Channel) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats
}

// Run reads requests and passes them to h until ctx is done or the transport
// fails. It closes the transport and waits for the writer before returning.
// Responses arriving after Run returned are dropped.
func (c *Channel) Run(ctx context.Context, h Handler) error {
	ctx, cancel := context.WithCancel(ctx)
	c.mu.Lock()
	c.ctx = ctx
	c.mu.Unlock()
	var wg sync.WaitGroup
	// Deferred, so that a panic on the reader (the crash-on-decode fault
	// lets one through) still stops the writer.
	defer func() {
		c.close()
		cancel()
		wg.Wait()
	}()

	wg.Add(2)
	go func() {
		defer wg.Done()
		c.writeLoop(ctx)
	}()
	go func() {
		// A blocked Receive only returns when the transport closes.
		defer wg.Done()
		select {
		case <-ctx.Done():
		case <-c.done:
		}
		c.close()
	}()

	err := c.readLoop(ctx, h)
	if c.failing() {
		// Let the writer send what Fail queued, then its ERR message (a
		// peer that does not read gets failFlushTimeout).
		t := time.NewTimer(failFlushTimeout)
		defer t.Stop()
		select {
		case <-c.done:
		case <-ctx.Done():
		case <-t.C:
		}
		return ErrFailed
	}
	return err
}

func (c *Channel) readLoop(ctx context.Context, h Handler) error {
	for {
		if c.failing() {
			return ErrFailed
		}
		if err := c.waitForRoom(ctx); err != nil {
			return err
		}
		msg, err := c.t.Receive(ctx)
		if err != nil {
			return err
		}
		c.mu.Lock()
		c.stats.Received++
		c.stats.Pending++
		if c.stats.Pending > c.stats.MaxPending {
			c.stats.MaxPending = c.stats.Pending
		}
		overflow := c.opts.FaultOnOverflow && c.stats.Pending > c.opts.HighMark
		c.mu.Unlock()
		if overflow {
			// Fault fault-on-overflow: the old .NET behaviour, which faulted
			// busy channels with BadTcpNotEnoughResources.
			c.log.Warn("closing channel: too many pending responses", "fault", "fault-on-overflow", "high", c.opts.HighMark)
			_ = c.t.Abort(ua.StatusBadTCPNotEnoughResources)
			c.close()
			return ErrOverflow
		}
		c.dispatch(h, msg)
		if c.gate != nil {
			c.gate.ReleaseGate()
		}
	}
}

// dispatch runs the handler; a panic answers the request with a
// ServiceFault BadInternalError and fails the channel.
func (c *Channel) dispatch(h Handler, msg Message) {
	defer func() {
		if p := recover(); p != nil {
			c.log.Error("panic in request handler: closing the channel",
				"request_id", msg.RequestID, "request", fmt.Sprintf("%T", msg.Request),
				"panic", p, "stack", string(debug.Stack()))
			c.Fail(msg.RequestID, internalFault(msg.Request, ua.StatusBadInternalError), ua.StatusBadInternalError)
			if c.opts.OnPanic != nil {
				c.opts.OnPanic()
			}
		}
	}()
	h(c, msg)
}

// internalFault returns a ServiceFault with code answering req (nil
// allowed).
func internalFault(req ua.Request, code ua.StatusCode) *ua.ServiceFault {
	var handle uint32
	if req != nil {
		if h := req.Header(); h != nil {
			handle = h.RequestHandle
		}
	}
	return faultFor(handle, code)
}

// faultFor returns a ServiceFault with code answering the request of
// handle.
func faultFor(handle uint32, code ua.StatusCode) *ua.ServiceFault {
	return &ua.ServiceFault{ResponseHeader: &ua.ResponseHeader{
		Timestamp:          time.Now(),
		RequestHandle:      handle,
		ServiceResult:      code,
		ServiceDiagnostics: &ua.DiagnosticInfo{},
		AdditionalHeader:   ua.NewExtensionObject(nil),
	}}
}

// Fail answers request reqID with resp and closes the channel with an ERR
// message carrying code once every response queued so far is written. The
// reader stops reading; later responses are dropped. It never blocks.
func (c *Channel) Fail(reqID uint32, resp ua.Response, code ua.StatusCode) {
	c.mu.Lock()
	if c.closed {
		c.stats.Dropped++
		c.release(1)
		c.mu.Unlock()
		return
	}
	c.queue = append(c.queue, outgoing{reqID: reqID, resp: resp})
	if c.failed == 0 {
		c.failed = code
	}
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// failing reports whether Fail was called.
func (c *Channel) failing() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failed != 0
}

// waitForRoom blocks while HighMark or more responses are pending, until the
// count drops to LowMark.
func (c *Channel) waitForRoom(ctx context.Context) error {
	if c.opts.NoBackpressure || c.opts.FaultOnOverflow {
		// Faults no-backpressure and fault-on-overflow: never stop reading
		// (the latter faults the channel instead, see readLoop).
		return nil
	}
	c.mu.Lock()
	byCount := c.stats.Pending >= c.opts.HighMark
	byBytes := c.enc != nil && c.stats.Unsent >= c.opts.MaxUnsent
	if !byCount && !byBytes || c.closed {
		c.mu.Unlock()
		return nil
	}
	if byCount {
		c.stats.Pauses++
	} else {
		c.stats.BytePauses++
	}
	c.byBytes = !byCount
	resume := make(chan struct{})
	c.resume = resume
	c.mu.Unlock()
	select {
	case <-resume:
		return nil
	case <-c.done:
		return errors.New("channel: closed")
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Respond queues the response to request reqID for the writer. It never
// blocks. Every request passed to the handler must be answered exactly once.
// After Fail, responses are dropped.
func (c *Channel) Respond(reqID uint32, resp ua.Response) {
	var body []byte
	if c.enc != nil {
		// Encoded on the answering goroutine, outside the lock.
		body = c.enc.Encode(reqID, resp)
	}
	c.mu.Lock()
	if c.droppedLocked() {
		c.mu.Unlock()
		return
	}
	if c.enc != nil {
		c.queue = append(c.queue, outgoing{reqID: reqID, body: c.chargeLocked(reqID, resp, body)})
	} else {
		c.queue = append(c.queue, outgoing{reqID: reqID, resp: resp})
	}
	c.mu.Unlock()
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// chargeLocked charges body, the encoded answer to request reqID (resp),
// to the channel's unsent bytes and the budget, and returns what to send:
// body, or, when the channel already holds its share or the budget has no
// room, an encoded ServiceFault BadResourceUnavailable; a response that
// keeps the channel within smallUnsent always goes. c.mu must be held.
func (c *Channel) chargeLocked(reqID uint32, resp ua.Response, body []byte) []byte {
	n := int64(len(body))
	switch {
	case c.stats.Unsent+n <= smallUnsent:
		// a reading client's answer: always sent
		c.opts.Budget.Force(budget.Responses, n)
	case c.stats.Unsent < c.opts.MaxUnsent && c.opts.Budget.Charge(budget.Responses, n):
		// within the share before it: the channel may go over it by
		// this one response, and its reader stops until it is down
	default:
		if c.stats.Unsent >= c.opts.MaxUnsent {
			c.opts.Budget.Refuse(budget.Responses) // the channel's share, not the budget, refused it
		}
		c.stats.Refused++
		c.log.Debug("response refused: send budget exhausted", "request_id", reqID, "bytes", n,
			"unsent", c.stats.Unsent, "share", c.opts.MaxUnsent, "budget", c.opts.Budget.UsedBy(budget.Responses))
		var handle uint32
		if h := resp.Header(); h != nil {
			handle = h.RequestHandle
		}
		body = c.enc.Encode(reqID, faultFor(handle, ua.StatusBadResourceUnavailable))
		n = int64(len(body))
		c.opts.Budget.Force(budget.Responses, n)
	}
	c.stats.Unsent += n
	c.stats.MaxUnsent = max(c.stats.MaxUnsent, c.stats.Unsent)
	return body
}

// sentLocked gives back the bytes of o once written or dropped (release
// then resumes a reader paused for them at half the channel's share). c.mu
// must be held.
func (c *Channel) sentLocked(o outgoing) {
	if o.body == nil {
		return
	}
	n := int64(len(o.body))
	c.stats.Unsent -= n
	c.opts.Budget.Release(budget.Responses, n)
}

// OverShare reports whether the channel holds its share of unsent
// response bytes or more (never on a channel that does not budget
// responses): a request read before the reader stopped is better refused
// than run, as its answer would be refused once built.
func (c *Channel) OverShare() bool {
	if c.enc == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stats.Unsent >= c.opts.MaxUnsent
}

// droppedLocked reports whether a response comes too late to be sent, after
// close or Fail, and then retires its request as dropped. c.mu must be held.
func (c *Channel) droppedLocked() bool {
	if !c.closed && c.failed == 0 {
		return false
	}
	c.stats.Dropped++
	c.release(1)
	return true
}

// SendNow writes the response to request reqID from the calling goroutine,
// past the writer, and blocks until it is written: the crypto-in-gate
// fault's workers send their own responses, as .NET's SendResponse does on
// a pool thread, and wait for the transport's send gate. After Fail or
// close the response is dropped; a failed write closes the channel.
func (c *Channel) SendNow(reqID uint32, resp ua.Response) {
	c.mu.Lock()
	if c.droppedLocked() {
		c.mu.Unlock()
		return
	}
	ctx := c.ctx
	c.mu.Unlock()
	err := c.t.Send(ctx, reqID, resp)
	c.mu.Lock()
	if err != nil {
		c.stats.Dropped++
		c.retire(1)
	} else {
		c.stats.Written++
		c.release(1)
	}
	c.mu.Unlock()
	if err != nil {
		c.log.Debug("channel write failed", "err", err)
		c.close()
	}
}

// Park moves the request being handled out of the pending count: it waits
// for an event, not for a worker or the writer, and must not hold the
// reader's backpressure slot (parked Publish requests at the high mark
// would stop the reader, and with it the requests that would let them be
// answered). The caller bounds how many requests it parks, and answers a
// parked request with RespondParked or retires it with ForgetParked, never
// with Respond or Forget.
func (c *Channel) Park() {
	c.mu.Lock()
	c.stats.Parked++
	if !c.opts.ParkHoldsSlot {
		c.release(1)
	}
	// Fault publish-blocks-reader: the parked request stays pending.
	c.mu.Unlock()
}

// RespondParked answers a parked request: it counts as pending again until
// written, then goes the way of Respond. It never blocks.
func (c *Channel) RespondParked(reqID uint32, resp ua.Response) {
	c.mu.Lock()
	c.stats.Parked--
	if !c.opts.ParkHoldsSlot {
		c.stats.Pending++
	}
	c.mu.Unlock()
	c.Respond(reqID, resp)
}

// ForgetParked retires a parked request that will never be answered (the
// publish-drop fault).
func (c *Channel) ForgetParked() {
	c.mu.Lock()
	c.stats.Parked--
	c.stats.Dropped++
	if c.opts.ParkHoldsSlot {
		c.release(1)
	}
	c.mu.Unlock()
}

// Forget retires a request that will never be answered, without sending
// anything: only the publish-drop and lost-response faults use it, so that
// dropping a request does not also leak its pending slot and stall the
// channel.
func (c *Channel) Forget() {
	c.mu.Lock()
	c.stats.Dropped++
	c.release(1)
	c.mu.Unlock()
}

// release retires n pending responses and resumes a paused reader at the low
// mark (at 0 under the late-resume fault), counting the resume. c.mu must be
// held.
func (c *Channel) release(n int) {
	c.stats.Pending -= n
	low := c.opts.LowMark
	if c.opts.LateResume {
		low = 0
	}
	if c.resume == nil || c.stats.Unsent > c.opts.MaxUnsent/2 {
		return
	}
	if c.byBytes {
		// paused for unsent bytes: resume once they are down to half
		// the share and the count leaves room
		if c.stats.Pending < c.opts.HighMark {
			close(c.resume)
			c.resume = nil
		}
		return
	}
	if c.stats.Pending <= low {
		close(c.resume)
		c.resume = nil
		c.stats.Resumes++
		if c.stats.LowestResume < 0 || c.stats.Pending < c.stats.LowestResume {
			c.stats.LowestResume = c.stats.Pending
		}
	}
}

// retire retires n pending responses of a channel that is going away (a
// failed write, responses dropped at close): it wakes a paused reader,
// which then sees the channel closed, without counting a resume. c.mu
// must be held.
func (c *Channel) retire(n int) {
	c.stats.Pending -= n
	if c.resume != nil {
		close(c.resume)
		c.resume = nil
	}
}

func (c *Channel) writeLoop(ctx context.Context) {
	defer func() {
		if p := recover(); p != nil {
			c.log.Error("panic in channel writer: closing the channel", "panic", p, "stack", string(debug.Stack()))
			if c.opts.OnPanic != nil {
				c.opts.OnPanic()
			}
			_ = c.t.Abort(ua.StatusBadInternalError)
			c.close()
			c.dropQueued()
		}
	}()
	var batch []outgoing
	for {
		select {
		case <-c.kick:
		case <-c.done:
			c.dropQueued()
			return
		}
		c.mu.Lock()
		batch, c.queue = c.queue, batch[:0]
		c.mu.Unlock()
		for i, o := range batch {
			var err error
			if o.body != nil {
				err = c.enc.SendEncoded(ctx, o.reqID, o.body)
			} else {
				err = c.t.Send(ctx, o.reqID, o.resp)
			}
			if err != nil {
				c.log.Debug("channel write failed", "err", err)
				c.mu.Lock()
				c.stats.Dropped += int64(len(batch) - i)
				for _, o := range batch[i:] {
					c.sentLocked(o)
				}
				c.retire(len(batch) - i)
				c.mu.Unlock()
				c.close()
				c.dropQueued()
				return
			}
			c.mu.Lock()
			c.stats.Written++
			c.sentLocked(o)
			c.release(1)
			c.mu.Unlock()
		}
		clear(batch)
		if c.opts.WriterDropsKick {
			// Fault writer-lost-wakeup: the kick that came in during
			// the write is taken for the batch just written.
			select {
			case <-c.kick:
			default:
			}
		}
		c.mu.Lock()
		code, drained := c.failed, len(c.queue) == 0
		c.mu.Unlock()
		if code != 0 && drained {
			// Fail: everything queued before it is written.
			_ = c.t.Abort(code)
			c.close()
			c.dropQueued()
			return
		}
	}
}

func (c *Channel) dropQueued() {
	c.mu.Lock()
	n := len(c.queue)
	for _, o := range c.queue {
		c.sentLocked(o)
	}
	c.queue = nil
	c.stats.Dropped += int64(n)
	c.retire(n)
	c.mu.Unlock()
}

func (c *Channel) close() {
	c.closeMu.Do(func() {
		c.mu.Lock()
		c.closed = true
		c.mu.Unlock()
		close(c.done)
		_ = c.t.Close()
	})
}
