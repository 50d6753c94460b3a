package uawire

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/gopcua/opcua/ua"
	"github.com/gopcua/opcua/uacp"
)

// Limits of a Conn.
const (
	// BufSize is the buffer size a Hello announces by default (gopcua's).
	BufSize = 0xFFFF
	// MaxFrame bounds a frame the server sends to a Conn.
	MaxFrame = 64 << 20
)

// Conn is a raw client connection over SecurityPolicy None. Its methods
// write and read on the embedded net.Conn without deadlines of their own.
// It is not safe for concurrent use.
type Conn struct {
	net.Conn
	// Ack is the server's Acknowledge, once the Hello got one.
	Ack uacp.Acknowledge
	// ChannelID and TokenID identify the open secure channel.
	ChannelID, TokenID uint32
	// Token is the authentication token of the session, else nil.
	Token *ua.NodeID
	// Sequence numbers the chunks and requests sent.
	Sequence

	handle uint32
	// parts holds the chunks of responses still incomplete.
	parts Assembler
}

// NewConn returns a Conn over nc that has sent nothing yet.
func NewConn(nc net.Conn) *Conn { return &Conn{Conn: nc} }

// Dial connects to addr (host:port) and runs the Hello/Acknowledge
// handshake with hel; zero buffer sizes mean BufSize, an empty endpoint
// URL opc.tcp://addr.
func Dial(addr string, hel uacp.Hello) (*Conn, error) {
	nc, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	c := NewConn(nc)
	if hel.ReceiveBufSize == 0 {
		hel.ReceiveBufSize = BufSize
	}
	if hel.SendBufSize == 0 {
		hel.SendBufSize = BufSize
	}
	if hel.EndpointURL == "" {
		hel.EndpointURL = "opc.tcp://" + addr
	}
	_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
	defer nc.SetDeadline(time.Time{})
	if err := c.hello(hel); err != nil {
		nc.Close()
		return nil, err
	}
	return c, nil
}

// hello sends hel and reads the Acknowledge into Ack.
func (c *Conn) hello(hel uacp.Hello) error {
	b, err := HelloFrame(hel)
	if err != nil {
		return err
	}
	_, body, err := c.exchange(b, TypeAcknowledge)
	if err != nil {
		return err
	}
	_, err = c.Ack.Decode(body)
	return err
}

// exchange writes b and reads the answer, a frame of type want.
func (c *Conn) exchange(b []byte, want string) (chunk byte, body []byte, err error) {
	if _, err := c.Write(b); err != nil {
		return 0, nil, err
	}
	typ, chunk, body, err := c.ReadFrame()
	if err != nil {
		return 0, nil, err
	}
	if typ != want {
		return 0, nil, fmt.Errorf("uawire: %s answered with %s", b[:3], typ)
	}
	return chunk, body, nil
}

// ReadFrame reads one frame of at most MaxFrame bytes (see package
// function ReadFrame). An ERR message is returned with an *ErrorMessage
// error.
func (c *Conn) ReadFrame() (typ string, chunk byte, body []byte, err error) {
	typ, chunk, body, err = ReadFrame(c.Conn, MaxFrame)
	if err == nil && typ == TypeError {
		code, reason, _ := ParseError(body)
		err = &ErrorMessage{Code: ua.StatusCode(code), Reason: reason}
	}
	return typ, chunk, body, err
}

// Header returns the header of the next request, with token (nil: the
// session's, or the null token before a session).
func (c *Conn) Header(token *ua.NodeID) *ua.RequestHeader {
	if token == nil {
		token = c.Token
	}
	c.handle++
	return NewRequestHeader(token, c.handle)
}

// Body sets req's header (the session's token, the next handle) and
// returns its encoded body.
func (c *Conn) Body(req ua.Request) ([]byte, error) {
	req.SetHeader(c.Header(nil))
	return EncodeService(req)
}

// OpenFrame returns an OpenSecureChannel request of kind (Issue or Renew)
// for a token of lifetime, as an OPN chunk of the current channel, and
// its request id.
func (c *Conn) OpenFrame(kind ua.SecurityTokenRequestType, lifetime time.Duration) ([]byte, uint32, error) {
	req := NewOpenRequest(kind, ua.MessageSecurityModeNone, []byte{}, lifetime)
	req.RequestHeader = c.Header(nil)
	body, err := EncodeService(req)
	if err != nil {
		return nil, 0, err
	}
	seq, id := c.Next()
	return OpenFrame(c.ChannelID, seq, id, body), id, nil
}

// Opened takes the channel and token ids of an OpenSecureChannel response
// (v, as decoded); an error if v is none.
func (c *Conn) Opened(v any) error {
	resp, ok := v.(*ua.OpenSecureChannelResponse)
	if !ok || resp.SecurityToken == nil {
		return fmt.Errorf("uawire: OPN answered with %T", v)
	}
	c.ChannelID, c.TokenID = resp.SecurityToken.ChannelID, resp.SecurityToken.TokenID
	return nil
}

// Open opens the secure channel (OpenSecureChannel, Issue).
func (c *Conn) Open() error { return c.openSecureChannel(ua.SecurityTokenRequestTypeIssue) }

// Renew renews the security token (OpenSecureChannel, Renew); TokenID is
// the new token.
func (c *Conn) Renew() error { return c.openSecureChannel(ua.SecurityTokenRequestTypeRenew) }

func (c *Conn) openSecureChannel(kind ua.SecurityTokenRequestType) error {
	b, _, err := c.OpenFrame(kind, time.Hour)
	if err != nil {
		return err
	}
	chunk, body, err := c.exchange(b, TypeOpen)
	if err != nil {
		return err
	}
	ch, err := ParseBody(TypeOpen, chunk, body)
	if err != nil {
		return err
	}
	v, err := DecodeService(ch.Body)
	if err != nil {
		return err
	}
	return c.Opened(v)
}

// Chunk writes one MSG chunk of type chunk ('C', 'F' or 'A') of request
// reqID with data as its body part.
func (c *Conn) Chunk(chunk byte, reqID uint32, data []byte) error {
	_, err := c.Write(SymmetricFrame(TypeMessage, chunk, c.ChannelID, c.TokenID, c.NextSeq(), reqID, data))
	return err
}

// CloseFrame returns a CloseSecureChannel request (which has no response)
// as a CLO chunk.
func (c *Conn) CloseFrame() ([]byte, error) {
	body, err := c.Body(&ua.CloseSecureChannelRequest{})
	if err != nil {
		return nil, err
	}
	id := c.NextRequestID()
	return SymmetricFrame(TypeClose, ChunkFinal, c.ChannelID, c.TokenID, c.NextSeq(), id, body), nil
}

// SendBody sends a service body (type id and structure) in MSG chunks
// within the server's receive buffer and returns its request id.
func (c *Conn) SendBody(body []byte) (uint32, error) {
	id := c.NextRequestID()
	room := int(c.Ack.ReceiveBufSize) - SymmetricHeaderSize
	if room <= 0 {
		room = BufSize - SymmetricHeaderSize
	}
	for len(body) > room {
		if err := c.Chunk(ChunkIntermediate, id, body[:room]); err != nil {
			return id, err
		}
		body = body[room:]
	}
	return id, c.Chunk(ChunkFinal, id, body)
}

// Send sets req's header (its own token, if it has one, else the
// session's; its own timeout hint, if set) and sends it.
func (c *Conn) Send(req ua.Request) (uint32, error) {
	h := req.Header()
	var token *ua.NodeID
	if h != nil {
		token = h.AuthenticationToken
	}
	hdr := c.Header(token)
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
func (r *Response) Status() ua.StatusCode { return ServiceResult(r.Value) }

// Receive reads chunks until a response is complete.
func (c *Conn) Receive() (*Response, error) {
	var sizes []int
	for {
		typ, chunk, body, err := c.ReadFrame()
		if err != nil {
			return nil, err
		}
		if typ != TypeMessage || len(body) < SymmetricHeaderSize-HeaderSize {
			return nil, fmt.Errorf("uawire: got %s%c of %d bytes", typ, chunk, len(body)+HeaderSize)
		}
		ch, err := ParseBody(typ, chunk, body)
		if err != nil {
			return nil, err
		}
		sizes = append(sizes, len(body)+HeaderSize)
		if chunk == ChunkAbort {
			c.parts.Drop(ch.RequestID)
			return nil, errors.New("uawire: response aborted")
		}
		data, complete, _ := c.parts.Add(ch)
		if !complete {
			continue
		}
		v, err := DecodeService(data)
		if err != nil {
			return nil, err
		}
		return &Response{RequestID: ch.RequestID, Value: v, Chunks: sizes}, nil
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
		ClientDescription:       &ua.ApplicationDescription{ApplicationName: ua.NewLocalizedText("uawire")},
		SessionName:             "uawire",
		ClientNonce:             make([]byte, 32),
		RequestedSessionTimeout: 60_000,
	})
	if err != nil {
		return err
	}
	created, ok := r.Value.(*ua.CreateSessionResponse)
	if !ok {
		return fmt.Errorf("uawire: CreateSession: %v", r.Status())
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
		return fmt.Errorf("uawire: ActivateSession: %v", r.Status())
	}
	return nil
}
