package server

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/gopcua/opcua"
	"github.com/gopcua/opcua/ua"

	"github.com/opcua-chaos/opcua-chaos/fixtures/subprobe"
	"github.com/opcua-chaos/opcua-chaos/server/catalog"
)

func defaultProbe(endpoint, kind string, items int) subprobe.Config {
	return subprobe.Config{
		Endpoint: endpoint, Kind: kind, Items: items,
		Sampling: 10 * time.Millisecond, Publishing: 100 * time.Millisecond,
		Outstanding: 8, Warmup: 500 * time.Millisecond, Windows: 3, Window: time.Second,
		Measure: subprobe.Delivered,
	}
}

// e2eItems is the large item count of the end-to-end measurements: 1024,
// or 32 under -race (run without -race for the full figure:
// go test -run 'TestSubscription' -v ./server/).
func e2eItems(t *testing.T) int {
	if raceEnabled {
		t.Log("-race build: 32 items instead of 1024 (go test -run TestSubscription ./server/ for 1024)")
		return 32
	}
	return 1024
}

// TestSubscription100Hz: a gopcua client subscribed to 1 and 1024
// SampledCounter and FastCounter items at 10 ms, with 8 Publish requests
// outstanding, receives ≥ 99 % of the samples of every item (median of
// three 1 s windows, judged by SourceTimestamp), and no SampledCounter
// value is lost in a queue.
func TestSubscription100Hz(t *testing.T) {
	if testing.Short() {
		t.Skip("real-time measurement")
	}
	endpoint, _ := startServer(t, Config{Counters: 1024})
	for _, kind := range []string{"SampledCounter", "FastCounter"} {
		for _, items := range []int{1, e2eItems(t)} {
			t.Run(fmt.Sprintf("%s/%d", kind, items), func(t *testing.T) {
				// Best of up to 3 attempts: a busy shared machine can only
				// make a run look worse, so one clean run shows the server
				// holds the rate (the drift test keeps the bar honest).
				res, err := subprobe.Best(context.Background(), defaultProbe(endpoint, kind, items), 3, 0.99, func(a int, r subprobe.Result) {
					t.Logf("attempt %d, %s × %d at 10 ms: %v; server %s", a, kind, items, r, samplingStats(t, endpoint))
				})
				if err != nil {
					t.Fatal(err)
				}
				if res.Median < 0.99 {
					t.Errorf("median fraction %.4f < 0.99 (%v)", res.Median, res)
				}
				if res.Gaps > 0 {
					t.Errorf("%d SampledCounter values lost between notifications", res.Gaps)
				}
			})
		}
	}
}

// TestSubscriptionSamplingDriftCaught: with the sampling-drift fault the
// same measurement of 1024 (32 under -race) SampledCounter items falls
// below 99 %.
func TestSubscriptionSamplingDriftCaught(t *testing.T) {
	if testing.Short() {
		t.Skip("real-time measurement")
	}
	endpoint, _ := startServer(t, Config{Counters: 1024, Faults: Faults{catalog.FaultSamplingDrift: true}})
	n := e2eItems(t)
	// Best of 2 attempts (pass 2.0 never stops early), as generous as the
	// clean test's best of 3 needs to be for a result this far below.
	res, err := subprobe.Best(context.Background(), defaultProbe(endpoint, "SampledCounter", n), 2, 2, func(a int, r subprobe.Result) {
		t.Logf("attempt %d, sampling-drift, SampledCounter × %d at 10 ms: %v; server %s", a, n, r, samplingStats(t, endpoint))
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Median >= 0.99 {
		t.Errorf("sampling-drift not caught: median fraction %.4f ≥ 0.99", res.Median)
	}
}

// samplingStats reads the server's sampling diagnostics nodes.
func samplingStats(t testing.TB, endpoint string) string {
	t.Helper()
	c, err := dial(endpoint)
	if err != nil {
		return "stats: " + err.Error()
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = c.Close(ctx)
	}()
	names := []string{NodeSamplingCycles, NodeSamplingLate, NodeSamplingMissed, NodeSamplingMaxLateness, NodeNotifications}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := &ua.ReadRequest{}
	for _, n := range names {
		req.NodesToRead = append(req.NodesToRead, &ua.ReadValueID{NodeID: counter(n), AttributeID: ua.AttributeIDValue})
	}
	resp, err := c.Read(ctx, req)
	if err != nil {
		return "stats: " + err.Error()
	}
	out := ""
	for i, dv := range resp.Results {
		if dv.Value != nil {
			out += fmt.Sprintf("%s=%v ", names[i], dv.Value.Value())
		}
	}
	return out
}

// TestLoadConfigSubscriptions: OPCUA_COUNTERS and the two subscription
// fault names.
func TestLoadConfigSubscriptions(t *testing.T) {
	env := map[string]string{"OPCUA_COUNTERS": "100", "OPCUA_FAULTS": "sampling-drift,publish-drop"}
	cfg, err := LoadConfig(nil, func(k string) string { return env[k] }, io.Discard)
	if err != nil || cfg.Counters != 100 || !cfg.Faults.Has(catalog.FaultSamplingDrift) || !cfg.Faults.Has(catalog.FaultPublishDrop) {
		t.Fatalf("cfg %+v, err %v", cfg, err)
	}
	for _, v := range []string{"0", "-3", "x", "1000001"} {
		env := map[string]string{"OPCUA_COUNTERS": v}
		if _, err := LoadConfig(nil, func(k string) string { return env[k] }, io.Discard); err == nil || !strings.Contains(err.Error(), "OPCUA_COUNTERS") {
			t.Errorf("OPCUA_COUNTERS=%s: err %v", v, err)
		}
	}
}

// sendSvc sends one request on c and returns the response or the service
// fault as an error.
func sendSvc(t *testing.T, c *opcua.Client, req ua.Request) (ua.Response, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var resp ua.Response
	err := c.Send(ctx, req, func(r ua.Response) error { resp = r; return nil })
	if err == nil {
		if f, ok := resp.(*ua.ServiceFault); ok {
			err = f.ResponseHeader.ServiceResult
		}
	}
	return resp, err
}

func readInt(t *testing.T, c *opcua.Client, name string) int64 {
	t.Helper()
	v, _ := readValues(t, c, counter(name))[0].Value.Value().(int64)
	return v
}

// TestSubscriptionServicesOverTheWire: the services answer through the
// server's dispatch: a 0 ms publishing interval and 0.1 ms sampling are
// revised to 1 ms, SampledCounter moves only when sampled (Read does not
// move it), Publish returns data, Republish serves an unacknowledged
// message, CloseSession deletes the subscription and its sampling group.
func TestSubscriptionServicesOverTheWire(t *testing.T) {
	endpoint, srv := startServer(t, Config{Counters: 16})
	c := connect(t, endpoint)
	before := readInt(t, c, "SampledCounter.3")
	if again := readInt(t, c, "SampledCounter.3"); again != before {
		t.Fatalf("Read moved SampledCounter.3: %d → %d", before, again)
	}
	r, err := sendSvc(t, c, &ua.CreateSubscriptionRequest{RequestedPublishingInterval: 0, PublishingEnabled: true})
	if err != nil {
		t.Fatal(err)
	}
	cs := r.(*ua.CreateSubscriptionResponse)
	if want := float64(DefaultMinPublishingInterval / time.Millisecond); cs.RevisedPublishingInterval != want {
		t.Errorf("revised publishing interval %v, want %v (the minimum)", cs.RevisedPublishingInterval, want)
	}
	if _, err := sendSvc(t, c, &ua.ModifySubscriptionRequest{SubscriptionID: cs.SubscriptionID, RequestedPublishingInterval: 20}); err != nil {
		t.Fatal(err)
	}
	r, err = sendSvc(t, c, &ua.CreateMonitoredItemsRequest{
		SubscriptionID: cs.SubscriptionID, TimestampsToReturn: ua.TimestampsToReturnBoth,
		ItemsToCreate: []*ua.MonitoredItemCreateRequest{{
			ItemToMonitor:  &ua.ReadValueID{NodeID: counter("SampledCounter.3"), AttributeID: ua.AttributeIDValue, DataEncoding: &ua.QualifiedName{}},
			MonitoringMode: ua.MonitoringModeReporting,
			RequestedParameters: &ua.MonitoringParameters{
				ClientHandle: 7, SamplingInterval: 0.1, QueueSize: 100, DiscardOldest: true, Filter: ua.NewExtensionObject(nil),
			},
		}, {
			ItemToMonitor:       &ua.ReadValueID{NodeID: counter("SampledCounter.99"), AttributeID: ua.AttributeIDValue, DataEncoding: &ua.QualifiedName{}},
			MonitoringMode:      ua.MonitoringModeReporting,
			RequestedParameters: &ua.MonitoringParameters{ClientHandle: 8, Filter: ua.NewExtensionObject(nil)},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	res := r.(*ua.CreateMonitoredItemsResponse).Results
	if res[0].StatusCode != ua.StatusOK || res[0].RevisedSamplingInterval != 1 || res[1].StatusCode != ua.StatusBadNodeIDUnknown {
		t.Fatalf("create results: %v/%v, %v", res[0].StatusCode, res[0].RevisedSamplingInterval, res[1].StatusCode)
	}
	var msg *ua.NotificationMessage
	for i := 0; msg == nil && i < 20; i++ {
		r, err := sendSvc(t, c, &ua.PublishRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if p := r.(*ua.PublishResponse); len(p.NotificationMessage.NotificationData) > 0 {
			msg = p.NotificationMessage
		}
	}
	if msg == nil {
		t.Fatal("no data message in 20 Publish responses")
	}
	dc := msg.NotificationData[0].Value.(*ua.DataChangeNotification)
	if len(dc.MonitoredItems) == 0 || dc.MonitoredItems[0].ClientHandle != 7 {
		t.Fatalf("notifications %+v", dc.MonitoredItems)
	}
	if v := dc.MonitoredItems[0].Value.Value.Value().(int64); v != before+1 {
		t.Errorf("first sample %d, want %d", v, before+1)
	}
	r, err = sendSvc(t, c, &ua.RepublishRequest{SubscriptionID: cs.SubscriptionID, RetransmitSequenceNumber: msg.SequenceNumber})
	if err != nil || r.(*ua.RepublishResponse).NotificationMessage.SequenceNumber != msg.SequenceNumber {
		t.Fatalf("Republish: %v", err)
	}
	if n := readInt(t, c, NodeSubscriptions); n != 1 {
		t.Fatalf("Subscription.Count %d", n)
	}
	// CloseSession deletes the subscription and stops its sampling group.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "subscriptions deleted", func() bool {
		st := srv.subs.Stats()
		groups, _ := srv.subs.Sampler().Stats()
		return st.Subscriptions == 0 && st.Items == 0 && len(groups) == 0
	})
}

// TestPublishDropFaultOverTheWire: with publish-drop, of 150 Publish
// requests outstanding only 3 are kept and the others are never answered
// (the client times them out), and the channel keeps serving: the dropped
// requests do not hold backpressure slots (high mark 100).
func TestPublishDropFaultOverTheWire(t *testing.T) {
	endpoint, srv := startServer(t, Config{Counters: 4, Faults: Faults{catalog.FaultPublishDrop: true}})
	c := connect(t, endpoint)
	r, err := sendSvc(t, c, &ua.CreateSubscriptionRequest{RequestedPublishingInterval: 50, RequestedMaxKeepAliveCount: 1000, PublishingEnabled: true})
	if err != nil {
		t.Fatal(err)
	}
	if r.(*ua.CreateSubscriptionResponse).SubscriptionID == 0 {
		t.Fatal("no subscription id")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	for range 150 {
		go func() { _ = c.Send(ctx, &ua.PublishRequest{}, func(ua.Response) error { return nil }) }()
	}
	// 3 are kept; the subscription's first publishing cycle may answer one
	// of them with a keep-alive while the others still arrive, which makes
	// room for one more: 146 or 147 are dropped.
	waitFor(t, "146 or 147 Publish requests dropped", func() bool { return srv.subs.Stats().Dropped >= 146 })
	if d := srv.subs.Stats().Dropped; d > 147 {
		t.Fatalf("%d Publish requests dropped, want at most 147 (3 kept)", d)
	}
	if v := readInt(t, c, NodeSubscriptions); v != 1 {
		t.Fatalf("Subscription.Count %d after the drops", v)
	}
}

// TestGopcuaSubscribeInterop: gopcua's own subscription API (one Publish
// outstanding, its acknowledgements and keep-alive handling) receives
// consecutive SampledCounter values from the server.
func TestGopcuaSubscribeInterop(t *testing.T) {
	endpoint, _ := startServer(t, Config{Counters: 4})
	c := connect(t, endpoint)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	notes := make(chan *opcua.PublishNotificationData, 100)
	sub, err := c.Subscribe(ctx, &opcua.SubscriptionParameters{Interval: 20 * time.Millisecond}, notes)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Cancel(context.Background()) }()
	item := opcua.NewMonitoredItemCreateRequestWithDefaults(counter("SampledCounter.1"), ua.AttributeIDValue, 42)
	item.RequestedParameters.SamplingInterval = 5
	item.RequestedParameters.QueueSize = 100
	if res, err := sub.Monitor(ctx, ua.TimestampsToReturnBoth, item); err != nil || res.Results[0].StatusCode != ua.StatusOK {
		t.Fatalf("Monitor: %v", err)
	}
	var last int64
	for n := 0; n < 50; {
		select {
		case <-ctx.Done():
			t.Fatalf("only %d values after 10 s", n)
		case d := <-notes:
			if d.Error != nil {
				t.Fatal(d.Error)
			}
			dc, ok := d.Value.(*ua.DataChangeNotification)
			if !ok {
				continue
			}
			for _, mi := range dc.MonitoredItems {
				v := mi.Value.Value.Value().(int64)
				if mi.ClientHandle != 42 || (last != 0 && v != last+1) {
					t.Fatalf("handle %d value %d after %d", mi.ClientHandle, v, last)
				}
				last = v
				n++
			}
		}
	}
}
