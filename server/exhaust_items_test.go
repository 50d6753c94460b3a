package server

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gopcua/opcua"
	"github.com/gopcua/opcua/ua"

	"github.com/opcua-chaos/opcua-chaos/server/catalog"
	"github.com/opcua-chaos/opcua-chaos/server/internal/subscription"
)

// Tests of issue 44 item 6: monitored items by their NodeId's size.

// ownerNode is the diagnostic node Owner.<owner>.Queued of an owner name
// of n copies of c: a pattern any name resolves.
func ownerNode(c byte, n int) *ua.NodeID {
	return counter(OwnerNode(strings.Repeat(string(c), n), "Queued"))
}

// monitor creates a subscription on c and one reporting item per node,
// sampled every ms with a queue of 1, and returns the results.
func monitor(t *testing.T, c *opcua.Client, nodes ...*ua.NodeID) []*ua.MonitoredItemCreateResult {
	t.Helper()
	r, err := sendSvc(t, c, &ua.CreateSubscriptionRequest{RequestedPublishingInterval: 1000, RequestedMaxKeepAliveCount: 10, RequestedLifetimeCount: 1000, PublishingEnabled: true})
	if err != nil {
		t.Fatal(err)
	}
	req := &ua.CreateMonitoredItemsRequest{SubscriptionID: r.(*ua.CreateSubscriptionResponse).SubscriptionID, TimestampsToReturn: ua.TimestampsToReturnBoth}
	for i, n := range nodes {
		req.ItemsToCreate = append(req.ItemsToCreate, &ua.MonitoredItemCreateRequest{
			ItemToMonitor:  &ua.ReadValueID{NodeID: n, AttributeID: ua.AttributeIDValue, DataEncoding: &ua.QualifiedName{}},
			MonitoringMode: ua.MonitoringModeReporting,
			RequestedParameters: &ua.MonitoringParameters{ClientHandle: uint32(i), SamplingInterval: 1, QueueSize: 1,
				DiscardOldest: true, Filter: ua.NewExtensionObject(&ua.DataChangeFilter{Trigger: ua.DataChangeTriggerStatusValue})},
		})
	}
	r, err = sendSvc(t, c, req)
	if err != nil {
		t.Fatalf("CreateMonitoredItems: %v", err)
	}
	return r.(*ua.CreateMonitoredItemsResponse).Results
}

// TestLongNodeIDsRefused: an item of a 1 MiB NodeId (Owner.<1 MiB>.Queued,
// which the diagnostic pattern resolves) is refused BadNodeIdInvalid, and
// so are a Read and a Browse of it; an item of a 4000-byte NodeId is
// granted and charged its NodeId and overhead beside its queue. Under the
// fault long-nodeids-kept the 1 MiB item is granted and every item is
// charged its queue only.
func TestLongNodeIDsRefused(t *testing.T) {
	const long, fits = 1 << 20, 4000
	longNode, fitsNode := ownerNode('a', long), ownerNode('b', fits)
	fitsLen := int64(len(fitsNode.StringID()))
	queue := int64(subscription.DefaultValueSize) // queue size 1

	ts := runServer(t, Config{})
	c := connect(t, ts.endpoint, anonymous(t, ts.endpoint))
	res := monitor(t, c, longNode, fitsNode, counter(NodeRequests))
	if res[0].StatusCode != ua.StatusBadNodeIDInvalid {
		t.Errorf("item of a %d-byte NodeId: %v, want BadNodeIdInvalid", long, res[0].StatusCode)
	}
	for i, r := range res[1:] {
		if r.StatusCode != ua.StatusOK {
			t.Fatalf("item %d: %v, want Good", i+1, r.StatusCode)
		}
	}
	want := 2*(queue+itemOverhead) + fitsLen + int64(len(NodeRequests))
	if got := readInt(t, c, NodeMemoryCharged+".items"); got != want {
		t.Errorf("Memory.Charged.items = %d, want %d (2 queues of 1 value, 2 × %d overhead, NodeIds of %d and %d bytes)",
			got, want, itemOverhead, fitsLen, len(NodeRequests))
	}
	if dv := readValues(t, c, longNode)[0]; dv.Status != ua.StatusBadNodeIDInvalid {
		t.Errorf("Read of a %d-byte NodeId: %v, want BadNodeIdInvalid", long, dv.Status)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	br, err := c.Browse(ctx, &ua.BrowseRequest{NodesToBrowse: []*ua.BrowseDescription{{NodeID: longNode, BrowseDirection: ua.BrowseDirectionForward, IncludeSubtypes: true}}})
	if err != nil {
		t.Fatal(err)
	}
	if br.Results[0].StatusCode != ua.StatusBadNodeIDInvalid {
		t.Errorf("Browse of a %d-byte NodeId: %v, want BadNodeIdInvalid", long, br.Results[0].StatusCode)
	}

	t.Run(string(catalog.FaultLongNodeIDsKept), func(t *testing.T) {
		ts := runServer(t, Config{Faults: Faults{catalog.FaultLongNodeIDsKept: true}})
		c := connect(t, ts.endpoint, anonymous(t, ts.endpoint))
		for i, r := range monitor(t, c, longNode, fitsNode) {
			if r.StatusCode != ua.StatusOK {
				t.Errorf("item %d under the fault: %v, want Good", i, r.StatusCode)
			}
		}
		if got := readInt(t, c, NodeMemoryCharged+".items"); got != 2*queue {
			t.Errorf("Memory.Charged.items = %d under the fault, want %d (the queues only)", got, 2*queue)
		}
	})
}

// TestSampleResolvedOnce: sampling an item of a 4000-byte NodeId takes
// its name from the NodeId once, when the item is created: 1000 samples
// allocate less than one copy of the name each. Under the fault
// long-nodeids-kept every sample copies it (ua.NodeID.StringID) again.
func TestSampleResolvedOnce(t *testing.T) {
	const nameLen, samples = 4000, 1000
	node := ownerNode('c', nameLen)
	perSample := func(faults Faults) float64 {
		ts := runServer(t, Config{Faults: faults})
		read, code := nodeSource{ts.Server}.Resolve(node, ua.AttributeIDValue)
		if code != ua.StatusOK {
			t.Fatalf("resolve: %v", code)
		}
		st := subscription.SampleTime{Wall: time.Now()}
		read(st) // warm
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for range samples {
			if dv := read(st); dv.Status != ua.StatusOK {
				t.Fatalf("sample: %v", dv.Status)
			}
		}
		runtime.ReadMemStats(&after)
		return float64(after.TotalAlloc-before.TotalAlloc) / samples
	}
	if b := perSample(nil); b >= nameLen {
		t.Errorf("%.0f bytes allocated per sample of a %d-byte name, want less than one copy of it", b, nameLen)
	}
	if b := perSample(Faults{catalog.FaultLongNodeIDsKept: true}); b < nameLen {
		t.Errorf("%.0f bytes allocated per sample under the fault, want a copy of the %d-byte name or more", b, nameLen)
	}
}
