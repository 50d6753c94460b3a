// Package uawire is the OPC UA binary codec (UA TCP and UA Secure
// Conversation) shared by the raw clients of the repository: the reference
// server's tests, the harness's attackers and its load driver's fast path.
//
// It holds the framing (message header, chunk types, HEL/ACK/ERR,
// OPN/CLO/MSG frames and their parsing), the sequence numbers and request
// ids of a channel, the encoding of service requests and the decoding of
// responses, ServiceFaults and ERR messages with gopcua's ua package, and
// a synchronous client connection (Conn) that opens a SecurityPolicy None
// channel and a session. Its pieces are deliberately small, so that a
// client can build what no well-behaved client would send: malformed
// bodies, floods of unfinished chunks, small receive buffers.
package uawire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/gopcua/opcua/ua"
)

// Sizes of the fixed parts of a message.
const (
	// HeaderSize is the message header: message type, chunk type and size.
	HeaderSize = 8
	// SymmetricHeaderSize is the message header, secure channel id, token
	// id, sequence number and request id: the offset of a MSG body.
	SymmetricHeaderSize = 24
)

// Chunk types.
const (
	ChunkFinal        = 'F'
	ChunkIntermediate = 'C'
	ChunkAbort        = 'A'
)

// Message types.
const (
	TypeHello       = "HEL"
	TypeAcknowledge = "ACK"
	TypeError       = "ERR"
	TypeOpen        = "OPN"
	TypeClose       = "CLO"
	TypeMessage     = "MSG"
)

// Parse errors.
var (
	// ErrMalformed reports bytes that are not a valid message.
	ErrMalformed = errors.New("uawire: malformed message")
	// ErrTooLarge reports a chunk larger than the receive limit.
	ErrTooLarge = errors.New("uawire: chunk too large")
)

// Frame returns a message of type typ ("HEL", "MSG", …) and chunk type
// chunk with body, its size field set to the frame's length.
func Frame(typ string, chunk byte, body []byte) []byte {
	b := make([]byte, 0, HeaderSize+len(body))
	b = append(append(b, typ...), chunk)
	b = binary.LittleEndian.AppendUint32(b, uint32(HeaderSize+len(body)))
	return append(b, body...)
}

// AppendSymmetricHeader appends what follows the message header of a MSG
// or CLO chunk before its body: secure channel id, token id, sequence
// number and request id.
func AppendSymmetricHeader(b []byte, channelID, tokenID, seq, reqID uint32) []byte {
	b = binary.LittleEndian.AppendUint32(b, channelID)
	b = binary.LittleEndian.AppendUint32(b, tokenID)
	b = binary.LittleEndian.AppendUint32(b, seq)
	return binary.LittleEndian.AppendUint32(b, reqID)
}

// SymmetricFrame returns a MSG or CLO chunk (SecurityPolicy None) of
// chunk type chunk with body.
func SymmetricFrame(typ string, chunk byte, channelID, tokenID, seq, reqID uint32, body []byte) []byte {
	b := AppendSymmetricHeader(make([]byte, 0, SymmetricHeaderSize-HeaderSize+len(body)), channelID, tokenID, seq, reqID)
	return Frame(typ, chunk, append(b, body...))
}

// OpenFrame returns an OPN chunk of secure channel channelID under
// SecurityPolicy None (no certificate, no thumbprint) with body.
func OpenFrame(channelID, seq, reqID uint32, body []byte) []byte {
	b := binary.LittleEndian.AppendUint32(nil, channelID)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(ua.SecurityPolicyURINone)))
	b = append(b, ua.SecurityPolicyURINone...)
	b = binary.LittleEndian.AppendUint32(b, 0xffffffff)
	b = binary.LittleEndian.AppendUint32(b, 0xffffffff)
	b = binary.LittleEndian.AppendUint32(b, seq)
	b = binary.LittleEndian.AppendUint32(b, reqID)
	return Frame(TypeOpen, ChunkFinal, append(b, body...))
}

// ReadFrame reads one message from r: its type, chunk type and what
// follows the message header. A size field below the header or above max
// gives an error wrapping ErrMalformed or ErrTooLarge.
func ReadFrame(r io.Reader, max int) (typ string, chunk byte, body []byte, err error) {
	var hdr [HeaderSize]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return "", 0, nil, err
	}
	size := binary.LittleEndian.Uint32(hdr[4:])
	if size < HeaderSize {
		return "", 0, nil, fmt.Errorf("%w: %q frame of %d bytes", ErrMalformed, hdr[:4], size)
	}
	if int64(size) > int64(max) {
		return "", 0, nil, fmt.Errorf("%w: %q frame of %d bytes", ErrTooLarge, hdr[:4], size)
	}
	body = make([]byte, size-HeaderSize)
	if _, err := io.ReadFull(r, body); err != nil {
		return "", 0, nil, err
	}
	return string(hdr[:3]), hdr[3], body, nil
}

// Chunk is one parsed MSG, OPN, CLO chunk or ERR message.
type Chunk struct {
	// Type is "MSG", "OPN", "CLO" or "ERR".
	Type string
	// ChunkType is 'F', 'C' or 'A' ('F' for ERR).
	ChunkType byte
	// ChannelID, TokenID, Seq and RequestID are the secure channel id,
	// security token id (MSG and CLO), sequence number and request id (not
	// set for ERR).
	ChannelID, TokenID, Seq, RequestID uint32
	// Body is what follows the headers: the encoded service for F and C
	// chunks, error code and reason for A chunks and ERR messages. It
	// aliases the input.
	Body []byte
}

// chunkTypes are the message types a chunk of a secure channel has.
var chunkTypes = [...]string{TypeMessage, TypeOpen, TypeClose, TypeError}

// ParseChunk parses the chunk at the start of b. It returns n = 0 and no
// error if b does not hold a complete chunk yet; max bounds the chunk size.
func ParseChunk(b []byte, max int) (c Chunk, n int, err error) {
	if len(b) < HeaderSize {
		return c, 0, nil
	}
	size := int(binary.LittleEndian.Uint32(b[4:]))
	if size < HeaderSize {
		return c, 0, fmt.Errorf("%w: chunk size %d", ErrMalformed, size)
	}
	if size > max {
		return c, 0, fmt.Errorf("%w: %d > %d bytes", ErrTooLarge, size, max)
	}
	if len(b) < size {
		return c, 0, nil
	}
	m := b[:size]
	for _, t := range chunkTypes {
		if string(m[:3]) == t {
			c.Type = t // no allocation: the constant
			break
		}
	}
	if c.Type == "" {
		return c, 0, fmt.Errorf("%w: message type %q", ErrMalformed, m[:3])
	}
	c, err = ParseBody(c.Type, m[3], m[HeaderSize:])
	if err != nil {
		return c, 0, err
	}
	return c, size, nil
}

// ParseBody parses what follows the message header of a chunk of type typ
// ("MSG", "OPN", "CLO" or "ERR") and chunk type chunk, as ReadFrame returns
// them.
func ParseBody(typ string, chunk byte, body []byte) (c Chunk, err error) {
	c.Type, c.ChunkType = typ, chunk
	size := HeaderSize + len(body)
	switch typ {
	case TypeError:
		c.Body = body
		return c, nil
	case TypeMessage, TypeClose, TypeOpen:
	default:
		return c, fmt.Errorf("%w: message type %q", ErrMalformed, typ)
	}
	if chunk != ChunkFinal && chunk != ChunkIntermediate && chunk != ChunkAbort {
		return c, fmt.Errorf("%w: chunk type %q", ErrMalformed, chunk)
	}
	if len(body) < 4 {
		return c, fmt.Errorf("%w: %s chunk of %d bytes", ErrMalformed, typ, size)
	}
	c.ChannelID = binary.LittleEndian.Uint32(body)
	p := 4
	if typ == TypeOpen {
		// asymmetric security header: policy uri, certificate, thumbprint
		for range 3 {
			if p = skipString(body, p); p < 0 {
				return c, fmt.Errorf("%w: OPN security header", ErrMalformed)
			}
		}
	} else {
		if len(body) < 8 {
			return c, fmt.Errorf("%w: %s chunk of %d bytes", ErrMalformed, typ, size)
		}
		c.TokenID = binary.LittleEndian.Uint32(body[4:])
		p = 8
	}
	if len(body) < p+8 {
		return c, fmt.Errorf("%w: %s chunk of %d bytes", ErrMalformed, typ, size)
	}
	c.Seq = binary.LittleEndian.Uint32(body[p:])
	c.RequestID = binary.LittleEndian.Uint32(body[p+4:])
	c.Body = body[p+8:]
	return c, nil
}

// skipString returns the offset after the String or ByteString at b[p:],
// or -1 if it does not fit (or has a length below -1).
func skipString(b []byte, p int) int {
	if len(b)-p < 4 {
		return -1
	}
	n := int(int32(binary.LittleEndian.Uint32(b[p:])))
	p += 4
	switch {
	case n == -1:
		return p
	case n < -1 || len(b)-p < n:
		return -1
	}
	return p + n
}

// ParseError decodes the error code and reason of an ERR message or an
// abort chunk body.
func ParseError(body []byte) (code uint32, reason string, err error) {
	if len(body) < 4 {
		return 0, "", fmt.Errorf("%w: error message", ErrMalformed)
	}
	code = binary.LittleEndian.Uint32(body)
	if len(body) == 4 {
		return code, "", nil
	}
	end := skipString(body, 4)
	if end < 0 {
		return code, "", fmt.Errorf("%w: error message", ErrMalformed)
	}
	if end > 8 {
		reason = string(body[8:end])
	}
	return code, reason, nil
}

// ErrorMessage is an ERR message from the server.
type ErrorMessage struct {
	Code   ua.StatusCode
	Reason string
}

// Error is e.g. "uawire: ERR BadTcpMessageTooLarge: reason".
func (e *ErrorMessage) Error() string {
	return fmt.Sprintf("uawire: ERR %v: %s", e.Code, e.Reason)
}

// Assembler reassembles the messages of a channel from their chunks, by
// request id, within bounds. Its zero value has no bounds; it allocates
// nothing for single-chunk messages. It is not safe for concurrent use.
type Assembler struct {
	// MaxSize bounds the body of one message, MaxChunks its intermediate
	// chunks (0: no bound).
	MaxSize, MaxChunks int

	parts  map[uint32][]byte
	chunks map[uint32]int
}

// Add takes a MSG or CLO chunk that is not an abort. For an intermediate
// chunk it keeps the body and returns complete false; for a final chunk
// it returns the message's whole body (c.Body itself if the message has
// one chunk). A message beyond the bounds is dropped with an error
// wrapping ua.StatusBadResponseTooLarge.
func (a *Assembler) Add(c Chunk) (body []byte, complete bool, err error) {
	id := c.RequestID
	if c.ChunkType == ChunkIntermediate {
		if a.parts == nil {
			a.parts, a.chunks = map[uint32][]byte{}, map[uint32]int{}
		}
		a.parts[id] = append(a.parts[id], c.Body...)
		a.chunks[id]++
		if a.over(len(a.parts[id])) || (a.MaxChunks > 0 && a.chunks[id] > a.MaxChunks) {
			a.Drop(id)
			return nil, false, fmt.Errorf("response to request %d: %w", id, ua.StatusBadResponseTooLarge)
		}
		return nil, false, nil
	}
	p, ok := a.parts[id]
	if !ok {
		return c.Body, true, nil
	}
	a.Drop(id)
	body = append(p, c.Body...)
	if a.over(len(body)) {
		return nil, true, fmt.Errorf("response to request %d: %w", id, ua.StatusBadResponseTooLarge)
	}
	return body, true, nil
}

func (a *Assembler) over(size int) bool { return a.MaxSize > 0 && size > a.MaxSize }

// Drop forgets the chunks of request id (e.g. on an abort chunk).
func (a *Assembler) Drop(id uint32) {
	delete(a.parts, id)
	delete(a.chunks, id)
}
