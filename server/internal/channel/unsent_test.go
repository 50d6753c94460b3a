package channel

import (
	"context"
	"testing"
	"time"

	"github.com/gopcua/opcua/ua"

	"github.com/opcua-chaos/opcua-chaos/server/internal/budget"
)

// encodingFake is a fakeTransport that encodes ahead (an Encoder): every
// answer but a ServiceFault is size bytes.
type encodingFake struct {
	*fakeTransport
	size int
}

func (f *encodingFake) Encode(reqID uint32, resp ua.Response) []byte {
	if _, fault := resp.(*ua.ServiceFault); fault {
		return make([]byte, 40)
	}
	return make([]byte, f.size)
}

func (f *encodingFake) SendEncoded(ctx context.Context, reqID uint32, body []byte) error {
	return f.Send(ctx, reqID, nil)
}

// TestUnsentBytesBudgeted: answers of 100 000 bytes to a peer that reads
// none, each answered as its request is read. The channel goes over its
// 250 000-byte share by one answer at most and then stops its reader;
// each written answer gives its bytes back, the reader resumes at half
// the share, and closing gives back what was still queued. Under
// responses-unbudgeted nothing is charged and only the count (the high
// mark) stops the reader.
func TestUnsentBytesBudgeted(t *testing.T) {
	for _, fault := range []bool{false, true} {
		b := budget.New(64 << 20)
		f := &encodingFake{fakeTransport: newFake(40), size: 100_000}
		ch := New(f, withFaults(Options{HighMark: 30, LowMark: 10, Budget: b, MaxUnsent: 250_000, UnbudgetedResponses: fault}))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- ch.Run(ctx, func(ch *Channel, msg Message) { ch.Respond(msg.RequestID, &ua.ReadResponse{}) })
		}()
		st := settleStats(ch)
		if fault {
			if st.Received != 30 || st.Unsent != 0 || b.UsedBy(budget.Responses) != 0 || st.BytePauses != 0 {
				t.Errorf("responses-unbudgeted: %+v, %d charged: want 30 read (the high mark), nothing charged", st, b.UsedBy(budget.Responses))
			}
			cancel()
			<-done
			continue
		}
		if st.Received != 3 || st.BytePauses != 1 || st.Unsent != 300_000 || b.UsedBy(budget.Responses) != 300_000 {
			t.Errorf("%+v, %d charged: want 3 read, 300 000 bytes unsent and charged, the reader stopped for them", st, b.UsedBy(budget.Responses))
		}
		// two answers written: 100 000 bytes left, below half the share:
		// the reader resumes
		f.release <- struct{}{}
		f.release <- struct{}{}
		if st2 := settleStats(ch); st2.Received <= st.Received {
			t.Errorf("received %d after two answers were written (unsent %d): want the reader resumed", st2.Received, st2.Unsent)
		}
		cancel()
		<-done
		if got := b.UsedBy(budget.Responses); got != 0 {
			t.Errorf("%d bytes still charged after the channel closed", got)
		}
	}
}

// TestUnsentOverShareRefused: 40 requests read before any is answered;
// their 100 000-byte answers come together. Three fit the 250 000-byte
// share (the third takes it over), the other 37 are answered with a
// ServiceFault BadResourceUnavailable, charged too, and counted refused
// in the budget.
func TestUnsentOverShareRefused(t *testing.T) {
	b := budget.New(64 << 20)
	f := &encodingFake{fakeTransport: newFake(40), size: 100_000}
	ch := New(f, withFaults(Options{HighMark: 100, Budget: b, MaxUnsent: 250_000}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		_ = ch.Run(ctx, func(ch *Channel, msg Message) {
			time.AfterFunc(50*time.Millisecond, func() { ch.Respond(msg.RequestID, &ua.ReadResponse{}) })
		})
	}()
	time.Sleep(200 * time.Millisecond) // the answers come after 50 ms
	st := settleStats(ch)
	if st.Received != 40 || st.Refused != 37 || st.Unsent != 300_000+37*40 {
		t.Errorf("%+v: want 40 read, 37 refused, 301 480 bytes unsent", st)
	}
	if got := b.Refused(budget.Responses); got != 37 {
		t.Errorf("budget counts %d refused responses, want 37", got)
	}
	if !ch.OverShare() {
		t.Error("OverShare false with the share taken")
	}
}

// settleStats returns ch's stats once they stop changing (at most 1 s).
func settleStats(ch *Channel) Stats {
	var last Stats
	for range 100 {
		time.Sleep(10 * time.Millisecond)
		st := ch.Stats()
		if st == last {
			return st
		}
		last = st
	}
	return last
}
