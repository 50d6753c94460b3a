package uawire

import (
	"fmt"
	"time"

	"github.com/gopcua/opcua/ua"
	"github.com/gopcua/opcua/uacp"
)

// MaxSeq is the highest sequence number before it wraps to 1 (Part 6,
// 6.7.2.4).
const MaxSeq = 4294966271

// Sequence numbers a channel's chunks and its requests. Its zero value
// starts both at 1. It is not safe for concurrent use.
type Sequence struct {
	seq, reqID uint32
}

// NextSeq returns the next sequence number, wrapping after MaxSeq.
func (s *Sequence) NextSeq() uint32 {
	s.seq++
	if s.seq > MaxSeq {
		s.seq = 1
	}
	return s.seq
}

// NextRequestID returns the next request id (never 0).
func (s *Sequence) NextRequestID() uint32 {
	s.reqID++
	if s.reqID == 0 {
		s.reqID = 1
	}
	return s.reqID
}

// Next returns the sequence number and request id of a single-chunk
// request.
func (s *Sequence) Next() (seq, reqID uint32) {
	return s.NextSeq(), s.NextRequestID()
}

// HelloFrame returns hel as a HEL message.
func HelloFrame(hel uacp.Hello) ([]byte, error) {
	body, err := ua.Encode(&hel)
	if err != nil {
		return nil, fmt.Errorf("encode hello: %w", err)
	}
	return Frame(TypeHello, ChunkFinal, body), nil
}

// NewRequestHeader returns the header of a request with authentication
// token (nil: the null token) and handle, stamped now, with a 10 s
// timeout hint.
func NewRequestHeader(token *ua.NodeID, handle uint32) *ua.RequestHeader {
	if token == nil {
		token = ua.NewTwoByteNodeID(0)
	}
	return &ua.RequestHeader{
		AuthenticationToken: token,
		Timestamp:           time.Now(),
		RequestHandle:       handle,
		TimeoutHint:         10_000,
		AdditionalHeader:    ua.NewExtensionObject(nil),
	}
}

// NewOpenRequest returns an OpenSecureChannel request of kind (Issue or
// Renew) in security mode mode with the client nonce (empty, not nil,
// under None) for a token of lifetime.
func NewOpenRequest(kind ua.SecurityTokenRequestType, mode ua.MessageSecurityMode, nonce []byte, lifetime time.Duration) *ua.OpenSecureChannelRequest {
	return &ua.OpenSecureChannelRequest{
		RequestType:       kind,
		SecurityMode:      mode,
		ClientNonce:       nonce,
		RequestedLifetime: uint32(lifetime / time.Millisecond),
	}
}

// EncodeService encodes a service structure with its four-byte type id
// (the body of a MSG message).
func EncodeService(v any) ([]byte, error) {
	typeID := ua.ServiceTypeID(v)
	if typeID == 0 {
		return nil, fmt.Errorf("encode %T: not a service", v)
	}
	b, err := ua.Encode(v)
	if err != nil {
		return nil, fmt.Errorf("encode %T: %w", v, err)
	}
	return append([]byte{1, 0, byte(typeID), byte(typeID >> 8)}, b...), nil
}

// DecodeService decodes a service body (type id and structure) with
// gopcua's ua.DecodeService, under a recover: a server's odd response
// must not take its client down.
func DecodeService(b []byte) (v any, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("decode response: panic: %v", p)
		}
	}()
	_, v, err = ua.DecodeService(b)
	return v, err
}

// ServiceResult returns the service result of a decoded response (a
// ServiceFault's too), or BadUnexpectedError if v has no response header.
func ServiceResult(v any) ua.StatusCode {
	if r, ok := v.(ua.Response); ok && r.Header() != nil {
		return r.Header().ServiceResult
	}
	return ua.StatusBadUnexpectedError
}

// ResponseError returns the status code of a ServiceFault, or of a
// response with a service result other than Good, as an error; nil for
// any other value.
func ResponseError(v any) error {
	switch r := v.(type) {
	case *ua.ServiceFault:
		return ServiceResult(r)
	case ua.Response:
		if h := r.Header(); h != nil && h.ServiceResult != ua.StatusOK {
			return h.ServiceResult
		}
	}
	return nil
}
