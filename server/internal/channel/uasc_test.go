package channel

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/gopcua/opcua/id"
	"github.com/gopcua/opcua/ua"
	"github.com/gopcua/opcua/uacp"

	"github.com/opcua-chaos/opcua-chaos/internal/uawire"
	"github.com/opcua-chaos/opcua-chaos/server/internal/uabin"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// pair accepts one connection with cfg and dials it with hel; the
// transport's Receive runs in the test.
func pair(t *testing.T, cfg Config, hel uacp.Hello) (*SecureTransport, *uawire.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	type result struct {
		st  *SecureTransport
		err error
	}
	res := make(chan result, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			res <- result{nil, err}
			return
		}
		cfg.Logger = quiet
		st, err := Accept(c, cfg)
		res <- result{st, err}
	}()
	c, err := uawire.Dial(l.Addr().String(), hel)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	r := <-res
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() { r.st.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return r.st, c
}

// open runs the client's OpenSecureChannel against st, which serves it in
// Receive and then returns the client's first request.
func open(t *testing.T, st *SecureTransport, c *uawire.Conn) {
	t.Helper()
	msgc := make(chan Message, 1)
	go func() {
		m, _ := st.Receive(context.Background())
		msgc <- m
	}()
	if err := c.Open(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Send(&ua.GetEndpointsRequest{}); err != nil {
		t.Fatal(err)
	}
	if m := <-msgc; m.Request == nil {
		t.Fatalf("first request: %+v", m)
	}
}

// bigResponse is a ReadResponse of n String values of 100 bytes.
func bigResponse(n int) *ua.ReadResponse {
	r := &ua.ReadResponse{ResponseHeader: &ua.ResponseHeader{RequestHandle: 9, ServiceDiagnostics: &ua.DiagnosticInfo{}, AdditionalHeader: ua.NewExtensionObject(nil)}}
	for range n {
		r.Results = append(r.Results, &ua.DataValue{EncodingMask: ua.DataValueValue, Value: ua.MustVariant(string(bytes.Repeat([]byte("x"), 100)))})
	}
	return r
}

// TestSendSplitsIntoChunks: a response larger than the client's receive
// buffer goes out in chunks of at most that size, with increasing sequence
// numbers, the last one final.
func TestSendSplitsIntoChunks(t *testing.T) {
	st, c := pair(t, Config{IDs: IDs{SecureChannelID: 5, SequenceNumber: 1, TokenID: 3}}, uacp.Hello{ReceiveBufSize: 8192, SendBufSize: 8192})
	open(t, st, c)
	go func() { _ = st.Send(context.Background(), 42, bigResponse(1000)) }()
	var last uint32
	var data []byte
	for {
		typ, chunk, body, err := c.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		if typ != "MSG" || len(body)+8 > 8192 {
			t.Fatalf("%s%c of %d bytes", typ, chunk, len(body)+8)
		}
		ch, tok, seq, req := binary.LittleEndian.Uint32(body), binary.LittleEndian.Uint32(body[4:]), binary.LittleEndian.Uint32(body[8:]), binary.LittleEndian.Uint32(body[12:])
		if ch != 5 || tok != 3 || req != 42 || seq <= last {
			t.Fatalf("chunk header channel %d token %d seq %d (last %d) request %d", ch, tok, seq, last, req)
		}
		last = seq
		data = append(data, body[16:]...)
		if chunk == 'F' {
			break
		}
	}
	_, v, err := ua.DecodeService(data)
	if err != nil || len(v.(*ua.ReadResponse).Results) != 1000 {
		t.Fatalf("reassembled: %v", err)
	}
}

// TestSendResponseTooLarge: beyond the client's MaxChunkCount the response
// is replaced by a ServiceFault BadResponseTooLarge with its handle.
func TestSendResponseTooLarge(t *testing.T) {
	st, c := pair(t, Config{IDs: IDs{SecureChannelID: 5, SequenceNumber: 1, TokenID: 3}}, uacp.Hello{ReceiveBufSize: 8192, SendBufSize: 8192, MaxChunkCount: 2})
	open(t, st, c)
	go func() { _ = st.Send(context.Background(), 42, bigResponse(1000)) }()
	r, err := c.Receive()
	if err != nil {
		t.Fatal(err)
	}
	f, ok := r.Value.(*ua.ServiceFault)
	if !ok || f.ResponseHeader.ServiceResult != ua.StatusBadResponseTooLarge || f.ResponseHeader.RequestHandle != 9 || r.RequestID != 42 {
		t.Fatalf("got %T %+v", r.Value, r.Value)
	}
}

// TestProtocolErrors: violations are answered with an ERR message and a
// closed connection.
func TestProtocolErrors(t *testing.T) {
	for name, tc := range map[string]struct {
		open bool
		send func(c *uawire.Conn) error
		want ua.StatusCode
	}{
		"MSG before OPN": {false, func(c *uawire.Conn) error { return c.Chunk('F', 1, []byte{1, 2}) }, ua.StatusBadTCPSecureChannelUnknown},
		"unknown token": {true, func(c *uawire.Conn) error {
			c.TokenID++
			return c.Chunk('F', 1, []byte{1, 2})
		}, ua.StatusBadSecureChannelTokenUnknown},
		"unknown channel": {true, func(c *uawire.Conn) error {
			c.ChannelID++
			return c.Chunk('F', 1, []byte{1, 2})
		}, ua.StatusBadTCPSecureChannelUnknown},
		"message type": {true, func(c *uawire.Conn) error {
			_, err := c.Write(uawire.Frame("XYZ", 'F', make([]byte, 16)))
			return err
		}, ua.StatusBadTCPMessageTypeInvalid},
		"chunk larger than the buffer": {true, func(c *uawire.Conn) error {
			_, err := c.Write(binary.LittleEndian.AppendUint32([]byte("MSGF"), 70000))
			return err
		}, ua.StatusBadTCPMessageTooLarge},
		"no sequence header": {true, func(c *uawire.Conn) error {
			_, err := c.Write(uawire.Frame("MSG", 'F', make([]byte, 10)))
			return err
		}, ua.StatusBadDecodingError},
	} {
		t.Run(name, func(t *testing.T) {
			st, c := pair(t, Config{IDs: IDs{SecureChannelID: 5, SequenceNumber: 1, TokenID: 3}}, uacp.Hello{})
			if tc.open {
				open(t, st, c)
			}
			errc := make(chan error, 1)
			go func() {
				_, err := st.Receive(context.Background())
				errc <- err
			}()
			if err := tc.send(c); err != nil {
				t.Fatal(err)
			}
			_, _, _, err := c.ReadFrame()
			var em *uawire.ErrorMessage
			if !errors.As(err, &em) || em.Code != tc.want {
				t.Fatalf("got %v, want ERR %v", err, tc.want)
			}
			var pe *ProtocolError
			if err := <-errc; !errors.As(err, &pe) || pe.Code != tc.want {
				t.Errorf("Receive: %v", err)
			}
		})
	}
}

// TestRenew: a Renew issues a new token; the old one is accepted until
// the client uses the new one, then refused.
func TestRenew(t *testing.T) {
	st, c := pair(t, Config{IDs: IDs{SecureChannelID: 5, SequenceNumber: 1, TokenID: 3}}, uacp.Hello{})
	open(t, st, c)
	type result struct {
		m   Message
		err error
	}
	recv := make(chan result, 1)
	receive := func() result {
		go func() {
			m, err := st.Receive(context.Background())
			recv <- result{m, err}
		}()
		return <-recv
	}
	renewed := make(chan error, 1)
	go func() { renewed <- c.Renew() }()
	go func() {
		m, err := st.Receive(context.Background())
		recv <- result{m, err}
	}()
	if err := <-renewed; err != nil || c.TokenID != 4 {
		t.Fatalf("Renew: %v, token %d", err, c.TokenID)
	}
	c.TokenID = 3 // the old token still works
	if _, err := c.Send(&ua.GetEndpointsRequest{}); err != nil {
		t.Fatal(err)
	}
	if r := <-recv; r.err != nil || r.m.Request == nil {
		t.Fatalf("old token after Renew: %+v", r)
	}
	c.TokenID = 4
	if _, err := c.Send(&ua.GetEndpointsRequest{}); err != nil {
		t.Fatal(err)
	}
	if r := receive(); r.err != nil || r.m.Request == nil {
		t.Fatalf("new token: %+v", r)
	}
	c.TokenID = 3 // the client moved on: the old token is gone
	if _, err := c.Send(&ua.GetEndpointsRequest{}); err != nil {
		t.Fatal(err)
	}
	var pe *ProtocolError
	if r := receive(); !errors.As(r.err, &pe) || pe.Code != ua.StatusBadSecureChannelTokenUnknown {
		t.Fatalf("old token after the new one was used: %+v", r)
	}
}

// TestHelloRejected: buffers below 8192 bytes are refused.
func TestHelloRejected(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		c, err := l.Accept()
		if err == nil {
			_, _ = Accept(c, Config{Logger: quiet})
		}
	}()
	_, err = uawire.Dial(l.Addr().String(), uacp.Hello{ReceiveBufSize: 1024, SendBufSize: 1024})
	var em *uawire.ErrorMessage
	if !errors.As(err, &em) || em.Code != ua.StatusBadConnectionRejected {
		t.Fatalf("got %v, want ERR BadConnectionRejected", err)
	}
}

// negativeVariantLength is a WriteRequest body whose Variant claims -2
// elements (issue 14).
func negativeVariantLength(t *testing.T) []byte {
	b, err := uawire.EncodeService(&ua.WriteRequest{
		RequestHeader: &ua.RequestHeader{AuthenticationToken: ua.NewTwoByteNodeID(0), RequestHandle: 77, AdditionalHeader: ua.NewExtensionObject(nil)},
		NodesToWrite: []*ua.WriteValue{{NodeID: ua.NewNumericNodeID(0, id.Server), AttributeID: ua.AttributeIDValue,
			Value: &ua.DataValue{EncodingMask: ua.DataValueValue, Value: ua.MustVariant([]int32{0x5a5a5a5a})}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Replace(b, []byte{0x86, 1, 0, 0, 0, 0x5a, 0x5a, 0x5a, 0x5a}, []byte{0x86, 0xfe, 0xff, 0xff, 0xff}, 1)
}

// TestUnguardedDecodePanics: the crash-on-decode fault bypasses the guard,
// so gopcua's panic escapes the transport (recovered here, at test level);
// guarded, the same request is an answerable decoding error with its
// RequestHandle.
func TestUnguardedDecodePanics(t *testing.T) {
	body := negativeVariantLength(t)
	guarded := &SecureTransport{decoder: uabin.NewDecoder(uabin.Limits{}), log: quiet}
	msg := guarded.request(1, body)
	if !errors.Is(msg.Err, ua.StatusBadDecodingError) || msg.Handle != 77 {
		t.Errorf("guarded: %+v", msg)
	}
	unguarded := &SecureTransport{cfg: Config{Unguarded: true}, decoder: uabin.NewDecoder(uabin.Limits{}), log: quiet}
	defer func() {
		if p := recover(); p == nil {
			t.Error("unguarded decode did not panic")
		}
	}()
	unguarded.request(1, body)
}

// TestWriteLockWithin: LockWithin gets a lock released within its bound
// and gives up on one held longer.
func TestWriteLockWithin(t *testing.T) {
	l := newWriteLock()
	l.Lock()
	go func() {
		time.Sleep(20 * time.Millisecond)
		l.Unlock()
	}()
	if !l.LockWithin(5 * time.Second) {
		t.Fatal("LockWithin did not get a lock released after 20 ms")
	}
	start := time.Now()
	if l.LockWithin(50 * time.Millisecond) {
		t.Fatal("LockWithin got a lock that is held")
	}
	if waited := time.Since(start); waited < 50*time.Millisecond {
		t.Fatalf("LockWithin gave up after %v, want at least 50ms", waited)
	}
}
