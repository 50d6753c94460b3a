package subscription

import (
	"slices"

	"github.com/gopcua/opcua/ua"

	"github.com/opcua-chaos/opcua-chaos/server/internal/budget"
)

// Retransmission queues (issue 44, item 5): every notification message a
// subscription keeps for Republish until it is acknowledged is charged
// its estimated size to the budget's Retransmit class, and one session may
// hold at most 1/RetransmitSessionShare of the class, so that a client
// that never acknowledges cannot take the memory of the others. A message
// that does not fit drops its subscription's oldest kept messages (Part 4
// 5.13.6 lets a server drop them: a Republish of one is answered
// BadMessageNotAvailable), or is sent without being kept when its
// subscription keeps none. The retransmit-unbudgeted fault keeps them by
// count only (MaxRetransmit), charged nowhere.

// RetransmitSessionShare is the share of the Retransmit class one session
// may hold (¼).
const RetransmitSessionShare = 4

// Estimates of what a kept notification message holds.
const (
	// retransMessageCost is a message's own cost: the NotificationMessage,
	// its ExtensionObject and DataChange and their slices.
	retransMessageCost = 256
	// retransNoteCost is one MonitoredItemNotification's cost beside its
	// value (ValueSize): the struct and its slot.
	retransNoteCost = 48
)

// retransBudgeted reports whether kept messages are charged.
func (m *Manager) retransBudgeted() bool {
	return m.opts.Budget != nil && !m.opts.RetransmitUnbudgeted
}

// retransShare is the most one session's kept messages may be charged.
func (m *Manager) retransShare() int64 {
	return m.opts.Budget.ClassLimit(budget.Retransmit) / RetransmitSessionShare
}

// retransCost estimates the memory msg holds while kept: its own
// structures and, per notification, the decoded value (ValueSize) and the
// notification around it.
func (m *Manager) retransCost(msg *ua.NotificationMessage) int64 {
	cost := int64(retransMessageCost)
	for _, eo := range msg.NotificationData {
		if eo == nil {
			continue
		}
		if dc, ok := eo.Value.(*DataChange); ok {
			cost += int64(len(dc.MonitoredItems)) * (m.opts.ValueSize + retransNoteCost)
		}
	}
	return cost
}

// keepLocked keeps msg, just sent, in sub's retransmission queue: beyond
// MaxRetransmit messages (1 under the republish-forgets fault) the oldest
// are dropped; when budgeted, its charge must fit the session's share and
// the Retransmit class, else sub's oldest messages are dropped until it
// does, or msg is not kept. s.mu held.
func (s *Session) keepLocked(sub *Subscription, msg *ua.NotificationMessage) {
	m := s.m
	keep := m.opts.MaxRetransmit
	if m.opts.RepublishForgets {
		keep = 1 // fault republish-forgets: earlier messages are gone
	}
	if n := len(sub.retrans) + 1 - keep; n > 0 {
		// beyond the count: not dropped for the budget, not counted
		s.releaseRetransLocked(sub, n)
	}
	if !m.retransBudgeted() {
		sub.retrans = append(sub.retrans, msg)
		sub.retransCost = append(sub.retransCost, 0)
		return
	}
	cost := m.retransCost(msg)
	share := m.retransShare()
	dropped := 0
	for s.retransBytes+cost > share || !m.opts.Budget.Charge(budget.Retransmit, cost) {
		if len(sub.retrans) == 0 {
			// nothing of its own left to drop: sent, not kept
			m.retransDropped.Add(1)
			m.opts.Budget.Refuse(budget.Retransmit)
			s.logDropped(sub, dropped+1)
			return
		}
		s.dropOldestLocked(sub, 1)
		dropped++
	}
	sub.retrans = append(sub.retrans, msg)
	sub.retransCost = append(sub.retransCost, cost)
	sub.retransBytes += cost
	s.retransBytes += cost
	if dropped > 0 {
		s.logDropped(sub, dropped)
	}
}

// logDropped logs messages dropped for the budget, now and then.
func (s *Session) logDropped(sub *Subscription, n int) {
	m := s.m
	if total := m.retransDropped.Load(); total/1000 != (total-int64(n))/1000 || total == int64(n) {
		m.log.Info("retransmission queue over its budget: oldest messages dropped", "subscription", sub.id,
			"dropped_total", total, "session_bytes", s.retransBytes, "share", m.retransShare(),
			"class_bytes", m.opts.Budget.UsedBy(budget.Retransmit), "limit", m.opts.Budget.ClassLimit(budget.Retransmit))
	}
}

// dropOldestLocked drops sub's n oldest kept messages for the byte
// budget, counted as dropped (Stats.RetransDropped) when they are
// charged. s.mu held.
func (s *Session) dropOldestLocked(sub *Subscription, n int) {
	n = min(n, len(sub.retrans))
	for i := range n {
		if sub.retransCost[i] > 0 {
			s.m.retransDropped.Add(1)
		}
	}
	s.releaseRetransLocked(sub, n)
}

// releaseRetransLocked removes sub's n oldest kept messages and gives
// back their charge. s.mu held.
func (s *Session) releaseRetransLocked(sub *Subscription, n int) {
	n = min(n, len(sub.retrans))
	var freed int64
	for _, c := range sub.retransCost[:n] {
		freed += c
	}
	sub.retrans = slices.Delete(sub.retrans, 0, n)
	sub.retransCost = slices.Delete(sub.retransCost, 0, n)
	s.release(sub, freed)
}

// removeRetransLocked removes sub's kept message i (acknowledged) and
// gives back its charge. s.mu held.
func (s *Session) removeRetransLocked(sub *Subscription, i int) {
	freed := sub.retransCost[i]
	sub.retrans = slices.Delete(sub.retrans, i, i+1)
	sub.retransCost = slices.Delete(sub.retransCost, i, i+1)
	s.release(sub, freed)
}

// release gives back n bytes of sub's charge.
func (s *Session) release(sub *Subscription, n int64) {
	if n == 0 {
		return
	}
	sub.retransBytes -= n
	s.retransBytes -= n
	s.m.opts.Budget.Release(budget.Retransmit, n)
}

// moveRetransLocked moves sub's charge from session from to s (a
// transfer) and drops sub's oldest messages while s is over its share.
// Both sessions' locks held.
func (s *Session) moveRetransLocked(from *Session, sub *Subscription) {
	from.retransBytes -= sub.retransBytes
	s.retransBytes += sub.retransBytes
	if !s.m.retransBudgeted() {
		return
	}
	for s.retransBytes > s.m.retransShare() && len(sub.retrans) > 0 {
		s.dropOldestLocked(sub, 1)
	}
}
