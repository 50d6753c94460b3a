package server

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gopcua/opcua"
	"github.com/gopcua/opcua/ua"

	"github.com/opcua-chaos/opcua-chaos/server/catalog"
)

// The fault switches of issue 12 (sampler-skips is tested with the sampler,
// in internal/subscription): each test runs with the switch off and on and
// shows the behaviour it changes.

// TestCloseRunsQueuedFault: closing a session with requests queued behind a
// busy worker answers them BadSessionClosed at once and never runs them;
// with close-runs-queued they stay queued, run after the CloseSession
// response and are answered Good.
func TestCloseRunsQueuedFault(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("fault=%v", on), func(t *testing.T) {
			cfg := Config{Workers: 1}
			if on {
				cfg.Faults = Faults{catalog.FaultCloseRunsQueued: true}
			}
			endpoint, srv := startServer(t, cfg)
			other := connect(t, endpoint, asUser(t, endpoint, "user2", "password1"))
			c, err := dial(endpoint, asUser(t, endpoint, "user1", "password"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close(context.Background())
			running := occupyWorker(t, srv, other, 300)
			before, _ := srv.queue.Owner("user1")
			var errs []<-chan error
			for range 5 {
				errs = append(errs, asyncRead(c, slowRead(1)))
			}
			waitFor(t, "5 queued requests", func() bool { return len(queuedHandles(srv)) == 5 })
			if err := c.CloseSession(context.Background()); err != nil {
				t.Fatalf("CloseSession: %v", err)
			}
			closed := time.Now()
			for i, errc := range errs {
				err := waitErr(t, errc, "queued read")
				switch {
				case on && err != nil:
					t.Errorf("queued read %d: %v, want it run after the close and answered Good (the fault)", i, err)
				case !on && !errors.Is(err, ua.StatusBadSessionClosed):
					t.Errorf("queued read %d: err = %v, want BadSessionClosed", i, err)
				}
			}
			if err := waitErr(t, running, "running read"); err != nil {
				t.Errorf("running read of the other session: %v", err)
			}
			o, _ := srv.queue.Owner("user1")
			ran := o.Dispatched - before.Dispatched
			if want := map[bool]int64{false: 0, true: 5}[on]; ran != want {
				t.Errorf("%d of the closed session's queued requests were dispatched, want %d", ran, want)
			}
			t.Logf("fault=%v: %d queued requests dispatched after the close, answers within %v", on, ran, time.Since(closed).Round(time.Millisecond))
		})
	}
}

// readAll sends n Reads of CurrentTime on c, 16 at a time, each bounded by
// timeout, and returns how many got no answer within it.
func readAll(t *testing.T, c *opcua.Client, n int, timeout time.Duration) (unanswered int) {
	t.Helper()
	var (
		next atomic.Int64
		lost atomic.Int64
		wg   sync.WaitGroup
	)
	for range 16 {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				_, err := c.Read(ctx, &ua.ReadRequest{NodesToRead: []*ua.ReadValueID{{
					NodeID: ua.NewNumericNodeID(0, 2258), AttributeID: ua.AttributeIDValue,
				}}})
				cancel()
				switch {
				case err == nil:
				case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ua.StatusBadTimeout):
					lost.Add(1)
				default:
					t.Errorf("read: %v", err)
				}
			}
		})
	}
	wg.Wait()
	return int(lost.Load())
}

// TestLostResponseFault: with lost-response the 500th and 1000th Read of a
// channel get no answer, while the channel stays open and serves the next
// request; without it every Read is answered.
func TestLostResponseFault(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("fault=%v", on), func(t *testing.T) {
			cfg := Config{}
			if on {
				cfg.Faults = Faults{catalog.FaultLostResponse: true}
			}
			endpoint, srv := startServer(t, cfg)
			c := connect(t, endpoint, anonymous(t, endpoint))
			// connecting read the namespace array: one Read of the channel
			lost := readAll(t, c, 2*LostResponseEvery, time.Second)
			if want := map[bool]int{false: 0, true: 2}[on]; lost != want {
				t.Errorf("%d Reads unanswered, want %d", lost, want)
			}
			// the channel is still up and answers
			if lost := readAll(t, c, 1, 5*time.Second); lost != 0 {
				t.Errorf("the channel stopped answering after the lost responses")
			}
			if n := srv.stats.channels.Load(); n != 1 {
				t.Errorf("%d channels open, want 1: the fault must not close the channel", n)
			}
			// The writer releases a slot just after the write, so the
			// client may read a response before its slot is free.
			deadline := time.Now().Add(2 * time.Second)
			for {
				_, _, pending, _ := srv.chans.totals()
				if pending == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Errorf("%d responses pending 2 s after the reads: a lost response must release its slot", pending)
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

// TestRetainMemoryFault: with retain-memory the server keeps
// RetainPerRequest bytes per served Read for good; without it nothing.
func TestRetainMemoryFault(t *testing.T) {
	const reads = 200
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("fault=%v", on), func(t *testing.T) {
			cfg := Config{}
			if on {
				cfg.Faults = Faults{catalog.FaultRetainMemory: true}
			}
			endpoint, srv := startServer(t, cfg)
			c := connect(t, endpoint, anonymous(t, endpoint))
			if lost := readAll(t, c, reads, 5*time.Second); lost != 0 {
				t.Fatalf("%d reads unanswered", lost)
			}
			got := srv.leak.size()
			// connecting read the namespace array too
			if on && (got < reads*RetainPerRequest || got > (reads+5)*RetainPerRequest) {
				t.Errorf("retained %d bytes after %d reads, want %d per read", got, reads, RetainPerRequest)
			}
			if !on && got != 0 {
				t.Errorf("retained %d bytes without the fault", got)
			}
		})
	}
}
