// Package subscription implements the OPC UA subscription services of the
// reference server: subscriptions with publishing interval, lifetime and
// keep-alive counts, monitored items sampled at fixed rates with a bounded
// queue, notification messages with sequence numbers, a retransmission queue,
// acknowledgements, Republish, MaxNotificationsPerPublish and responses split
// to fit a size budget, with several Publish requests queued per session.
//
// Sampling runs on a Sampler: one goroutine and timer per sampling interval
// group, absolute deadlines on a monotonic Clock (injectable for tests).
//
// Fault switches reproduce known bugs on demand: SamplingDrift (wait one
// interval after each sample, seed 003), SamplerSkips (never sample a few
// items of a group), PublishDrop (silently drop Publish requests beyond a
// small number per session), RepublishForgets (retain only the last
// message), SkippedSequence (never use every SkipSequenceEvery-th sequence
// number), DuplicateSamples (queue every DuplicateSampleEvery-th sample
// twice) and SampleAtPublish (grant the sampling interval asked for, sample
// at the publishing interval).
//
// The package knows nothing about channels or sessions of the server: a
// caller keys a Session by any comparable value and passes a respond
// function with each Publish request.
package subscription

import (
	"context"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gopcua/opcua/ua"

	"github.com/opcua-chaos/opcua-chaos/server/internal/budget"
)

// Defaults of Options.
const (
	DefaultMinSamplingInterval   = time.Millisecond
	DefaultMinPublishingInterval = time.Millisecond
	DefaultMaxInterval           = time.Hour
	DefaultKeepAliveCount        = 10
	DefaultMaxKeepAliveCount     = 100_000
	DefaultMaxLifetime           = 2 * time.Hour
	DefaultMaxQueueSize          = 1000
	// UnboundedQueueSize is the queue size the item-queues-unbounded
	// fault grants at most (the limit before issue 32).
	UnboundedQueueSize = 10_000
	// DefaultValueSize estimates the bytes one queued value holds: a
	// DataValue of a scalar Variant with both timestamps, its boxed value
	// and its ring slot (176 bytes measured for an Int64), rounded up.
	DefaultValueSize          = 192
	DefaultMaxResponseBytes   = 0xffff // gopcua's receive buffer: one chunk
	DefaultMaxPublishRequests = 100
	DefaultMaxRetransmit      = 256
	DefaultMaxSubscriptions   = 1000
	// DefaultMaxSubscriptionsTotal bounds live subscriptions of all
	// sessions: each costs its publishing loop (a goroutine, a timer)
	// and its state, about 5 KB, and a wake-up every publishing
	// interval.
	DefaultMaxSubscriptionsTotal = 10_000
	// DefaultMaxPublishRate bounds the publishing cycles per second of
	// all subscriptions together (100 000: 1000 subscriptions at 10 ms,
	// 10 000 at 100 ms): each cycle wakes a subscription's loop, a few
	// microseconds of CPU.
	DefaultMaxPublishRate = 100_000
	// DefaultAnonymousShare is the share of MaxSubscriptionsTotal and of
	// MaxPublishRate the subscriptions of anonymous sessions together may
	// hold: the rest stays for sessions with a user identity.
	DefaultAnonymousShare       = 0.5
	DefaultMaxItems             = 100_000
	DefaultMaxItemsPerCall      = 10_000
	DefaultMaxItemsPerSession   = 20_000
	DefaultMaxItemsTotal        = 100_000
	DefaultMaxOperations        = 100_000
	DefaultPublishDropKeep      = 3
	DefaultSkipSequenceEvery    = 50
	DefaultDuplicateSampleEvery = 200
)

// Options configure a Manager. Zero values mean the defaults.
type Options struct {
	// Clock is the monotonic clock (NewRealClock()).
	Clock Clock
	// Source resolves the nodes items may monitor. Nil resolves nothing.
	Source Source
	// Logger receives the manager's log (slog.Default()).
	Logger *slog.Logger

	// MinSamplingInterval is the fastest sampling interval (1 ms); smaller
	// requests, 0 included, are revised up to it.
	MinSamplingInterval time.Duration
	// MaxSamplingInterval caps the sampling interval (1 h).
	MaxSamplingInterval time.Duration
	// MinPublishingInterval is the fastest publishing interval (1 ms).
	MinPublishingInterval time.Duration
	// MaxPublishingInterval caps the publishing interval (1 h).
	MaxPublishingInterval time.Duration
	// DefaultKeepAliveCount replaces a requested keep-alive count of 0 (10).
	DefaultKeepAliveCount uint32
	// MaxKeepAliveCount caps the keep-alive count (100000).
	MaxKeepAliveCount uint32
	// MaxLifetime caps lifetime count × publishing interval (2 h).
	MaxLifetime time.Duration
	// MaxQueueSize caps a monitored item's queue size
	// (DefaultMaxQueueSize, 1000: the most the suites ask for, an outage
	// of seconds at 20 ms sampling). A queue is allocated as values
	// arrive, not at its full size.
	MaxQueueSize uint32
	// Budget, if not nil, is charged each monitored item's queue size ×
	// ValueSize and its ItemCost (budget.Items) while the item lives: an item that does not
	// fit gets BadResourceUnavailable in CreateMonitoredItems (a queue
	// that cannot grow in ModifyMonitoredItems keeps its size and gets
	// the same). A transferred item keeps its charge.
	Budget *budget.Budget
	// RetransmitUnbudgeted is the retransmit-unbudgeted fault: the
	// notification messages kept for Republish are bounded by count
	// only (MaxRetransmit a subscription) and charged nowhere. Otherwise,
	// with a Budget, each kept message is charged its estimated size
	// (retransCost) to budget.Retransmit, and one session may hold at
	// most 1/RetransmitSessionShare of that class: a message that does
	// not fit drops its subscription's oldest kept messages first (a
	// Republish of one answers BadMessageNotAvailable, Part 4 5.13.6),
	// or is not kept at all.
	RetransmitUnbudgeted bool
	// ParkedKeepsRequest is the parked-publish-whole fault: a parked
	// Publish keeps its whole decoded request (every acknowledgement)
	// and is charged nowhere: parked Publishes are bounded by count only.
	ParkedKeepsRequest bool
	// ItemCost, if not nil, is what a monitored item of a node is charged
	// to Budget beside its queue, while it lives: its NodeId's bytes and
	// its own state (nil: the queue only).
	ItemCost func(node *ua.NodeID) int64
	// ValueSize is the estimated size of one queued value in bytes
	// (DefaultValueSize).
	ValueSize int64
	// EagerQueues is part of the item-queues-unbounded fault: a queue is
	// allocated at its full size when the item is created or modified.
	EagerQueues bool
	// MaxNotificationsPerPublish caps notifications per message on top of
	// the client's own limit (0: only the size budget limits).
	MaxNotificationsPerPublish uint32
	// MaxResponseBytes is the default size budget of one Publish response,
	// encoded with its transport headers (65535).
	MaxResponseBytes int
	// MaxPublishRequests bounds the queued Publish requests per session
	// (100); beyond it the oldest is answered BadTooManyPublishRequests.
	MaxPublishRequests int
	// MaxRetransmit bounds a subscription's retransmission queue (256
	// messages); the oldest unacknowledged message is dropped beyond it.
	MaxRetransmit int
	// MaxSubscriptions bounds subscriptions per session (1000).
	MaxSubscriptions int
	// MaxSubscriptionsTotal bounds live subscriptions of all sessions
	// (DefaultMaxSubscriptionsTotal): CreateSubscription beyond it is
	// answered BadTooManySubscriptions.
	MaxSubscriptionsTotal int
	// MaxPublishRate bounds the publishing cycles per second of all
	// subscriptions (DefaultMaxPublishRate; a subscription publishing
	// every interval runs 1 s / interval of them): CreateSubscription
	// that would go past it is answered BadTooManySubscriptions, and
	// ModifySubscription to a shorter interval that would keeps the
	// interval it had. Negative: no limit.
	MaxPublishRate float64
	// Anonymous, if not nil, tells whether the session keyed key has no
	// user identity (nil: every session has one). A subscription is
	// charged to the anonymous class when its session is anonymous at
	// CreateSubscription, and keeps that class for its life, across
	// TransferSubscriptions and ModifySubscription.
	Anonymous func(key any) bool
	// AnonymousShare is the share of MaxSubscriptionsTotal and of
	// MaxPublishRate that the subscriptions of anonymous sessions
	// together may hold (0: DefaultAnonymousShare): CreateSubscription
	// of an anonymous session beyond either is answered
	// BadTooManySubscriptions while user sessions still get theirs, and
	// its ModifySubscription to a shorter interval beyond the rate share
	// keeps the interval it had. 1 or more: no share, anonymous sessions
	// may take it all (the anonymous-subscriptions-unshared fault).
	AnonymousShare float64
	// MaxItems bounds monitored items per subscription (100000).
	MaxItems int
	// MaxItemsPerCall bounds the items of one CreateMonitoredItems call
	// (10000): a bigger call is answered BadTooManyOperations.
	MaxItemsPerCall int
	// MaxItemsPerSession (20000) and MaxItemsTotal (100000, all sessions)
	// bound live monitored items: an item beyond either gets
	// BadTooManyMonitoredItems.
	MaxItemsPerSession int
	MaxItemsTotal      int
	// MaxOperations bounds the operations of one service request (100000).
	MaxOperations int

	// SamplingDrift is the sampling-drift fault: the sampler waits one
	// interval after each sample instead of keeping absolute deadlines.
	SamplingDrift bool
	// SamplerSkips is the sampler-skips fault: the sampler never samples
	// the items at positions ≡ SkipResidue (mod SkipModulus) of a group.
	SamplerSkips bool
	// PublishDrop is the publish-drop fault: Publish requests beyond
	// PublishDropKeep queued per session are dropped without an answer.
	PublishDrop bool
	// PublishDropKeep is the queue length beyond which PublishDrop drops
	// (3).
	PublishDropKeep int
	// RepublishForgets is the republish-forgets fault: a subscription's
	// retransmission queue keeps only the message just sent, so Republish
	// of any earlier unacknowledged message is BadMessageNotAvailable.
	RepublishForgets bool
	// RepublishNext is the republish-next fault: Republish of number n
	// answers the message n+1 of the retransmission queue (and
	// BadMessageNotAvailable when it is not kept).
	RepublishNext bool
	// KeepAliveConsumesSeq is the keepalive-consumes-seq fault: a
	// keep-alive uses up the number it carries, so the next message
	// carries the one after it.
	KeepAliveConsumesSeq bool
	// TransferNoStatusChange is the transfer-no-status-change fault: the
	// session a subscription left in Transfer is not sent the
	// StatusChangeNotification Good_SubscriptionTransferred.
	TransferNoStatusChange bool
	// SkippedSequence is the skipped-sequence fault: a subscription never
	// uses the sequence numbers that are multiples of SkipSequenceEvery
	// (never sent, retained or announced by a keep-alive).
	SkippedSequence bool
	// SkipSequenceEvery is SkippedSequence's period, at least 2
	// (DefaultSkipSequenceEvery).
	SkipSequenceEvery uint32
	// DuplicateSamples is the duplicate-samples fault: every
	// DuplicateSampleEvery-th sample of a monitored item, if it is
	// reported, is queued twice (the same DataValue again).
	DuplicateSamples bool
	// DuplicateSampleEvery is DuplicateSamples' period
	// (DefaultDuplicateSampleEvery).
	DuplicateSampleEvery int64
	// SampleAtPublish is the sample-at-publish fault: an item is answered
	// its revised sampling interval as usual but sampled at its
	// subscription's publishing interval when that is longer.
	SampleAtPublish bool
}

// orDefault sets *p to v when it is not above zero.
func orDefault[T ~int | ~int64](p *T, v T) {
	if *p <= 0 {
		*p = v
	}
}

func (o *Options) fill() {
	if o.Clock == nil {
		o.Clock = NewRealClock()
	}
	if o.Source == nil {
		o.Source = Sources{}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	orDefault(&o.MinSamplingInterval, DefaultMinSamplingInterval)
	orDefault(&o.MaxSamplingInterval, DefaultMaxInterval)
	orDefault(&o.MinPublishingInterval, DefaultMinPublishingInterval)
	orDefault(&o.MaxPublishingInterval, DefaultMaxInterval)
	orDefault(&o.MaxLifetime, DefaultMaxLifetime)
	o.MaxSamplingInterval = max(o.MaxSamplingInterval, o.MinSamplingInterval)
	o.MaxPublishingInterval = max(o.MaxPublishingInterval, o.MinPublishingInterval)
	orDefault(&o.MaxResponseBytes, DefaultMaxResponseBytes)
	orDefault(&o.MaxPublishRequests, DefaultMaxPublishRequests)
	orDefault(&o.MaxRetransmit, DefaultMaxRetransmit)
	orDefault(&o.MaxSubscriptions, DefaultMaxSubscriptions)
	orDefault(&o.MaxSubscriptionsTotal, DefaultMaxSubscriptionsTotal)
	if o.MaxPublishRate == 0 {
		o.MaxPublishRate = DefaultMaxPublishRate
	}
	if o.AnonymousShare <= 0 || math.IsNaN(o.AnonymousShare) {
		o.AnonymousShare = DefaultAnonymousShare
	}
	orDefault(&o.MaxItems, DefaultMaxItems)
	orDefault(&o.MaxItemsPerCall, DefaultMaxItemsPerCall)
	orDefault(&o.MaxItemsPerSession, DefaultMaxItemsPerSession)
	orDefault(&o.MaxItemsTotal, DefaultMaxItemsTotal)
	orDefault(&o.MaxOperations, DefaultMaxOperations)
	orDefault(&o.PublishDropKeep, DefaultPublishDropKeep)
	if o.SkipSequenceEvery < 2 { // 1 would skip every number
		o.SkipSequenceEvery = DefaultSkipSequenceEvery
	}
	orDefault(&o.DuplicateSampleEvery, DefaultDuplicateSampleEvery)
	if o.DefaultKeepAliveCount == 0 {
		o.DefaultKeepAliveCount = DefaultKeepAliveCount
	}
	if o.MaxKeepAliveCount == 0 {
		o.MaxKeepAliveCount = DefaultMaxKeepAliveCount
	}
	if o.MaxQueueSize == 0 {
		o.MaxQueueSize = DefaultMaxQueueSize
	}
	if o.ValueSize <= 0 {
		o.ValueSize = DefaultValueSize
	}
}

// millis converts a requested interval in milliseconds to a duration; ok is
// false for NaN, infinities and values ≤ 0.
func millis(ms float64) (time.Duration, bool) {
	if math.IsNaN(ms) || math.IsInf(ms, 0) || ms <= 0 {
		return 0, false
	}
	if ms > float64(math.MaxInt64/int64(time.Millisecond)) {
		return time.Duration(math.MaxInt64), true
	}
	return time.Duration(ms * float64(time.Millisecond)), true
}

// RevisePublishingInterval revises a requested publishing interval (ms): 0,
// negative, NaN or below the minimum give the minimum; above the maximum
// gives the maximum.
func (o Options) RevisePublishingInterval(ms float64) time.Duration {
	d, ok := millis(ms)
	if !ok || d < o.MinPublishingInterval {
		return o.MinPublishingInterval
	}
	return min(d, o.MaxPublishingInterval).Round(time.Microsecond)
}

// ReviseSamplingInterval revises a requested sampling interval (ms): -1 (any
// negative value) means the publishing interval; 0, NaN or below the minimum
// give the minimum; above the maximum gives the maximum.
func (o Options) ReviseSamplingInterval(ms float64, publishing time.Duration) time.Duration {
	if ms < 0 && !math.IsInf(ms, 0) {
		return min(max(publishing, o.MinSamplingInterval), o.MaxSamplingInterval)
	}
	d, ok := millis(ms)
	if !ok || d < o.MinSamplingInterval {
		return o.MinSamplingInterval
	}
	return min(d, o.MaxSamplingInterval).Round(time.Microsecond)
}

// ReviseCounts revises keep-alive and lifetime counts for a publishing
// interval: keep-alive 0 gives the default, keep-alive × interval and
// lifetime × interval stay below MaxLifetime, and lifetime ≥ 3 × keep-alive.
func (o Options) ReviseCounts(interval time.Duration, lifetime, keepAlive uint32) (uint32, uint32) {
	if keepAlive == 0 {
		keepAlive = o.DefaultKeepAliveCount
	}
	maxCount := uint32(min(int64(o.MaxLifetime/max(interval, 1)), math.MaxUint32))
	maxCount = max(maxCount, 3)
	keepAlive = min(keepAlive, o.MaxKeepAliveCount, max(maxCount/3, 1))
	keepAlive = max(keepAlive, 1)
	lifetime = min(max(lifetime, 3*keepAlive), maxCount)
	return lifetime, keepAlive
}

// ReviseQueueSize revises a requested queue size: 0 gives 1, above the
// maximum gives the maximum.
func (o Options) ReviseQueueSize(n uint32) uint32 {
	return min(max(n, 1), o.MaxQueueSize)
}

// Stats are a manager's counters.
type Stats struct {
	Sessions      int   // sessions with subscription state
	Subscriptions int   // live subscriptions
	Items         int   // live monitored items
	ItemsDeleted  int64 // monitored items deleted (with their subscription too)
	Created       int64 // subscriptions created
	Expired       int64 // subscriptions that outlived their lifetime
	Messages      int64 // notification messages sent
	KeepAlives    int64 // keep-alive messages sent
	Notifications int64 // data change notifications sent
	Republished   int64 // messages sent again by Republish
	Dropped       int64 // Publish requests dropped by the publish-drop fault
	TooMany       int64 // Publish requests answered BadTooManyPublishRequests
	TimedOut      int64 // Publish requests answered BadTimeout
	// RetransDropped counts notification messages dropped from (or never
	// kept in) a retransmission queue for its byte budget.
	RetransDropped int64
	// TooManySubs counts CreateSubscription calls refused at
	// MaxSubscriptionsTotal or MaxPublishRate, or at the anonymous share
	// of either.
	TooManySubs int64
	// AnonymousSubs are the live subscriptions charged to the anonymous
	// class, AnonymousRate their publishing cycles per second.
	AnonymousSubs int
	AnonymousRate float64
	// Rate is the publishing cycles per second of all live
	// subscriptions.
	Rate     float64
	Sampling GroupStats
}

// Manager holds the subscription state of every session of a server.
type Manager struct {
	opts    Options
	clock   Clock
	log     *slog.Logger
	sampler *Sampler
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup // subscription loops

	nextSubID  atomic.Uint32
	nextItemID atomic.Uint32

	mu       sync.Mutex
	sessions map[any]*Session
	// transferMu serializes Transfer, the only path that holds two
	// sessions' locks.
	transferMu sync.Mutex

	created, expired, messages, keepAlives, notifications atomic.Int64
	republished, dropped, tooMany, timedOut               atomic.Int64
	retransDropped, tooManySubs                           atomic.Int64
	// rate is the publishing cycles per second of all live
	// subscriptions, in thousandths (rateCost).
	rate                      atomic.Int64
	subs, items, itemsDeleted atomic.Int64
	// anonSubs and anonRate are the part of subs and rate charged to
	// the anonymous class; anonSubLimit and anonRateLimit its share of
	// them (-1: no share).
	anonSubs, anonRate          atomic.Int64
	anonSubLimit, anonRateLimit int64
}

// New returns a manager whose loops run until ctx ends or Close is called.
func New(ctx context.Context, opts Options) *Manager {
	opts.fill()
	ctx, cancel := context.WithCancel(ctx)
	m := &Manager{
		opts:     opts,
		clock:    opts.Clock,
		log:      opts.Logger,
		ctx:      ctx,
		cancel:   cancel,
		sessions: make(map[any]*Session),
	}
	m.anonSubLimit, m.anonRateLimit = -1, -1
	if opts.AnonymousShare < 1 {
		if opts.MaxSubscriptionsTotal < math.MaxInt {
			m.anonSubLimit = int64(float64(opts.MaxSubscriptionsTotal) * opts.AnonymousShare)
		}
		if opts.MaxPublishRate >= 0 {
			m.anonRateLimit = int64(opts.MaxPublishRate * 1000 * opts.AnonymousShare)
		}
	}
	m.sampler = NewSampler(ctx, opts.Clock, SamplerFaults{Drift: opts.SamplingDrift, Skips: opts.SamplerSkips}, opts.Logger)
	return m
}

// Options returns the manager's options with defaults filled in.
func (m *Manager) Options() Options { return m.opts }

// Sampler returns the manager's sampler.
func (m *Manager) Sampler() *Sampler { return m.sampler }

// Close closes every session and stops all loops.
func (m *Manager) Close() {
	m.mu.Lock()
	all := make([]*Session, 0, len(m.sessions))
	for k, s := range m.sessions {
		all = append(all, s)
		delete(m.sessions, k)
	}
	m.mu.Unlock()
	for _, s := range all {
		s.close(ua.StatusBadShutdown)
	}
	m.cancel()
	m.wg.Wait()
	m.sampler.Close()
}

// Session returns the subscription state of the session key, creating it if
// needed; created reports whether it was created. After Close it returns a
// closed session.
func (m *Manager) Session(key any) (s *Session, created bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s = m.sessions[key]; s != nil {
		return s, false
	}
	s = &Session{m: m, key: key, subs: make(map[uint32]*Subscription)}
	if m.ctx.Err() != nil {
		s.closed = true
		return s, true
	}
	m.sessions[key] = s
	return s, true
}

// Lookup returns the subscription state of key, or nil.
func (m *Manager) Lookup(key any) *Session {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sessions[key]
}

// CloseSession deletes the subscriptions of session key and answers its
// queued Publish requests BadSessionClosed.
func (m *Manager) CloseSession(key any) {
	m.mu.Lock()
	s := m.sessions[key]
	delete(m.sessions, key)
	m.mu.Unlock()
	if s != nil {
		s.close(ua.StatusBadSessionClosed)
	}
}

// Stats returns the manager's counters.
func (m *Manager) Stats() Stats {
	m.mu.Lock()
	n := len(m.sessions)
	m.mu.Unlock()
	_, sampling := m.sampler.Stats()
	return Stats{
		Sessions:       n,
		Subscriptions:  int(m.subs.Load()),
		Items:          int(m.items.Load()),
		ItemsDeleted:   m.itemsDeleted.Load(),
		Created:        m.created.Load(),
		Expired:        m.expired.Load(),
		Messages:       m.messages.Load(),
		KeepAlives:     m.keepAlives.Load(),
		Notifications:  m.notifications.Load(),
		Republished:    m.republished.Load(),
		Dropped:        m.dropped.Load(),
		TooMany:        m.tooMany.Load(),
		TimedOut:       m.timedOut.Load(),
		RetransDropped: m.retransDropped.Load(),
		TooManySubs:    m.tooManySubs.Load(),
		AnonymousSubs:  int(m.anonSubs.Load()),
		AnonymousRate:  float64(m.anonRate.Load()) / 1000,
		Rate:           float64(m.rate.Load()) / 1000,
		Sampling:       sampling,
	}
}

// responseHeader is the header of a response to req.
func responseHeader(req ua.Request, code ua.StatusCode, now time.Time) *ua.ResponseHeader {
	var handle uint32
	if req != nil {
		if h := req.Header(); h != nil {
			handle = h.RequestHandle
		}
	}
	return &ua.ResponseHeader{
		Timestamp:          now,
		RequestHandle:      handle,
		ServiceResult:      code,
		ServiceDiagnostics: &ua.DiagnosticInfo{},
		AdditionalHeader:   ua.NewExtensionObject(nil),
	}
}

func (m *Manager) header(req ua.Request, code ua.StatusCode) *ua.ResponseHeader {
	return responseHeader(req, code, m.clock.Wall(m.clock.Now()))
}

// opsStatus checks the operation count n of a service request:
// BadNothingToDo for none, BadTooManyOperations above the limit, else Good.
func (m *Manager) opsStatus(n int) ua.StatusCode {
	switch {
	case n == 0:
		return ua.StatusBadNothingToDo
	case n > m.opts.MaxOperations:
		return ua.StatusBadTooManyOperations
	}
	return ua.StatusOK
}

// reserveItem counts one more live item unless MaxItemsTotal are live; it
// reports whether it did.
func (m *Manager) reserveItem() bool {
	for {
		n := m.items.Load()
		if n >= int64(m.opts.MaxItemsTotal) {
			return false
		}
		if m.items.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// reserveUpTo adds n to c unless that would take it past limit (-1: no
// limit); it reports whether it did.
func reserveUpTo(c *atomic.Int64, n, limit int64) bool {
	if limit < 0 {
		c.Add(n)
		return true
	}
	for {
		cur := c.Load()
		if cur+n > limit {
			return false
		}
		if c.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

// reserveSub counts one more live subscription of the class anon unless
// MaxSubscriptionsTotal are live, or, for an anonymous one, the
// anonymous share of them; it reports whether it did.
func (m *Manager) reserveSub(anon bool) bool {
	if anon && !reserveUpTo(&m.anonSubs, 1, m.anonSubLimit) {
		return false
	}
	if !reserveUpTo(&m.subs, 1, int64(m.opts.MaxSubscriptionsTotal)) {
		if anon {
			m.anonSubs.Add(-1)
		}
		return false
	}
	return true
}

// releaseSub gives back what reserveSub counted.
func (m *Manager) releaseSub(anon bool) {
	m.subs.Add(-1)
	if anon {
		m.anonSubs.Add(-1)
	}
}

// rateCost is what a subscription publishing every iv adds to the
// manager's rate: its cycles per second, in thousandths (at least 1).
func rateCost(iv time.Duration) int64 {
	return max(int64(time.Second)*1000/int64(max(iv, 1)), 1)
}

// rateLimit is MaxPublishRate in thousandths (-1: no limit).
func (m *Manager) rateLimit() int64 {
	if m.opts.MaxPublishRate < 0 {
		return -1
	}
	return int64(m.opts.MaxPublishRate * 1000)
}

// reserveRate adds n to the publishing rate of the class anon unless
// that would go past MaxPublishRate, or, for an anonymous one, past the
// anonymous share of it; it reports whether it did.
func (m *Manager) reserveRate(anon bool, n int64) bool {
	if anon && !reserveUpTo(&m.anonRate, n, m.anonRateLimit) {
		return false
	}
	if !reserveUpTo(&m.rate, n, m.rateLimit()) {
		if anon {
			m.anonRate.Add(-n)
		}
		return false
	}
	return true
}

// releaseRate gives back n of what reserveRate added.
func (m *Manager) releaseRate(anon bool, n int64) {
	m.rate.Add(-n)
	if anon {
		m.anonRate.Add(-n)
	}
}

// anonymous reports whether the session keyed key has no user identity
// now (Options.Anonymous).
func (m *Manager) anonymous(key any) bool {
	return m.opts.Anonymous != nil && m.opts.Anonymous(key)
}

// queueCost is the budget charge of a queue of size values.
func (m *Manager) queueCost(size int) int64 { return int64(size) * m.opts.ValueSize }

// nodeCost is the budget charge of an item of node beside its queue
// (Options.ItemCost).
func (m *Manager) nodeCost(node *ua.NodeID) int64 {
	if m.opts.ItemCost == nil {
		return 0
	}
	return m.opts.ItemCost(node)
}

// releaseItem gives back the budget charge of an item being deleted. The
// item's session's mutex held.
func (m *Manager) releaseItem(it *MonitoredItem) {
	m.opts.Budget.Release(budget.Items, it.charged)
	it.charged = 0
}

// Fault returns a ServiceFault answering req with code.
func (m *Manager) Fault(req ua.Request, code ua.StatusCode) *ua.ServiceFault {
	return &ua.ServiceFault{ResponseHeader: m.header(req, code)}
}

// samplerInterval is the interval the sampler runs an item at whose
// revised sampling interval is revised, in a subscription publishing
// every publishing: revised, or under the sample-at-publish fault the
// publishing interval when that is longer (the client is still answered
// revised).
func (m *Manager) samplerInterval(revised, publishing time.Duration) time.Duration {
	if m.opts.SampleAtPublish {
		return max(revised, publishing)
	}
	return revised
}

// dupEvery is the duplicate-samples fault's period, 0 when it is off.
func (m *Manager) dupEvery() int64 {
	if m.opts.DuplicateSamples {
		return m.opts.DuplicateSampleEvery
	}
	return 0
}
