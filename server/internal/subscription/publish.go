package subscription

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/gopcua/opcua/ua"

	"github.com/opcua-chaos/opcua-chaos/server/internal/budget"
)

// Publish queues a Publish request. Its acknowledgements are processed now;
// it is answered when a subscription of the session has a notification
// message or a keep-alive to send (at once if one is late).
func (s *Session) Publish(call PublishCall) {
	m := s.m
	r := call.Request
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed && len(s.statuses) > 0 {
		// A subscription left the session: its status change first.
		msg := s.statuses[0]
		s.statuses = slices.Delete(s.statuses, 0, 1)
		msg.ResponseHeader = m.header(r, ua.StatusOK)
		msg.Results = make([]ua.StatusCode, len(r.SubscriptionAcknowledgements))
		for i, a := range r.SubscriptionAcknowledgements {
			msg.Results[i] = s.ackLocked(a)
		}
		call.Respond(msg)
		return
	}
	switch {
	case s.closed:
		call.Respond(m.Fault(r, ua.StatusBadSessionClosed))
		return
	case len(s.subs) == 0:
		call.Respond(m.Fault(r, ua.StatusBadNoSubscription))
		return
	case m.opts.PublishDrop && len(s.pending) >= m.opts.PublishDropKeep:
		// Fault publish-drop: the request is dropped without an answer
		// (gopcua's stock server does this beyond 100 per session).
		m.dropped.Add(1)
		if call.Dropped != nil {
			call.Dropped()
		}
		return
	}
	p := &pendingPublish{call: call}
	if h := r.RequestHeader; h != nil && h.TimeoutHint > 0 {
		p.deadline = now + time.Duration(h.TimeoutHint)*time.Millisecond
	}
	if len(r.SubscriptionAcknowledgements) > 0 {
		p.results = make([]ua.StatusCode, len(r.SubscriptionAcknowledgements))
		for i, a := range r.SubscriptionAcknowledgements {
			p.results[i] = s.ackLocked(a)
		}
	}
	if !m.opts.ParkedKeepsRequest {
		// Parked, it keeps what its answer needs: the request header
		// (its handle) and the acknowledgements' results, charged by
		// bytes. (Fault parked-publish-whole: the whole request, charged
		// nowhere.)
		p.call.Request = &ua.PublishRequest{RequestHeader: r.RequestHeader}
		if !m.chargeParked(p) {
			m.tooMany.Add(1)
			p.call.Respond(m.Fault(p.call.Request, ua.StatusBadTooManyPublishRequests))
			return
		}
	}
	if len(s.pending) >= m.opts.MaxPublishRequests {
		old := s.pending[0]
		s.pending = slices.Delete(s.pending, 0, 1)
		m.tooMany.Add(1)
		old.call.Respond(m.Fault(old.call.Request, ua.StatusBadTooManyPublishRequests))
	}
	s.pending = append(s.pending, p)
	for _, sub := range s.order {
		sub.lifetimeCtr = 0
	}
	s.serveLateLocked(now)
}

// Parked Publish costs, charged to budget.Publish while parked.
const (
	// parkedOverhead is what a parked Publish costs beside its results:
	// the pendingPublish, its call and trimmed request, its header.
	parkedOverhead = 512
	// smallParked is what a parked Publish may always cost (its results
	// for up to 1000 acknowledgements): a client that acknowledges as it
	// goes parks whatever others hold, within MaxPublishRequests.
	smallParked = parkedOverhead + 4*1000
)

// chargeParked charges p's cost (its results and parkedOverhead) to the
// budget's Publish class and makes its Respond give it back, once; it
// reports false, charging nothing, when a cost above smallParked does not
// fit.
func (m *Manager) chargeParked(p *pendingPublish) bool {
	cost := int64(parkedOverhead + 4*len(p.results))
	switch {
	case m.opts.Budget == nil:
		return true
	case cost <= smallParked:
		m.opts.Budget.Force(budget.Publish, cost)
	case !m.opts.Budget.Charge(budget.Publish, cost):
		m.log.Debug("Publish refused: publish budget exhausted", "bytes", cost, "acks", len(p.results),
			"publish_bytes", m.opts.Budget.UsedBy(budget.Publish), "limit", m.opts.Budget.ClassLimit(budget.Publish))
		return false
	}
	respond := p.call.Respond
	var once sync.Once
	p.call.Respond = func(r ua.Response) {
		once.Do(func() { m.opts.Budget.Release(budget.Publish, cost) })
		respond(r)
	}
	return true
}

// ackLocked removes an acknowledged message from its retransmission queue.
func (s *Session) ackLocked(a *ua.SubscriptionAcknowledgement) ua.StatusCode {
	if a == nil {
		return ua.StatusBadSubscriptionIDInvalid
	}
	sub := s.subs[a.SubscriptionID]
	if sub == nil {
		return ua.StatusBadSubscriptionIDInvalid
	}
	i := slices.IndexFunc(sub.retrans, func(n *ua.NotificationMessage) bool { return n.SequenceNumber == a.SequenceNumber })
	if i < 0 {
		return ua.StatusBadSequenceNumberUnknown
	}
	s.removeRetransLocked(sub, i)
	return ua.StatusOK
}

// Republish serves the Republish service from the retransmission queue.
func (s *Session) Republish(r *ua.RepublishRequest) ua.Response {
	m := s.m
	return s.onSub(r, r.SubscriptionID, func(sub *Subscription) ua.Response {
		want := r.RetransmitSequenceNumber
		if m.opts.RepublishNext {
			want++ // fault republish-next: the message after the one asked for
		}
		i := slices.IndexFunc(sub.retrans, func(n *ua.NotificationMessage) bool { return n.SequenceNumber == want })
		if i < 0 {
			return m.Fault(r, ua.StatusBadMessageNotAvailable)
		}
		sub.lifetimeCtr = 0
		m.republished.Add(1)
		return &ua.RepublishResponse{ResponseHeader: m.header(r, ua.StatusOK), NotificationMessage: sub.retrans[i]}
	})
}

// run is a subscription's publishing loop: one cycle every publishing
// interval on absolute deadlines.
func (s *Session) run(ctx context.Context, sub *Subscription) {
	clock := s.m.clock
	s.mu.Lock()
	iv := sub.interval
	s.mu.Unlock()
	t0 := clock.Now()
	deadline := t0 + iv
	for {
		now, woken, err := clock.SleepUntil(ctx, deadline, sub.wake)
		if err != nil {
			return
		}
		s.mu.Lock()
		if sub.deleted || sub.sess != s { // deleted, or transferred to another session
			s.mu.Unlock()
			return
		}
		if woken { // the interval changed: restart the grid now
			iv = sub.interval
			t0, deadline = now, now+iv
			s.mu.Unlock()
			continue
		}
		expired := s.cycleLocked(sub, now)
		iv = sub.interval
		s.mu.Unlock()
		if expired {
			return
		}
		deadline, _ = NextDeadline(t0, iv, deadline, now)
	}
}

// cycleLocked runs one publishing cycle. It reports whether the
// subscription expired. s.mu held.
func (s *Session) cycleLocked(sub *Subscription, now time.Duration) (expired bool) {
	m := s.m
	s.expirePendingLocked(now)
	switch {
	case sub.enabled && sub.hasData():
		if !s.sendDataLocked(sub, now) {
			sub.late = true
		}
	default:
		sub.keepAliveCtr++
		if !sub.sentFirst || sub.keepAliveCtr >= sub.keepAlive {
			if !s.sendKeepAliveLocked(sub, now) {
				sub.late = true
			}
		}
	}
	if len(s.pending) == 0 {
		sub.lifetimeCtr++
		if sub.lifetimeCtr >= sub.lifetime {
			m.expired.Add(1)
			m.log.Info("subscription expired", "subscription", sub.id, "lifetime", sub.lifetime, "interval", sub.interval)
			s.deleteLocked(sub)
			s.noSubscriptionsLocked()
			return true
		}
	}
	return false
}

// serveLateLocked answers queued Publish requests for late subscriptions,
// round robin. s.mu held.
func (s *Session) serveLateLocked(now time.Duration) {
	n := len(s.order)
	for k := 0; k < n && len(s.pending) > 0; k++ {
		sub := s.order[(s.rr+k)%n]
		if !sub.late {
			continue
		}
		var sent bool
		if sub.enabled && sub.hasData() {
			// sendDataLocked leaves the subscription late while data is
			// left, so the next request is answered at once too.
			sent = s.sendDataLocked(sub, now)
		} else if sent = s.sendKeepAliveLocked(sub, now); sent {
			sub.late = false
		}
		if sent {
			s.rr = (s.rr + k + 1) % n
		}
	}
}

// hasData reports whether a reporting item has queued values. sess.mu held.
func (sub *Subscription) hasData() bool {
	for _, it := range sub.list {
		if it.mode == ua.MonitoringModeReporting && it.pending() > 0 {
			return true
		}
	}
	return false
}

// expirePendingLocked answers queued requests whose TimeoutHint passed or
// whose channel is gone. s.mu held.
func (s *Session) expirePendingLocked(now time.Duration) {
	s.pending = slices.DeleteFunc(s.pending, func(p *pendingPublish) bool {
		switch {
		case gone(p.call.Done):
			p.call.Respond(s.m.Fault(p.call.Request, ua.StatusBadSecureChannelClosed))
			return true
		case p.deadline > 0 && now >= p.deadline:
			s.m.timedOut.Add(1)
			p.call.Respond(s.m.Fault(p.call.Request, ua.StatusBadTimeout))
			return true
		}
		return false
	})
}

func gone(done <-chan struct{}) bool {
	if done == nil {
		return false
	}
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// popLocked takes the oldest queued request that can still be answered.
func (s *Session) popLocked(now time.Duration) *pendingPublish {
	s.expirePendingLocked(now)
	if len(s.pending) == 0 {
		return nil
	}
	p := s.pending[0]
	s.pending[0] = nil
	s.pending = s.pending[1:]
	return p
}

// nextSeq returns the next sequence number and advances it (never 0).
// Under the skipped-sequence fault it advances past the multiples of
// skipEvery (0: none skipped), so sub.seq, which keep-alives announce as
// the next number, is never a skipped one either.
func (sub *Subscription) nextSeq(skipEvery uint32) uint32 {
	n := sub.seq
	for {
		sub.seq++
		if sub.seq != 0 && (skipEvery == 0 || sub.seq%skipEvery != 0) {
			return n
		}
	}
}

// skipEvery is the skipped-sequence fault's period, 0 when it is off.
func (m *Manager) skipEvery() uint32 {
	if m.opts.SkippedSequence {
		return m.opts.SkipSequenceEvery
	}
	return 0
}

func (sub *Subscription) available() []uint32 {
	out := make([]uint32, len(sub.retrans))
	for i, n := range sub.retrans {
		out[i] = n.SequenceNumber
	}
	return out
}

// sendKeepAliveLocked answers a queued request with a keep-alive. s.mu held.
func (s *Session) sendKeepAliveLocked(sub *Subscription, now time.Duration) bool {
	p := s.popLocked(now)
	if p == nil {
		return false
	}
	m := s.m
	seq := sub.seq // the next one; not consumed
	if m.opts.KeepAliveConsumesSeq {
		seq = sub.nextSeq(m.skipEvery()) // fault keepalive-consumes-seq: used up
	}
	p.call.Respond(&ua.PublishResponse{
		ResponseHeader:           m.header(p.call.Request, ua.StatusOK),
		SubscriptionID:           sub.id,
		AvailableSequenceNumbers: sub.available(),
		NotificationMessage: &ua.NotificationMessage{
			SequenceNumber: seq,
			PublishTime:    m.clock.Wall(now),
		},
		Results: p.results,
	})
	m.keepAlives.Add(1)
	sub.sentFirst = true
	sub.keepAliveCtr = 0
	sub.lifetimeCtr = 0
	return true
}

// sendDataLocked answers queued requests with notification messages until
// the subscription has no data left or no request is queued. It reports
// whether at least one message was sent. s.mu held.
func (s *Session) sendDataLocked(sub *Subscription, now time.Duration) bool {
	m := s.m
	sent := false
	for sub.hasData() {
		p := s.popLocked(now)
		if p == nil {
			break
		}
		budget := p.call.Budget
		if budget <= 0 {
			budget = m.opts.MaxResponseBytes
		}
		// Room for the retransmission list including this message (it may
		// evict one) and the acknowledgement results.
		avail := min(len(sub.retrans)+1, m.opts.MaxRetransmit)
		room := budget - publishOverhead - 4*avail - 4*len(p.results)
		limit := int(sub.maxNotif)
		if c := int(m.opts.MaxNotificationsPerPublish); c > 0 && (limit == 0 || c < limit) {
			limit = c
		}
		notes := sub.collect(room, limit)
		if len(notes) == 0 {
			// Nothing fits (a single value above the budget was dropped):
			// give the request back.
			s.pending = slices.Insert(s.pending, 0, p)
			continue
		}
		msg := &ua.NotificationMessage{
			SequenceNumber:   sub.nextSeq(m.skipEvery()),
			PublishTime:      m.clock.Wall(now),
			NotificationData: []*ua.ExtensionObject{newDataChangeObject(notes)},
		}
		s.keepLocked(sub, msg)
		more := sub.hasData()
		p.call.Respond(&ua.PublishResponse{
			ResponseHeader:           m.header(p.call.Request, ua.StatusOK),
			SubscriptionID:           sub.id,
			AvailableSequenceNumbers: sub.available(),
			MoreNotifications:        more,
			NotificationMessage:      msg,
			Results:                  p.results,
		})
		m.messages.Add(1)
		m.notifications.Add(int64(len(notes)))
		sub.sentFirst = true
		sub.keepAliveCtr = 0
		sub.lifetimeCtr = 0
		sent = true
	}
	if sent {
		sub.late = sub.hasData() // more left and no request: still late
	}
	return sent
}

// publishOverhead bounds the encoded size of a PublishResponse with one
// DataChangeNotification and no items, acknowledgement results or available
// sequence numbers, transport headers included (~110 bytes), with a margin.
const publishOverhead = 192

// collect drains queued values of reporting items, oldest first per item
// and round robin over items, until room bytes or limit notifications (0:
// no limit) are used. A single value larger than room is dropped.
func (sub *Subscription) collect(room, limit int) []*ua.MonitoredItemNotification {
	var out []*ua.MonitoredItemNotification
	n := len(sub.list)
	if n == 0 {
		return nil
	}
	start := sub.rr % n
	for k := range n {
		i := (start + k) % n
		it := sub.list[i]
		if it.mode != ua.MonitoringModeReporting {
			continue
		}
		it.mu.Lock()
		for it.n > 0 {
			v := it.buf[it.head]
			size := 4 + dataValueSize(v)
			if limit > 0 && len(out) >= limit || size > room {
				if len(out) == 0 && size > room {
					it.drainLocked(1) // can never be sent
					it.discarded++
					continue
				}
				it.mu.Unlock()
				sub.rr = i // resume with this item
				return out
			}
			room -= size
			it.buf[it.head] = nil
			it.head = (it.head + 1) % len(it.buf)
			it.n--
			out = append(out, &ua.MonitoredItemNotification{ClientHandle: it.handle, Value: v})
		}
		it.mu.Unlock()
	}
	sub.rr = start + 1
	return out
}

// dataValueSize is the encoded size of a DataValue.
func dataValueSize(v *ua.DataValue) int {
	n := 1
	if v.Has(ua.DataValueValue) {
		n += variantSize(v.Value)
	}
	if v.Has(ua.DataValueStatusCode) {
		n += 4
	}
	if v.Has(ua.DataValueSourceTimestamp) {
		n += 8
	}
	if v.Has(ua.DataValueSourcePicoseconds) {
		n += 2
	}
	if v.Has(ua.DataValueServerTimestamp) {
		n += 8
	}
	if v.Has(ua.DataValueServerPicoseconds) {
		n += 2
	}
	return n
}

func variantSize(v *ua.Variant) int {
	if v == nil {
		return 1
	}
	if v.ArrayLength() == 0 && !v.Has(ua.VariantArrayValues) {
		switch x := v.Value().(type) {
		case nil:
			return 1
		case bool, int8, uint8:
			return 2
		case int16, uint16:
			return 3
		case int32, uint32, float32, ua.StatusCode:
			return 5
		case int64, uint64, float64, time.Time:
			return 9
		case string:
			return 5 + len(x)
		case []byte:
			return 5 + len(x)
		}
	}
	b, err := v.Encode()
	if err != nil {
		return 1 << 30 // never fits: dropped by collect
	}
	return len(b)
}
