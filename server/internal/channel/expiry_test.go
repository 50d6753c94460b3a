package channel

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gopcua/opcua/ua"
	"github.com/gopcua/opcua/uacp"
)

// TestTokenClockStopsWhileReaderStalls: a token's lifetime runs only while
// the reader reads: a message read late because the reader was paused is
// accepted, one that arrives after the reader waited past the expiry is
// refused with BadSecureChannelTokenUnknown.
func TestTokenClockStopsWhileReaderStalls(t *testing.T) {
	const left = 100 * time.Millisecond
	st, c := pair(t, Config{EnforceLifetime: true}, uacp.Hello{})
	open(t, st, c)
	st.tokMu.Lock()
	st.expires = st.readTime(time.Now()) + left
	st.tokMu.Unlock()

	// The reader is outside Receive (paused) for 3 × left.
	time.Sleep(3 * left)
	if _, err := c.Send(&ua.GetEndpointsRequest{}); err != nil {
		t.Fatal(err)
	}
	if m, err := st.Receive(context.Background()); err != nil || m.Request == nil {
		t.Fatalf("request read after a stall: %+v %v, want it accepted", m, err)
	}

	// Now the reader waits in Receive past the expiry.
	type result struct {
		m   Message
		err error
	}
	res := make(chan result, 1)
	go func() {
		m, err := st.Receive(context.Background())
		res <- result{m, err}
	}()
	time.Sleep(3 * left)
	if _, err := c.Send(&ua.GetEndpointsRequest{}); err != nil {
		t.Fatal(err)
	}
	r := <-res
	var pe *ProtocolError
	if !errors.As(r.err, &pe) || pe.Code != ua.StatusBadSecureChannelTokenUnknown {
		t.Fatalf("request after the expiry: %+v %v, want BadSecureChannelTokenUnknown", r.m, r.err)
	}
}
