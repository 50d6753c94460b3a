package server

// Issue 44, items 5 and 7: retransmission queues charged by bytes to the
// memory budget's retransmit class and a session's share of it (the
// retransmit-unbudgeted fault keeps 256 messages a subscription,
// uncharged); a server-wide subscription limit and a 10 ms minimum
// publishing interval (the subscriptions-unbounded fault: only the
// per-session limit, 1 ms).

import (
	"fmt"
	"testing"
	"time"

	"github.com/gopcua/opcua/id"
	"github.com/gopcua/opcua/ua"
	"github.com/gopcua/opcua/uacp"

	"github.com/opcua-chaos/opcua-chaos/internal/uawire"
	"github.com/opcua-chaos/opcua-chaos/server/catalog"
	"github.com/opcua-chaos/opcua-chaos/server/internal/budget"
	"github.com/opcua-chaos/opcua-chaos/server/internal/subscription"
)

// fastSubscription creates a subscription publishing every ms (revised
// to the server's minimum) with items items of CurrentTime sampled every
// sampling ms, queue 1, and returns its id.
func fastSubscription(t *testing.T, c *uawire.Conn, items int, sampling float64) uint32 {
	t.Helper()
	r, err := c.Call(&ua.CreateSubscriptionRequest{RequestedPublishingInterval: 1, RequestedLifetimeCount: 60_000,
		RequestedMaxKeepAliveCount: 10_000, PublishingEnabled: true})
	if err != nil {
		t.Fatalf("CreateSubscription: %v", err)
	}
	cs, ok := r.Value.(*ua.CreateSubscriptionResponse)
	if !ok {
		t.Fatalf("CreateSubscription: %v", r.Status())
	}
	reqs := make([]*ua.MonitoredItemCreateRequest, items)
	for i := range reqs {
		reqs[i] = &ua.MonitoredItemCreateRequest{
			ItemToMonitor: &ua.ReadValueID{NodeID: ua.NewNumericNodeID(0, id.Server_ServerStatus_CurrentTime),
				AttributeID: ua.AttributeIDValue, DataEncoding: &ua.QualifiedName{}},
			MonitoringMode: ua.MonitoringModeReporting,
			RequestedParameters: &ua.MonitoringParameters{ClientHandle: uint32(i), SamplingInterval: sampling,
				QueueSize: 1, DiscardOldest: true, Filter: ua.NewExtensionObject(nil)},
		}
	}
	r, err = c.Call(&ua.CreateMonitoredItemsRequest{SubscriptionID: cs.SubscriptionID, TimestampsToReturn: ua.TimestampsToReturnBoth, ItemsToCreate: reqs})
	if err != nil || r.Status() != ua.StatusOK {
		t.Fatalf("CreateMonitoredItems: %v %v", err, r.Status())
	}
	return cs.SubscriptionID
}

// publishData sends a Publish without acknowledgements and returns its
// answer, and whether it carried notifications (not a keep-alive).
func publishData(t *testing.T, c *uawire.Conn) (*ua.PublishResponse, bool) {
	t.Helper()
	r, err := c.Call(&ua.PublishRequest{})
	if err != nil {
		t.Fatalf("Publish: %v", err)
	}
	p, ok := r.Value.(*ua.PublishResponse)
	if !ok {
		t.Fatalf("Publish answered %v", r.Status())
	}
	return p, p.NotificationMessage != nil && len(p.NotificationMessage.NotificationData) > 0
}

// TestRetransmitCountTrimNotDropped: a subscription's retransmission
// queue beyond its count (subscription.DefaultMaxRetransmit messages)
// loses its oldest, within a budget they all fit: those are not dropped
// for the budget (Stats.RetransDropped stays 0).
func TestRetransmitCountTrimNotDropped(t *testing.T) {
	const publishes = subscription.DefaultMaxRetransmit + 60
	ts := runServer(t, Config{MemoryBudget: 512 << 20})
	c := rawChannel(t, ts.addr, uacp.Hello{})
	if err := c.Session(nil); err != nil {
		t.Fatalf("session: %v", err)
	}
	fastSubscription(t, c, 1, 10)
	kept, data := 0, 0
	for data < publishes {
		if p, ok := publishData(t, c); ok {
			data++
			kept = len(p.AvailableSequenceNumbers)
		}
	}
	st := ts.subs.Stats()
	t.Logf("%d data messages, %d kept, %d dropped for the budget", data, kept, st.RetransDropped)
	if kept != subscription.DefaultMaxRetransmit || st.RetransDropped != 0 {
		t.Errorf("%d kept, %d counted dropped for the budget: want %d kept, none counted", kept, st.RetransDropped, subscription.DefaultMaxRetransmit)
	}
}

// TestRetransmitBudgeted: one session, 4 subscriptions of 100 fast items
// each, 400 Publishes never acknowledged. Protected (an 8 MiB budget:
// retransmit class 1 MiB, a session's share 256 KiB), the kept messages
// stay within the session's share, the oldest are dropped (Republish of
// the first answers BadMessageNotAvailable, of the last the message), an
// acknowledgement gives its charge back and closing the session the rest.
// Under retransmit-unbudgeted every data message is kept (≤ 256 a
// subscription), charged nowhere.
func TestRetransmitBudgeted(t *testing.T) {
	const (
		subs      = 4
		items     = 100
		publishes = 400
	)
	for _, fault := range []bool{false, true} {
		t.Run(fmt.Sprintf("retransmit-unbudgeted=%v", fault), func(t *testing.T) {
			cfg := Config{MemoryBudget: 8 << 20}
			if fault {
				cfg.Faults = Faults{catalog.FaultRetransmitUnbudgeted: true}
			}
			ts := runServer(t, cfg)
			c := rawChannel(t, ts.addr, uacp.Hello{})
			if err := c.Session(nil); err != nil {
				t.Fatalf("session: %v", err)
			}
			ids := make([]uint32, subs)
			for i := range ids {
				ids[i] = fastSubscription(t, c, items, 10)
			}
			before := heapAfterGC()
			first := map[uint32]uint32{} // subscription → its first data message
			last := map[uint32]uint32{}
			kept := map[uint32]int{} // subscription → messages available at its last answer
			data := 0
			for range publishes {
				p, ok := publishData(t, c)
				if !ok {
					continue
				}
				data++
				seq := p.NotificationMessage.SequenceNumber
				if _, ok := first[p.SubscriptionID]; !ok {
					first[p.SubscriptionID] = seq
				}
				last[p.SubscriptionID] = seq
				kept[p.SubscriptionID] = len(p.AvailableSequenceNumbers)
			}
			grown := heapAfterGC() - before
			charged := ts.budget.UsedBy(budget.Retransmit)
			share := ts.budget.ClassLimit(budget.Retransmit) / subscription.RetransmitSessionShare
			st := ts.subs.Stats()
			total := 0
			for _, n := range kept {
				total += n
			}
			t.Logf("%d data messages, %d kept at the last answers, %d dropped for the budget, retransmit class %d bytes (session share %d), heap grown %d kB",
				data, total, st.RetransDropped, charged, share, grown>>10)
			if data < publishes/2 {
				t.Fatalf("only %d of %d Publishes carried data", data, publishes)
			}
			sub := ids[0]
			republish := func(seq uint32) ua.StatusCode {
				r, err := c.Call(&ua.RepublishRequest{SubscriptionID: sub, RetransmitSequenceNumber: seq})
				if err != nil {
					t.Fatalf("Republish: %v", err)
				}
				return r.Status()
			}
			if fault {
				if charged != 0 || st.RetransDropped != 0 {
					t.Errorf("retransmit-unbudgeted: %d bytes charged, %d dropped: want none", charged, st.RetransDropped)
				}
				if total < min(data, subs*subscription.DefaultMaxRetransmit)-subs {
					t.Errorf("retransmit-unbudgeted: %d messages kept of %d sent: want all", total, data)
				}
				if got := republish(first[sub]); got != ua.StatusOK {
					t.Errorf("retransmit-unbudgeted: Republish of the first message: %v, want Good", got)
				}
				return
			}
			if charged == 0 || charged > share {
				t.Errorf("retransmit class holds %d bytes: want some, within the session's share %d", charged, share)
			}
			if st.RetransDropped == 0 || total >= data {
				t.Errorf("%d messages dropped, %d of %d kept: want the oldest dropped", st.RetransDropped, total, data)
			}
			if got := republish(first[sub]); got != ua.StatusBadMessageNotAvailable {
				t.Errorf("Republish of the first (dropped) message: %v, want BadMessageNotAvailable", got)
			}
			if got := republish(last[sub]); got != ua.StatusOK {
				t.Errorf("Republish of the last message: %v, want Good", got)
			}
			// an acknowledgement gives its message's charge back
			r, err := c.Call(&ua.PublishRequest{SubscriptionAcknowledgements: []*ua.SubscriptionAcknowledgement{{SubscriptionID: sub, SequenceNumber: last[sub]}}})
			if err != nil {
				t.Fatal(err)
			}
			if p, ok := r.Value.(*ua.PublishResponse); !ok || len(p.Results) != 1 || p.Results[0] != ua.StatusOK {
				t.Fatalf("acknowledgement: %v", r.Status())
			}
			if got := republish(last[sub]); got != ua.StatusBadMessageNotAvailable {
				t.Errorf("Republish of an acknowledged message: %v, want BadMessageNotAvailable", got)
			}
			// closing the session gives back the rest
			if _, err := c.Send(&ua.CloseSessionRequest{DeleteSubscriptions: true}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the retransmit class back to 0", func() bool { return ts.budget.UsedBy(budget.Retransmit) == 0 })
		})
	}
}

// TestSubscriptionsServerWide: 3 sessions each ask for 30 subscriptions
// publishing every 1 ms on a server whose limit is 50. Protected, 50 are
// granted at the 10 ms minimum, the other 40 answered
// BadTooManySubscriptions, and a deleted one makes room for another.
// Under subscriptions-unbounded all 90 are granted at 1 ms.
func TestSubscriptionsServerWide(t *testing.T) {
	const (
		sessions = 3
		each     = 30
		limit    = 50
	)
	for _, fault := range []bool{false, true} {
		t.Run(fmt.Sprintf("subscriptions-unbounded=%v", fault), func(t *testing.T) {
			// anonymous sessions: without an anonymous share (1), the
			// server-wide limit alone (TestAnonymousSubscriptionShare
			// judges the share)
			cfg := Config{MaxSubscriptions: limit, AnonymousSubscriptionShare: 1}
			if fault {
				cfg.Faults = Faults{catalog.FaultSubscriptionsUnbounded: true}
			}
			ts := runServer(t, cfg)
			create := func(c *uawire.Conn) (uint32, float64, ua.StatusCode) {
				r, err := c.Call(&ua.CreateSubscriptionRequest{RequestedPublishingInterval: 1, RequestedLifetimeCount: 10_000,
					RequestedMaxKeepAliveCount: 1000, PublishingEnabled: true})
				if err != nil {
					t.Fatalf("CreateSubscription: %v", err)
				}
				if cs, ok := r.Value.(*ua.CreateSubscriptionResponse); ok {
					return cs.SubscriptionID, cs.RevisedPublishingInterval, ua.StatusOK
				}
				return 0, 0, r.Status()
			}
			granted, refused := 0, 0
			var some *uawire.Conn
			var someID uint32
			for range sessions {
				c := rawSessionChannel(t, ts.addr)
				for range each {
					sub, iv, st := create(c)
					switch st {
					case ua.StatusOK:
						granted++
						some, someID = c, sub
						want := float64(DefaultMinPublishingInterval / time.Millisecond)
						if fault {
							want = 1
						}
						if iv != want {
							t.Fatalf("revised publishing interval %v ms, want %v", iv, want)
						}
					case ua.StatusBadTooManySubscriptions:
						refused++
					default:
						t.Fatalf("CreateSubscription answered %v", st)
					}
				}
			}
			t.Logf("%d granted, %d refused BadTooManySubscriptions (server-wide limit %d, live %d)", granted, refused, limit, ts.subs.Stats().Subscriptions)
			if fault {
				if granted != sessions*each {
					t.Errorf("subscriptions-unbounded: %d of %d granted: want all", granted, sessions*each)
				}
				return
			}
			if granted != limit || refused != sessions*each-limit {
				t.Fatalf("%d granted, %d refused: want %d granted, %d refused", granted, refused, limit, sessions*each-limit)
			}
			r, err := some.Call(&ua.DeleteSubscriptionsRequest{SubscriptionIDs: []uint32{someID}})
			if err != nil || r.Status() != ua.StatusOK {
				t.Fatalf("DeleteSubscriptions: %v %v", err, r.Status())
			}
			if _, _, st := create(some); st != ua.StatusOK {
				t.Errorf("CreateSubscription after one was deleted: %v, want Good", st)
			}
			if _, _, st := create(some); st != ua.StatusBadTooManySubscriptions {
				t.Errorf("CreateSubscription at the limit again: %v, want BadTooManySubscriptions", st)
			}
		})
	}
}

// TestPublishRateServerWide: subscriptions asked for at 1 ms on a server
// whose publishing rate is 1000 cycles a second, beside two at 1 s (1 a
// second each). Protected, 9 are granted at the 10 ms minimum (100 cycles a
// second each), the rest answered BadTooManySubscriptions, and a
// ModifySubscription of a 1 s one to 10 ms, which would go past the rate,
// keeps the interval it had. Under subscriptions-unbounded all 20 are
// granted at 1 ms.
func TestPublishRateServerWide(t *testing.T) {
	for _, fault := range []bool{false, true} {
		t.Run(fmt.Sprintf("subscriptions-unbounded=%v", fault), func(t *testing.T) {
			// an anonymous session: the server-wide rate alone (no
			// anonymous share; TestAnonymousPublishRateShare judges it)
			cfg := Config{MaxPublishRate: 1000, AnonymousSubscriptionShare: 1}
			if fault {
				cfg.Faults = Faults{catalog.FaultSubscriptionsUnbounded: true}
			}
			ts := runServer(t, cfg)
			c := rawSessionChannel(t, ts.addr)
			create := func(ms float64) (uint32, ua.StatusCode) {
				r, err := c.Call(&ua.CreateSubscriptionRequest{RequestedPublishingInterval: ms, RequestedLifetimeCount: 10_000,
					RequestedMaxKeepAliveCount: 1000, PublishingEnabled: true})
				if err != nil {
					t.Fatalf("CreateSubscription: %v", err)
				}
				if cs, ok := r.Value.(*ua.CreateSubscriptionResponse); ok {
					return cs.SubscriptionID, ua.StatusOK
				}
				return 0, r.Status()
			}
			// two at 1 s first (1 cycle a second each)
			var slow uint32
			for range 2 {
				sid, st := create(1000)
				if st != ua.StatusOK {
					t.Fatalf("CreateSubscription at 1 s: %v", st)
				}
				slow = sid
			}
			granted := 0
			for range 20 {
				if _, st := create(1); st == ua.StatusOK {
					granted++
				} else if st != ua.StatusBadTooManySubscriptions {
					t.Fatalf("CreateSubscription answered %v", st)
				}
			}
			t.Logf("%d of 20 granted at 1 ms asked (publishing rate limit 1000 a second)", granted)
			if fault {
				if granted != 20 {
					t.Errorf("subscriptions-unbounded: %d of 20 granted: want all", granted)
				}
				return
			}
			if granted != 9 {
				t.Fatalf("%d granted: want 9 (2 + 9 × 100 cycles a second within 1000)", granted)
			}
			r, err := c.Call(&ua.ModifySubscriptionRequest{SubscriptionID: slow, RequestedPublishingInterval: 10, RequestedLifetimeCount: 10_000, RequestedMaxKeepAliveCount: 1000})
			if err != nil {
				t.Fatal(err)
			}
			if m, ok := r.Value.(*ua.ModifySubscriptionResponse); !ok || m.RevisedPublishingInterval != 1000 {
				t.Errorf("ModifySubscription to 10 ms over the rate: %v, want the 1000 ms it had", r.Value)
			}
		})
	}
}
