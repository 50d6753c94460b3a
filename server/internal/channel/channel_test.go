package channel

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gopcua/opcua/ua"
)

// withFaults applies the channel faults named in OPCUA_TEST_FAULTS (the
// server's fault names) to opts:
//
//	OPCUA_TEST_FAULTS=no-backpressure go test ./server/internal/channel
func withFaults(opts Options) Options {
	for _, name := range strings.Split(os.Getenv("OPCUA_TEST_FAULTS"), ",") {
		switch strings.TrimSpace(name) {
		case "no-backpressure":
			opts.NoBackpressure = true
		case "fault-on-overflow":
			opts.FaultOnOverflow = true
		case "late-resume":
			opts.LateResume = true
		case "publish-blocks-reader":
			opts.ParkHoldsSlot = true
		case "writer-lost-wakeup":
			opts.WriterDropsKick = true
		}
	}
	opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	return opts
}

// fakeTransport delivers `total` requests as fast as they are read; every
// Send blocks until the test releases it, like a peer that stopped reading.
type fakeTransport struct {
	total   int
	mu      sync.Mutex
	read    int
	sent    int
	aborted ua.StatusCode
	release chan struct{} // one token per Send allowed
	closed  chan struct{}
	once    sync.Once
}

func newFake(total int) *fakeTransport {
	return &fakeTransport{total: total, release: make(chan struct{}, total), closed: make(chan struct{})}
}

func (f *fakeTransport) Receive(ctx context.Context) (Message, error) {
	f.mu.Lock()
	if f.read < f.total {
		f.read++
		id := uint32(f.read)
		f.mu.Unlock()
		return Message{RequestID: id, Request: &ua.ReadRequest{RequestHeader: &ua.RequestHeader{RequestHandle: id}}}, nil
	}
	f.mu.Unlock()
	<-f.closed
	return Message{}, io.EOF
}

func (f *fakeTransport) Send(ctx context.Context, id uint32, resp ua.Response) error {
	select {
	case <-f.release:
	case <-f.closed:
		return io.EOF
	}
	f.mu.Lock()
	f.sent++
	f.mu.Unlock()
	return nil
}

func (f *fakeTransport) Abort(code ua.StatusCode) error {
	f.mu.Lock()
	f.aborted = code
	f.mu.Unlock()
	return f.Close()
}

func (f *fakeTransport) Close() error {
	f.once.Do(func() { close(f.closed) })
	return nil
}

func (f *fakeTransport) counts() (read, sent int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.read, f.sent
}

// settle waits until the transport's read count stops changing.
func settle(f *fakeTransport) int {
	last := -1
	for {
		time.Sleep(20 * time.Millisecond)
		n, _ := f.counts()
		if n == last {
			return n
		}
		last = n
	}
}

func answerAtOnce(ch *Channel, msg Message) {
	ch.Respond(msg.RequestID, &ua.ReadResponse{ResponseHeader: &ua.ResponseHeader{RequestHandle: msg.RequestID}})
}

// TestBackpressureStopsAndResumesReading: with the peer not reading, the
// channel stops reading at 100 pending responses, resumes only at 50, and is
// never faulted for being busy.
func TestBackpressureStopsAndResumesReading(t *testing.T) {
	const total = 1000
	f := newFake(total)
	ch := New(f, withFaults(Options{HighMark: 100, LowMark: 50}))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	runErr := make(chan error, 1)
	go func() { runErr <- ch.Run(ctx, answerAtOnce) }()

	if n := settle(f); n != 100 {
		t.Fatalf("read %d requests with no response written, want to stop at 100", n)
	}
	// 49 responses written: 51 pending, still above the low mark.
	for range 49 {
		f.release <- struct{}{}
	}
	if n := settle(f); n != 100 {
		t.Fatalf("read %d requests at 51 pending, want no resume before the low mark", n)
	}
	// The 50th write reaches the low mark: reading resumes up to 100 pending.
	f.release <- struct{}{}
	if n := settle(f); n != 150 {
		t.Fatalf("read %d requests after reaching the low mark, want 150", n)
	}
	// Let everything through.
	for range total - 50 {
		f.release <- struct{}{}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, sent := f.counts(); sent == total {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %v of %d responses written", ch.Stats().Written, total)
		}
		time.Sleep(5 * time.Millisecond)
	}
	st := ch.Stats()
	if st.MaxPending > 100 || st.Pauses < 2 || st.Pending != 0 || st.Dropped != 0 {
		t.Errorf("stats %+v: want max pending ≤ 100, ≥ 2 pauses, nothing pending or dropped", st)
	}
	if st.Resumes < 2 || st.LowestResume != 50 {
		t.Errorf("stats %+v: want ≥ 2 resumes, each at the low mark (lowest 50)", st)
	}
	select {
	case err := <-runErr:
		t.Fatalf("channel closed while busy: %v (abort code %v)", err, f.aborted)
	default:
	}
	cancel()
	if err := <-runErr; !errors.Is(err, context.Canceled) && !errors.Is(err, io.EOF) && err != nil && !strings.Contains(err.Error(), "closed") {
		t.Errorf("Run: %v", err)
	}
}

// TestRespondNeverBlocks: a handler answering from many goroutines is never
// blocked by a stalled writer.
// TestLateResumeDrainsThePipeline: the late-resume fault resumes a paused
// reader only when nothing is pending, and the stats say so.
func TestLateResumeDrainsThePipeline(t *testing.T) {
	f := newFake(300)
	opts := withFaults(Options{HighMark: 100, LowMark: 50})
	opts.LateResume = true
	ch := New(f, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	go func() { _ = ch.Run(ctx, answerAtOnce) }()
	if n := settle(f); n != 100 {
		t.Fatalf("read %d requests, want to stop at 100", n)
	}
	if st := ch.Stats(); st.LowestResume != -1 || st.Resumes != 0 {
		t.Fatalf("stats %+v before any resume, want lowest -1 and no resumes", st)
	}
	for range 99 {
		f.release <- struct{}{}
	}
	if n := settle(f); n != 100 {
		t.Fatalf("read %d requests at 1 pending, want no resume before the pipeline is empty", n)
	}
	f.release <- struct{}{}
	if n := settle(f); n != 200 {
		t.Fatalf("read %d requests once empty, want 200", n)
	}
	if st := ch.Stats(); st.Resumes != 1 || st.LowestResume != 0 {
		t.Errorf("stats %+v: want one resume at 0 pending", st)
	}
}

func TestRespondNeverBlocks(t *testing.T) {
	f := newFake(50)
	ch := New(f, withFaults(Options{HighMark: 100, LowMark: 50}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	answered := make(chan struct{}, 50)
	runDone := make(chan struct{})
	go func() {
		defer close(runDone)
		_ = ch.Run(ctx, func(ch *Channel, msg Message) {
			go func() {
				answerAtOnce(ch, msg)
				answered <- struct{}{}
			}()
		})
	}()
	for i := range 50 {
		select {
		case <-answered:
		case <-time.After(5 * time.Second):
			t.Fatalf("Respond blocked: %d of 50 returned with the writer stalled", i)
		}
	}
	cancel()
	<-runDone
	if st := ch.Stats(); st.Pending != 0 {
		t.Errorf("after close: %d pending, want 0 (dropped responses are released)", st.Pending)
	}
}

// TestParkedRequestsHoldNoSlot: requests the handler parks do not count
// toward the high mark, so the reader goes on reading past it; answered,
// they are pending again until written and the counts return to zero.
func TestParkedRequestsHoldNoSlot(t *testing.T) {
	const total = 300
	f := newFake(total)
	ch := New(f, withFaults(Options{HighMark: 100, LowMark: 50}))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var mu sync.Mutex
	var parked []uint32
	runErr := make(chan error, 1)
	go func() {
		runErr <- ch.Run(ctx, func(ch *Channel, msg Message) {
			ch.Park()
			mu.Lock()
			parked = append(parked, msg.RequestID)
			mu.Unlock()
		})
	}()
	if n := settle(f); n != total {
		t.Fatalf("read %d of %d parked requests: the reader stopped", n, total)
	}
	if st := ch.Stats(); st.Parked != total || st.Pending != 0 || st.Pauses != 0 {
		t.Fatalf("stats %+v: want %d parked, nothing pending, no pause", st, total)
	}
	mu.Lock()
	ids := parked
	mu.Unlock()
	// The last one is dropped (publish-drop), the others answered.
	ch.ForgetParked()
	for _, id := range ids[1:] {
		ch.RespondParked(id, &ua.PublishResponse{ResponseHeader: &ua.ResponseHeader{RequestHandle: id}})
	}
	if st := ch.Stats(); st.Parked != 0 || st.Pending != total-1 {
		t.Fatalf("stats %+v: want nothing parked, %d pending", st, total-1)
	}
	for range total - 1 {
		f.release <- struct{}{}
	}
	deadline := time.Now().Add(10 * time.Second)
	for ch.Stats().Written != total-1 {
		if time.Now().After(deadline) {
			t.Fatalf("stats %+v: not every answer written", ch.Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if st := ch.Stats(); st.Pending != 0 || st.Dropped != 1 {
		t.Errorf("stats %+v: want nothing pending, 1 dropped", st)
	}
	cancel()
	<-runErr
}

// TestParkHoldsSlotFaultStopsTheReader is the publish-blocks-reader fault:
// parked requests stay pending, so the reader stops at the high mark with
// only parked requests outstanding.
func TestParkHoldsSlotFaultStopsTheReader(t *testing.T) {
	f := newFake(300)
	ch := New(f, withFaults(Options{HighMark: 100, LowMark: 50, ParkHoldsSlot: true}))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	runErr := make(chan error, 1)
	go func() {
		runErr <- ch.Run(ctx, func(ch *Channel, msg Message) { ch.Park() })
	}()
	if n := settle(f); n != 100 {
		t.Errorf("read %d requests, want the high mark's 100: the reader went on", n)
	}
	if st := ch.Stats(); st.Parked != 100 || st.Pending != 100 || st.Pauses != 1 {
		t.Errorf("stats %+v: want 100 parked and pending, one pause", st)
	}
	cancel()
	<-runErr
}

// TestWriterDropsKickFaultHoldsAResponse is the writer-lost-wakeup fault:
// a response queued while the writer writes another waits until a later
// response on the channel wakes the writer; without the fault it goes out
// right after the write.
func TestWriterDropsKickFaultHoldsAResponse(t *testing.T) {
	for _, fault := range []bool{false, true} {
		f := newFake(3)
		ch := New(f, withFaults(Options{WriterDropsKick: fault}))
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		runErr := make(chan error, 1)
		go func() { runErr <- ch.Run(ctx, func(*Channel, Message) {}) }()
		if n := settle(f); n != 3 {
			t.Fatalf("read %d of 3 requests", n)
		}
		resp := func(id uint32) ua.Response {
			return &ua.ReadResponse{ResponseHeader: &ua.ResponseHeader{RequestHandle: id}}
		}
		ch.Respond(1, resp(1)) // the writer takes it and blocks in Send
		time.Sleep(20 * time.Millisecond)
		ch.Respond(2, resp(2)) // queued during the write
		for range 3 {
			f.release <- struct{}{}
		}
		time.Sleep(100 * time.Millisecond)
		want := int64(2)
		if fault {
			want = 1 // response 2 held
		}
		if w := ch.Stats().Written; w != want {
			t.Errorf("fault %v: %d written while nothing else was answered, want %d", fault, w, want)
		}
		ch.Respond(3, resp(3)) // a later response wakes the writer
		deadline := time.Now().Add(5 * time.Second)
		for ch.Stats().Written != 3 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if w := ch.Stats().Written; w != 3 {
			t.Errorf("fault %v: %d of 3 written after a later response", fault, w)
		}
		cancel()
		<-runErr
	}
}
