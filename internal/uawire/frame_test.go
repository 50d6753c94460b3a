package uawire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"reflect"
	"testing"

	"github.com/gopcua/opcua/ua"
	"github.com/gopcua/opcua/uacp"
)

func TestFramesParse(t *testing.T) {
	msg := SymmetricFrame(TypeMessage, ChunkIntermediate, 3, 4, 5, 6, []byte("body"))
	for n := range len(msg) {
		if _, k, err := ParseChunk(msg[:n], 1<<16); k != 0 || err != nil {
			t.Fatalf("partial chunk of %d bytes: n=%d err=%v", n, k, err)
		}
	}
	c, n, err := ParseChunk(append(msg, 'M'), 1<<16)
	want := Chunk{Type: TypeMessage, ChunkType: ChunkIntermediate, ChannelID: 3, TokenID: 4, Seq: 5, RequestID: 6}
	if err != nil || n != len(msg) || string(c.Body) != "body" {
		t.Fatalf("MSG chunk = %+v n=%d err=%v", c, n, err)
	}
	c.Body = nil
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("MSG chunk = %+v, want %+v", c, want)
	}
	if _, _, err := ParseChunk(msg, len(msg)-1); !errors.Is(err, ErrTooLarge) {
		t.Errorf("too large: err = %v", err)
	}
	opn := OpenFrame(7, 8, 9, []byte{1, 2})
	c, _, err = ParseChunk(opn, 1<<16)
	if err != nil || c.Type != TypeOpen || c.ChannelID != 7 || c.Seq != 8 || c.RequestID != 9 || !bytes.Equal(c.Body, []byte{1, 2}) {
		t.Fatalf("OPN chunk = %+v, %v", c, err)
	}
	for name, b := range map[string][]byte{
		"message type": Frame("XYZ", ChunkFinal, make([]byte, 16)),
		"chunk type":   Frame(TypeMessage, 'X', make([]byte, 16)),
		"short MSG":    Frame(TypeMessage, ChunkFinal, make([]byte, 10)),
		"short OPN":    opn[:len(opn)-12],
	} {
		binary.LittleEndian.PutUint32(b[4:], uint32(len(b)))
		if _, _, err := ParseChunk(b, 1<<16); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
	e := Frame(TypeError, ChunkFinal, []byte{0, 0, 0x80, 0x80, 1, 0, 0, 0, 'x'})
	c, _, err = ParseChunk(e, 1<<16)
	if err != nil || c.Type != TypeError {
		t.Fatalf("ERR = %+v, %v", c, err)
	}
	if code, reason, err := ParseError(c.Body); err != nil || code != 0x80800000 || reason != "x" {
		t.Fatalf("ParseError = %#x %q %v", code, reason, err)
	}
	if _, _, err := ParseError([]byte{1, 2, 3, 4, 9, 0, 0, 0}); !errors.Is(err, ErrMalformed) {
		t.Errorf("truncated reason: err = %v", err)
	}
}

func TestReadFrameLimits(t *testing.T) {
	b := Frame(TypeHello, ChunkFinal, make([]byte, 100))
	if _, _, _, err := ReadFrame(bytes.NewReader(b), 100); !errors.Is(err, ErrTooLarge) {
		t.Errorf("over the limit: err = %v", err)
	}
	binary.LittleEndian.PutUint32(b[4:], 7)
	if _, _, _, err := ReadFrame(bytes.NewReader(b), 1000); !errors.Is(err, ErrMalformed) {
		t.Errorf("size 7: err = %v", err)
	}
}

func TestSequenceWraps(t *testing.T) {
	s := Sequence{seq: MaxSeq - 1, reqID: 1<<32 - 1}
	if seq, id := s.Next(); seq != MaxSeq || id != 1 {
		t.Errorf("Next = %d, %d; want %d, 1", seq, id, uint32(MaxSeq))
	}
	if seq := s.NextSeq(); seq != 1 {
		t.Errorf("NextSeq after MaxSeq = %d, want 1", seq)
	}
}

func TestResponseError(t *testing.T) {
	bad := &ua.ReadResponse{ResponseHeader: &ua.ResponseHeader{ServiceResult: ua.StatusBadTooManyOperations}}
	for v, want := range map[any]error{
		&ua.ReadResponse{ResponseHeader: &ua.ResponseHeader{}}: nil,
		bad: ua.StatusBadTooManyOperations,
		&ua.ServiceFault{ResponseHeader: &ua.ResponseHeader{ServiceResult: ua.StatusBadSessionIDInvalid}}: ua.StatusBadSessionIDInvalid,
		&ua.ServiceFault{}: ua.StatusBadUnexpectedError,
		"no response":      nil,
	} {
		if got := ResponseError(v); got != want {
			t.Errorf("ResponseError(%T) = %v, want %v", v, got, want)
		}
	}
	if _, err := DecodeService([]byte{1, 0, 0x77, 0x02, 0xff}); err == nil {
		t.Error("DecodeService of a truncated ReadRequest: no error")
	}
}

// TestConn runs a Conn against a scripted server: Hello, OpenSecureChannel,
// a request answered in two chunks, an ERR.
func TestConn(t *testing.T) {
	client, server := net.Pipe()
	defer client.Close()
	done := make(chan error, 1)
	go func() { done <- serve(server) }()
	c := NewConn(client)
	if err := c.hello(uacp.Hello{ReceiveBufSize: 8192, SendBufSize: 8192}); err != nil {
		t.Fatal(err)
	}
	if c.Ack.ReceiveBufSize != 8192 {
		t.Errorf("Ack = %+v", c.Ack)
	}
	if err := c.Open(); err != nil {
		t.Fatal(err)
	}
	if c.ChannelID != 11 || c.TokenID != 12 {
		t.Errorf("channel %d token %d, want 11 and 12", c.ChannelID, c.TokenID)
	}
	r, err := c.Call(&ua.ReadRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := r.Value.(*ua.ReadResponse); !ok || r.Status() != ua.StatusOK || len(r.Chunks) != 2 {
		t.Errorf("response %+v", r)
	}
	_, _, _, err = c.ReadFrame()
	var em *ErrorMessage
	if !errors.As(err, &em) || em.Code != ua.StatusBadTCPInternalError || em.Reason != "bye" {
		t.Errorf("ERR: %v", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// goodHeader is a response header gopcua can encode.
func goodHeader() *ua.ResponseHeader {
	return &ua.ResponseHeader{ServiceDiagnostics: &ua.DiagnosticInfo{}, AdditionalHeader: ua.NewExtensionObject(nil)}
}

// serve is TestConn's server side.
func serve(nc net.Conn) error {
	defer nc.Close()
	s := NewConn(nc)
	if _, _, _, err := s.ReadFrame(); err != nil {
		return err
	}
	ack, err := ua.Encode(&uacp.Acknowledge{ReceiveBufSize: 8192, SendBufSize: 8192})
	if err != nil {
		return err
	}
	if _, err := nc.Write(Frame(TypeAcknowledge, ChunkFinal, ack)); err != nil {
		return err
	}
	if _, _, _, err := s.ReadFrame(); err != nil {
		return err
	}
	body, err := EncodeService(&ua.OpenSecureChannelResponse{ResponseHeader: goodHeader(),
		SecurityToken: &ua.ChannelSecurityToken{ChannelID: 11, TokenID: 12}, ServerNonce: []byte{}})
	if err != nil {
		return err
	}
	if _, err := nc.Write(OpenFrame(11, 1, 1, body)); err != nil {
		return err
	}
	typ, chunk, b, err := s.ReadFrame()
	if err != nil {
		return err
	}
	req, err := ParseBody(typ, chunk, b)
	if err != nil {
		return err
	}
	body, err = EncodeService(&ua.ReadResponse{ResponseHeader: goodHeader()})
	if err != nil {
		return err
	}
	half := len(body) / 2
	if _, err := nc.Write(SymmetricFrame(TypeMessage, ChunkIntermediate, 11, 12, 2, req.RequestID, body[:half])); err != nil {
		return err
	}
	if _, err := nc.Write(SymmetricFrame(TypeMessage, ChunkFinal, 11, 12, 3, req.RequestID, body[half:])); err != nil {
		return err
	}
	e, err := ua.Encode(&uacp.Error{ErrorCode: uint32(ua.StatusBadTCPInternalError), Reason: "bye"})
	if err != nil {
		return err
	}
	_, err = nc.Write(Frame(TypeError, ChunkFinal, e))
	return err
}
