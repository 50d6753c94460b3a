package subscription

import (
	"context"
	"slices"

	"github.com/gopcua/opcua/ua"
)

// Owner returns the key of the session that owns subscription id, or
// false if no session has it.
func (m *Manager) Owner(id uint32) (key any, ok bool) {
	m.mu.Lock()
	sessions := make([]*Session, 0, len(m.sessions))
	for _, s := range m.sessions {
		sessions = append(sessions, s)
	}
	m.mu.Unlock()
	for _, s := range sessions {
		s.mu.Lock()
		_, has := s.subs[id]
		s.mu.Unlock()
		if has {
			return s.key, true
		}
	}
	return nil, false
}

// Transfer moves subscription id from the session keyed from to to
// (TransferSubscriptions, Part 4 5.13.7): the subscription keeps its id,
// its monitored items and their queued values, its sequence numbers and
// its retransmission queue, and from now on publishes through to's
// Publish requests. With sendInitial every reporting item queues its
// current value. The caller has checked that both sessions belong to the
// same user. It returns the sequence numbers available for Republish, or
// the status: BadSubscriptionIDInvalid when from does not own id (any
// more). A transfer within one session only sends the initial values.
//
// With dropItems (the transfer-drops fault) the subscription arrives
// without its monitored items: they are deleted on the way.
func (m *Manager) Transfer(id uint32, from any, to *Session, sendInitial, dropItems bool) ([]uint32, ua.StatusCode) {
	// Transfers are serialized, so that two sessions' locks are only ever
	// held together here, always the source's first: no other path holds
	// two session locks.
	m.transferMu.Lock()
	defer m.transferMu.Unlock()
	src := m.Lookup(from)
	if src == nil {
		return nil, ua.StatusBadSubscriptionIDInvalid
	}
	src.mu.Lock()
	defer src.mu.Unlock()
	if src != to {
		to.mu.Lock()
		defer to.mu.Unlock()
	}
	sub := src.subs[id]
	switch {
	case sub == nil || sub.deleted:
		return nil, ua.StatusBadSubscriptionIDInvalid
	case to.closed:
		return nil, ua.StatusBadSessionClosed
	}
	if src != to {
		// The old publishing loop ends: it checks, under its session's
		// lock, that the subscription is still its own.
		sub.stop()
		delete(src.subs, id)
		if i := slices.Index(src.order, sub); i >= 0 {
			src.order = slices.Delete(src.order, i, i+1)
		}
		src.items -= len(sub.list)
		src.transferredLocked(sub)
		src.noSubscriptionsLocked()
		to.subs[id] = sub
		to.order = append(to.order, sub)
		to.items += len(sub.list)
		to.moveRetransLocked(src, sub)
		sub.sess = to
		sub.lifetimeCtr = 0
		ctx, cancel := context.WithCancel(m.ctx)
		sub.stop = cancel
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			to.run(ctx, sub)
		}()
	}
	if dropItems {
		to.dropItemsLocked(sub)
	}
	if sendInitial {
		st := to.sampleTime()
		for _, it := range sub.list {
			if it.mode == ua.MonitoringModeReporting {
				it.mu.Lock()
				it.hasLast = false // queue the current value even if unchanged
				it.mu.Unlock()
				it.Sample(st)
			}
		}
	}
	m.log.Debug("subscription transferred", "subscription", id, "send_initial", sendInitial)
	return sub.available(), ua.StatusOK
}

// transferredLocked tells the session a subscription left that it is gone
// (Part 4 5.13.7): a Publish response whose NotificationMessage holds a
// StatusChangeNotification Good_SubscriptionTransferred, sent to a queued
// Publish request or kept for the next one. The message carries the
// subscription's next sequence number without consuming it, as a
// keep-alive does: the sequence goes on unbroken in the new session, and
// the message is not kept for Republish. s.mu held.
func (s *Session) transferredLocked(sub *Subscription) {
	if s.closed || s.m.opts.TransferNoStatusChange { // fault transfer-no-status-change: not told
		return
	}
	m := s.m
	now := s.now()
	change := ua.NewExtensionObject(&ua.StatusChangeNotification{Status: ua.StatusGoodSubscriptionTransferred, DiagnosticInfo: &ua.DiagnosticInfo{}})
	msg := &ua.PublishResponse{
		SubscriptionID: sub.id,
		NotificationMessage: &ua.NotificationMessage{
			SequenceNumber:   sub.seq,
			PublishTime:      m.clock.Wall(now),
			NotificationData: []*ua.ExtensionObject{change},
		},
	}
	if p := s.popLocked(now); p != nil {
		msg.ResponseHeader, msg.Results = m.header(p.call.Request, ua.StatusOK), p.results
		p.call.Respond(msg)
		return
	}
	if len(s.statuses) >= maxStatuses {
		s.statuses = slices.Delete(s.statuses, 0, 1)
	}
	s.statuses = append(s.statuses, msg)
}

// dropItemsLocked deletes every monitored item of sub (the transfer-drops
// fault). s.mu held.
func (s *Session) dropItemsLocked(sub *Subscription) {
	s.releaseItemsLocked(sub.list)
	sub.items, sub.list, sub.rr = make(map[uint32]*MonitoredItem), nil, 0
}
