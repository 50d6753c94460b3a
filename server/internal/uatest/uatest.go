// Package uatest is a raw OPC UA client for the server's tests. It speaks
// the UA Connection Protocol and UA Secure Conversation (SecurityPolicy
// None) byte by byte, so a test can send what no well-behaved client would:
// malformed bodies, floods of unfinished chunks, small receive buffers.
package uatest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/gopcua/opcua/ua"
	"github.com/gopcua/opcua/uacp"
)

// Conn is a raw client connection. It is not safe for concurrent use.
type Conn struct {
	net.Conn
	// Ack is the server's Acknowledge.
	Ack uacp.Acknowledge
	// ChannelID and TokenID identify the open secure channel.
	ChannelID, TokenID uint32
	// Token is the authentication token of the session (CreateSession).
	Token *ua.NodeID

	seq    uint32
	reqID  uint32
	handle uint32
}

// Dial connects to addr (host:port) and runs the Hello/Acknowledge
// handshake with hel; zero buffer sizes mean 65535.
func Dial(addr string, hel uacp.Hello) (*Conn, error) {
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	c := &Conn{Conn: nc}
	if hel.ReceiveBufSize == 0 {
		hel.ReceiveBufSize = 0xffff
	}
	if hel.SendBufSize == 0 {
		hel.SendBufSize = 0xffff
	}
	if hel.EndpointURL == "" {
		hel.EndpointURL = "opc.tcp://" + addr
	}
	body, err := ua.Encode(&hel)
	if err != nil {
		nc.Close()
		return nil, err
	}
	_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
	defer nc.SetDeadline(time.Time{})
	if _, err := nc.Write(Frame("HEL", 'F', body)); err != nil {
		nc.Close()
		return nil, err
	}
	typ, _, body, err := c.ReadFrame()
	if err != nil {
		nc.Close()
		return nil, err
	}
	if typ != "ACK" {
		nc.Close()
		return nil, fmt.Errorf("uatest: handshake: got %s", typ)
	}
	if _, err := c.Ack.Decode(body); err != nil {
		nc.Close()
		return nil, err
	}
	return c, nil
}

// Frame returns a UACP frame.
func Frame(typ string, chunk byte, body []byte) []byte {
	b := append([]byte(typ), chunk)
	b = binary.LittleEndian.AppendUint32(b, uint32(8+len(body)))
	return append(b, body...)
}

// EncodeService encodes a service structure with its four-byte type id.
func EncodeService(v any) ([]byte, error) {
	typeID := ua.ServiceTypeID(v)
	if typeID == 0 {
		return nil, fmt.Errorf("uatest: %T is not a service", v)
	}
	b, err := ua.Encode(v)
	if err != nil {
		return nil, err
	}
	return append([]byte{1, 0, byte(typeID), byte(typeID >> 8)}, b...), nil
}

// ErrorMessage is an ERR message from the server.
type ErrorMessage struct {
	Code   ua.StatusCode
	Reason string
}

func (e *ErrorMessage) Error() string {
	return fmt.Sprintf("uatest: ERR %v: %s", e.Code, e.Reason)
}

// ReadFrame reads one frame. An ERR frame is returned as an *ErrorMessage.
func (c *Conn) ReadFrame() (typ string, chunk byte, body []byte, err error) {
	var hdr [8]byte
	if _, err := io.ReadFull(c.Conn, hdr[:]); err != nil {
		return "", 0, nil, err
	}
	size := binary.LittleEndian.Uint32(hdr[4:])
	if size < 8 || size > 64<<20 {
		return "", 0, nil, fmt.Errorf("uatest: frame of %d bytes", size)
	}
	body = make([]byte, size-8)
	if _, err := io.ReadFull(c.Conn, body); err != nil {
		return "", 0, nil, err
	}
	typ, chunk = string(hdr[:3]), hdr[3]
	if typ == "ERR" {
		var m uacp.Error
		_, _ = m.Decode(body)
		return typ, chunk, body, &ErrorMessage{Code: ua.StatusCode(m.ErrorCode), Reason: m.Reason}
	}
	return typ, chunk, body, nil
}

// Open opens the secure channel (OpenSecureChannel, Issue).
func (c *Conn) Open() error { return c.openSecureChannel(ua.SecurityTokenRequestTypeIssue) }

// Renew renews the security token (OpenSecureChannel, Renew); TokenID is
// the new token.
func (c *Conn) Renew() error { return c.openSecureChannel(ua.SecurityTokenRequestTypeRenew) }

func (c *Conn) openSecureChannel(kind ua.SecurityTokenRequestType) error {
	body, err := EncodeService(&ua.OpenSecureChannelRequest{
		RequestHeader:     c.header(nil),
		RequestType:       kind,
		SecurityMode:      ua.MessageSecurityModeNone,
		ClientNonce:       []byte{},
		RequestedLifetime: 3_600_000,
	})
	if err != nil {
		return err
	}
	b := binary.LittleEndian.AppendUint32(nil, c.ChannelID)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(ua.SecurityPolicyURINone)))
	b = append(b, ua.SecurityPolicyURINone...)
	b = binary.LittleEndian.AppendUint32(b, 0xffffffff)
	b = binary.LittleEndian.AppendUint32(b, 0xffffffff)
	b = binary.LittleEndian.AppendUint32(b, c.nextSeq())
	b = binary.LittleEndian.AppendUint32(b, c.nextReqID())
	if _, err := c.Write(Frame("OPN", 'F', append(b, body...))); err != nil {
		return err
	}
	typ, _, body, err := c.ReadFrame()
	if err != nil {
		return err
	}
	if typ != "OPN" {
		return fmt.Errorf("uatest: OpenSecureChannel answered with %s", typ)
	}
	// Skip the channel id and asymmetric header, then the sequence header.
	r := body[4:]
	for range 3 {
		n := int32(binary.LittleEndian.Uint32(r))
		r = r[4+max(n, 0):]
	}
	_, v, err := ua.DecodeService(r[8:])
	if err != nil {
		return err
	}
	resp, ok := v.(*ua.OpenSecureChannelResponse)
	if !ok {
		return fmt.Errorf("uatest: OPN answered with %T", v)
	}
	c.ChannelID, c.TokenID = resp.SecurityToken.ChannelID, resp.SecurityToken.TokenID
	return nil
}

func (c *Conn) nextSeq() uint32   { c.seq++; return c.seq }
func (c *Conn) nextReqID() uint32 { c.reqID++; return c.reqID }

// header returns a request header with token (nil: the session's).
func (c *Conn) header(token *ua.NodeID) *ua.RequestHeader {
	if token == nil {
		token = c.Token
	}
	if token == nil {
		token = ua.NewTwoByteNodeID(0)
	}
	c.handle++
	return &ua.RequestHeader{
		AuthenticationToken: token,
		Timestamp:           time.Now(),
		RequestHandle:       c.handle,
		TimeoutHint:         10_000,
		AdditionalHeader:    ua.NewExtensionObject(nil),
	}
}

// Chunk writes one MSG chunk of kind chunk ('C', 'F' or 'A') for request
// reqID with data as its body part.
func (c *Conn) Chunk(chunk byte, reqID uint32, data []byte) error {
	b := binary.LittleEndian.AppendUint32(nil, c.ChannelID)
	b = binary.LittleEndian.AppendUint32(b, c.TokenID)
	b = binary.LittleEndian.AppendUint32(b, c.nextSeq())
	b = binary.LittleEndian.AppendUint32(b, reqID)
	_, err := c.Write(Frame("MSG", chunk, append(b, data...)))
	return err
}

// SendBody sends a service message body (type id and structure), in
// chunks within the server's receive buffer, and returns its request id.
func (c *Conn) SendBody(body []byte) (uint32, error) {
	id := c.nextReqID()
	max := int(c.Ack.ReceiveBufSize) - 24
	for len(body) > max {
		if err := c.Chunk('C', id, body[:max]); err != nil {
			return id, err
		}
		body = body[max:]
	}
	return id, c.Chunk('F', id, body)
}

// Send sets req's header (the session's token unless it has one) and sends
// it.
func (c *Conn) Send(req ua.Request) (uint32, error) {
	h := req.Header()
	var token *ua.NodeID
	if h != nil {
		token = h.AuthenticationToken
	}
	hdr := c.header(token)
	if h != nil && h.TimeoutHint != 0 {
		hdr.TimeoutHint = h.TimeoutHint
	}
	req.SetHeader(hdr)
	body, err := EncodeService(req)
	if err != nil {
		return 0, err
	}
	return c.SendBody(body)
}

// Response is one reassembled response.
type Response struct {
	RequestID uint32
	Value     any   // the decoded service structure
	Chunks    []int // size of each chunk, headers included
}

// Status returns the service result of the response.
func (r *Response) Status() ua.StatusCode {
	if resp, ok := r.Value.(ua.Response); ok && resp.Header() != nil {
		return resp.Header().ServiceResult
	}
	return ua.StatusBadUnexpectedError
}

// Receive reads chunks until a response is complete.
func (c *Conn) Receive() (*Response, error) {
	var data []byte
	var sizes []int
	for {
		typ, chunk, body, err := c.ReadFrame()
		if err != nil {
			return nil, err
		}
		if typ != "MSG" || len(body) < 16 {
			return nil, fmt.Errorf("uatest: got %s%c of %d bytes", typ, chunk, len(body)+8)
		}
		sizes = append(sizes, len(body)+8)
		data = append(data, body[16:]...)
		switch chunk {
		case 'C':
			continue
		case 'A':
			return nil, errors.New("uatest: response aborted")
		}
		_, v, err := ua.DecodeService(data)
		if err != nil {
			return nil, err
		}
		return &Response{RequestID: binary.LittleEndian.Uint32(body[12:]), Value: v, Chunks: sizes}, nil
	}
}

// Call sends req and waits for its response (others are skipped).
func (c *Conn) Call(req ua.Request) (*Response, error) {
	id, err := c.Send(req)
	if err != nil {
		return nil, err
	}
	for {
		r, err := c.Receive()
		if err != nil || r.RequestID == id {
			return r, err
		}
	}
}

// AnonymousPolicy returns the PolicyId of the first anonymous token policy
// the endpoints advertise ("" if none does).
func AnonymousPolicy(eps []*ua.EndpointDescription) string {
	for _, e := range eps {
		for _, p := range e.UserIdentityTokens {
			if p != nil && p.TokenType == ua.UserTokenTypeAnonymous {
				return p.PolicyID
			}
		}
	}
	return ""
}

// Session creates a session and activates it with identity (nil:
// anonymous); Token is set to its authentication token.
func (c *Conn) Session(identity any) error {
	r, err := c.Call(&ua.CreateSessionRequest{
		RequestHeader:           &ua.RequestHeader{AuthenticationToken: ua.NewTwoByteNodeID(0)},
		ClientDescription:       &ua.ApplicationDescription{ApplicationName: ua.NewLocalizedText("uatest")},
		SessionName:             "uatest",
		ClientNonce:             make([]byte, 32),
		RequestedSessionTimeout: 60_000,
	})
	if err != nil {
		return err
	}
	created, ok := r.Value.(*ua.CreateSessionResponse)
	if !ok {
		return fmt.Errorf("uatest: CreateSession: %v", r.Status())
	}
	c.Token = created.AuthenticationToken
	if identity == nil {
		identity = &ua.AnonymousIdentityToken{PolicyID: AnonymousPolicy(created.ServerEndpoints)}
	}
	r, err = c.Call(&ua.ActivateSessionRequest{
		ClientSignature:    &ua.SignatureData{},
		UserIdentityToken:  ua.NewExtensionObject(identity),
		UserTokenSignature: &ua.SignatureData{},
	})
	if err != nil {
		return err
	}
	if r.Status() != ua.StatusOK {
		return fmt.Errorf("uatest: ActivateSession: %v", r.Status())
	}
	return nil
}
