package server

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/gopcua/opcua"
	"github.com/gopcua/opcua/ua"

	"github.com/opcua-chaos/opcua-chaos/server/catalog"
	"github.com/opcua-chaos/opcua-chaos/server/internal/budget"
	"github.com/opcua-chaos/opcua-chaos/server/internal/subscription"
)

// Small session limits for the lockout tests (issue 32).
const (
	exhaustMaxSessions    = 20
	exhaustMaxUnactivated = 10
)

// exhaustServer runs a server with the small session limits, the user
// alice and the given faults.
func exhaustServer(t *testing.T, faults ...catalog.Fault) *testServer {
	t.Helper()
	fs := Faults{}
	for _, f := range faults {
		fs[f] = true
	}
	return runServer(t, Config{MaxSessions: exhaustMaxSessions, MaxUnactivatedSessions: exhaustMaxUnactivated,
		Users: map[string]string{"alice": "secret"}, Faults: fs})
}

// closeChannel closes a raw client's secure channel (Cleanup may close it
// again).
func closeChannel(t *testing.T, c *opcua.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = c.Close(ctx)
}

// userLogin opens a fresh session as alice and reads with it; it returns
// the first error.
func userLogin(t *testing.T, endpoint string) error {
	t.Helper()
	c, err := dial(endpoint, asUser(t, endpoint, "alice", "secret"))
	if err != nil {
		return err
	}
	defer closeChannel(t, c)
	_, err = c.Read(context.Background(), statusReadRequest())
	return err
}

// anonymousToken is an anonymous identity token with the advertised policy.
func anonymousToken() *ua.AnonymousIdentityToken {
	return &ua.AnonymousIdentityToken{PolicyID: PolicyAnonymous}
}

// TestAnonymousFloodLeavesRoomForLogins: MaxSessions anonymous sessions
// are tried, each on its own channel, and the channels closed: the
// anonymous share (MaxSessions/2) refuses the rest BadTooManySessions
// (the sessions holding it are busy: none idle for YieldIdle), and a user
// login still creates and activates a session. Under the
// sessions-outlive-channels fault all of them are activated and outlive
// their channels: the login is refused.
func TestAnonymousFloodLeavesRoomForLogins(t *testing.T) {
	for _, fault := range []bool{false, true} {
		t.Run(fmt.Sprintf("sessions-outlive-channels=%v", fault), func(t *testing.T) {
			var ts *testServer
			if fault {
				ts = exhaustServer(t, catalog.FaultSessionsOutliveChannels)
			} else {
				ts = exhaustServer(t)
			}
			// All are tried while their channels are open (no orphan can
			// make room yet), then the channels close.
			activated := 0
			var chans []*opcua.Client
			for range exhaustMaxSessions {
				c := newRawChannel(t, ts.endpoint)
				chans = append(chans, c)
				switch err := createRaw(t, c).activate(anonymousToken()); {
				case err == nil:
					activated++
				case !errors.Is(err, ua.StatusBadTooManySessions):
					t.Fatalf("anonymous activation: %v", err)
				}
			}
			for _, c := range chans {
				closeChannel(t, c)
			}
			want := exhaustMaxSessions / 2
			if fault {
				want = exhaustMaxSessions
			}
			if activated != want {
				t.Errorf("%d anonymous sessions activated, want %d", activated, want)
			}
			waitFor(t, "the flood's sessions to be orphans", func() bool { return ts.sessions.Counts().Orphaned == activated })
			err := userLogin(t, ts.endpoint)
			switch {
			case !fault && err != nil:
				t.Errorf("user login after an anonymous flood: %v", err)
			case fault && !errors.Is(err, ua.StatusBadTooManySessions):
				t.Errorf("sessions-outlive-channels: user login %v, want BadTooManySessions", err)
			}
			if c := ts.sessions.Counts(); !fault && (c.Anonymous > exhaustMaxSessions/2 || c.AnonymousRefused != exhaustMaxSessions/2) {
				t.Errorf("counts %+v", c)
			}
		})
	}
}

// TestAnonymousOrphansMakeRoom: with the anonymous share full of orphans
// (their channels closed), a new anonymous client closes the oldest of
// them and is served; under sessions-outlive-channels it is refused.
func TestAnonymousOrphansMakeRoom(t *testing.T) {
	ts := exhaustServer(t)
	for range exhaustMaxSessions / 2 {
		c := newRawChannel(t, ts.endpoint)
		if err := createRaw(t, c).activate(anonymousToken()); err != nil {
			t.Fatal(err)
		}
		closeChannel(t, c)
	}
	waitFor(t, "orphans", func() bool { return ts.sessions.Counts().Orphaned == exhaustMaxSessions/2 })
	c := newRawChannel(t, ts.endpoint)
	r := createRaw(t, c)
	if err := r.activate(anonymousToken()); err != nil {
		t.Fatalf("anonymous activation with the share full of orphans: %v", err)
	}
	if err := r.read(); err != nil {
		t.Errorf("read: %v", err)
	}
	if n := ts.sessions.Counts().OrphansEvicted; n != 1 {
		t.Errorf("%d orphans closed, want 1", n)
	}
}

// TestAnonymousShareYieldsToFresh (issue 44, item 3): the anonymous share
// full of sessions on live channels does not lock a fresh anonymous client
// out for long: beside sessions used a moment ago it is refused, but once
// one went AnonymousYieldIdle without a request its activation closes the
// session idle longest and it reads; the sessions used since keep theirs.
// Under anonymous-full-refuses it is refused BadTooManySessions.
func TestAnonymousShareYieldsToFresh(t *testing.T) {
	for _, fault := range []bool{false, true} {
		t.Run(fmt.Sprintf("anonymous-full-refuses=%v", fault), func(t *testing.T) {
			const yieldIdle = 100 * time.Millisecond
			ts := runServer(t, Config{MaxSessions: exhaustMaxSessions, MaxUnactivatedSessions: exhaustMaxUnactivated,
				AnonymousYieldIdle: yieldIdle, Faults: Faults{catalog.FaultAnonymousFullRefuses: fault}})
			var held []*rawSession
			for range exhaustMaxSessions / 2 {
				r := createRaw(t, newRawChannel(t, ts.endpoint))
				if err := r.activate(anonymousToken()); err != nil {
					t.Fatal(err)
				}
				held = append(held, r)
			}
			// Busy a moment ago: none yields yet.
			early := createRaw(t, newRawChannel(t, ts.endpoint))
			if err := early.activate(anonymousToken()); !errors.Is(err, ua.StatusBadTooManySessions) {
				t.Fatalf("anonymous client beside sessions busy a moment ago: %v, want BadTooManySessions", err)
			}
			time.Sleep(2 * yieldIdle)
			for _, r := range held[1:] { // held[0] stays idle longest
				if err := r.read(); err != nil {
					t.Fatal(err)
				}
			}
			fresh := createRaw(t, newRawChannel(t, ts.endpoint))
			err := fresh.activate(anonymousToken())
			if fault {
				if !errors.Is(err, ua.StatusBadTooManySessions) {
					t.Fatalf("anonymous-full-refuses: fresh anonymous client %v, want BadTooManySessions", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("fresh anonymous client at a full anonymous share: %v", err)
			}
			if err := fresh.read(); err != nil {
				t.Errorf("fresh anonymous client's Read: %v", err)
			}
			if err := held[0].read(); !errors.Is(err, ua.StatusBadSessionIDInvalid) {
				t.Errorf("the session idle longest: Read %v, want BadSessionIdInvalid (closed for the fresh client)", err)
			}
			if err := held[1].read(); err != nil {
				t.Errorf("a session used since: %v", err)
			}
			if n := ts.sessions.Counts().AnonymousYielded; n != 1 {
				t.Errorf("%d anonymous sessions yielded, want 1", n)
			}
		})
	}
}

// TestUnactivatedFloodLeavesRoom: MaxUnactivatedSessions sessions created
// and never activated do not lock a new client out: CreateSession closes
// the oldest of them. Under the unactivated-refuse fault it is refused.
func TestUnactivatedFloodLeavesRoom(t *testing.T) {
	for _, fault := range []bool{false, true} {
		t.Run(fmt.Sprintf("unactivated-refuse=%v", fault), func(t *testing.T) {
			var ts *testServer
			if fault {
				ts = exhaustServer(t, catalog.FaultUnactivatedRefuse)
			} else {
				ts = exhaustServer(t)
			}
			c := newRawChannel(t, ts.endpoint)
			for range exhaustMaxUnactivated {
				createRaw(t, c)
			}
			cl, err := dial(ts.endpoint, anonymous(t, ts.endpoint))
			if err == nil {
				defer closeChannel(t, cl)
				_, err = cl.Read(context.Background(), statusReadRequest())
			}
			switch {
			case !fault && err != nil:
				t.Errorf("new client after %d unactivated sessions: %v", exhaustMaxUnactivated, err)
			case fault && !errors.Is(err, ua.StatusBadTooManySessions):
				t.Errorf("unactivated-refuse: new client %v, want BadTooManySessions", err)
			}
			if n := ts.sessions.Counts().UnactivatedEvicted; !fault && n != 1 {
				t.Errorf("%d unactivated sessions closed, want 1", n)
			}
		})
	}
}

// TestOrphanResumesOnANewChannel: a session whose channel closed stays
// resumable by ActivateSession on a new channel while the table is not
// full (the recovery suites depend on it), anonymous or not.
func TestOrphanResumesOnANewChannel(t *testing.T) {
	ts := exhaustServer(t)
	for _, user := range []bool{false, true} {
		c := newRawChannel(t, ts.endpoint)
		r := createRaw(t, c)
		tok := func() any {
			if user {
				return r.user("alice", "secret", r.nonce)
			}
			return anonymousToken()
		}
		if err := r.activate(tok()); err != nil {
			t.Fatal(err)
		}
		closeChannel(t, c)
		waitFor(t, "the session to be an orphan", func() bool { return ts.sessions.Counts().Orphaned == 1 })
		r.c = newRawChannel(t, ts.endpoint)
		if err := r.activate(tok()); err != nil {
			t.Fatalf("user=%v: reactivation on a new channel: %v", user, err)
		}
		if err := r.read(); err != nil {
			t.Errorf("user=%v: read on the new channel: %v", user, err)
		}
		if n := ts.sessions.Counts().Orphaned; n != 0 {
			t.Errorf("user=%v: %d orphans after the reactivation", user, n)
		}
	}
}

// itemQueueBomb creates n monitored items of queue size 10 000 at 1 ms in
// one call and returns the results.
func itemQueueBomb(t *testing.T, c *opcua.Client, n int) (sub uint32, results []*ua.MonitoredItemCreateResult) {
	t.Helper()
	r, err := sendSvc(t, c, &ua.CreateSubscriptionRequest{RequestedPublishingInterval: 1000, RequestedMaxKeepAliveCount: 10, RequestedLifetimeCount: 1000, PublishingEnabled: true})
	if err != nil {
		t.Fatal(err)
	}
	sub = r.(*ua.CreateSubscriptionResponse).SubscriptionID
	req := &ua.CreateMonitoredItemsRequest{SubscriptionID: sub, TimestampsToReturn: ua.TimestampsToReturnBoth}
	for i := range n {
		req.ItemsToCreate = append(req.ItemsToCreate, &ua.MonitoredItemCreateRequest{
			ItemToMonitor:  &ua.ReadValueID{NodeID: counter(fmt.Sprintf("SampledCounter.%d", i%16)), AttributeID: ua.AttributeIDValue, DataEncoding: &ua.QualifiedName{}},
			MonitoringMode: ua.MonitoringModeReporting,
			RequestedParameters: &ua.MonitoringParameters{ClientHandle: uint32(i), SamplingInterval: 1, QueueSize: 10_000,
				DiscardOldest: true, Filter: ua.NewExtensionObject(nil)},
		})
	}
	r, err = sendSvc(t, c, req)
	if err != nil {
		t.Fatalf("CreateMonitoredItems: %v", err)
	}
	return sub, r.(*ua.CreateMonitoredItemsResponse).Results
}

// TestItemQueueBomb: 2 000 items asking for queues of 10 000 values get
// queues of subscription.DefaultMaxQueueSize, charged to the items share
// of the memory budget (Memory.Charged.items stays within it); the items
// beyond it get BadResourceUnavailable while the call succeeds; the
// charge returns to 0 after DeleteSubscriptions. Under the
// item-queues-unbounded fault the queue size of 10 000 is granted.
func TestItemQueueBomb(t *testing.T) {
	const limit = 64 << 20 // items share: 32 MiB, 174 items of 1000 values
	ts := runServer(t, Config{Counters: 16, MemoryBudget: limit})
	c := connect(t, ts.endpoint, anonymous(t, ts.endpoint))
	sub, results := itemQueueBomb(t, c, 2000)
	good := 0
	refused := 0
	for i, res := range results {
		switch res.StatusCode {
		case ua.StatusOK:
			good++
			if res.RevisedQueueSize != subscription.DefaultMaxQueueSize {
				t.Fatalf("item %d: queue size %d granted, want %d", i, res.RevisedQueueSize, subscription.DefaultMaxQueueSize)
			}
			if refused > 0 {
				t.Fatalf("item %d granted after a refused one", i)
			}
		case ua.StatusBadResourceUnavailable:
			refused++
		default:
			t.Fatalf("item %d: %v", i, res.StatusCode)
		}
	}
	share := ts.budget.ClassLimit(budget.Items)
	// each item is charged its queue, its NodeId and itemOverhead
	perItem := func(i int) int64 {
		return int64(subscription.DefaultMaxQueueSize*subscription.DefaultValueSize) + itemOverhead + int64(len(fmt.Sprintf("SampledCounter.%d", i%16)))
	}
	want, wantCharged := 0, int64(0)
	for wantCharged+perItem(want) <= share {
		wantCharged += perItem(want)
		want++
	}
	if good != want || refused != 2000-want {
		t.Errorf("%d items granted, %d refused; want %d, %d", good, refused, want, 2000-want)
	}
	charged := readInt(t, c, NodeMemoryCharged+".items")
	if charged != wantCharged || charged > share {
		t.Errorf("Memory.Charged.items = %d, want %d (share %d)", charged, wantCharged, share)
	}
	if n := readInt(t, c, "Memory.Refused.items"); n != int64(refused) {
		t.Errorf("Memory.Refused.items = %d, want %d", n, refused)
	}
	if _, err := sendSvc(t, c, &ua.DeleteSubscriptionsRequest{SubscriptionIDs: []uint32{sub}}); err != nil {
		t.Fatal(err)
	}
	if n := readInt(t, c, NodeMemoryCharged+".items"); n != 0 {
		t.Errorf("Memory.Charged.items = %d after DeleteSubscriptions", n)
	}

	t.Run("item-queues-unbounded", func(t *testing.T) {
		ts := runServer(t, Config{Counters: 16, MemoryBudget: limit, Faults: Faults{catalog.FaultItemQueuesUnbounded: true}})
		c := connect(t, ts.endpoint, anonymous(t, ts.endpoint))
		_, results := itemQueueBomb(t, c, 20)
		for i, res := range results {
			if res.StatusCode != ua.StatusOK || res.RevisedQueueSize != subscription.UnboundedQueueSize {
				t.Fatalf("item %d: %v, queue size %d; want Good, %d", i, res.StatusCode, res.RevisedQueueSize, subscription.UnboundedQueueSize)
			}
		}
		if n := readInt(t, c, NodeMemoryCharged+".items"); n != 0 {
			t.Errorf("Memory.Charged.items = %d under the fault, want 0", n)
		}
	})
}
