package subscription

import (
	"testing"
	"time"

	"github.com/gopcua/opcua/ua"

	"github.com/opcua-chaos/opcua-chaos/server/internal/budget"
)

// TestLazyQueueRing: a queue grows as values arrive, never beyond its
// size, and keeps its values in order across growth and wrap-around.
func TestLazyQueueRing(t *testing.T) {
	it := &MonitoredItem{size: 10, discardOldest: true}
	if len(it.buf) != 0 {
		t.Fatal("a new queue is allocated")
	}
	next, want := int64(1), int64(1)
	push := func(k int) {
		for range k {
			it.push(int64Value(next, time.Time{}))
			next++
		}
	}
	drain := func(k int) {
		for _, dv := range it.drainLocked(k) {
			if got := dv.Value.Value().(int64); got != want {
				t.Fatalf("drained %d, want %d", got, want)
			}
			want++
		}
	}
	push(3) // 4 slots
	drain(2)
	push(4) // wraps, then grows to 8 with the head moved
	if len(it.buf) != 8 || it.n != 5 {
		t.Fatalf("ring %d slots, %d values; want 8, 5", len(it.buf), it.n)
	}
	drain(1)
	push(6) // grows to the queue size, 10
	if len(it.buf) != 10 || it.n != 10 {
		t.Fatalf("ring %d slots, %d values; want 10, 10", len(it.buf), it.n)
	}
	drain(0)
	if it.discarded != 0 {
		t.Errorf("discarded %d", it.discarded)
	}
	push(12) // 2 discarded, the oldest
	want += 2
	drain(0)
	if len(it.buf) != 10 || it.discarded != 2 {
		t.Errorf("ring %d slots, %d discarded", len(it.buf), it.discarded)
	}
	// Shrinking keeps the newest values, allocating only for them.
	push(5)
	it.resize(3, false)
	want += 2
	if len(it.buf) != 3 || it.n != 3 {
		t.Errorf("after resize: ring %d slots, %d values", len(it.buf), it.n)
	}
	drain(0)
	it.resize(100, true)
	if len(it.buf) != 100 {
		t.Errorf("eager resize: ring %d slots", len(it.buf))
	}
}

// TestItemBudget: each item is charged its queue size × ValueSize while it
// lives: an item beyond the budget gets BadResourceUnavailable (the call
// succeeds), Modify charges a growth and releases a shrink, deletion,
// DeleteSubscriptions and a closed session release, and a transfer keeps
// the charge. Queue sizes are revised down to MaxQueueSize.
func TestItemBudget(t *testing.T) {
	// Items share: 1 MiB / 2 = 512 KiB; an item of 1000 values costs
	// 192 000 bytes: 2 fit.
	b := budget.New(1 << 20)
	h := newHarness(t, Options{Budget: b})
	perItem := int64(DefaultMaxQueueSize * DefaultValueSize)
	sub := h.createSub(100, 10, 100, 0)
	req := &ua.CreateMonitoredItemsRequest{RequestHeader: hdr(), SubscriptionID: sub, TimestampsToReturn: ua.TimestampsToReturnBoth}
	for i := range 4 {
		req.ItemsToCreate = append(req.ItemsToCreate, &ua.MonitoredItemCreateRequest{
			ItemToMonitor:       &ua.ReadValueID{NodeID: ua.NewStringNodeID(1, SampledCounterPrefix+itoa(i)), AttributeID: ua.AttributeIDValue},
			MonitoringMode:      ua.MonitoringModeReporting,
			RequestedParameters: &ua.MonitoringParameters{ClientHandle: uint32(i), SamplingInterval: 1, QueueSize: 10_000, DiscardOldest: true},
		})
	}
	resp, ok := h.s.CreateMonitoredItems(req).(*ua.CreateMonitoredItemsResponse)
	if !ok {
		t.Fatal("CreateMonitoredItems failed")
	}
	var ids []uint32
	for i, res := range resp.Results {
		switch {
		case i < 2 && (res.StatusCode != ua.StatusOK || res.RevisedQueueSize != DefaultMaxQueueSize):
			t.Errorf("item %d: %v, queue %d", i, res.StatusCode, res.RevisedQueueSize)
		case i >= 2 && res.StatusCode != ua.StatusBadResourceUnavailable:
			t.Errorf("item %d beyond the budget: %v", i, res.StatusCode)
		}
		if res.StatusCode == ua.StatusOK {
			ids = append(ids, res.MonitoredItemID)
		}
	}
	if got := b.UsedBy(budget.Items); got != 2*perItem {
		t.Fatalf("charged %d, want %d", got, 2*perItem)
	}
	if n := h.m.Stats().Items; n != 2 {
		t.Errorf("%d live items, want 2 (a refused item is not counted)", n)
	}
	// Shrink one to 10 values, then grow it back.
	modify := func(q uint32) ua.StatusCode {
		r := h.s.ModifyMonitoredItems(&ua.ModifyMonitoredItemsRequest{RequestHeader: hdr(), SubscriptionID: sub,
			ItemsToModify: []*ua.MonitoredItemModifyRequest{{MonitoredItemID: ids[0],
				RequestedParameters: &ua.MonitoringParameters{SamplingInterval: 1, QueueSize: q, DiscardOldest: true}}}})
		return r.(*ua.ModifyMonitoredItemsResponse).Results[0].StatusCode
	}
	if code := modify(10); code != ua.StatusOK || b.UsedBy(budget.Items) != perItem+10*DefaultValueSize {
		t.Errorf("shrink: %v, charged %d", code, b.UsedBy(budget.Items))
	}
	// Another item fills the room the shrink left: growing back no longer fits.
	h.createItems(sub, SampledCounterPrefix, 1, 1, 1000)
	if code := modify(1000); code != ua.StatusBadResourceUnavailable {
		t.Errorf("growth beyond the budget: %v", code)
	}
	// A transfer keeps the charge.
	to, _ := h.m.Session("s2")
	before := b.UsedBy(budget.Items)
	if _, code := h.m.Transfer(sub, "s1", to, false, false); code != ua.StatusOK || b.UsedBy(budget.Items) != before {
		t.Errorf("transfer: %v, charged %d, want %d", code, b.UsedBy(budget.Items), before)
	}
	// Deleting an item releases it; closing the session releases the rest.
	to.DeleteMonitoredItems(&ua.DeleteMonitoredItemsRequest{RequestHeader: hdr(), SubscriptionID: sub, MonitoredItemIDs: ids[1:2]})
	if got := b.UsedBy(budget.Items); got != before-perItem {
		t.Errorf("after DeleteMonitoredItems: charged %d, want %d", got, before-perItem)
	}
	h.m.CloseSession("s2")
	if got := b.UsedBy(budget.Items); got != 0 {
		t.Errorf("after the session closed: charged %d", got)
	}

	// DeleteSubscriptions releases too.
	sub = h.createSub(100, 10, 100, 0)
	h.createItems(sub, SampledCounterPrefix, 2, 1, 50)
	h.s.DeleteSubscriptions(&ua.DeleteSubscriptionsRequest{RequestHeader: hdr(), SubscriptionIDs: []uint32{sub}})
	if got := b.UsedBy(budget.Items); got != 0 {
		t.Errorf("after DeleteSubscriptions: charged %d", got)
	}
}

// TestEagerQueuesFault: under the item-queues-unbounded fault's options (no
// budget, MaxQueueSize UnboundedQueueSize, EagerQueues) a queue size of
// 10 000 is granted and allocated at once.
func TestEagerQueuesFault(t *testing.T) {
	h := newHarness(t, Options{MaxQueueSize: UnboundedQueueSize, EagerQueues: true})
	sub := h.createSub(100, 10, 100, 0)
	ids := h.createItems(sub, SampledCounterPrefix, 1, 1, 10_000)
	h.s.mu.Lock()
	it := h.s.subs[sub].items[ids[0]]
	h.s.mu.Unlock()
	it.mu.Lock()
	defer it.mu.Unlock()
	if it.size != 10_000 || len(it.buf) != 10_000 {
		t.Errorf("queue size %d, %d slots allocated; want 10000, 10000", it.size, len(it.buf))
	}
}
