package server

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/gopcua/opcua/id"
	"github.com/gopcua/opcua/ua"
	"github.com/gopcua/opcua/uacp"

	"github.com/opcua-chaos/opcua-chaos/internal/uawire"
)

// fuzzSeeds are valid encoded requests of every service the server serves
// (and some it does not), and issue 14's malformed ones.
func fuzzSeeds(t testing.TB) [][]byte {
	h := func() *ua.RequestHeader { return rawHeader(1) }
	rv := func(n *ua.NodeID) *ua.ReadValueID {
		return &ua.ReadValueID{NodeID: n, AttributeID: ua.AttributeIDValue, DataEncoding: &ua.QualifiedName{}}
	}
	item := func(name string, ms float64) *ua.MonitoredItemCreateRequest {
		return &ua.MonitoredItemCreateRequest{ItemToMonitor: rv(counter(name)), MonitoringMode: ua.MonitoringModeReporting,
			RequestedParameters: &ua.MonitoringParameters{ClientHandle: 1, SamplingInterval: ms, QueueSize: 2, Filter: ua.NewExtensionObject(&ua.DataChangeFilter{Trigger: ua.DataChangeTriggerStatusValue})}}
	}
	reqs := []ua.Request{
		&ua.ReadRequest{RequestHeader: h(), TimestampsToReturn: ua.TimestampsToReturnBoth, NodesToRead: []*ua.ReadValueID{
			rv(ua.NewNumericNodeID(0, id.Server_ServerStatus)), rv(counter(NodeSubscriptions)), rv(counter(NodeSamplingCycles)),
			rv(counter("Owner.user1.Queued")), rv(counter("Slow.5")), rv(counter("Busy.100")), rv(counter("SampledCounter.1")),
		}},
		&ua.WriteRequest{RequestHeader: h(), NodesToWrite: []*ua.WriteValue{{NodeID: counter("x"), AttributeID: ua.AttributeIDValue,
			Value: &ua.DataValue{EncodingMask: ua.DataValueValue, Value: ua.MustVariant([]*ua.Variant{ua.MustVariant(int32(1)), ua.MustVariant(&ua.DiagnosticInfo{})})}}}},
		&ua.CreateSubscriptionRequest{RequestHeader: h(), RequestedPublishingInterval: 5, RequestedLifetimeCount: 100, RequestedMaxKeepAliveCount: 5, PublishingEnabled: true},
		&ua.ModifySubscriptionRequest{RequestHeader: h(), SubscriptionID: 1, RequestedPublishingInterval: 2},
		&ua.CreateMonitoredItemsRequest{RequestHeader: h(), SubscriptionID: 1, TimestampsToReturn: ua.TimestampsToReturnBoth, ItemsToCreate: []*ua.MonitoredItemCreateRequest{
			item(NodeSubscriptions, 1), item(NodeSamplingSamples, 2), item("FastCounter.3", 1)}},
		&ua.ModifyMonitoredItemsRequest{RequestHeader: h(), SubscriptionID: 1, ItemsToModify: []*ua.MonitoredItemModifyRequest{{MonitoredItemID: 1, RequestedParameters: &ua.MonitoringParameters{SamplingInterval: 3, Filter: ua.NewExtensionObject(nil)}}}},
		&ua.SetMonitoringModeRequest{RequestHeader: h(), SubscriptionID: 1, MonitoringMode: ua.MonitoringModeDisabled, MonitoredItemIDs: []uint32{1, 2}},
		&ua.DeleteMonitoredItemsRequest{RequestHeader: h(), SubscriptionID: 1, MonitoredItemIDs: []uint32{1}},
		&ua.SetPublishingModeRequest{RequestHeader: h(), SubscriptionIDs: []uint32{1}},
		&ua.PublishRequest{RequestHeader: h(), SubscriptionAcknowledgements: []*ua.SubscriptionAcknowledgement{{SubscriptionID: 1, SequenceNumber: 1}}},
		&ua.RepublishRequest{RequestHeader: h(), SubscriptionID: 1, RetransmitSequenceNumber: 1},
		&ua.DeleteSubscriptionsRequest{RequestHeader: h(), SubscriptionIDs: []uint32{1, 2}},
		&ua.CancelRequest{RequestHeader: h(), RequestHandle: 1},
		&ua.GetEndpointsRequest{RequestHeader: h(), EndpointURL: "opc.tcp://x"},
		&ua.FindServersRequest{RequestHeader: h()},
		&ua.CreateSessionRequest{RequestHeader: h(), ClientDescription: &ua.ApplicationDescription{ApplicationName: ua.NewLocalizedText("f")}, SessionName: "f", ClientNonce: make([]byte, 32), RequestedSessionTimeout: 1000},
		&ua.ActivateSessionRequest{RequestHeader: h(), ClientSignature: &ua.SignatureData{}, UserIdentityToken: ua.NewExtensionObject(&ua.UserNameIdentityToken{PolicyID: PolicyUserName, UserName: "user1", Password: []byte("password")}), UserTokenSignature: &ua.SignatureData{}},
		&ua.CloseSessionRequest{RequestHeader: h(), DeleteSubscriptions: true},
		&ua.BrowseRequest{RequestHeader: h(), View: &ua.ViewDescription{ViewID: ua.NewTwoByteNodeID(0)}},
	}
	var out [][]byte
	for _, r := range reqs {
		out = append(out, encodeService(t, r))
	}
	return append(out, negativeVariantLength(t), hugeArrayClaim(t), []byte{}, []byte{1, 0, 0x77, 0x02})
}

// fuzzTarget is a server with a raw secure channel and an activated
// session, kept across fuzz inputs.
type fuzzTarget struct {
	ts     *testServer
	c      *uawire.Conn
	execs  int
	panics int64
}

func newFuzzTarget(t testing.TB) *fuzzTarget {
	// Login delays and backpressure would only slow the fuzzer down, and
	// the sessions the fuzzer creates (but never activates) must not take
	// every slot from the harness's own.
	ts := runServer(t, Config{
		LoginDelay: time.Millisecond, LoginDelayMax: time.Millisecond,
		HighMark: 10_000, LowMark: 5000, Counters: 16,
		MaxSessions: 1_000_000, MaxUnactivatedSessions: 500_000, UnactivatedTimeout: time.Second,
	})
	return &fuzzTarget{ts: ts}
}

// connect opens a fresh channel and session.
func (ft *fuzzTarget) connect(t *testing.T) {
	if ft.c != nil {
		ft.c.Close()
	}
	c, err := uawire.Dial(ft.ts.addr, uacp.Hello{})
	if err == nil {
		err = c.Open()
	}
	if err == nil {
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		err = c.Session(nil)
	}
	if err != nil {
		t.Fatalf("fuzz target: connect: %v", err)
	}
	ft.c = c
}

// prepare makes a request the fuzzer built usable on the target's
// session: its own authentication token and a short TimeoutHint (Slow and
// Busy nodes honour it), so that the fuzzer reaches the handlers instead of
// BadSessionIdInvalid. Bodies that do not decode are sent as they are.
func (ft *fuzzTarget) prepare(body []byte) []byte {
	v, err := ft.ts.decoder.DecodeService(body)
	req, ok := v.(ua.Request)
	if err != nil || !ok || req.Header() == nil {
		return body
	}
	h := req.Header()
	h.AuthenticationToken = ft.c.Token
	h.TimeoutHint = 200
	b, err := func() (b []byte, err error) {
		defer func() {
			if recover() != nil {
				err = errors.New("encode panicked")
			}
		}()
		return uawire.EncodeService(req)
	}()
	if err != nil {
		return body
	}
	return b
}

// exec sends one message body on the channel, then a Read, and requires
// the Read's answer within 5 s: the server did not crash, wedge or drop
// the channel, and recovered no panic.
func (ft *fuzzTarget) exec(t *testing.T, body []byte) {
	ft.execs++
	if ft.c == nil || ft.execs%200 == 0 || ft.ts.sessions.Lookup(ft.c.Token) == nil {
		// A new session now and then: subscriptions and parked Publish
		// requests of the old one go with it.
		if ft.c != nil {
			_, _ = ft.c.Send(&ua.CloseSessionRequest{DeleteSubscriptions: true})
		}
		ft.connect(t)
	}
	_ = ft.c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := ft.c.SendBody(ft.prepare(body)); err != nil {
		t.Fatalf("send: %v", err)
	}
	ping, err := ft.c.Send(&ua.ReadRequest{NodesToRead: []*ua.ReadValueID{{NodeID: ua.NewNumericNodeID(0, id.Server_ServerStatus_State), AttributeID: ua.AttributeIDValue, DataEncoding: &ua.QualifiedName{}}}})
	if err != nil {
		t.Fatalf("send ping: %v", err)
	}
	for {
		r, err := ft.c.Receive()
		var em *uawire.ErrorMessage
		switch {
		case errors.As(err, &em) && (em.Code == ua.StatusBadRequestTooLarge || em.Code == ua.StatusBadTCPMessageTooLarge):
			ft.c = nil // a body above the limits: the channel is closed by design
			return
		case err != nil:
			t.Fatalf("no answer to the Read after the input (%d bytes): %v", len(body), err)
		}
		if r.RequestID == ping {
			break
		}
	}
	if n := ft.ts.stats.panics.Load(); n != ft.panics {
		ft.panics = n
		t.Fatalf("the server recovered a panic handling the input")
	}
}

// FuzzHandleMessage feeds arbitrary service message bodies, after a valid
// Hello, OpenSecureChannel and session, through the server's decoding and
// dispatch over the wire; after each, the server must answer a Read on the
// same channel. The seed corpus runs with every go test.
//
//	go test -run XXX -fuzz FuzzHandleMessage -fuzztime 30s ./server
func FuzzHandleMessage(f *testing.F) {
	for _, b := range fuzzSeeds(f) {
		f.Add(b)
	}
	ft := newFuzzTarget(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		ft.exec(t, body)
	})
}

// TestHandleMessageMutations is a short fuzz run as a plain test: 400
// random mutations (bit flips, byte overwrites with boundary values,
// truncations, insertions) of the seeds through FuzzHandleMessage's
// harness, with a fixed seed.
func TestHandleMessageMutations(t *testing.T) {
	seeds := fuzzSeeds(t)
	ft := newFuzzTarget(t)
	rng := rand.New(rand.NewPCG(14, 2026))
	boundary := [][]byte{{0xff, 0xff, 0xff, 0xff}, {0xfe, 0xff, 0xff, 0xff}, {0xff, 0xff, 0xff, 0x7f}, {0, 0, 0, 0x80}, {0x40}, {0x80}}
	for i := range 400 {
		b := append([]byte(nil), seeds[rng.IntN(len(seeds))]...)
		for range 1 + rng.IntN(3) {
			if len(b) == 0 {
				break
			}
			at := rng.IntN(len(b))
			switch rng.IntN(4) {
			case 0:
				b[at] ^= 1 << rng.IntN(8)
			case 1:
				b = append(b[:at], append(append([]byte(nil), boundary[rng.IntN(len(boundary))]...), b[at:]...)...)
			case 2:
				copy(b[at:], boundary[rng.IntN(len(boundary))])
			case 3:
				b = b[:at]
			}
		}
		t.Run(fmt.Sprint(i), func(t *testing.T) { ft.exec(t, b) })
		if t.Failed() {
			t.Fatalf("input %d: % x", i, b)
		}
	}
	st := &ft.ts.stats
	t.Logf("%d requests, %d answered BadDecodingError, %d with another Bad result", st.requests.Load(), st.decodingErrors.Load(), st.rejectedRequests.Load()-st.decodingErrors.Load())
}
