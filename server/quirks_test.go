package server

import (
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/gopcua/opcua/ua"

	"github.com/opcua-chaos/opcua-chaos/server/catalog"
)

// TestParseQuirks: every declared quirk parses, the set prints sorted, and
// an unknown name is one error line listing the valid ones.
func TestParseQuirks(t *testing.T) {
	var names []string
	for _, q := range catalog.AllQuirks() {
		names = append(names, string(q))
	}
	qs, err := ParseQuirks(" " + strings.Join(names, " , ") + ",")
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range catalog.AllQuirks() {
		if !qs.Has(q) {
			t.Errorf("%s not on", q)
		}
	}
	if got, want := qs.String(), strings.Join(slices.Sorted(slices.Values(names)), ","); got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	if got := (Quirks{}).String(); got != "none" {
		t.Errorf("empty String() = %q", got)
	}
	_, err = ParseQuirks("min-sampling-50ms,fast-everything")
	if err == nil || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), `"fast-everything"`) ||
		!strings.Contains(err.Error(), "retain-freed-memory") {
		t.Errorf("unknown quirk: err = %v", err)
	}
}

// TestLoadConfigQuirks: OPCUA_QUIRKS and -quirks switch quirks on; a bad
// name is an error naming OPCUA_QUIRKS.
func TestLoadConfigQuirks(t *testing.T) {
	getenv := func(v string) func(string) string {
		return func(k string) string {
			if k == "OPCUA_QUIRKS" {
				return v
			}
			return ""
		}
	}
	cfg, err := LoadConfig(nil, getenv("min-sampling-50ms"), io.Discard)
	if err != nil || !cfg.Quirks.Has(catalog.QuirkMinSampling50ms) || cfg.Quirks.Has(catalog.QuirkNoCertOnNone) {
		t.Errorf("env: quirks %v, err %v", cfg.Quirks, err)
	}
	cfg, err = LoadConfig([]string{"-quirks", "no-cert-on-none"}, getenv(""), io.Discard)
	if err != nil || !cfg.Quirks.Has(catalog.QuirkNoCertOnNone) {
		t.Errorf("flag: quirks %v, err %v", cfg.Quirks, err)
	}
	if _, err = LoadConfig(nil, getenv("bogus"), io.Discard); err == nil || !strings.HasPrefix(err.Error(), "OPCUA_QUIRKS: unknown quirk \"bogus\"") {
		t.Errorf("bad quirk: err = %v", err)
	}
}

// TestQuirkMinSampling50ms: under min-sampling-50ms a requested 10 ms
// sampling interval is revised to 50 ms and 100 ms stays 100 ms; without
// it 10 ms is granted.
func TestQuirkMinSampling50ms(t *testing.T) {
	for _, tc := range []struct {
		quirks   Quirks
		want10ms float64
	}{{Quirks{catalog.QuirkMinSampling50ms: true}, 50}, {nil, 10}} {
		t.Run(tc.quirks.String(), func(t *testing.T) {
			endpoint, _ := startServer(t, Config{Counters: 4, Quirks: tc.quirks})
			c := connect(t, endpoint)
			r, err := sendSvc(t, c, &ua.CreateSubscriptionRequest{RequestedPublishingInterval: 100, PublishingEnabled: true})
			if err != nil {
				t.Fatal(err)
			}
			sub := r.(*ua.CreateSubscriptionResponse).SubscriptionID
			item := func(handle uint32, ms float64) *ua.MonitoredItemCreateRequest {
				return &ua.MonitoredItemCreateRequest{
					ItemToMonitor:  &ua.ReadValueID{NodeID: counter("SampledCounter.1"), AttributeID: ua.AttributeIDValue, DataEncoding: &ua.QualifiedName{}},
					MonitoringMode: ua.MonitoringModeReporting,
					RequestedParameters: &ua.MonitoringParameters{
						ClientHandle: handle, SamplingInterval: ms, QueueSize: 1, DiscardOldest: true, Filter: ua.NewExtensionObject(nil),
					},
				}
			}
			r, err = sendSvc(t, c, &ua.CreateMonitoredItemsRequest{
				SubscriptionID: sub, TimestampsToReturn: ua.TimestampsToReturnBoth,
				ItemsToCreate: []*ua.MonitoredItemCreateRequest{item(1, 10), item(2, 100)},
			})
			if err != nil {
				t.Fatal(err)
			}
			res := r.(*ua.CreateMonitoredItemsResponse).Results
			if len(res) != 2 || res[0].StatusCode != ua.StatusOK || res[1].StatusCode != ua.StatusOK {
				t.Fatalf("create results %+v", res)
			}
			if got := res[0].RevisedSamplingInterval; got != tc.want10ms {
				t.Errorf("10 ms revised to %v ms, want %v", got, tc.want10ms)
			}
			if got := res[1].RevisedSamplingInterval; got != 100 {
				t.Errorf("100 ms revised to %v ms, want 100", got)
			}
		})
	}
}

// TestRetainerKeepsPeakWithoutGrowing: the ballast fills what the runtime
// freed up to its peak, gives way when a later burst of the same size needs
// the memory again (the total stays at the peak), and the total grows only
// with a bigger burst.
func TestRetainerKeepsPeakWithoutGrowing(t *testing.T) {
	const mib = 1 << 20
	var r retainer
	defer r.b.resize(0)
	for i, tc := range []struct{ held, wantBallast uint64 }{
		{10 * mib, 0},        // baseline
		{60 * mib, 0},        // first burst
		{12 * mib, 48 * mib}, // after it: freed memory retained
		{60 * mib, 0},        // second burst: the ballast gives way
		{11 * mib, 49 * mib},
		{70 * mib, 0}, // a bigger burst raises the peak
		{10 * mib, 60 * mib},
	} {
		r.step(tc.held)
		if got := r.b.size(); got != tc.wantBallast {
			t.Errorf("step %d (held %d MiB): ballast %d MiB, want %d", i, tc.held/mib, got/mib, tc.wantBallast/mib)
		}
		if total := tc.held + r.b.size(); total > r.peak {
			t.Errorf("step %d: total %d MiB above the peak %d MiB", i, total/mib, r.peak/mib)
		}
	}
}

// TestQuirkNoTestNodes: under no-test-nodes the service-time nodes and the
// sampled counters are unknown, to Read and to CreateMonitoredItems; the
// read-only diagnostics stay. Without it they are served.
func TestQuirkNoTestNodes(t *testing.T) {
	for _, quirk := range []bool{false, true} {
		cfg := Config{}
		want := ua.StatusOK
		if quirk {
			cfg.Quirks, want = Quirks{catalog.QuirkNoTestNodes: true}, ua.StatusBadNodeIDUnknown
		}
		endpoint, _ := startServer(t, cfg)
		c := connect(t, endpoint, anonymous(t, endpoint))
		res := readValues(t, c, counter("Slow.10"), counter("Busy.10"), counter("SampledCounter.0"), counter("FastCounter.0"), counter(NodeQueueDepth))
		for i, dv := range res[:4] {
			if dv.Status != want {
				t.Errorf("quirk %v: node %d status %v, want %v", quirk, i, dv.Status, want)
			}
		}
		if res[4].Status != ua.StatusOK {
			t.Errorf("quirk %v: %s status %v, want the diagnostics kept", quirk, NodeQueueDepth, res[4].Status)
		}
		r, err := sendSvc(t, c, &ua.CreateSubscriptionRequest{RequestedPublishingInterval: 20, RequestedLifetimeCount: 1000, RequestedMaxKeepAliveCount: 10, PublishingEnabled: true})
		if err != nil {
			t.Fatal(err)
		}
		r, err = sendSvc(t, c, &ua.CreateMonitoredItemsRequest{
			SubscriptionID: r.(*ua.CreateSubscriptionResponse).SubscriptionID, TimestampsToReturn: ua.TimestampsToReturnSource,
			ItemsToCreate: []*ua.MonitoredItemCreateRequest{{
				ItemToMonitor:       &ua.ReadValueID{NodeID: counter("SampledCounter.1"), AttributeID: ua.AttributeIDValue, DataEncoding: &ua.QualifiedName{}},
				MonitoringMode:      ua.MonitoringModeReporting,
				RequestedParameters: &ua.MonitoringParameters{ClientHandle: 1, SamplingInterval: 10, QueueSize: 10, DiscardOldest: true, Filter: ua.NewExtensionObject(nil)},
			}},
		})
		if err != nil {
			t.Fatal(err)
		}
		if got := r.(*ua.CreateMonitoredItemsResponse).Results[0].StatusCode; got != want {
			t.Errorf("quirk %v: monitored item on SampledCounter.1: %v, want %v", quirk, got, want)
		}
	}
}
