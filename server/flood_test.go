package server

import (
	"runtime"
	"testing"
	"time"

	"github.com/gopcua/opcua/id"
	"github.com/gopcua/opcua/ua"
	"github.com/gopcua/opcua/uacp"

	"github.com/opcua-chaos/opcua-chaos/internal/uawire"
	"github.com/opcua-chaos/opcua-chaos/server/internal/subscription"
)

// Floods of valid requests that a server must bound (issue 14: Publish
// flood, CreateMonitoredItems for 100 000 items).

// rawSessionChannel opens a raw channel with an activated anonymous
// session.
func rawSessionChannel(t *testing.T, addr string) *uawire.Conn {
	t.Helper()
	c := rawChannel(t, addr, uacp.Hello{})
	if err := c.Session(nil); err != nil {
		t.Fatalf("session: %v", err)
	}
	return c
}

// rawSubscription creates a subscription with a long publishing interval
// and keep-alive count, so that nothing answers a parked Publish during a
// test, and returns its id.
func rawSubscription(t *testing.T, c *uawire.Conn) uint32 {
	t.Helper()
	r, err := c.Call(&ua.CreateSubscriptionRequest{
		RequestedPublishingInterval: 60_000,
		RequestedLifetimeCount:      30,
		RequestedMaxKeepAliveCount:  10,
		PublishingEnabled:           true,
	})
	if err != nil {
		t.Fatalf("CreateSubscription: %v", err)
	}
	resp, ok := r.Value.(*ua.CreateSubscriptionResponse)
	if !ok {
		t.Fatalf("CreateSubscription: %v", r.Status())
	}
	return resp.SubscriptionID
}

// stateRead reads the server state.
func stateRead() *ua.ReadRequest {
	return &ua.ReadRequest{
		RequestHeader:      &ua.RequestHeader{},
		TimestampsToReturn: ua.TimestampsToReturnNeither,
		NodesToRead: []*ua.ReadValueID{{
			NodeID:       ua.NewNumericNodeID(0, id.Server_ServerStatus_State),
			AttributeID:  ua.AttributeIDValue,
			DataEncoding: &ua.QualifiedName{},
		}},
	}
}

// TestPublishFlood: 500 Publish requests, none acknowledged, on a session
// with a subscription that has nothing to send. The server keeps at most
// MaxPublishRequests of them parked and answers the oldest beyond that
// with BadTooManyPublishRequests; the parked ones hold no backpressure
// slot, so a Read behind them on the same channel, and one on another
// channel, are answered at once; closing the session answers the parked
// ones. Before the fix, the parked Publishes counted as pending responses:
// at the channel's high mark (100) the reader stopped and the Read was
// never read.
func TestPublishFlood(t *testing.T) {
	const flood = 500
	ts := runServer(t, Config{})
	c := rawSessionChannel(t, ts.addr)
	rawSubscription(t, c)
	publishes := map[uint32]bool{} // request id → answered
	for range flood {
		id, err := c.Send(&ua.PublishRequest{RequestHeader: &ua.RequestHeader{TimeoutHint: 600_000}})
		if err != nil {
			t.Fatalf("send Publish: %v", err)
		}
		publishes[id] = false
	}
	readID, err := c.Send(stateRead())
	if err != nil {
		t.Fatalf("send Read: %v", err)
	}

	// Another client on another channel is served meanwhile.
	other := rawSessionChannel(t, ts.addr)
	start := time.Now()
	_ = other.SetDeadline(start.Add(2 * time.Second))
	if r, err := other.Call(stateRead()); err != nil || r.Status() != ua.StatusOK {
		t.Fatalf("Read on another channel during the flood: %v %v", r.Status(), err)
	}

	// The flooding channel answers the Read behind the flood.
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	codes := map[ua.StatusCode]int{}
	for {
		r, err := c.Receive()
		if err != nil {
			t.Fatalf("waiting for the Read behind %d Publish requests: %v (answers so far %v)", flood, err, codes)
		}
		if r.RequestID == readID {
			if r.Status() != ua.StatusOK {
				t.Fatalf("Read behind the flood: %v", r.Status())
			}
			break
		}
		if _, ok := publishes[r.RequestID]; !ok {
			t.Fatalf("unexpected response %T to request %d", r.Value, r.RequestID)
		}
		publishes[r.RequestID] = true
		codes[r.Status()]++
	}
	t.Logf("Read behind the flood answered after %v; Publish answers before it: %v", time.Since(start), codes)
	max := subscription.DefaultMaxPublishRequests
	if got := codes[ua.StatusBadTooManyPublishRequests]; got != flood-max {
		t.Errorf("%d BadTooManyPublishRequests, want %d (flood %d, limit %d)", got, flood-max, flood, max)
	}

	// Closing the session answers every parked Publish.
	closeID, err := c.Send(&ua.CloseSessionRequest{DeleteSubscriptions: true})
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	for {
		r, err := c.Receive()
		if err != nil {
			t.Fatalf("after CloseSession: %v", err)
		}
		if r.RequestID == closeID {
			break
		}
		publishes[r.RequestID] = true
		codes[r.Status()]++
	}
	unanswered := 0
	for _, answered := range publishes {
		if !answered {
			unanswered++
		}
	}
	if unanswered > 0 {
		t.Errorf("%d of %d Publish requests unanswered after CloseSession (answers %v)", unanswered, flood, codes)
	}
	if _, _, _, p := ts.chans.totals(); p != 0 {
		t.Errorf("%d requests still parked after CloseSession", p)
	}
}

// createItemsRaw asks for n monitored items of CurrentTime (sampled every
// second, queue size 1) in one CreateMonitoredItems call and returns the
// service result and the count of each item result.
func createItemsRaw(t *testing.T, c *uawire.Conn, sub uint32, n int) (ua.StatusCode, map[ua.StatusCode]int) {
	t.Helper()
	items := make([]*ua.MonitoredItemCreateRequest, n)
	for i := range items {
		items[i] = &ua.MonitoredItemCreateRequest{
			ItemToMonitor: &ua.ReadValueID{NodeID: ua.NewNumericNodeID(0, id.Server_ServerStatus_CurrentTime),
				AttributeID: ua.AttributeIDValue, DataEncoding: &ua.QualifiedName{}},
			MonitoringMode: ua.MonitoringModeReporting,
			RequestedParameters: &ua.MonitoringParameters{ClientHandle: uint32(i), SamplingInterval: 1000,
				QueueSize: 1, DiscardOldest: true, Filter: ua.NewExtensionObject(nil)},
		}
	}
	r, err := c.Call(&ua.CreateMonitoredItemsRequest{SubscriptionID: sub, TimestampsToReturn: ua.TimestampsToReturnBoth, ItemsToCreate: items})
	if err != nil {
		t.Fatalf("CreateMonitoredItems of %d items: %v", n, err)
	}
	codes := map[ua.StatusCode]int{}
	if resp, ok := r.Value.(*ua.CreateMonitoredItemsResponse); ok {
		for _, res := range resp.Results {
			codes[res.StatusCode]++
		}
	}
	return r.Status(), codes
}

// readUint32 reads a UInt32 node of namespace 0 on c.
func readUint32(t *testing.T, c *uawire.Conn, node uint32) uint32 {
	t.Helper()
	r, err := c.Call(&ua.ReadRequest{TimestampsToReturn: ua.TimestampsToReturnNeither, NodesToRead: []*ua.ReadValueID{
		{NodeID: ua.NewNumericNodeID(0, node), AttributeID: ua.AttributeIDValue, DataEncoding: &ua.QualifiedName{}}}})
	if err != nil {
		t.Fatal(err)
	}
	resp, ok := r.Value.(*ua.ReadResponse)
	if !ok || len(resp.Results) != 1 || resp.Results[0].Value == nil {
		t.Fatalf("read i=%d: %v", node, r.Status())
	}
	v, ok := resp.Results[0].Value.Value().(uint32)
	if !ok {
		t.Fatalf("read i=%d: %T, want uint32", node, resp.Results[0].Value.Value())
	}
	return v
}

// TestMonitoredItemLimits: CreateMonitoredItems above the per-call limit
// is refused BadTooManyOperations; items beyond the per-session and the
// total limit get BadTooManyMonitoredItems; deleting a subscription gives
// its items back; the limits are advertised in ServerCapabilities.
func TestMonitoredItemLimits(t *testing.T) {
	ts := runServer(t, Config{MaxMonitoredItemsPerCall: 100, MaxMonitoredItemsPerSession: 250, MaxMonitoredItems: 400})
	a := rawSessionChannel(t, ts.addr)
	if got := readUint32(t, a, id.Server_ServerCapabilities_OperationLimits_MaxMonitoredItemsPerCall); got != 100 {
		t.Errorf("OperationLimits.MaxMonitoredItemsPerCall = %d, want 100", got)
	}
	if got := readUint32(t, a, id.Server_ServerCapabilities_MaxMonitoredItems); got != 400 {
		t.Errorf("ServerCapabilities.MaxMonitoredItems = %d, want 400", got)
	}
	subA := rawSubscription(t, a)
	if st, _ := createItemsRaw(t, a, subA, 101); st != ua.StatusBadTooManyOperations {
		t.Errorf("101 items in one call: %v, want BadTooManyOperations", st)
	}
	created := map[ua.StatusCode]int{}
	for range 3 {
		st, codes := createItemsRaw(t, a, subA, 100)
		if st != ua.StatusOK {
			t.Fatalf("100 items: %v", st)
		}
		for c, n := range codes {
			created[c] += n
		}
	}
	if created[ua.StatusOK] != 250 || created[ua.StatusBadTooManyMonitoredItems] != 50 {
		t.Errorf("session A, 300 items: %v, want 250 Good and 50 BadTooManyMonitoredItems", created)
	}
	b := rawSessionChannel(t, ts.addr)
	subB := rawSubscription(t, b)
	_, codes := createItemsRaw(t, b, subB, 100)
	_, more := createItemsRaw(t, b, subB, 100)
	for c, n := range more {
		codes[c] += n
	}
	if codes[ua.StatusOK] != 150 || codes[ua.StatusBadTooManyMonitoredItems] != 50 {
		t.Errorf("session B, 200 items with 250 of 400 live: %v, want 150 Good and 50 BadTooManyMonitoredItems", codes)
	}
	if r, err := a.Call(&ua.DeleteSubscriptionsRequest{SubscriptionIDs: []uint32{subA}}); err != nil || r.Status() != ua.StatusOK {
		t.Fatalf("DeleteSubscriptions: %v %v", r, err)
	}
	if _, codes := createItemsRaw(t, b, subB, 100); codes[ua.StatusOK] != 100 {
		t.Errorf("session B after A's items were deleted: %v, want 100 Good", codes)
	}
	if n := ts.subs.Stats().Items; n != 250 {
		t.Errorf("%d live items, want 250", n)
	}
}

// TestMonitoredItemFlood: 100 000 items asked for at the default limits,
// in calls of the per-call limit, are created up to the per-session limit
// and refused beyond it, without stalling another client; deleting the
// subscription frees them.
func TestMonitoredItemFlood(t *testing.T) {
	const want = 100_000
	ts := runServer(t, Config{})
	c := rawSessionChannel(t, ts.addr)
	sub := rawSubscription(t, c)
	other := rawSessionChannel(t, ts.addr)
	per := subscription.DefaultMaxItemsPerCall
	codes := map[ua.StatusCode]int{}
	for range want / per {
		st, cs := createItemsRaw(t, c, sub, per)
		if st != ua.StatusOK {
			t.Fatalf("CreateMonitoredItems: %v", st)
		}
		for k, n := range cs {
			codes[k] += n
		}
		start := time.Now()
		if r, err := other.Call(stateRead()); err != nil || r.Status() != ua.StatusOK || time.Since(start) > time.Second {
			t.Fatalf("Read of another client during the flood: %v %v after %v", r.Status(), err, time.Since(start))
		}
	}
	limit := subscription.DefaultMaxItemsPerSession
	if codes[ua.StatusOK] != limit || codes[ua.StatusBadTooManyMonitoredItems] != want-limit {
		t.Errorf("%d items: %v, want %d Good and the rest BadTooManyMonitoredItems", want, codes, limit)
	}
	if r, err := c.Call(&ua.DeleteSubscriptionsRequest{SubscriptionIDs: []uint32{sub}}); err != nil || r.Status() != ua.StatusOK {
		t.Fatalf("DeleteSubscriptions: %v %v", r, err)
	}
	if n := ts.subs.Stats().Items; n != 0 {
		t.Errorf("%d live items after DeleteSubscriptions", n)
	}
}

// TestMemoryReturnedAfterItemBurst: deleting a burst of 20 000 monitored
// items hands the freed heap back to the OS within a few seconds, not at
// the background scavenger's pace.
func TestMemoryReturnedAfterItemBurst(t *testing.T) {
	ts := runServer(t, Config{})
	c := rawSessionChannel(t, ts.addr)
	sub := rawSubscription(t, c)
	released := func() uint64 {
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapReleased
	}
	for range 2 {
		createItemsRaw(t, c, sub, subscription.DefaultMaxItemsPerCall)
	}
	before := released()
	if r, err := c.Call(&ua.DeleteSubscriptionsRequest{SubscriptionIDs: []uint32{sub}}); err != nil || r.Status() != ua.StatusOK {
		t.Fatalf("DeleteSubscriptions: %v %v", r, err)
	}
	waitFor(t, "freed memory released to the OS", func() bool { return released() >= before+5<<20 })
}
