package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/gopcua/opcua"
	"github.com/gopcua/opcua/ua"
)

// queuedHandles returns the RequestHandles of the Read requests waiting in
// the server's fair queue.
func queuedHandles(srv *Server) []uint32 {
	var out []uint32
	srv.connsMu.Lock()
	defer srv.connsMu.Unlock()
	for cn := range srv.conns {
		cn.queued.mu.Lock()
		for j := range cn.queued.jobs {
			out = append(out, j.handle)
		}
		cn.queued.mu.Unlock()
	}
	return out
}

// waitFor polls cond every 5 ms for up to 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func slowRead(ms int) *ua.ReadRequest {
	return &ua.ReadRequest{NodesToRead: []*ua.ReadValueID{{
		NodeID: ua.NewStringNodeID(1, fmt.Sprintf("Slow.%d", ms)), AttributeID: ua.AttributeIDValue,
	}}}
}

// asyncRead starts a Read and returns a channel with its error.
func asyncRead(c *opcua.Client, req *ua.ReadRequest) <-chan error {
	errc := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := c.Read(ctx, req)
		errc <- err
	}()
	return errc
}

func waitErr(t *testing.T, errc <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-errc:
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no answer within 10 s", what)
		return nil
	}
}

// occupyWorker starts a Slow read on c and waits until the single worker
// runs it.
func occupyWorker(t *testing.T, srv *Server, c *opcua.Client, ms int) <-chan error {
	t.Helper()
	errc := asyncRead(c, slowRead(ms))
	waitFor(t, "the worker to be busy", func() bool { return srv.busyWorkers.Load() == 1 })
	return errc
}

// TestCancelQueuedRequest: a queued request whose handle is cancelled
// completes once with BadRequestCancelledByClient, returns its slot and is
// never run; CancelCount reports it.
func TestCancelQueuedRequest(t *testing.T) {
	endpoint, srv := startServer(t, Config{Workers: 1})
	c := connect(t, endpoint, asUser(t, endpoint, "user1", "password"))
	readsBefore := srv.stats.readRequests.Load()

	running := occupyWorker(t, srv, c, 400)
	queued := asyncRead(c, slowRead(1))
	waitFor(t, "a queued request", func() bool { return len(queuedHandles(srv)) == 1 })
	handle := queuedHandles(srv)[0]

	var cancelResp *ua.CancelResponse
	err := c.Send(context.Background(), &ua.CancelRequest{RequestHandle: handle}, func(r ua.Response) error {
		cancelResp, _ = r.(*ua.CancelResponse)
		return nil
	})
	if err != nil || cancelResp == nil {
		t.Fatalf("Cancel: %v %T", err, cancelResp)
	}
	if cancelResp.CancelCount != 1 {
		t.Errorf("CancelCount = %d, want 1", cancelResp.CancelCount)
	}
	if err := waitErr(t, queued, "cancelled read"); !errors.Is(err, ua.StatusBadRequestCancelledByClient) {
		t.Errorf("cancelled read: err = %v, want BadRequestCancelledByClient", err)
	}
	if st := srv.queue.Stats(); st.Charged != 0 {
		t.Errorf("queue slots held after cancel = %d, want 0", st.Charged)
	}
	if err := waitErr(t, running, "running read"); err != nil {
		t.Errorf("running read: %v", err)
	}
	// The cancelled request never runs, even after the worker is free.
	time.Sleep(50 * time.Millisecond)
	if n := srv.stats.readRequests.Load() - readsBefore; n != 1 {
		t.Errorf("%d Read requests ran, want 1 (the cancelled one must not run)", n)
	}
	if o, _ := srv.queue.Owner("user1"); o.Cancelled != 1 || o.Charged != 0 || o.Enqueued != o.Dispatched+o.Cancelled {
		t.Errorf("owner user1: %+v", o)
	}
	// A second Cancel finds nothing.
	cancelResp = nil
	_ = c.Send(context.Background(), &ua.CancelRequest{RequestHandle: handle}, func(r ua.Response) error {
		cancelResp, _ = r.(*ua.CancelResponse)
		return nil
	})
	if cancelResp == nil || cancelResp.CancelCount != 0 {
		t.Errorf("second Cancel: %+v", cancelResp)
	}
}

// TestCloseSessionCancelsQueued: closing a session answers its queued
// requests BadSessionClosed at once and returns their slots.
func TestCloseSessionCancelsQueued(t *testing.T) {
	endpoint, srv := startServer(t, Config{Workers: 1})
	other := connect(t, endpoint, asUser(t, endpoint, "user2", "password1"))
	// Connect first: connecting reads the namespace array, which would
	// queue behind the busy worker.
	c, err := dial(endpoint, asUser(t, endpoint, "user1", "password"))
	if err != nil {
		t.Fatal(err)
	}
	running := occupyWorker(t, srv, other, 400)
	defer c.Close(context.Background())
	var errs []<-chan error
	for range 5 {
		errs = append(errs, asyncRead(c, slowRead(1)))
	}
	waitFor(t, "5 queued requests", func() bool { return len(queuedHandles(srv)) == 5 })
	if err := c.CloseSession(context.Background()); err != nil {
		t.Fatalf("CloseSession: %v", err)
	}
	for i, errc := range errs {
		if err := waitErr(t, errc, "queued read"); !errors.Is(err, ua.StatusBadSessionClosed) {
			t.Errorf("queued read %d: err = %v, want BadSessionClosed", i, err)
		}
	}
	if st := srv.queue.Stats(); st.Queued != 0 || st.Charged != 0 {
		t.Errorf("after CloseSession: queued=%d slots=%d, want 0, 0", st.Queued, st.Charged)
	}
	if err := waitErr(t, running, "running read"); err != nil {
		t.Errorf("running read of the other session: %v", err)
	}
}

// proxy forwards one TCP connection to target until kill is called.
type proxy struct {
	l     net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func newProxy(t *testing.T, target string) *proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{l: l}
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				return
			}
			p.mu.Lock()
			p.conns = append(p.conns, in, out)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(out, in); out.Close() }()
			go func() { _, _ = io.Copy(in, out); in.Close() }()
		}
	}()
	t.Cleanup(p.kill)
	return p
}

func (p *proxy) endpoint() string { return "opc.tcp://" + p.l.Addr().String() }

// kill drops every connection abruptly.
func (p *proxy) kill() {
	p.l.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		c.Close()
	}
}

// TestLostConnectionCancelsQueued: when a client's connection drops, its
// queued requests are cancelled at once (slots back), before the worker
// would have reached them.
func TestLostConnectionCancelsQueued(t *testing.T) {
	endpoint, srv := startServer(t, Config{Workers: 1})
	other := connect(t, endpoint, asUser(t, endpoint, "user2", "password1"))
	p := newProxy(t, srv.Addr().String())
	c, err := dial(p.endpoint(), asUser(t, endpoint, "user1", "password"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	before, _ := srv.queue.Owner("user1")
	running := occupyWorker(t, srv, other, 1000)
	for range 5 {
		asyncRead(c, slowRead(1))
	}
	waitFor(t, "5 queued requests", func() bool { return srv.queue.Stats().Queued == 5 })
	p.kill()
	waitFor(t, "the queue to empty", func() bool {
		st := srv.queue.Stats()
		return st.Queued == 0 && st.Charged == 0
	})
	if o, _ := srv.queue.Owner("user1"); o.Cancelled-before.Cancelled != 5 || o.Dispatched != before.Dispatched {
		t.Errorf("owner user1: %+v (before %+v), want 5 more cancelled, none more dispatched", o, before)
	}
	if srv.busyWorkers.Load() != 1 {
		t.Errorf("the worker finished early: the test did not check cancellation before dispatch")
	}
	if err := waitErr(t, running, "running read"); err != nil {
		t.Errorf("running read of the other session: %v", err)
	}
}

// TestServerTooBusy: the total bound and the per-owner ceiling refuse
// requests with BadServerTooBusy; one owner cannot take another's share.
func TestServerTooBusy(t *testing.T) {
	endpoint, srv := startServer(t, Config{Workers: 1, QueueSize: 4, OwnerQueueSize: 2})
	c1 := connect(t, endpoint, asUser(t, endpoint, "user1", "password"))
	c2 := connect(t, endpoint, asUser(t, endpoint, "user2", "password1"))
	// The worker stays busy while both owners fill the queue and are
	// refused (six round trips): 500 ms was too short under -race on a
	// busy machine (the worker freed, the queue drained, "2 queued"
	// never seen).
	running := occupyWorker(t, srv, c1, 3000)

	var first []<-chan error
	for range 2 {
		first = append(first, asyncRead(c1, slowRead(1)))
	}
	waitFor(t, "2 queued", func() bool { return srv.queue.Stats().Queued == 2 })
	// user1's third queued request exceeds its ceiling.
	if err := waitErr(t, asyncRead(c1, slowRead(1)), "over ceiling"); !errors.Is(err, StatusBadServerTooBusy) {
		t.Errorf("over the owner ceiling: err = %v, want BadServerTooBusy", err)
	}
	// user2 still gets its share.
	var second []<-chan error
	for range 2 {
		second = append(second, asyncRead(c2, slowRead(1)))
	}
	waitFor(t, "4 queued", func() bool { return srv.queue.Stats().Queued == 4 })
	if err := waitErr(t, asyncRead(c2, slowRead(1)), "over total"); !errors.Is(err, StatusBadServerTooBusy) {
		t.Errorf("over the total bound: err = %v, want BadServerTooBusy", err)
	}
	for _, errc := range append(append(first, second...), running) {
		if err := waitErr(t, errc, "admitted read"); err != nil {
			t.Errorf("admitted read: %v", err)
		}
	}
	res := readValues(t, c1, counter(NodeTooBusy), counter(OwnerNode("user1", "Rejected")), counter(OwnerNode("user2", "Rejected")), counter(NodeQueueSlots))
	want := []int64{2, 1, 1, 0}
	for i, dv := range res {
		if got, _ := dv.Value.Value().(int64); got != want[i] {
			t.Errorf("diagnostic %d = %v, want %d", i, dv.Value.Value(), want[i])
		}
	}
}

// TestWeightedFairnessEndToEnd: heavy (weight 3) and light (weight 1) keep
// 30 reads each outstanding against one worker; while both are backlogged,
// heavy gets about three times light's service.
func TestWeightedFairnessEndToEnd(t *testing.T) {
	endpoint, srv := startServer(t, Config{Workers: 1, OwnerWeights: map[string]int{"heavy": 3, "light": 1}})
	heavy := connect(t, endpoint, asUser(t, endpoint, "heavy", "heavy"))
	light := connect(t, endpoint, asUser(t, endpoint, "light", "light"))
	running := occupyWorker(t, srv, heavy, 100)
	var wg sync.WaitGroup
	for _, c := range []*opcua.Client{heavy, light} {
		for range 30 {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				_, _ = c.Read(ctx, slowRead(2))
			})
		}
	}
	waitFor(t, "60 queued", func() bool { return srv.queue.Stats().Queued == 60 })
	_ = waitErr(t, running, "first read")
	// Sample when heavy has had 24 turns of its own.
	waitFor(t, "heavy service", func() bool { o, _ := srv.queue.Owner("heavy"); return o.Dispatched >= 1+24 })
	h, _ := srv.queue.Owner("heavy")
	l, _ := srv.queue.Owner("light")
	wg.Wait()
	ratio := float64(h.Dispatched-1) / float64(max(l.Dispatched, 1))
	t.Logf("heavy %d, light %d dispatched (ratio %.2f)", h.Dispatched-1, l.Dispatched, ratio)
	if ratio < 2.5 || ratio > 3.5 {
		t.Errorf("heavy/light = %.2f, want 2.5–3.5", ratio)
	}
}
