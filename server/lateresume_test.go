package server

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gopcua/opcua/ua"

	"github.com/opcua-chaos/opcua-chaos/server/catalog"
)

// TestFaultLateResumeSilent: with late-resume-silent a channel's paused
// reader resumes only when nothing is pending (as with late-resume), and the
// Channel.* counters read BadNodeIdUnknown while the other counters stay;
// without it the reader resumes at the low mark and the counters read.
func TestFaultLateResumeSilent(t *testing.T) {
	const high, low, reads = 10, 5, 30
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("fault=%v", on), func(t *testing.T) {
			endpoint, srv := startServer(t, Config{Workers: 2, HighMark: high, LowMark: low, Faults: Faults{catalog.FaultLateResumeSilent: on}})
			c := connect(t, endpoint, anonymous(t, endpoint))
			// reads Slow.20 Reads at once on one channel: the reader
			// stops at the high mark while two workers answer them.
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var wg sync.WaitGroup
			errs := make(chan error, reads)
			for range reads {
				wg.Go(func() {
					_, err := c.Read(ctx, &ua.ReadRequest{NodesToRead: []*ua.ReadValueID{{NodeID: ua.NewStringNodeID(1, "Slow.20"), AttributeID: ua.AttributeIDValue}}})
					if err != nil {
						errs <- err
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatalf("read Slow.20: %v", err)
			}
			pauses, _, _, _ := srv.chans.totals()
			lowest := srv.chans.lowestResume()
			if pauses == 0 {
				t.Fatalf("no backpressure pause with %d Reads pipelined against a high mark of %d", reads, high)
			}
			want := low
			if on {
				want = 0
			}
			if lowest != want {
				t.Errorf("paused readers resumed at %d pending at the fewest, want %d", lowest, want)
			}

			res := readValues(t, c, counter(NodeLowestResume), counter(NodeMaxPending), counter(NodePending), counter(NodeBackpressurePauses), counter(NodeParked), counter(NodeRequests))
			for i, dv := range res[:5] {
				if on && dv.Status != ua.StatusBadNodeIDUnknown {
					t.Errorf("channel counter %d: status %v, want BadNodeIdUnknown (the server publishes none)", i, dv.Status)
				}
				if !on && dv.Status != ua.StatusOK {
					t.Errorf("channel counter %d: status %v, want Good", i, dv.Status)
				}
			}
			if res[5].Status != ua.StatusOK {
				t.Errorf("%s: status %v, want Good (only the channel counters are absent)", NodeRequests, res[5].Status)
			}
		})
	}
}
