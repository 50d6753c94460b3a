package server

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gopcua/opcua"
	"github.com/gopcua/opcua/ua"

	"github.com/opcua-chaos/opcua-chaos/server/catalog"
)

// subscribeCounter creates a subscription publishing every 20 ms with one
// item on SampledCounter.1 sampled every 5 ms, and returns its id.
func subscribeCounter(t *testing.T, c *opcua.Client) uint32 {
	t.Helper()
	r, err := sendSvc(t, c, &ua.CreateSubscriptionRequest{RequestedPublishingInterval: 20, RequestedLifetimeCount: 1000, RequestedMaxKeepAliveCount: 10, PublishingEnabled: true})
	if err != nil {
		t.Fatal(err)
	}
	id := r.(*ua.CreateSubscriptionResponse).SubscriptionID
	r, err = sendSvc(t, c, &ua.CreateMonitoredItemsRequest{
		SubscriptionID: id, TimestampsToReturn: ua.TimestampsToReturnSource,
		ItemsToCreate: []*ua.MonitoredItemCreateRequest{{
			ItemToMonitor:  &ua.ReadValueID{NodeID: counter("SampledCounter.1"), AttributeID: ua.AttributeIDValue, DataEncoding: &ua.QualifiedName{}},
			MonitoringMode: ua.MonitoringModeReporting,
			RequestedParameters: &ua.MonitoringParameters{
				ClientHandle: 1, SamplingInterval: 5, QueueSize: 100, DiscardOldest: true, Filter: ua.NewExtensionObject(nil),
			},
		}},
	})
	if err != nil || r.(*ua.CreateMonitoredItemsResponse).Results[0].StatusCode != ua.StatusOK {
		t.Fatalf("create item: %v", err)
	}
	return id
}

// dataMessage publishes (without acknowledging) until a data message of
// subscription sub arrives, and returns it; nil after 50 responses.
func dataMessage(t *testing.T, c *opcua.Client, sub uint32) *ua.NotificationMessage {
	t.Helper()
	for range 50 {
		r, err := sendSvc(t, c, &ua.PublishRequest{})
		if err != nil {
			t.Fatalf("publish: %v", err)
		}
		if p := r.(*ua.PublishResponse); p.SubscriptionID == sub && len(p.NotificationMessage.NotificationData) > 0 {
			return p.NotificationMessage
		}
	}
	return nil
}

// moveSession detaches a's session and activates it on a new secure
// channel of client b (dialled, without a session of its own), as a
// client does after its connection broke.
func moveSession(t *testing.T, endpoint string, a *opcua.Client) (*opcua.Client, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := a.DetachSession(ctx)
	if err != nil {
		t.Fatal(err)
	}
	b, err := opcua.NewClient(endpoint, opcua.SecurityMode(ua.MessageSecurityModeNone), opcua.SecurityPolicy(ua.SecurityPolicyURINone),
		opcua.AutoReconnect(false), opcua.RequestTimeout(10*time.Second), anonymous(t, endpoint))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Dial(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = b.Close(ctx)
	})
	return b, b.ActivateSession(ctx, s)
}

// TestSessionMovesToANewChannel: a session activated again on another
// secure channel (same anonymous identity) is served there, keeps its
// subscription, sequence numbers and retransmission queue (Republish of
// a message sent on the old channel), and is no longer served on the old
// channel. With no-reactivate the activation is refused.
func TestSessionMovesToANewChannel(t *testing.T) {
	endpoint, srv := startServer(t, Config{Counters: 4})
	a := connect(t, endpoint, anonymous(t, endpoint))
	sub := subscribeCounter(t, a)
	first := dataMessage(t, a, sub)
	if first == nil {
		t.Fatal("no data message")
	}
	sessions := srv.sessions.Counts().Cumulated
	b, err := moveSession(t, endpoint, a)
	if err != nil {
		t.Fatalf("activate on the new channel: %v", err)
	}
	if n := srv.sessions.Counts().Cumulated; n != sessions {
		t.Errorf("%d sessions created by the move", n-sessions)
	}
	r, err := sendSvc(t, b, &ua.RepublishRequest{SubscriptionID: sub, RetransmitSequenceNumber: first.SequenceNumber})
	if err != nil || r.(*ua.RepublishResponse).NotificationMessage.SequenceNumber != first.SequenceNumber {
		t.Fatalf("Republish of message %d on the new channel: %v", first.SequenceNumber, err)
	}
	next := dataMessage(t, b, sub)
	if next == nil || next.SequenceNumber <= first.SequenceNumber {
		t.Fatalf("message after the move: %+v (first %d)", next, first.SequenceNumber)
	}
}

func TestNoReactivateFaultKeepsTheSessionOnItsChannel(t *testing.T) {
	endpoint, _ := startServer(t, Config{Counters: 4, Faults: Faults{catalog.FaultNoReactivate: true}})
	a := connect(t, endpoint, anonymous(t, endpoint))
	_, err := moveSession(t, endpoint, a)
	if !errors.Is(err, ua.StatusBadSecureChannelIDInvalid) {
		t.Fatalf("activate on the new channel = %v, want BadSecureChannelIDInvalid", err)
	}
}

// TestRepublishForgetsFault: unacknowledged messages stay available for
// Republish; with republish-forgets only the last one does.
func TestRepublishForgetsFault(t *testing.T) {
	for _, fault := range []bool{false, true} {
		cfg := Config{Counters: 4}
		if fault {
			cfg.Faults = Faults{catalog.FaultRepublishForgets: true}
		}
		endpoint, _ := startServer(t, cfg)
		c := connect(t, endpoint, anonymous(t, endpoint))
		sub := subscribeCounter(t, c)
		first, second := dataMessage(t, c, sub), dataMessage(t, c, sub)
		if first == nil || second == nil {
			t.Fatal("no data messages")
		}
		_, err := sendSvc(t, c, &ua.RepublishRequest{SubscriptionID: sub, RetransmitSequenceNumber: first.SequenceNumber})
		switch {
		case !fault && err != nil:
			t.Errorf("Republish of an unacknowledged message: %v", err)
		case fault && !errors.Is(err, ua.StatusBadMessageNotAvailable):
			t.Errorf("republish-forgets: Republish = %v, want BadMessageNotAvailable", err)
		}
	}
}

// TestTransferSubscriptions: a subscription moves to another session of
// the same user (user1) with its items and sequence numbers; the new
// session's Publish gets its data, the old one is told once
// (GoodSubscriptionTransferred) and then has none left. Another
// user's session may not take it. With transfer-drops it arrives empty.
func TestTransferSubscriptions(t *testing.T) {
	for _, fault := range []bool{false, true} {
		cfg := Config{Counters: 4}
		if fault {
			cfg.Faults = Faults{catalog.FaultTransferDrops: true}
		}
		endpoint, srv := startServer(t, cfg)
		a := connect(t, endpoint, asUser(t, endpoint, "user1", "password"))
		sub := subscribeCounter(t, a)
		first := dataMessage(t, a, sub)
		if first == nil {
			t.Fatal("no data message")
		}
		other := connect(t, endpoint, asUser(t, endpoint, "user2", "password1"))
		r, err := sendSvc(t, other, &ua.TransferSubscriptionsRequest{SubscriptionIDs: []uint32{sub}})
		if err != nil || r.(*ua.TransferSubscriptionsResponse).Results[0].StatusCode != ua.StatusBadUserAccessDenied {
			t.Fatalf("transfer to another user: %v %+v", err, r)
		}
		b := connect(t, endpoint, asUser(t, endpoint, "user1", "password"))
		r, err = sendSvc(t, b, &ua.TransferSubscriptionsRequest{SubscriptionIDs: []uint32{sub, 999}, SendInitialValues: true})
		if err != nil {
			t.Fatal(err)
		}
		res := r.(*ua.TransferSubscriptionsResponse).Results
		if res[0].StatusCode != ua.StatusOK || res[1].StatusCode != ua.StatusBadSubscriptionIDInvalid {
			t.Fatalf("transfer results %v, %v", res[0].StatusCode, res[1].StatusCode)
		}
		if len(res[0].AvailableSequenceNumbers) == 0 {
			t.Error("no sequence numbers available after the transfer")
		}
		// The old session is told (Part 4 5.13.7), once; then it has
		// nothing left.
		r, err = sendSvc(t, a, &ua.PublishRequest{})
		if err != nil {
			t.Fatalf("Publish on the old session: %v, want the status change", err)
		}
		pr := r.(*ua.PublishResponse)
		var change *ua.StatusChangeNotification
		if msg := pr.NotificationMessage; msg != nil && len(msg.NotificationData) == 1 {
			change, _ = msg.NotificationData[0].Value.(*ua.StatusChangeNotification)
		}
		if pr.SubscriptionID != sub || change == nil || change.Status != ua.StatusGoodSubscriptionTransferred {
			t.Errorf("Publish on the old session = %+v, want a StatusChangeNotification GoodSubscriptionTransferred for %d", pr, sub)
		}
		if _, err := sendSvc(t, a, &ua.PublishRequest{}); !errors.Is(err, ua.StatusBadNoSubscription) {
			t.Errorf("second Publish on the old session = %v, want BadNoSubscription", err)
		}
		next := dataMessage(t, b, sub)
		switch {
		case !fault && (next == nil || next.SequenceNumber <= first.SequenceNumber):
			t.Errorf("data after the transfer: %+v (before: %d)", next, first.SequenceNumber)
		case fault && next != nil:
			t.Errorf("transfer-drops: data after the transfer: %+v", next)
		}
		if items := srv.subs.Stats().Items; fault != (items == 0) {
			t.Errorf("fault %v: %d live items after the transfer", fault, items)
		}
	}
}

// TestTransferNoStatusChangeFault: after TransferSubscriptions the old
// session's Publish is answered with the StatusChangeNotification
// Good_SubscriptionTransferred (Part 4 5.14.7.1); with
// transfer-no-status-change it is answered BadNoSubscription at once.
func TestTransferNoStatusChangeFault(t *testing.T) {
	for _, fault := range []bool{false, true} {
		endpoint, _ := startServer(t, Config{Counters: 4, Faults: Faults{catalog.FaultTransferNoStatusChange: fault}})
		a := connect(t, endpoint, asUser(t, endpoint, "user1", "password"))
		sub := subscribeCounter(t, a)
		if dataMessage(t, a, sub) == nil {
			t.Fatal("no data message")
		}
		b := connect(t, endpoint, asUser(t, endpoint, "user1", "password"))
		r, err := sendSvc(t, b, &ua.TransferSubscriptionsRequest{SubscriptionIDs: []uint32{sub}})
		if err != nil || r.(*ua.TransferSubscriptionsResponse).Results[0].StatusCode != ua.StatusOK {
			t.Fatalf("transfer: %v %+v", err, r)
		}
		r, err = sendSvc(t, a, &ua.PublishRequest{})
		if fault {
			if !errors.Is(err, ua.StatusBadNoSubscription) {
				t.Errorf("transfer-no-status-change: Publish on the old session = %v %+v, want BadNoSubscription", err, r)
			}
			continue
		}
		var change *ua.StatusChangeNotification
		if err == nil {
			if msg := r.(*ua.PublishResponse).NotificationMessage; msg != nil && len(msg.NotificationData) == 1 {
				change, _ = msg.NotificationData[0].Value.(*ua.StatusChangeNotification)
			}
		}
		if change == nil || change.Status != ua.StatusGoodSubscriptionTransferred {
			t.Errorf("Publish on the old session = %v %+v, want the StatusChangeNotification GoodSubscriptionTransferred", err, r)
		}
	}
}
