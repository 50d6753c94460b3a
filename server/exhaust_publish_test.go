package server

// Issue 44, item 4: a parked Publish keeps only what its answer needs (its
// header and acknowledgement results), charged by bytes to the memory
// budget's publish class; one that does not fit is answered
// BadTooManyPublishRequests at once. The parked-publish-whole fault keeps
// the whole request, charged nowhere.

import (
	"fmt"
	"testing"
	"time"

	"github.com/gopcua/opcua/ua"
	"github.com/gopcua/opcua/uacp"

	"github.com/opcua-chaos/opcua-chaos/server/catalog"
	"github.com/opcua-chaos/opcua-chaos/server/internal/budget"
)

// fatPublish is a Publish with n acknowledgements of sequence numbers the
// subscription never sent.
func fatPublish(sub uint32, n int) *ua.PublishRequest {
	acks := make([]*ua.SubscriptionAcknowledgement, n)
	for i := range acks {
		acks[i] = &ua.SubscriptionAcknowledgement{SubscriptionID: sub, SequenceNumber: uint32(1_000_000 + i)}
	}
	return &ua.PublishRequest{SubscriptionAcknowledgements: acks}
}

// parked is the number of Publish requests parked on the server's
// channels.
func parked(srv *Server) int {
	n := 0
	for _, st := range liveChannels(srv) {
		n += st.Parked
	}
	return n
}

// TestParkedPublishBudgeted: 20 Publishes of 20 000 acknowledgements
// (160 kB each) on a subscription that has nothing to send. Protected,
// those that fit the publish class (256 KiB of a 4 MiB budget) are parked
// holding their results only, the rest are answered
// BadTooManyPublishRequests, and the live heap grows by little; a small
// Publish still parks. Under parked-publish-whole all 20 park, holding
// their requests, and nothing is charged.
func TestParkedPublishBudgeted(t *testing.T) {
	const (
		publishes = 20
		acks      = 20_000 // small enough to decode quickly under -race
	)
	for _, fault := range []bool{false, true} {
		t.Run(fmt.Sprintf("parked-publish-whole=%v", fault), func(t *testing.T) {
			cfg := Config{MemoryBudget: 4 << 20}
			if fault {
				cfg.Faults = Faults{catalog.FaultParkedPublishWhole: true}
			}
			ts := runServer(t, cfg)
			c := rawChannel(t, ts.addr, uacp.Hello{})
			if err := c.Session(nil); err != nil {
				t.Fatalf("session: %v", err)
			}
			sub := rawSubscription(t, c)
			body, err := c.Body(fatPublish(sub, acks))
			if err != nil {
				t.Fatal(err)
			}
			before := heapAfterGC()
			for range publishes {
				if _, err := c.SendBody(body); err != nil {
					t.Fatalf("send: %v", err)
				}
			}
			// each is parked, or answered at once
			refused := 0
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			waitFor(t, "every Publish parked or refused", func() bool {
				for parked(ts.Server)+refused < publishes {
					_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
					r, err := c.Receive()
					if err != nil {
						return false
					}
					if r.Status() != ua.StatusBadTooManyPublishRequests {
						t.Fatalf("a Publish answered %v, want BadTooManyPublishRequests or nothing", r.Status())
					}
					refused++
				}
				return true
			})
			grown := heapAfterGC() - before
			n := parked(ts.Server)
			charged := ts.budget.UsedBy(budget.Publish)
			t.Logf("%d parked, %d refused, heap grown %d MB, publish class %d bytes (limit %d)", n, refused, grown>>20, charged, ts.budget.ClassLimit(budget.Publish))
			if fault {
				if n != publishes || charged != 0 {
					t.Errorf("parked-publish-whole: %d parked, %d bytes charged: want all %d parked, none charged", n, charged, publishes)
				}
				if grown < publishes*acks*8 {
					t.Errorf("parked-publish-whole: the heap grew %d bytes: want the requests held (≥ %d)", grown, publishes*acks*8)
				}
				return
			}
			if n == 0 || refused == 0 {
				t.Errorf("%d parked, %d refused: want some of each", n, refused)
			}
			if limit := ts.budget.ClassLimit(budget.Publish); charged > limit || charged < int64(n)*4*acks {
				t.Errorf("publish class holds %d bytes for %d parked: want within [%d, %d]", charged, n, int64(n)*4*acks, limit)
			}
			// the heap, not a precise measure under -race (the byte
			// charge above is): judged in plain builds only
			if limit := int64(n)*(4*acks+4096) + 4<<20; !raceEnabled && grown > limit {
				t.Errorf("the heap grew %d bytes for %d parked Publishes: want their results only (≤ %d)", grown, n, limit)
			}
			// a small Publish parks beside them
			if _, err := c.Send(&ua.PublishRequest{}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "a small Publish parked", func() bool { return parked(ts.Server) == n+1 })
			// closing the session answers them and gives the bytes back
			if _, err := c.Send(&ua.CloseSessionRequest{DeleteSubscriptions: true}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the publish class back to 0", func() bool { return ts.budget.UsedBy(budget.Publish) == 0 })
		})
	}
}
