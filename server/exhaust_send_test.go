package server

// Issue 44, item 1: responses waiting in a channel's send queue are
// budgeted. A client that pipelines large answers and never reads them
// makes the server hold at most its channel's share (and all channels
// the budget's responses class); the reader stops above the share; a
// write without progress closes the channel and gives the bytes back;
// other clients are served meanwhile. The responses-unbudgeted fault
// undoes all of it.

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/gopcua/opcua/id"
	"github.com/gopcua/opcua/ua"
	"github.com/gopcua/opcua/uacp"

	"github.com/opcua-chaos/opcua-chaos/server/catalog"
	"github.com/opcua-chaos/opcua-chaos/server/internal/budget"
	"github.com/opcua-chaos/opcua-chaos/server/internal/channel"
)

// wideBrowse is a Browse of node n times in both directions with every
// result field and no reference limit: an answer many times its request.
func wideBrowse(node *ua.NodeID, n int) *ua.BrowseRequest {
	d := &ua.BrowseDescription{NodeID: node, BrowseDirection: ua.BrowseDirectionBoth, IncludeSubtypes: true,
		ReferenceTypeID: ua.NewNumericNodeID(0, id.References), ResultMask: uint32(ua.BrowseResultMaskAll)}
	nodes := make([]*ua.BrowseDescription, n)
	for i := range nodes {
		nodes[i] = d
	}
	return browseRequest(nodes...)
}

// heapAfterGC is the live heap after a collection.
func heapAfterGC() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// liveChannels returns the stats of the server's open channels.
func liveChannels(srv *Server) []channel.Stats {
	srv.chans.mu.Lock()
	defer srv.chans.mu.Unlock()
	var out []channel.Stats
	for ch := range srv.chans.live {
		out = append(out, ch.Stats())
	}
	return out
}

// TestUnreadResponsesBudgeted: one channel pipelines 60 Browses whose
// answers are about 1 MB each and never reads. Protected, the channel's
// unsent bytes stay within its share plus one answer, the rest are
// answered BadResourceUnavailable, its reader stops for them, the live
// heap grows by little, a fresh client is served, and the write deadline
// closes the channel, giving every byte back. Under responses-unbudgeted
// nothing is charged, the heap holds every answer, and the channel stays
// open past the deadline.
func TestUnreadResponsesBudgeted(t *testing.T) {
	const (
		pipelined = 60
		first     = 10
		nodes     = 200
		share     = 2 << 20
		deadline  = 3 * time.Second
	)
	node := ua.NewStringNodeID(1, FolderNode)
	for _, fault := range []bool{false, true} {
		t.Run(fmt.Sprintf("responses-unbudgeted=%v", fault), func(t *testing.T) {
			cfg := Config{Workers: 2, MemoryBudget: 64 << 20, MaxUnsentPerChannel: share, WriteTimeout: deadline}
			if fault {
				cfg.Faults = Faults{catalog.FaultResponsesUnbudgeted: true}
			}
			ts := runServer(t, cfg)
			// one answer's size, read normally
			probe := rawSessionChannel(t, ts.addr)
			r, err := probe.Call(wideBrowse(node, nodes))
			if err != nil || r.Status() != ua.StatusOK {
				t.Fatalf("browse: %v %v", err, r)
			}
			answer := int64(0)
			for _, n := range r.Chunks {
				answer += int64(n)
			}
			if answer < 512<<10 {
				t.Fatalf("one answer is %d bytes: too small to show anything", answer)
			}
			before := heapAfterGC()

			c := rawChannel(t, ts.addr, uacp.Hello{})
			if err := c.Session(nil); err != nil {
				t.Fatalf("session: %v", err)
			}
			// a first batch whose answers go over the share, then the
			// rest, which a protected server leaves unread
			send := func(n int) {
				for range n {
					if _, err := c.Send(wideBrowse(node, nodes)); err != nil {
						t.Fatalf("send: %v", err)
					}
				}
			}
			send(first)
			waitFor(t, "the first answers built", func() bool {
				for _, st := range liveChannels(ts.Server) {
					if st.Received >= first || st.BytePauses > 0 {
						return ts.queue.Stats().Queued == 0 && ts.busyWorkers.Load() == 0
					}
				}
				return false
			})
			send(pipelined - first)
			// everything the server will take is taken once the counts
			// stop moving; the unread channel is the one that received
			// the most (it may close before)
			var last []channel.Stats
			var attacker channel.Stats
			waitFor(t, "the server to settle", func() bool {
				time.Sleep(200 * time.Millisecond)
				st := liveChannels(ts.Server)
				for _, s := range st {
					if s.Received >= attacker.Received {
						attacker = s
					}
				}
				same := fmt.Sprint(st) == fmt.Sprint(last)
				last = st
				return same && ts.queue.Stats().Queued == 0 && ts.busyWorkers.Load() == 0
			})
			grown := heapAfterGC() - before
			t.Logf("answer %d bytes; heap grown %d MB; attacker channel: received %d, unsent %d (max %d), refused %d, byte pauses %d; responses charged %d",
				answer, grown>>20, attacker.Received, attacker.Unsent, attacker.MaxUnsent, attacker.Refused, attacker.BytePauses, ts.budget.UsedBy(budget.Responses))
			if fault {
				if got := ts.budget.UsedBy(budget.Responses); got != 0 {
					t.Errorf("responses-unbudgeted: %d bytes of responses charged, want 0", got)
				}
				if grown < 30*answer {
					t.Errorf("responses-unbudgeted: the heap grew %d bytes with %d answers of %d bytes unread: want them held", grown, pipelined, answer)
				}
			} else {
				if attacker.MaxUnsent > share+answer {
					t.Errorf("the channel held %d unsent bytes, over its share %d plus one answer (%d)", attacker.MaxUnsent, share, answer)
				}
				if attacker.Refused == 0 || attacker.BytePauses == 0 {
					t.Errorf("refused %d answers, reader paused %d times for bytes: want both", attacker.Refused, attacker.BytePauses)
				}
				if grown > share+2*answer+8<<20 {
					t.Errorf("the heap grew %d bytes with the channel's share %d: the answers are held beyond it", grown, share)
				}
				if got := ts.budget.UsedBy(budget.Responses); got > share+answer {
					t.Errorf("responses charged %d, over the channel's share %d and one answer", got, share)
				}
			}
			// a fresh client is served beside it
			fresh := rawSessionChannel(t, ts.addr)
			if r, err := fresh.Call(stateRead()); err != nil || r.Status() != ua.StatusOK {
				t.Errorf("a fresh client's Read beside the unread answers: %v %v", err, r)
			}
			// the write deadline closes the unread channel (without
			// reading from it)
			gone := func() bool {
				for _, st := range liveChannels(ts.Server) {
					if st.Received >= first {
						return false
					}
				}
				return true
			}
			if fault {
				time.Sleep(2 * deadline)
				if gone() {
					t.Errorf("responses-unbudgeted: the unread channel closed within %v: want no write deadline", 2*deadline)
				}
				return
			}
			for end := time.Now().Add(3 * deadline); !gone(); time.Sleep(10 * time.Millisecond) {
				if time.Now().After(end) {
					t.Fatalf("the unread channel still open %v after the load: no write deadline", 3*deadline)
				}
			}
			waitFor(t, "the responses' charge back to 0", func() bool { return ts.budget.UsedBy(budget.Responses) == 0 })
		})
	}
}
