package channel

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/gopcua/opcua/ua"
	"github.com/gopcua/opcua/uacp"
	"github.com/gopcua/opcua/uasc"
)

// IDs are the identifiers a server assigns to a new secure channel.
type IDs struct {
	SecureChannelID uint32
	SequenceNumber  uint32
	TokenID         uint32
}

// SecureTransport is a Transport over gopcua's uacp/uasc packages with
// SecurityPolicy None.
type SecureTransport struct {
	conn *uacp.Conn
	sc   *uasc.SecureChannel
	// EndpointURL is the endpoint URL the client sent in its Hello message.
	EndpointURL string
	// MaxResponseSize is the largest message the client accepts: its
	// receive buffer size, or its max message size if smaller and not 0.
	// uasc writes a response as one chunk, so no response may exceed it.
	MaxResponseSize int
}

// Accept runs the UACP Hello/Acknowledge handshake on c (which must be a
// *net.TCPConn) and creates a server secure channel over it. The handshake is
// bounded by timeout. On error, c is closed.
func Accept(c net.Conn, ids IDs, timeout time.Duration) (*SecureTransport, error) {
	tcp, ok := c.(*net.TCPConn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("channel: %T is not a TCP connection", c)
	}
	ack := *uacp.DefaultServerACK // per connection: uacp.Conn keeps the pointer
	conn, err := uacp.NewConn(tcp, &ack)
	if err != nil {
		c.Close()
		return nil, err
	}
	_ = c.SetDeadline(time.Now().Add(timeout))
	b, err := conn.Receive()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("channel: handshake: %w", err)
	}
	if len(b) < 8 || string(b[:4]) != "HELF" {
		conn.SendError(ua.StatusBadTCPMessageTypeInvalid)
		conn.Close()
		return nil, fmt.Errorf("channel: handshake: expected HEL, got %q", b[:min(4, len(b))])
	}
	hel := new(uacp.Hello)
	if _, err := hel.Decode(b[8:]); err != nil {
		conn.SendError(ua.StatusBadTCPInternalError)
		conn.Close()
		return nil, fmt.Errorf("channel: handshake: %w", err)
	}
	if err := conn.Send("ACKF", &ack); err != nil {
		conn.Close()
		return nil, fmt.Errorf("channel: handshake: %w", err)
	}
	_ = c.SetDeadline(time.Time{})

	cfg := &uasc.Config{
		SecurityPolicyURI: ua.SecurityPolicyURINone,
		SecurityMode:      ua.MessageSecurityModeNone,
		Lifetime:          uint32(time.Hour / time.Millisecond),
	}
	// uasc reports nothing on errch for server channels; it only must not be nil.
	errch := make(chan error, 1)
	sc, err := uasc.NewServerSecureChannel(hel.EndpointURL, conn, cfg, errch, ids.SecureChannelID, ids.SequenceNumber, ids.TokenID)
	if err != nil {
		conn.Close()
		return nil, err
	}
	limit := int(min(hel.ReceiveBufSize, ack.SendBufSize))
	if hel.MaxMessageSize > 0 {
		limit = min(limit, int(hel.MaxMessageSize))
	}
	return &SecureTransport{conn: conn, sc: sc, EndpointURL: hel.EndpointURL, MaxResponseSize: limit}, nil
}

// Receive returns the next service request. OpenSecureChannel requests are
// answered by uasc itself and skipped; aborted chunked messages are skipped.
func (t *SecureTransport) Receive(ctx context.Context) (Message, error) {
	for {
		msg := t.sc.Receive(ctx)
		if msg.Err != nil {
			if errors.Is(msg.Err, io.EOF) {
				return Message{}, io.EOF
			}
			if msg.RequestID == 0 {
				return Message{}, msg.Err // transport error: the stream is lost
			}
			var code ua.StatusCode
			if errors.As(msg.Err, &code) {
				continue // MSGA abort chunk: the peer gave up on one request
			}
			// The whole message was read but could not be decoded (or was
			// too large): answer it and keep the channel.
			return Message{RequestID: msg.RequestID, Err: msg.Err}, nil
		}
		req := msg.Request()
		if req == nil {
			continue // OpenSecureChannel, handled by uasc
		}
		return Message{RequestID: msg.RequestID, Request: req}, nil
	}
}

// Send writes one response.
func (t *SecureTransport) Send(ctx context.Context, reqID uint32, resp ua.Response) error {
	return t.sc.SendResponseWithContext(ctx, reqID, resp)
}

// Abort sends an ERR message with code and closes the connection.
func (t *SecureTransport) Abort(code ua.StatusCode) error {
	_ = t.conn.SetWriteDeadline(time.Now().Add(time.Second))
	t.conn.SendError(code)
	return t.conn.Close()
}

// Close closes the connection. (uasc's SecureChannel.Close would try to send
// a CloseSecureChannel request, which is a client's job.)
func (t *SecureTransport) Close() error {
	err := t.conn.Close()
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// RemoteAddr returns the peer's address.
func (t *SecureTransport) RemoteAddr() net.Addr { return t.conn.RemoteAddr() }
