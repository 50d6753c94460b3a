package subscription

import (
	"fmt"
	"math"
	"testing"

	"github.com/gopcua/opcua/ua"
)

// TestNextSeqSkips: nextSeq never returns 0 and, with a skip period, never
// a multiple of it, wrap-around included; sub.seq (what keep-alives
// announce) is always the number nextSeq returns next.
func TestNextSeqSkips(t *testing.T) {
	for _, c := range []struct {
		seq, every, ret, next uint32
	}{
		{1, 0, 1, 2},
		{49, 0, 49, 50},
		{math.MaxUint32, 0, math.MaxUint32, 1},
		{48, 50, 48, 49},
		{49, 50, 49, 51},
		{math.MaxUint32 - 1, 50, math.MaxUint32 - 1, math.MaxUint32},
		{math.MaxUint32, 50, math.MaxUint32, 1},
	} {
		sub := &Subscription{seq: c.seq}
		if got := sub.nextSeq(c.every); got != c.ret || sub.seq != c.next {
			t.Errorf("seq %d, skip every %d: returned %d then next %d, want %d then %d", c.seq, c.every, got, sub.seq, c.ret, c.next)
		}
	}
}

// TestSkippedSequenceFault: with SkippedSequence (period 5 here) a
// subscription's data messages are numbered 1, 2, 3, 4, 6; 5 is never
// available, and the keep-alive sent after message 4 announces 6, the
// number the next data message really has. Without it: 1 … 5, and the
// keep-alive announces 5.
func TestSkippedSequenceFault(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("fault=%v", on), func(t *testing.T) {
			h := newHarness(t, Options{SkippedSequence: on, SkipSequenceEvery: 5})
			sub, data := firstFourMessages(t, h)
			next, avail := uint32(5), []uint32{1, 2, 3, 4, 5}
			if on {
				next, avail = 6, []uint32{1, 2, 3, 4, 6}
			}
			// Publishing disabled: the next answer is a keep-alive.
			h.s.SetPublishingMode(&ua.SetPublishingModeRequest{RequestHeader: hdr(), SubscriptionIDs: []uint32{sub}, PublishingEnabled: false})
			h.publish(0)
			ka := asPublish(t, h.until(subscriptionLoops, 20))
			if len(ka.NotificationMessage.NotificationData) != 0 || ka.NotificationMessage.SequenceNumber != next {
				t.Fatalf("keep-alive announces %d (%d notifications), want %d", ka.NotificationMessage.SequenceNumber, len(ka.NotificationMessage.NotificationData), next)
			}
			h.s.SetPublishingMode(&ua.SetPublishingModeRequest{RequestHeader: hdr(), SubscriptionIDs: []uint32{sub}, PublishingEnabled: true})
			p := data()
			if p.NotificationMessage.SequenceNumber != next || !eqU32(p.AvailableSequenceNumbers, avail) {
				t.Fatalf("data message %d, available %v; want %d, %v", p.NotificationMessage.SequenceNumber, p.AvailableSequenceNumbers, next, avail)
			}
		})
	}
}

// TestDuplicateSamplesFault: with DuplicateSamples (period 10 here) the
// SampledCounter values 10, 20, 30 (the 10th, 20th, 30th sample) are queued
// twice, the same DataValue; without it every value arrives once.
func TestDuplicateSamplesFault(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("fault=%v", on), func(t *testing.T) {
			h := newHarness(t, Options{DuplicateSamples: on, DuplicateSampleEvery: 10})
			sub := h.createSub(50, 10, 100, 0)
			h.createItems(sub, SampledCounterPrefix, 1, 10, 100)
			var vals []*ua.DataValue
			for len(vals) == 0 || vals[len(vals)-1].Value.Value().(int64) <= 30 {
				h.publish(0)
				p := asPublish(t, h.until(2, 20))
				for _, eo := range p.NotificationMessage.NotificationData {
					for _, n := range eo.Value.(*DataChange).MonitoredItems {
						vals = append(vals, n.Value)
					}
				}
			}
			var twice []int64
			for i := 1; i < len(vals); i++ {
				prev, v := vals[i-1].Value.Value().(int64), vals[i].Value.Value().(int64)
				switch {
				case v == prev && vals[i].SourceTimestamp.Equal(vals[i-1].SourceTimestamp):
					twice = append(twice, v)
				case v != prev+1:
					t.Fatalf("value %d after %d", v, prev)
				}
			}
			var want []int64
			if on {
				want = []int64{10, 20, 30}
			}
			if fmt.Sprint(twice) != fmt.Sprint(want) {
				t.Fatalf("values queued twice %v, want %v", twice, want)
			}
		})
	}
}

// TestKeepAliveConsumesSeqFault: after data messages 1 … 4 a keep-alive
// (publishing disabled) announces 5 and the next data message is 5: the
// keep-alive used up nothing. With KeepAliveConsumesSeq the keep-alive
// carries 5 and the next data message is 6; 5 is never available.
func TestKeepAliveConsumesSeqFault(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("fault=%v", on), func(t *testing.T) {
			h := newHarness(t, Options{KeepAliveConsumesSeq: on})
			sub, data := firstFourMessages(t, h)
			h.s.SetPublishingMode(&ua.SetPublishingModeRequest{RequestHeader: hdr(), SubscriptionIDs: []uint32{sub}, PublishingEnabled: false})
			h.publish(0)
			ka := asPublish(t, h.until(subscriptionLoops, 20))
			if len(ka.NotificationMessage.NotificationData) != 0 || ka.NotificationMessage.SequenceNumber != 5 {
				t.Fatalf("keep-alive carries %d (%d notifications), want 5", ka.NotificationMessage.SequenceNumber, len(ka.NotificationMessage.NotificationData))
			}
			h.s.SetPublishingMode(&ua.SetPublishingModeRequest{RequestHeader: hdr(), SubscriptionIDs: []uint32{sub}, PublishingEnabled: true})
			next, avail := uint32(5), []uint32{1, 2, 3, 4, 5}
			if on {
				next, avail = 6, []uint32{1, 2, 3, 4, 6}
			}
			if p := data(); p.NotificationMessage.SequenceNumber != next || !eqU32(p.AvailableSequenceNumbers, avail) {
				t.Fatalf("data message %d, available %v after the keep-alive; want %d, %v", p.NotificationMessage.SequenceNumber, p.AvailableSequenceNumbers, next, avail)
			}
		})
	}
}

// TestRepublishNextFault: Republish of 2 returns message 2 from the
// retransmission queue {1, 2, 3}; with RepublishNext it returns message
// 3, and Republish of 3 (no 4 kept) is BadMessageNotAvailable.
func TestRepublishNextFault(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("fault=%v", on), func(t *testing.T) {
			h := newHarness(t, Options{RepublishNext: on})
			sub := h.createSub(50, 1, 100, 0)
			h.createItems(sub, SampledCounterPrefix, 1, 10, 100)
			for want := uint32(1); want <= 3; want++ {
				h.publish(0)
				if p := asPublish(t, h.until(2, 20)); p.NotificationMessage.SequenceNumber != want || len(p.NotificationMessage.NotificationData) == 0 {
					t.Fatalf("message %d (%d notifications), want data message %d", p.NotificationMessage.SequenceNumber, len(p.NotificationMessage.NotificationData), want)
				}
			}
			want := uint32(2)
			if on {
				want = 3
			}
			r := h.s.Republish(&ua.RepublishRequest{RequestHeader: hdr(), SubscriptionID: sub, RetransmitSequenceNumber: 2})
			if rp, ok := r.(*ua.RepublishResponse); !ok || rp.NotificationMessage.SequenceNumber != want {
				t.Fatalf("Republish(2) = %#v, want message %d", r, want)
			}
			r = h.s.Republish(&ua.RepublishRequest{RequestHeader: hdr(), SubscriptionID: sub, RetransmitSequenceNumber: 3})
			if c := faultCode(r); on != (c == ua.StatusBadMessageNotAvailable) {
				t.Fatalf("Republish(3) = %v (fault %v)", c, on)
			}
		})
	}
}

// subscriptionLoops is how many loops serve one subscription of a
// sampled item: the sampling group and the subscription.
const subscriptionLoops = 2

// firstFourMessages creates a subscription (50 ms) of one sampled counter
// (10 ms) on h and takes its data messages 1 to 4, failing t unless they
// come in that order. It returns the subscription and a function that
// asks for the next data message (failing t on a keep-alive).
func firstFourMessages(t *testing.T, h *harness) (uint32, func() *ua.PublishResponse) {
	t.Helper()
	sub := h.createSub(50, 1, 100, 0)
	h.createItems(sub, SampledCounterPrefix, 1, 10, 100)
	data := func() *ua.PublishResponse {
		t.Helper()
		h.publish(0)
		p := asPublish(t, h.until(subscriptionLoops, 20))
		if len(p.NotificationMessage.NotificationData) == 0 {
			t.Fatalf("keep-alive %d, want a data message", p.NotificationMessage.SequenceNumber)
		}
		return p
	}
	for want := uint32(1); want <= 4; want++ {
		if p := data(); p.NotificationMessage.SequenceNumber != want {
			t.Fatalf("data message %d, want %d", p.NotificationMessage.SequenceNumber, want)
		}
	}
	return sub, data
}
