package subscription

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/gopcua/opcua/ua"
)

type harness struct {
	t     *testing.T
	clk   *FakeClock
	m     *Manager
	s     *Session
	resps chan ua.Response
}

func newHarness(t *testing.T, opts Options) *harness {
	t.Helper()
	clk := NewFakeClock(time.Unix(1_700_000_000, 0))
	opts.Clock = clk
	if opts.Source == nil {
		opts.Source = NewCounters(1, 2048, clk)
	}
	m := New(context.Background(), opts)
	t.Cleanup(m.Close)
	s, _ := m.Session("s1")
	return &harness{t: t, clk: clk, m: m, s: s, resps: make(chan ua.Response, 1000)}
}

func hdr() *ua.RequestHeader { return &ua.RequestHeader{} }

func (h *harness) createSub(ms float64, keepAlive, lifetime, maxNotif uint32) uint32 {
	h.t.Helper()
	r := h.s.CreateSubscription(&ua.CreateSubscriptionRequest{
		RequestHeader: hdr(), RequestedPublishingInterval: ms, RequestedMaxKeepAliveCount: keepAlive,
		RequestedLifetimeCount: lifetime, MaxNotificationsPerPublish: maxNotif, PublishingEnabled: true,
	})
	cs, ok := r.(*ua.CreateSubscriptionResponse)
	if !ok {
		h.t.Fatalf("CreateSubscription: %#v", r)
	}
	return cs.SubscriptionID
}

func (h *harness) createItems(sub uint32, prefix string, n int, ms float64, queue uint32) []uint32 {
	h.t.Helper()
	req := &ua.CreateMonitoredItemsRequest{RequestHeader: hdr(), SubscriptionID: sub, TimestampsToReturn: ua.TimestampsToReturnBoth}
	for i := range n {
		req.ItemsToCreate = append(req.ItemsToCreate, &ua.MonitoredItemCreateRequest{
			ItemToMonitor:       &ua.ReadValueID{NodeID: ua.NewStringNodeID(1, prefix+itoa(i)), AttributeID: ua.AttributeIDValue},
			MonitoringMode:      ua.MonitoringModeReporting,
			RequestedParameters: &ua.MonitoringParameters{ClientHandle: uint32(i), SamplingInterval: ms, QueueSize: queue, DiscardOldest: true},
		})
	}
	r, ok := h.s.CreateMonitoredItems(req).(*ua.CreateMonitoredItemsResponse)
	if !ok {
		h.t.Fatal("CreateMonitoredItems failed")
	}
	var ids []uint32
	for i, res := range r.Results {
		if res.StatusCode != ua.StatusOK {
			h.t.Fatalf("item %d: %v", i, res.StatusCode)
		}
		ids = append(ids, res.MonitoredItemID)
	}
	return ids
}

func (h *harness) publish(budget int, acks ...*ua.SubscriptionAcknowledgement) {
	h.s.Publish(PublishCall{
		Request: &ua.PublishRequest{RequestHeader: hdr(), SubscriptionAcknowledgements: acks},
		Budget:  budget,
		Respond: func(r ua.Response) { h.resps <- r },
	})
}

// until steps the fake clock (n loops sleeping on it) until a response
// arrives, at most maxSteps times.
func (h *harness) until(n, maxSteps int) ua.Response {
	h.t.Helper()
	for range maxSteps {
		select {
		case r := <-h.resps:
			return r
		default:
		}
		if _, err := h.clk.Step(n, 5*time.Second); err != nil {
			h.t.Fatal(err)
		}
	}
	select {
	case r := <-h.resps:
		return r
	default:
	}
	h.t.Fatalf("no response after %d steps (now %v)", maxSteps, h.clk.Now())
	return nil
}

func (h *harness) none() {
	h.t.Helper()
	select {
	case r := <-h.resps:
		h.t.Fatalf("unexpected response %#v", r)
	default:
	}
}

func asPublish(t *testing.T, r ua.Response) *ua.PublishResponse {
	t.Helper()
	p, ok := r.(*ua.PublishResponse)
	if !ok {
		t.Fatalf("want a PublishResponse, got %#v", r)
	}
	return p
}

func faultCode(r ua.Response) ua.StatusCode {
	if f, ok := r.(*ua.ServiceFault); ok {
		return f.ResponseHeader.ServiceResult
	}
	return ua.StatusOK
}

// values returns the Int64 values per client handle of a data message.
func values(t *testing.T, msg *ua.NotificationMessage) map[uint32][]int64 {
	t.Helper()
	out := map[uint32][]int64{}
	for _, eo := range msg.NotificationData {
		dc, ok := eo.Value.(*DataChange)
		if !ok {
			t.Fatalf("unexpected notification %T", eo.Value)
		}
		for _, n := range dc.MonitoredItems {
			out[n.ClientHandle] = append(out[n.ClientHandle], n.Value.Value.Value().(int64))
		}
	}
	return out
}

func eqU32(a, b []uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestPublishAckRepublishSequence: sequence numbers count data messages
// from 1, keep-alives carry the next number without using it, acknowledged
// messages leave the retransmission queue, Republish serves the others, and
// SampledCounter values arrive without gaps.
func TestPublishAckRepublishSequence(t *testing.T) {
	h := newHarness(t, Options{})
	sub := h.createSub(100, 3, 30, 0)
	ids := h.createItems(sub, SampledCounterPrefix, 2, 10, 100)
	const loops = 2 // the 10 ms sampling group and the subscription

	next := map[uint32]int64{0: 1, 1: 1} // next expected value per handle
	check := func(msg *ua.NotificationMessage) {
		t.Helper()
		for hnd, vs := range values(t, msg) {
			for _, v := range vs {
				if next[hnd] < 0 { // resynchronise after a queue was cleared
					next[hnd] = v
				}
				if v != next[hnd] {
					t.Fatalf("seq %d handle %d: value %d, want %d (gap); values %v", msg.SequenceNumber, hnd, v, next[hnd], vs)
				}
				next[hnd]++
			}
		}
	}

	h.publish(0)
	h.publish(0)
	r1 := asPublish(t, h.until(loops, 20))
	if r1.NotificationMessage.SequenceNumber != 1 || !eqU32(r1.AvailableSequenceNumbers, []uint32{1}) {
		t.Fatalf("first message: seq %d, available %v", r1.NotificationMessage.SequenceNumber, r1.AvailableSequenceNumbers)
	}
	check(r1.NotificationMessage)
	if next[0] < 10 {
		t.Fatalf("first message carried only %d samples", next[0]-1)
	}
	r2 := asPublish(t, h.until(loops, 20))
	if r2.NotificationMessage.SequenceNumber != 2 || !eqU32(r2.AvailableSequenceNumbers, []uint32{1, 2}) {
		t.Fatalf("second message: seq %d, available %v", r2.NotificationMessage.SequenceNumber, r2.AvailableSequenceNumbers)
	}
	check(r2.NotificationMessage)

	h.publish(0,
		&ua.SubscriptionAcknowledgement{SubscriptionID: sub, SequenceNumber: 1},
		&ua.SubscriptionAcknowledgement{SubscriptionID: sub, SequenceNumber: 99},
		&ua.SubscriptionAcknowledgement{SubscriptionID: sub + 1000, SequenceNumber: 1},
	)
	r3 := asPublish(t, h.until(loops, 20))
	want := []ua.StatusCode{ua.StatusOK, ua.StatusBadSequenceNumberUnknown, ua.StatusBadSubscriptionIDInvalid}
	if len(r3.Results) != 3 || r3.Results[0] != want[0] || r3.Results[1] != want[1] || r3.Results[2] != want[2] {
		t.Fatalf("ack results %v, want %v", r3.Results, want)
	}
	if r3.NotificationMessage.SequenceNumber != 3 || !eqU32(r3.AvailableSequenceNumbers, []uint32{2, 3}) {
		t.Fatalf("third message: seq %d, available %v", r3.NotificationMessage.SequenceNumber, r3.AvailableSequenceNumbers)
	}
	check(r3.NotificationMessage)

	// Republish: 2 is available, 1 was acknowledged.
	rp, ok := h.s.Republish(&ua.RepublishRequest{RequestHeader: hdr(), SubscriptionID: sub, RetransmitSequenceNumber: 2}).(*ua.RepublishResponse)
	if !ok || rp.NotificationMessage.SequenceNumber != 2 || rp.NotificationMessage != r2.NotificationMessage {
		t.Fatalf("Republish(2) did not return message 2: %#v", rp)
	}
	if c := faultCode(h.s.Republish(&ua.RepublishRequest{RequestHeader: hdr(), SubscriptionID: sub, RetransmitSequenceNumber: 1})); c != ua.StatusBadMessageNotAvailable {
		t.Fatalf("Republish(1) after ack: %v, want BadMessageNotAvailable", c)
	}
	if c := faultCode(h.s.Republish(&ua.RepublishRequest{RequestHeader: hdr(), SubscriptionID: sub + 1000, RetransmitSequenceNumber: 2})); c != ua.StatusBadSubscriptionIDInvalid {
		t.Fatalf("Republish on unknown subscription: %v", c)
	}

	// Disable the items: after the keep-alive count of empty cycles a
	// keep-alive carries the next sequence number (4) without using it.
	mode := h.s.SetMonitoringMode(&ua.SetMonitoringModeRequest{RequestHeader: hdr(), SubscriptionID: sub, MonitoringMode: ua.MonitoringModeDisabled, MonitoredItemIDs: ids})
	if faultCode(mode) != ua.StatusOK {
		t.Fatal(faultCode(mode))
	}
	// Disabling clears the queues: values sampled since the last message
	// are gone.
	for hnd := range next {
		next[hnd] = -1
	}
	h.publish(0, &ua.SubscriptionAcknowledgement{SubscriptionID: sub, SequenceNumber: 2})
	var ka *ua.PublishResponse
	for range 3 { // a data message may still be due first
		r := asPublish(t, h.until(1, 40)) // only the subscription loop sleeps now
		if len(r.NotificationMessage.NotificationData) == 0 {
			ka = r
			break
		}
		check(r.NotificationMessage)
		h.publish(0)
	}
	if ka == nil {
		t.Fatal("no keep-alive")
	}
	seqKA := ka.NotificationMessage.SequenceNumber
	if last := ka.AvailableSequenceNumbers[len(ka.AvailableSequenceNumbers)-1]; seqKA != last+1 {
		t.Fatalf("keep-alive seq %d, want last data seq %d + 1", seqKA, last)
	}

	// Enable again: the next data message uses the keep-alive's number.
	h.s.SetMonitoringMode(&ua.SetMonitoringModeRequest{RequestHeader: hdr(), SubscriptionID: sub, MonitoringMode: ua.MonitoringModeReporting, MonitoredItemIDs: ids})
	h.publish(0)
	r5 := asPublish(t, h.until(loops, 20))
	if r5.NotificationMessage.SequenceNumber != seqKA {
		t.Fatalf("data after keep-alive: seq %d, want %d", r5.NotificationMessage.SequenceNumber, seqKA)
	}
	check(r5.NotificationMessage)
}

// TestPublishSplitsBySizeAndMaxNotifications: a backlog of 1024 values is
// spread over several responses, each within the size budget (encoded) and
// MaxNotificationsPerPublish, with MoreNotifications set on all but the
// last, and every value delivered once.
func TestPublishSplitsBySizeAndMaxNotifications(t *testing.T) {
	for _, c := range []struct {
		name     string
		budget   int
		maxNotif uint32
	}{
		{"size 4096", 4096, 0},
		{"size 65535", 0, 0},
		{"max 100", 0, 100},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, Options{})
			sub := h.createSub(1000, 10, 100, c.maxNotif)
			h.createItems(sub, FastCounterPrefix, 1024, 5000, 1) // initial samples only
			for range 40 {
				h.publish(c.budget)
			}
			// The cycle answers every request it can before its loop sleeps
			// again, so all responses are queued once until returns.
			all := []ua.Response{h.until(2, 10)}
			for len(h.resps) > 0 {
				all = append(all, <-h.resps)
			}
			budget := c.budget
			if budget == 0 {
				budget = DefaultMaxResponseBytes
			}
			seen := map[uint32]int{}
			msgs := 0
			for i, x := range all {
				r := asPublish(t, x)
				if len(r.NotificationMessage.NotificationData) == 0 {
					t.Fatalf("response %d is a keep-alive", i)
				}
				if r.MoreNotifications != (i < len(all)-1) {
					t.Errorf("response %d of %d: MoreNotifications %v", i, len(all), r.MoreNotifications)
				}
				msgs++
				body, err := ua.Encode(r)
				if err != nil {
					t.Fatal(err)
				}
				if size := len(body) + 28; size > budget {
					t.Errorf("message %d: %d bytes > budget %d", msgs, size, budget)
				}
				n := 0
				for hnd := range values(t, r.NotificationMessage) {
					seen[hnd]++
					n++
				}
				if c.maxNotif > 0 && n > int(c.maxNotif) {
					t.Errorf("message %d: %d notifications > %d", msgs, n, c.maxNotif)
				}
			}
			if len(seen) != 1024 {
				t.Errorf("%d of 1024 items delivered", len(seen))
			}
			for hnd, k := range seen {
				if k != 1 {
					t.Errorf("handle %d delivered %d times", hnd, k)
				}
			}
			t.Logf("%d messages", msgs)
			if c.budget == 4096 && msgs < 5 {
				t.Errorf("only %d messages for 1024 values in 4 KiB", msgs)
			}
		})
	}
}

// TestPublishQueueLimits: beyond MaxPublishRequests the oldest request is
// answered BadTooManyPublishRequests; Publish without subscriptions gives
// BadNoSubscription.
func TestPublishQueueLimits(t *testing.T) {
	h := newHarness(t, Options{MaxPublishRequests: 2})
	h.publish(0)
	if c := faultCode(<-h.resps); c != ua.StatusBadNoSubscription {
		t.Fatalf("no subscription: %v", c)
	}
	h.createSub(1000, 100, 1000, 0)
	h.publish(0)
	h.publish(0)
	h.none()
	h.publish(0)
	if c := faultCode(<-h.resps); c != ua.StatusBadTooManyPublishRequests {
		t.Fatalf("third request: %v", c)
	}
	if n := h.s.Pending(); n != 2 {
		t.Fatalf("%d pending, want 2", n)
	}
}

// TestPublishDropFault: with publish-drop, requests beyond
// PublishDropKeep are dropped without an answer.
func TestPublishDropFault(t *testing.T) {
	h := newHarness(t, Options{PublishDrop: true})
	h.createSub(1000, 100, 1000, 0)
	for range 5 {
		h.publish(0)
	}
	h.none()
	if n := h.s.Pending(); n != DefaultPublishDropKeep {
		t.Fatalf("%d pending, want %d", n, DefaultPublishDropKeep)
	}
	if d := h.m.Stats().Dropped; d != 5-DefaultPublishDropKeep {
		t.Fatalf("dropped %d", d)
	}
}

// TestSubscriptionLifetime: without Publish requests a subscription
// expires after its lifetime count of publishing cycles.
func TestSubscriptionLifetime(t *testing.T) {
	h := newHarness(t, Options{})
	h.createSub(100, 1, 3, 0)
	cycles := 0
	for ; cycles < 10 && len(h.s.Subscriptions()) > 0; cycles++ {
		ds, err := h.clk.WaitForSleepers(1, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		h.clk.Set(ds[0])
		// Wait until the loop sleeps again or has ended.
		for end := time.Now().Add(5 * time.Second); time.Now().Before(end); {
			if _, err := h.clk.WaitForSleepers(1, 5*time.Millisecond); err == nil || len(h.s.Subscriptions()) == 0 {
				break
			}
		}
	}
	if st := h.m.Stats(); st.Expired != 1 || st.Subscriptions != 0 || cycles != 3 {
		t.Fatalf("after %d cycles: stats %+v", cycles, st)
	}
}

// TestCloseSessionAnswersPending: closing a session deletes its
// subscriptions and answers its queued requests BadSessionClosed.
func TestCloseSessionAnswersPending(t *testing.T) {
	h := newHarness(t, Options{})
	sub := h.createSub(1000, 100, 1000, 0)
	h.createItems(sub, SampledCounterPrefix, 3, 10, 10)
	h.publish(0)
	h.m.CloseSession("s1")
	if c := faultCode(<-h.resps); c != ua.StatusBadSessionClosed {
		t.Fatalf("pending request: %v", c)
	}
	if st := h.m.Stats(); st.Subscriptions != 0 || st.Items != 0 {
		t.Fatalf("stats after close %+v", st)
	}
	groups, _ := h.m.Sampler().Stats()
	if len(groups) != 0 {
		t.Fatalf("sampling groups left: %+v", groups)
	}
}

// TestReviseIntervals: 0, negative, NaN and sub-millisecond intervals are
// revised to the 1 ms minimum, huge ones to the maximum.
func TestReviseIntervals(t *testing.T) {
	var o Options
	o.fill()
	ms := time.Millisecond
	for _, c := range []struct {
		in   float64
		want time.Duration
	}{
		{0, ms}, {-1, ms}, {math.NaN(), ms}, {math.Inf(1), ms}, {0.001, ms}, {0.999, ms},
		{1, ms}, {2.5, 2500 * time.Microsecond}, {1e18, time.Hour},
	} {
		if got := o.RevisePublishingInterval(c.in); got != c.want {
			t.Errorf("RevisePublishingInterval(%v) = %v, want %v", c.in, got, c.want)
		}
	}
	for _, c := range []struct {
		in   float64
		want time.Duration
	}{
		{-1, 250 * ms}, {0, ms}, {0.1, ms}, {math.NaN(), ms}, {10, 10 * ms}, {1e18, time.Hour},
	} {
		if got := o.ReviseSamplingInterval(c.in, 250*ms); got != c.want {
			t.Errorf("ReviseSamplingInterval(%v) = %v, want %v", c.in, got, c.want)
		}
	}
	lt, ka := o.ReviseCounts(ms, 0, 0)
	if ka != DefaultKeepAliveCount || lt < 3*ka {
		t.Errorf("ReviseCounts(1ms, 0, 0) = %d, %d", lt, ka)
	}
	lt, ka = o.ReviseCounts(time.Hour, 1_000_000, 1_000_000)
	if time.Duration(lt)*time.Hour > 3*DefaultMaxLifetime || ka > lt/3+1 {
		t.Errorf("ReviseCounts(1h, 1e6, 1e6) = %d, %d", lt, ka)
	}
}

// TestSubMillisecondIntervalsRun: a subscription requested at 0 ms with
// items at 0.1 ms runs on the real clock without crashing, at the 1 ms
// minimum.
func TestSubMillisecondIntervalsRun(t *testing.T) {
	clk := NewRealClock()
	m := New(context.Background(), Options{Clock: clk, Source: NewCounters(1, 8, clk)})
	defer m.Close()
	s, _ := m.Session(1)
	cs := s.CreateSubscription(&ua.CreateSubscriptionRequest{RequestHeader: hdr(), RequestedPublishingInterval: 0, PublishingEnabled: true}).(*ua.CreateSubscriptionResponse)
	if cs.RevisedPublishingInterval != 1 {
		t.Fatalf("revised publishing interval %v", cs.RevisedPublishingInterval)
	}
	req := &ua.CreateMonitoredItemsRequest{RequestHeader: hdr(), SubscriptionID: cs.SubscriptionID}
	for i, iv := range []float64{0.1, 0, -1, 0.999} {
		req.ItemsToCreate = append(req.ItemsToCreate, &ua.MonitoredItemCreateRequest{
			ItemToMonitor:       &ua.ReadValueID{NodeID: ua.NewStringNodeID(1, SampledCounterPrefix+itoa(i)), AttributeID: ua.AttributeIDValue},
			MonitoringMode:      ua.MonitoringModeReporting,
			RequestedParameters: &ua.MonitoringParameters{ClientHandle: uint32(i), SamplingInterval: iv, QueueSize: 10},
		})
	}
	cr := s.CreateMonitoredItems(req).(*ua.CreateMonitoredItemsResponse)
	for i, r := range cr.Results {
		if r.StatusCode != ua.StatusOK || r.RevisedSamplingInterval != 1 {
			t.Fatalf("item %d: %v, revised %v ms", i, r.StatusCode, r.RevisedSamplingInterval)
		}
	}
	resps := make(chan ua.Response, 10)
	got := 0
	stop := time.Now().Add(200 * time.Millisecond)
	for time.Now().Before(stop) {
		s.Publish(PublishCall{Request: &ua.PublishRequest{RequestHeader: hdr()}, Respond: func(r ua.Response) { resps <- r }})
		select {
		case r := <-resps:
			asPublish(t, r)
			got++
		case <-time.After(time.Second):
			t.Fatal("no Publish response within 1 s")
		}
	}
	if got < 20 {
		t.Fatalf("only %d responses in 200 ms at a 1 ms publishing interval", got)
	}
}

// TestItemQueueDiscard: queue size and discardOldest, with the overflow bit.
func TestItemQueueDiscard(t *testing.T) {
	mk := func(discardOldest bool) *MonitoredItem {
		return &MonitoredItem{discardOldest: discardOldest, size: 3}
	}
	val := func(v int64) *ua.DataValue { return int64Value(v, time.Time{}) }
	for _, oldest := range []bool{true, false} {
		it := mk(oldest)
		for v := int64(1); v <= 5; v++ {
			it.push(val(v))
		}
		got := it.drainLocked(0)
		var vs []int64
		for _, dv := range got {
			vs = append(vs, dv.Value.Value().(int64))
		}
		want := []int64{3, 4, 5}
		overflowAt := 0
		if !oldest {
			want = []int64{1, 2, 5}
			overflowAt = 2
		}
		if len(vs) != 3 || vs[0] != want[0] || vs[1] != want[1] || vs[2] != want[2] {
			t.Errorf("discardOldest=%v: %v, want %v", oldest, vs, want)
		}
		for i, dv := range got {
			if has := dv.Status&statusOverflow == statusOverflow; has != (i == overflowAt) {
				t.Errorf("discardOldest=%v: value %d overflow bit %v", oldest, i, has)
			}
		}
		if it.discarded != 2 {
			t.Errorf("discarded %d", it.discarded)
		}
	}
}

// TestPublishTimeoutHint: a queued Publish request whose TimeoutHint passes
// is answered BadTimeout at the next publishing cycle.
func TestPublishTimeoutHint(t *testing.T) {
	h := newHarness(t, Options{})
	h.createSub(100, 100, 1000, 0) // keep-alive only every 10 s
	h.s.Publish(PublishCall{
		Request: &ua.PublishRequest{RequestHeader: &ua.RequestHeader{TimeoutHint: 250}},
		Respond: func(r ua.Response) { h.resps <- r },
	})
	// The first cycle sends the initial keep-alive with the request.
	if r := asPublish(t, h.until(1, 5)); len(r.NotificationMessage.NotificationData) != 0 {
		t.Fatal("want the initial keep-alive")
	}
	h.s.Publish(PublishCall{
		Request: &ua.PublishRequest{RequestHeader: &ua.RequestHeader{TimeoutHint: 250}},
		Respond: func(r ua.Response) { h.resps <- r },
	})
	start := h.clk.Now()
	if c := faultCode(h.until(1, 10)); c != ua.StatusBadTimeout {
		t.Fatalf("got %v, want BadTimeout", c)
	}
	if waited := h.clk.Now() - start; waited < 250*time.Millisecond || waited > 400*time.Millisecond {
		t.Fatalf("answered after %v, want 250–400 ms", waited)
	}
}

// TestModifySubscriptionRestartsGrid: a shorter publishing interval takes
// effect at once, not after the old interval.
func TestModifySubscriptionRestartsGrid(t *testing.T) {
	h := newHarness(t, Options{})
	sub := h.createSub(10_000, 1, 1000, 0)
	if _, err := h.clk.WaitForSleepers(1, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	r := h.s.ModifySubscription(&ua.ModifySubscriptionRequest{RequestHeader: hdr(), SubscriptionID: sub, RequestedPublishingInterval: 0.5, RequestedMaxKeepAliveCount: 1})
	if m, ok := r.(*ua.ModifySubscriptionResponse); !ok || m.RevisedPublishingInterval != 1 {
		t.Fatalf("ModifySubscription: %#v", r)
	}
	// The loop re-arms at now + 1 ms.
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); {
		ds, err := h.clk.WaitForSleepers(1, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if ds[0] == h.clk.Now()+time.Millisecond {
			h.publish(0)
			if asPublish(t, h.until(1, 3)).SubscriptionID != sub {
				t.Fatal("wrong subscription")
			}
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("the loop did not re-arm at the new interval")
}

// TestMoreNotificationsAnsweredAtOnce: while a subscription has more
// notifications than one response holds, each new Publish request is
// answered at once, not at the next publishing cycle (a bug that capped
// delivery at outstanding requests × budget per publishing interval).
func TestMoreNotificationsAnsweredAtOnce(t *testing.T) {
	h := newHarness(t, Options{})
	sub := h.createSub(1000, 10, 100, 0)
	h.createItems(sub, FastCounterPrefix, 1024, 5000, 1)
	h.publish(4096)
	first := asPublish(t, h.until(2, 10))
	if !first.MoreNotifications {
		t.Fatal("first response should have more notifications")
	}
	for i := 0; ; i++ {
		if i > 20 {
			t.Fatal("too many responses")
		}
		h.publish(4096) // no clock step: must be answered now
		var r *ua.PublishResponse
		select {
		case x := <-h.resps:
			r = asPublish(t, x)
		default:
			t.Fatalf("request %d not answered at once", i+2)
		}
		if !r.MoreNotifications {
			break
		}
	}
}
