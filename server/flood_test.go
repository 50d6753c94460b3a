package server

import (
	"testing"
	"time"

	"github.com/gopcua/opcua/id"
	"github.com/gopcua/opcua/ua"
	"github.com/gopcua/opcua/uacp"

	"github.com/opcua-chaos/opcua-chaos/server/internal/subscription"
	"github.com/opcua-chaos/opcua-chaos/server/internal/uatest"
)

// Floods of valid requests that a server must bound (issue 14: Publish
// flood, CreateMonitoredItems for 100 000 items).

// rawSessionChannel opens a raw channel with an activated anonymous
// session.
func rawSessionChannel(t *testing.T, addr string) *uatest.Conn {
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
func rawSubscription(t *testing.T, c *uatest.Conn) uint32 {
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
