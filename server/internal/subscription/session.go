package subscription

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/gopcua/opcua/ua"

	"github.com/opcua-chaos/opcua-chaos/server/internal/budget"
)

// PublishCall is one Publish request handed to Session.Publish.
type PublishCall struct {
	// Request is the decoded request. Once parked, only its header is
	// kept (its acknowledgements are processed on arrival), unless the
	// parked-publish-whole fault is on.
	Request *ua.PublishRequest
	// Budget is the largest encoded size of the response, transport headers
	// included (the client's receive buffer size); 0 means the manager's
	// MaxResponseBytes.
	Budget int
	// Done, if not nil, is closed when the response can no longer be
	// delivered (the secure channel is gone): the request is then answered
	// BadSecureChannelClosed instead of consuming a notification message.
	Done <-chan struct{}
	// Respond sends the response. It is called exactly once (never, for a
	// request dropped by the publish-drop fault), possibly on another
	// goroutine and with the session's lock held: it must not block or call
	// back into the Session.
	Respond func(ua.Response)
	// Dropped, if not nil, is called instead of Respond when the
	// publish-drop fault drops the request.
	Dropped func()
}

type pendingPublish struct {
	call     PublishCall
	results  []ua.StatusCode
	deadline time.Duration // 0: none
}

// Session is the subscription state of one session.
type Session struct {
	m   *Manager
	key any

	mu      sync.Mutex
	subs    map[uint32]*Subscription
	order   []*Subscription // creation order, for round robin
	rr      int
	pending []*pendingPublish
	// statuses are status change messages for subscriptions that left
	// the session (Good_SubscriptionTransferred), waiting for a Publish
	// request (at most maxStatuses, the oldest dropped).
	statuses []*ua.PublishResponse
	items    int // live monitored items, all subscriptions
	// retransBytes is what the session's subscriptions' retransmission
	// queues are charged (budget.Retransmit).
	retransBytes int64
	closed       bool
}

// maxStatuses bounds the status change messages a session keeps for
// Publish requests its client may never send.
const maxStatuses = 16

// Subscription is one subscription of a session.
type Subscription struct {
	id uint32
	// sess is the owning session; Transfer changes it (and stop) with
	// both sessions' locks held, so either lock guards reading it.
	sess *Session
	wake chan struct{} // cap 1: interval changed
	stop context.CancelFunc

	// anon is the class the subscription is charged to for its life
	// (its session anonymous at CreateSubscription), rateCharged its
	// charge to the publishing rate (rateCost of interval): what is
	// released when it is deleted.
	anon bool

	// Guarded by sess.mu.
	rateCharged  int64
	interval     time.Duration
	lifetime     uint32
	keepAlive    uint32
	maxNotif     uint32
	priority     uint8
	enabled      bool
	seq          uint32                    // next sequence number
	retrans      []*ua.NotificationMessage // sent, unacknowledged, by sequence number
	retransCost  []int64                   // each kept message's charge to budget.Retransmit (0: none)
	retransBytes int64                     // their sum
	keepAliveCtr uint32
	lifetimeCtr  uint32
	late         bool // a cycle had something to send but no request
	sentFirst    bool
	items        map[uint32]*MonitoredItem
	list         []*MonitoredItem // creation order
	rr           int              // item to start the next message at
	deleted      bool
}

// ID returns the subscription id.
func (sub *Subscription) ID() uint32 { return sub.id }

// Subscriptions returns the ids of the session's subscriptions.
func (s *Session) Subscriptions() []uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]uint32, 0, len(s.order))
	for _, sub := range s.order {
		ids = append(ids, sub.id)
	}
	return ids
}

// Pending returns the number of queued Publish requests.
func (s *Session) Pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pending)
}

func (s *Session) now() time.Duration { return s.m.clock.Now() }

// sampleTime is the time of a sample taken now, due now.
func (s *Session) sampleTime() SampleTime {
	now := s.now()
	return SampleTime{Mono: now, Wall: s.m.clock.Wall(now), Deadline: now}
}

// onSub serves a request on the subscription id under the session lock; an
// unknown subscription faults the request with BadSubscriptionIdInvalid.
func (s *Session) onSub(r ua.Request, id uint32, serve func(sub *Subscription) ua.Response) ua.Response {
	s.mu.Lock()
	defer s.mu.Unlock()
	sub := s.subs[id]
	if sub == nil {
		return s.m.Fault(r, ua.StatusBadSubscriptionIDInvalid)
	}
	return serve(sub)
}

// onItems serves a request on ops monitored items of the subscription id
// (see onSub). Before the lock is taken, more operations than the server
// allows fault the request, and so does bad, a check of the request's own
// fields, when it is not Good.
func (s *Session) onItems(r ua.Request, ops int, bad ua.StatusCode, id uint32, serve func(sub *Subscription) ua.Response) ua.Response {
	if st := s.m.opsStatus(ops); st != ua.StatusOK {
		return s.m.Fault(r, st)
	}
	if bad != ua.StatusOK {
		return s.m.Fault(r, bad)
	}
	return s.onSub(r, id, serve)
}

// timestampsStatus checks a request's TimestampsToReturn.
func timestampsStatus(ts ua.TimestampsToReturn) ua.StatusCode {
	if ts > ua.TimestampsToReturnNeither {
		return ua.StatusBadTimestampsToReturnInvalid
	}
	return ua.StatusOK
}

// onSubs serves a request on the subscriptions ids: more operations than
// the server allows fault it; otherwise, with s.mu held, do runs on each
// subscription of ids and respond answers with the operation results
// (BadSubscriptionIdInvalid for an id of none).
func (s *Session) onSubs(r ua.Request, ids []uint32, do func(sub *Subscription), respond func(results []ua.StatusCode) ua.Response) ua.Response {
	if st := s.m.opsStatus(len(ids)); st != ua.StatusOK {
		return s.m.Fault(r, st)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	results := make([]ua.StatusCode, len(ids))
	for i, id := range ids {
		sub := s.subs[id]
		if sub == nil {
			results[i] = ua.StatusBadSubscriptionIDInvalid
			continue
		}
		do(sub)
	}
	return respond(results)
}

// close deletes every subscription and answers the queued Publish requests
// with code.
func (s *Session) close(code ua.StatusCode) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.closed = true
	for _, sub := range slices.Clone(s.order) {
		s.deleteLocked(sub)
	}
	for _, p := range s.pending {
		p.call.Respond(s.m.Fault(p.call.Request, code))
	}
	s.pending = nil
}

// ---- subscriptions ----

func (s *Session) revise(ms float64, lifetime, keepAlive uint32) (time.Duration, uint32, uint32) {
	iv := s.m.opts.RevisePublishingInterval(ms)
	lifetime, keepAlive = s.m.opts.ReviseCounts(iv, lifetime, keepAlive)
	return iv, lifetime, keepAlive
}

// CreateSubscription serves the CreateSubscription service.
func (s *Session) CreateSubscription(r *ua.CreateSubscriptionRequest) ua.Response {
	m := s.m
	// the session's class, asked before s.mu is taken: Options.Anonymous
	// may take the server session's own lock
	anon := m.anonymous(s.key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return m.Fault(r, ua.StatusBadSessionClosed)
	}
	if len(s.subs) >= m.opts.MaxSubscriptions {
		return m.Fault(r, ua.StatusBadTooManySubscriptions)
	}
	if !m.reserveSub(anon) {
		if m.tooManySubs.Add(1)%1000 == 1 {
			m.log.Info("subscription refused: server-wide limit, or the anonymous share of it", "limit", m.opts.MaxSubscriptionsTotal,
				"anonymous", anon, "anonymous_limit", m.anonSubLimit, "refused", m.tooManySubs.Load())
		}
		return m.Fault(r, ua.StatusBadTooManySubscriptions)
	}
	iv, lifetime, keepAlive := s.revise(r.RequestedPublishingInterval, r.RequestedLifetimeCount, r.RequestedMaxKeepAliveCount)
	cost := rateCost(iv)
	if !m.reserveRate(anon, cost) {
		m.releaseSub(anon)
		if m.tooManySubs.Add(1)%1000 == 1 {
			m.log.Info("subscription refused: server-wide publishing rate, or the anonymous share of it", "interval", iv, "limit_per_s", m.opts.MaxPublishRate,
				"anonymous", anon, "refused", m.tooManySubs.Load())
		}
		return m.Fault(r, ua.StatusBadTooManySubscriptions)
	}
	id := m.nextSubID.Add(1)
	ctx, cancel := context.WithCancel(m.ctx)
	sub := &Subscription{
		id:          id,
		sess:        s,
		anon:        anon,
		rateCharged: cost,
		wake:        make(chan struct{}, 1),
		stop:        cancel,
		interval:    iv,
		lifetime:    lifetime,
		keepAlive:   keepAlive,
		maxNotif:    r.MaxNotificationsPerPublish,
		priority:    r.Priority,
		enabled:     r.PublishingEnabled,
		seq:         1,
		items:       make(map[uint32]*MonitoredItem),
	}
	s.subs[id] = sub
	s.order = append(s.order, sub)
	m.created.Add(1)
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		s.run(ctx, sub)
	}()
	m.log.Debug("subscription created", "subscription", id, "interval", iv, "lifetime", lifetime, "keepalive", keepAlive)
	return &ua.CreateSubscriptionResponse{
		ResponseHeader:            m.header(r, ua.StatusOK),
		SubscriptionID:            id,
		RevisedPublishingInterval: durMillis(iv),
		RevisedLifetimeCount:      lifetime,
		RevisedMaxKeepAliveCount:  keepAlive,
	}
}

func durMillis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// ModifySubscription serves the ModifySubscription service.
func (s *Session) ModifySubscription(r *ua.ModifySubscriptionRequest) ua.Response {
	m := s.m
	return s.onSub(r, r.SubscriptionID, func(sub *Subscription) ua.Response {
		iv, lifetime, keepAlive := s.revise(r.RequestedPublishingInterval, r.RequestedLifetimeCount, r.RequestedMaxKeepAliveCount)
		// The subscription's class pays the difference: a faster
		// interval is reserved first, a slower one gives back.
		if cost := rateCost(iv); cost > sub.rateCharged && !m.reserveRate(sub.anon, cost-sub.rateCharged) {
			// over the server's publishing rate (or the anonymous
			// share of it): the interval it had
			iv = sub.interval
			lifetime, keepAlive = m.opts.ReviseCounts(iv, r.RequestedLifetimeCount, r.RequestedMaxKeepAliveCount)
		} else {
			if cost < sub.rateCharged {
				m.releaseRate(sub.anon, sub.rateCharged-cost)
			}
			sub.rateCharged = cost
		}
		changed := iv != sub.interval
		sub.interval, sub.lifetime, sub.keepAlive = iv, lifetime, keepAlive
		sub.maxNotif, sub.priority = r.MaxNotificationsPerPublish, r.Priority
		sub.lifetimeCtr = 0
		if changed {
			select {
			case sub.wake <- struct{}{}:
			default:
			}
		}
		return &ua.ModifySubscriptionResponse{
			ResponseHeader:            m.header(r, ua.StatusOK),
			RevisedPublishingInterval: durMillis(iv),
			RevisedLifetimeCount:      lifetime,
			RevisedMaxKeepAliveCount:  keepAlive,
		}
	})
}

// DeleteSubscriptions serves the DeleteSubscriptions service.
func (s *Session) DeleteSubscriptions(r *ua.DeleteSubscriptionsRequest) ua.Response {
	return s.onSubs(r, r.SubscriptionIDs, s.deleteLocked, func(results []ua.StatusCode) ua.Response {
		s.noSubscriptionsLocked()
		return &ua.DeleteSubscriptionsResponse{ResponseHeader: s.m.header(r, ua.StatusOK), Results: results}
	})
}

// releaseItemsLocked stops sampling the items, releases them and takes them
// off the item counts. s.mu held.
func (s *Session) releaseItemsLocked(items []*MonitoredItem) {
	for _, it := range items {
		if it.mode != ua.MonitoringModeDisabled {
			s.m.sampler.Remove(it, it.interval)
		}
		it.setActive(false)
		s.m.releaseItem(it)
	}
	s.m.items.Add(-int64(len(items)))
	s.m.itemsDeleted.Add(int64(len(items)))
	s.items -= len(items)
}

// deleteLocked removes a subscription and its items. s.mu held.
func (s *Session) deleteLocked(sub *Subscription) {
	if sub.deleted {
		return
	}
	sub.deleted = true
	sub.stop()
	delete(s.subs, sub.id)
	if i := slices.Index(s.order, sub); i >= 0 {
		s.order = slices.Delete(s.order, i, i+1)
	}
	s.releaseItemsLocked(sub.list)
	s.m.releaseSub(sub.anon)
	s.m.releaseRate(sub.anon, sub.rateCharged)
	sub.rateCharged = 0
	s.releaseRetransLocked(sub, len(sub.retrans))
	sub.items, sub.list, sub.retrans, sub.retransCost = nil, nil, nil, nil
	s.m.log.Debug("subscription deleted", "subscription", sub.id)
}

// noSubscriptionsLocked answers queued Publish requests BadNoSubscription
// once the session has no subscription left. s.mu held.
func (s *Session) noSubscriptionsLocked() {
	if len(s.subs) > 0 {
		return
	}
	for _, p := range s.pending {
		p.call.Respond(s.m.Fault(p.call.Request, ua.StatusBadNoSubscription))
	}
	s.pending = nil
}

// SetPublishingMode serves the SetPublishingMode service.
func (s *Session) SetPublishingMode(r *ua.SetPublishingModeRequest) ua.Response {
	return s.onSubs(r, r.SubscriptionIDs, func(sub *Subscription) { sub.enabled = r.PublishingEnabled }, func(results []ua.StatusCode) ua.Response {
		return &ua.SetPublishingModeResponse{ResponseHeader: s.m.header(r, ua.StatusOK), Results: results}
	})
}

// ---- monitored items ----

// itemParams validates and revises monitoring parameters.
func (s *Session) itemParams(sub *Subscription, p *ua.MonitoringParameters, attr ua.AttributeID) (iv time.Duration, size uint32, trigger ua.DataChangeTrigger, code ua.StatusCode) {
	if p == nil {
		return 0, 0, 0, ua.StatusBadDecodingError
	}
	trigger = ua.DataChangeTriggerStatusValue
	if p.Filter != nil && p.Filter.Value != nil {
		f, ok := p.Filter.Value.(*ua.DataChangeFilter)
		switch {
		case !ok:
			return 0, 0, 0, ua.StatusBadMonitoredItemFilterUnsupported
		case attr != ua.AttributeIDValue:
			return 0, 0, 0, ua.StatusBadFilterNotAllowed
		case f.DeadbandType != 0: // deadbands are not supported
			return 0, 0, 0, ua.StatusBadMonitoredItemFilterUnsupported
		case f.Trigger > ua.DataChangeTriggerStatusValueTimestamp:
			return 0, 0, 0, ua.StatusBadMonitoredItemFilterInvalid
		}
		trigger = f.Trigger
	}
	iv = s.m.opts.ReviseSamplingInterval(p.SamplingInterval, sub.interval)
	return iv, s.m.opts.ReviseQueueSize(p.QueueSize), trigger, ua.StatusOK
}

// CreateMonitoredItems serves the CreateMonitoredItems service. Each new
// item takes an initial sample at once.
func (s *Session) CreateMonitoredItems(r *ua.CreateMonitoredItemsRequest) ua.Response {
	m := s.m
	bad := timestampsStatus(r.TimestampsToReturn)
	if len(r.ItemsToCreate) > m.opts.MaxItemsPerCall {
		bad = ua.StatusBadTooManyOperations
	}
	return s.onItems(r, len(r.ItemsToCreate), bad, r.SubscriptionID, func(sub *Subscription) ua.Response {
		st := s.sampleTime()
		results := make([]*ua.MonitoredItemCreateResult, len(r.ItemsToCreate))
		refused := 0 // items over the memory budget
		defer func() {
			if refused > 0 {
				m.log.Info("monitored items refused: item queue budget exhausted", "subscription", sub.id, "refused", refused,
					"items_bytes", m.opts.Budget.UsedBy(budget.Items), "limit", m.opts.Budget.ClassLimit(budget.Items))
			}
		}()
		for i, c := range r.ItemsToCreate {
			res := &ua.MonitoredItemCreateResult{FilterResult: ua.NewExtensionObject(nil)}
			results[i] = res
			if c == nil || c.ItemToMonitor == nil || c.ItemToMonitor.NodeID == nil {
				res.StatusCode = ua.StatusBadNodeIDUnknown
				continue
			}
			if len(sub.list) >= m.opts.MaxItems || s.items >= m.opts.MaxItemsPerSession {
				res.StatusCode = ua.StatusBadTooManyMonitoredItems
				continue
			}
			if c.MonitoringMode > ua.MonitoringModeReporting {
				res.StatusCode = ua.StatusBadMonitoringModeInvalid
				continue
			}
			rv := c.ItemToMonitor
			if rv.IndexRange != "" {
				res.StatusCode = ua.StatusBadIndexRangeInvalid
				continue
			}
			if rv.DataEncoding != nil && rv.DataEncoding.Name != "" {
				res.StatusCode = ua.StatusBadDataEncodingInvalid
				continue
			}
			attr := ua.AttributeID(rv.AttributeID)
			read, code := m.opts.Source.Resolve(rv.NodeID, attr)
			if code != ua.StatusOK {
				res.StatusCode = code
				continue
			}
			iv, size, trigger, code := s.itemParams(sub, c.RequestedParameters, attr)
			if code != ua.StatusOK {
				res.StatusCode = code
				continue
			}
			if !m.reserveItem() {
				res.StatusCode = ua.StatusBadTooManyMonitoredItems
				continue
			}
			// The queue's memory at its full size, charged now so that the
			// queues can never grow beyond the budget (none under the
			// item-queues-unbounded fault: the manager has no budget),
			// and the item's NodeId and own state beside it.
			nodeCharge := m.nodeCost(rv.NodeID)
			cost := m.queueCost(int(size)) + nodeCharge
			if !m.opts.Budget.Charge(budget.Items, cost) {
				m.items.Add(-1)
				refused++
				res.StatusCode = ua.StatusBadResourceUnavailable
				continue
			}
			it := &MonitoredItem{
				id:            m.nextItemID.Add(1),
				node:          rv.NodeID,
				attr:          attr,
				read:          read,
				clientHandle:  c.RequestedParameters.ClientHandle,
				interval:      m.samplerInterval(iv, sub.interval),
				mode:          c.MonitoringMode,
				handle:        c.RequestedParameters.ClientHandle,
				ts:            r.TimestampsToReturn,
				trigger:       trigger,
				discardOldest: c.RequestedParameters.DiscardOldest,
				size:          int(size),
				charged:       cost,
				nodeCharge:    nodeCharge,
				active:        c.MonitoringMode != ua.MonitoringModeDisabled,
				dupEvery:      m.dupEvery(),
			}
			if m.opts.EagerQueues {
				// Fault item-queues-unbounded: the whole queue now.
				it.buf = make([]*ua.DataValue, size)
			}
			sub.items[it.id] = it
			sub.list = append(sub.list, it)
			s.items++
			if it.mode != ua.MonitoringModeDisabled {
				it.Sample(st)
				m.sampler.Add(it, it.interval)
			}
			res.MonitoredItemID = it.id
			res.RevisedSamplingInterval = durMillis(iv)
			res.RevisedQueueSize = size
		}
		return &ua.CreateMonitoredItemsResponse{ResponseHeader: m.header(r, ua.StatusOK), Results: results}
	})
}

// ModifyMonitoredItems serves the ModifyMonitoredItems service.
func (s *Session) ModifyMonitoredItems(r *ua.ModifyMonitoredItemsRequest) ua.Response {
	m := s.m
	return s.onItems(r, len(r.ItemsToModify), timestampsStatus(r.TimestampsToReturn), r.SubscriptionID, func(sub *Subscription) ua.Response {
		results := make([]*ua.MonitoredItemModifyResult, len(r.ItemsToModify))
		for i, c := range r.ItemsToModify {
			res := &ua.MonitoredItemModifyResult{FilterResult: ua.NewExtensionObject(nil)}
			results[i] = res
			var it *MonitoredItem
			if c != nil {
				it = sub.items[c.MonitoredItemID]
			}
			if it == nil {
				res.StatusCode = ua.StatusBadMonitoredItemIDInvalid
				continue
			}
			iv, size, trigger, code := s.itemParams(sub, c.RequestedParameters, it.attr)
			if code != ua.StatusOK {
				res.StatusCode = code
				continue
			}
			// A bigger queue is charged its growth first; a smaller one gives
			// the difference back.
			cost := m.queueCost(int(size)) + it.nodeCharge
			if cost > it.charged && !m.opts.Budget.Charge(budget.Items, cost-it.charged) {
				res.StatusCode = ua.StatusBadResourceUnavailable
				continue
			}
			if cost < it.charged {
				m.opts.Budget.Release(budget.Items, it.charged-cost)
			}
			if m.opts.Budget != nil {
				it.charged = cost
			}
			run := m.samplerInterval(iv, sub.interval)
			if run != it.interval && it.mode != ua.MonitoringModeDisabled {
				m.sampler.Remove(it, it.interval)
				m.sampler.Add(it, run)
			}
			it.interval = run
			it.clientHandle = c.RequestedParameters.ClientHandle
			it.mu.Lock()
			it.handle = it.clientHandle
			it.ts = r.TimestampsToReturn
			it.trigger = trigger
			it.discardOldest = c.RequestedParameters.DiscardOldest
			it.resize(int(size), m.opts.EagerQueues)
			it.mu.Unlock()
			res.RevisedSamplingInterval = durMillis(iv)
			res.RevisedQueueSize = size
		}
		return &ua.ModifyMonitoredItemsResponse{ResponseHeader: m.header(r, ua.StatusOK), Results: results}
	})
}

// DeleteMonitoredItems serves the DeleteMonitoredItems service.
func (s *Session) DeleteMonitoredItems(r *ua.DeleteMonitoredItemsRequest) ua.Response {
	m := s.m
	return s.onItems(r, len(r.MonitoredItemIDs), ua.StatusOK, r.SubscriptionID, func(sub *Subscription) ua.Response {
		results := make([]ua.StatusCode, len(r.MonitoredItemIDs))
		var deleted []*MonitoredItem
		gone := make(map[*MonitoredItem]bool)
		for i, id := range r.MonitoredItemIDs {
			it := sub.items[id]
			if it == nil {
				results[i] = ua.StatusBadMonitoredItemIDInvalid
				continue
			}
			delete(sub.items, id)
			deleted = append(deleted, it)
			gone[it] = true
		}
		if len(deleted) > 0 {
			s.releaseItemsLocked(deleted)
			sub.list = slices.DeleteFunc(sub.list, func(it *MonitoredItem) bool { return gone[it] })
			sub.rr = 0
		}
		return &ua.DeleteMonitoredItemsResponse{ResponseHeader: m.header(r, ua.StatusOK), Results: results}
	})
}

// SetMonitoringMode serves the SetMonitoringMode service.
func (s *Session) SetMonitoringMode(r *ua.SetMonitoringModeRequest) ua.Response {
	m := s.m
	bad := ua.StatusOK
	if r.MonitoringMode > ua.MonitoringModeReporting {
		bad = ua.StatusBadMonitoringModeInvalid
	}
	return s.onItems(r, len(r.MonitoredItemIDs), bad, r.SubscriptionID, func(sub *Subscription) ua.Response {
		st := s.sampleTime()
		results := make([]ua.StatusCode, len(r.MonitoredItemIDs))
		for i, id := range r.MonitoredItemIDs {
			it := sub.items[id]
			if it == nil {
				results[i] = ua.StatusBadMonitoredItemIDInvalid
				continue
			}
			was := it.mode
			it.mode = r.MonitoringMode
			switch {
			case was == ua.MonitoringModeDisabled && it.mode != ua.MonitoringModeDisabled:
				it.setActive(true)
				it.Sample(st)
				m.sampler.Add(it, it.interval)
			case was != ua.MonitoringModeDisabled && it.mode == ua.MonitoringModeDisabled:
				m.sampler.Remove(it, it.interval)
				it.clear()
			}
		}
		return &ua.SetMonitoringModeResponse{ResponseHeader: m.header(r, ua.StatusOK), Results: results}
	})
}
