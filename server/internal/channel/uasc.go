package channel

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gopcua/opcua/ua"
	"github.com/gopcua/opcua/uacp"
	"github.com/gopcua/opcua/uapolicy"

	"github.com/opcua-chaos/opcua-chaos/internal/uasec"
	"github.com/opcua-chaos/opcua-chaos/server/internal/budget"
	"github.com/opcua-chaos/opcua-chaos/server/internal/uabin"
)

// IDs are the identifiers a server assigns to a new secure channel.
type IDs struct {
	SecureChannelID uint32
	SequenceNumber  uint32
	TokenID         uint32
}

// Defaults of Limits.
const (
	DefaultBufSize        = 0xffff  // receive and send buffer (gopcua's)
	DefaultMaxMessageSize = 2 << 20 // largest request, 2 MiB (gopcua's)
	DefaultMaxChunkCount  = 512     // most chunks of one request (gopcua's)
	// MinBufSize is the smallest buffer a peer may announce (Part 6,
	// 7.1.2.3: at least 8192 bytes).
	MinBufSize = 8192
	// maxEndpointURL bounds the Hello's EndpointUrl (Part 6, 7.1.2.3).
	maxEndpointURL = 4096
)

// Limits bound what one secure channel accepts, buffers and sends. Zero
// values mean the defaults.
type Limits struct {
	// ReceiveBufSize is the largest chunk accepted: the Acknowledge's
	// ReceiveBufferSize, at most the client's SendBufferSize (65535).
	ReceiveBufSize uint32
	// SendBufSize is the largest chunk sent: the Acknowledge's
	// SendBufferSize, at most the client's ReceiveBufferSize (65535).
	SendBufSize uint32
	// MaxMessageSize bounds one request, all chunks (2 MiB).
	MaxMessageSize uint32
	// MaxChunkCount bounds the chunks of one request (512).
	MaxChunkCount uint32
	// MaxBufferedChunks bounds the intermediate chunks held for unfinished
	// requests of the channel, all request ids together (MaxChunkCount).
	MaxBufferedChunks int
	// MaxBufferedBytes bounds their bytes (MaxMessageSize).
	MaxBufferedBytes int
}

func (l Limits) fill() Limits {
	if l.ReceiveBufSize == 0 {
		l.ReceiveBufSize = DefaultBufSize
	}
	if l.SendBufSize == 0 {
		l.SendBufSize = DefaultBufSize
	}
	l.ReceiveBufSize = max(l.ReceiveBufSize, MinBufSize)
	l.SendBufSize = max(l.SendBufSize, MinBufSize)
	if l.MaxMessageSize == 0 {
		l.MaxMessageSize = DefaultMaxMessageSize
	}
	if l.MaxChunkCount == 0 {
		l.MaxChunkCount = DefaultMaxChunkCount
	}
	if l.MaxBufferedChunks <= 0 {
		l.MaxBufferedChunks = int(l.MaxChunkCount)
	}
	if l.MaxBufferedBytes <= 0 {
		l.MaxBufferedBytes = int(l.MaxMessageSize)
	}
	return l
}

// Config configures Accept.
type Config struct {
	// IDs are the channel's identifiers.
	IDs IDs
	// HandshakeTimeout bounds the time from accepting the connection to
	// the end of the first OpenSecureChannel. Zero means no bound (the
	// unbounded-idle fault).
	HandshakeTimeout time.Duration
	// MinLifetime is the shortest security token lifetime granted: a
	// shorter request is revised up to it. Zero means 10 s.
	MinLifetime time.Duration
	// Limits bound the channel.
	Limits Limits
	// Decoder checks and decodes requests (see package uabin); nil means a
	// decoder with default limits.
	Decoder *uabin.Decoder
	// Unguarded decodes requests with gopcua's decoder alone, unchecked and
	// without a recover (the crash-on-decode fault): a malformed request
	// panics on the channel's reader.
	Unguarded bool
	// Logger receives protocol errors; nil means slog.Default().
	Logger *slog.Logger
	// Security lets clients open secured channels (Sign, SignAndEncrypt);
	// nil accepts SecurityPolicy None only (BadSecurityPolicyRejected).
	Security *Security
	// CryptoInGate is the crypto-in-gate fault: on a secured channel the
	// reader takes the send gate to verify and decrypt a request and keeps
	// it until the request's handler returned (see ReleaseGate), and
	// responses are signed and encrypted holding the gate.
	CryptoInGate bool
	// Budget is charged (class budget.Chunks) for the unfinished chunks
	// the channel buffers, beside the per-channel Limits: a chunk that
	// does not fit closes the channel with ERR BadTcpNotEnoughResources.
	// The charge is released when its request completes or is aborted,
	// and when the channel closes. Nil: per-channel limits only (the
	// chunks-per-channel-only fault).
	Budget *budget.Budget
	// IdleTimeout closes the channel with ERR BadTimeout when Active does
	// not report true that long after the first OpenSecureChannel, and
	// again every IdleTimeout after that: a channel opened and left
	// without an activated session, or whose sessions were closed, does
	// not hold a connection forever. Zero: no idle timeout (the
	// idle-after-open fault).
	IdleTimeout time.Duration
	// Active reports whether the channel holds an activated session now;
	// the idle timeout spares such a channel until its next check. Nil
	// means never.
	Active func() bool
	// WriteTimeout closes the channel when a write makes no progress for
	// that long (a peer that stopped reading its responses): its queued
	// responses and their budget are released. Zero: writes wait forever
	// (the responses-unbudgeted fault).
	WriteTimeout time.Duration
	// EnforceLifetime closes the channel with ERR
	// BadSecureChannelTokenUnknown when its security token is not renewed
	// within 125 % of the token's revised lifetime (Part 6, 6.7.4: the
	// token expires), and refuses a message carrying an expired token
	// with the same error. A token's time runs only while the server
	// reads the channel: time the reader spends paused (backpressure) or
	// handing a request on does not count, so a renewal the server was
	// slow to read never expires a token. Off: tokens never expire (the
	// idle-after-open fault).
	EnforceLifetime bool
	// MaxOPNBlocks bounds the RSA blocks of a secured OpenSecureChannel
	// request: one of more closes the channel with ERR
	// BadSecurityChecksFailed before any block is decrypted (its
	// signature is inside the encrypted plaintext: see
	// uasec.Asymmetric.OpenOPN). Zero: no bound (the
	// opn-blocks-unbounded fault).
	MaxOPNBlocks int
	// AdmitOPN, when set, is asked before the blocks of a secured
	// OpenSecureChannel request are decrypted, with their number: false
	// closes the channel with ERR BadTcpServerTooBusy, nothing
	// decrypted (the server's budget of RSA work per peer address). Nil
	// admits every request.
	AdmitOPN func(blocks int) bool
}

// Closing reasons of a channel closed by one of its timers.
var (
	// ErrIdle: no session was activated within Config.IdleTimeout after
	// OpenSecureChannel.
	ErrIdle = errors.New("no session activated within the idle timeout after OpenSecureChannel")
	// ErrTokenExpired: the security token was not renewed within 125 % of
	// its lifetime.
	ErrTokenExpired = errors.New("security token not renewed within 125 % of its lifetime")
)

// expiryGrace is the share of a token's revised lifetime after which an
// unrenewed token expires: clients renew at 75 %, so 125 % leaves them
// half a lifetime of slack.
const expiryGrace = 1.25

// minRecheck spaces the checks of a token's expiry while the reader is
// paused.
const minRecheck = 50 * time.Millisecond

// Frame and header sizes of UA Secure Conversation with SecurityPolicy None.
const (
	frameHeaderLen = 8  // message type, chunk type, message size
	symHeaderLen   = 16 // frame header, secure channel id, token id
	seqHeaderLen   = 8  // sequence number, request id
	msgHeaderLen   = symHeaderLen + seqHeaderLen
	maxSequence    = 4294966271 // wraps to 1 after this (Part 6, 6.7.2.4)
)

// SecureTransport is a Transport for one secure channel: UA Connection
// Protocol framing and UA Secure Conversation chunks over a net.Conn, with
// SecurityPolicy None or, given Config.Security, a secured policy whose
// chunks are signed (and encrypted) with package uasec (OPN chunks with its
// Asymmetric, MSG and CLO chunks with a Symmetric per token). On a
// secured channel every MSG and CLO chunk is verified (and decrypted) on
// the reader with its token's keys and its sequence number checked (the
// last one plus 1, wrapping as Part 6 says; an OPN chunk resets it); a
// chunk that fails closes the channel with ERR BadSecurityChecksFailed or
// BadSequenceNumberInvalid. Responses are sealed outside any lock, after
// their sequence numbers were reserved, and written in order. It replaces gopcua's uasc.SecureChannel on the server
// side, which buffers unfinished chunks without a bound, keeps a 64 KiB
// buffer per chunk, writes every response as one chunk whatever the client's
// receive buffer, and hands message bodies to gopcua's decoder unchecked.
//
// Receive is called by one reader goroutine; Send, Abort and Close may be
// called from other goroutines.
type SecureTransport struct {
	// EndpointURL is the endpoint URL the client sent in its Hello message.
	EndpointURL string
	// MaxResponseSize is the largest response that fits in one chunk of
	// the client's receive buffer (and its max message size if smaller):
	// the budget of a Publish response. Larger responses are sent in
	// several chunks.
	MaxResponseSize int

	conn    net.Conn
	cfg     Config
	lim     Limits
	decoder *uabin.Decoder
	log     *slog.Logger

	// The client's limits from its Hello (0: no limit).
	peerMaxMessage int
	peerMaxChunks  int
	sendChunk      int // largest chunk sent

	// Reader state (Receive only).
	hdr       [frameHeaderLen]byte
	rbuf      []byte // one chunk; its contents are copied out
	open      bool
	partial   map[uint32]*partialMessage
	bufChunks int // intermediate chunks held in partial
	bufBytes  int // their bytes

	// sendMu is the send gate of a None channel: one message at a time,
	// sequence numbers and write together, so chunks of two never
	// interleave. Secured channels order their writes by ticket instead
	// (reserve, writeInTurn) and never sign or encrypt under it, but under
	// the crypto-in-gate fault.
	sendMu   sync.Mutex
	seq      uint32 // last sequence number sent; sendMu held (None) or turnMu (secured)
	writeMu  writeLock
	gateHeld bool // the reader holds sendMu for a request being handled (crypto-in-gate)

	// Write order of a secured channel's chunks: tickets are taken with
	// their sequence numbers and written in order.
	turnMu     sync.Mutex
	turnCond   *sync.Cond
	nextTicket uint64
	served     uint64

	thumbprint []byte    // SHA-1 of our certificate (secured channels)
	sec        *secState // set by the first secured OPN (reader); tokMu for other goroutines
	rseq       uint32    // last sequence number received (reader, secured channels)
	rseqSet    bool

	// tokMu guards the tokens apart from sendMu: Send holds sendMu while
	// it writes to a slow client, and the reader checks every incoming
	// message's token; under sendMu the reader could take only one request
	// per response written, and a server behind a slow reader would stop
	// reading long before its backpressure mark.
	tokMu    sync.Mutex
	token    uint32 // current security token
	oldToken uint32 // previous token, accepted until the client uses the new one
	sendTok  uint32 // token id written in MSG headers
	// The symmetric keys of token, oldToken and sendTok (secured channels).
	keys, oldKeys, sendKeys *symKeys
	// expires and oldExpires are when token and oldToken expire
	// (Config.EnforceLifetime; zero otherwise), on the clock of
	// readTime; expiry closes the channel once the current token expired
	// unless a renewal moved it.
	expires, oldExpires time.Duration
	expiry              *time.Timer
	// stalled is the time the reader spent outside Receive (paused for
	// backpressure, handing a request on) since the transport started,
	// up to outside, when Receive last returned (zero while the reader is
	// in Receive). Tokens expire by readTime: now minus stalled.
	start   time.Time
	stalled time.Duration
	outside time.Time
	idle    *time.Timer // Config.IdleTimeout after the first OPN
	stopped bool        // Close ran: no timer is armed again

	// chargeMu guards charged: the bytes of unfinished chunks charged to
	// Config.Budget. The reader charges and releases; Close releases the
	// rest, from any goroutine, once.
	chargeMu     sync.Mutex
	charged      int64
	chargeClosed bool

	// reason is why a timer closed the channel (a *ProtocolError), which
	// Receive returns instead of the closed connection's error.
	reason atomic.Pointer[ProtocolError]

	closeOnce sync.Once
	closeErr  error
}

// partialMessage collects the chunks of one request.
type partialMessage struct {
	chunks int
	data   []byte
}

// ProtocolError is a transport error answered with an ERR message: the
// channel is closed.
type ProtocolError struct {
	Code ua.StatusCode
	Err  error
}

func (e *ProtocolError) Error() string { return fmt.Sprintf("channel: %v (%v)", e.Err, e.Code) }

// Unwrap returns the status code and the cause.
func (e *ProtocolError) Unwrap() []error { return []error{e.Code, e.Err} }

// Accept runs the UACP Hello/Acknowledge handshake on c and returns the
// secure channel transport. The handshake deadline stays on the connection
// until the first OpenSecureChannel is done. On error, c is closed (after an
// ERR message where the protocol allows).
func Accept(c net.Conn, cfg Config) (*SecureTransport, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Decoder == nil {
		cfg.Decoder = uabin.NewDecoder(uabin.Limits{})
	}
	lim := cfg.Limits.fill()
	t := &SecureTransport{
		writeMu: newWriteLock(),
		conn:    c,
		cfg:     cfg,
		lim:     lim,
		decoder: cfg.Decoder,
		log:     cfg.Logger,
		rbuf:    make([]byte, lim.ReceiveBufSize),
		partial: make(map[uint32]*partialMessage),
		seq:     cfg.IDs.SequenceNumber - 1,
		start:   time.Now(),
	}
	t.turnCond = sync.NewCond(&t.turnMu)
	if cfg.Security != nil {
		t.thumbprint = uapolicy.Thumbprint(cfg.Security.Certificate)
	}
	if cfg.HandshakeTimeout > 0 {
		_ = c.SetDeadline(time.Now().Add(cfg.HandshakeTimeout))
	}
	typ, chunk, body, err := t.readFrame()
	if err != nil {
		t.Close()
		return nil, fmt.Errorf("channel: handshake: %w", err)
	}
	if typ != uacp.MessageTypeHello || chunk != 'F' {
		return nil, t.fail(ua.StatusBadTCPMessageTypeInvalid, fmt.Errorf("handshake: expected HELF, got %q%c", typ, chunk))
	}
	hel := new(uacp.Hello)
	if _, err := hel.Decode(body); err != nil {
		return nil, t.fail(ua.StatusBadDecodingError, fmt.Errorf("handshake: Hello: %w", err))
	}
	switch {
	case hel.ReceiveBufSize < MinBufSize || hel.SendBufSize < MinBufSize:
		return nil, t.fail(ua.StatusBadConnectionRejected, fmt.Errorf("handshake: buffers %d/%d below %d", hel.ReceiveBufSize, hel.SendBufSize, MinBufSize))
	case len(hel.EndpointURL) > maxEndpointURL:
		return nil, t.fail(ua.StatusBadTCPEndpointURLInvalid, fmt.Errorf("handshake: endpoint URL of %d bytes", len(hel.EndpointURL)))
	}
	ack := &uacp.Acknowledge{
		ReceiveBufSize: min(lim.ReceiveBufSize, hel.SendBufSize),
		SendBufSize:    min(lim.SendBufSize, hel.ReceiveBufSize),
		MaxMessageSize: lim.MaxMessageSize,
		MaxChunkCount:  lim.MaxChunkCount,
	}
	body, err = ua.Encode(ack)
	if err == nil {
		err = t.write(frame(uacp.MessageTypeAcknowledge, 'F', body))
	}
	if err != nil {
		t.Close()
		return nil, fmt.Errorf("channel: handshake: %w", err)
	}
	t.rbuf = t.rbuf[:ack.ReceiveBufSize]
	t.EndpointURL = hel.EndpointURL
	t.sendChunk = int(ack.SendBufSize)
	t.peerMaxMessage = int(hel.MaxMessageSize)
	t.peerMaxChunks = int(hel.MaxChunkCount)
	t.MaxResponseSize = t.sendChunk
	if t.peerMaxMessage > 0 {
		t.MaxResponseSize = min(t.MaxResponseSize, t.peerMaxMessage)
	}
	return t, nil
}

// frame returns a UACP frame: header and body.
func frame(typ string, chunk byte, body []byte) []byte {
	b := make([]byte, frameHeaderLen, frameHeaderLen+len(body))
	copy(b, typ)
	b[3] = chunk
	binary.LittleEndian.PutUint32(b[4:], uint32(frameHeaderLen+len(body)))
	return append(b, body...)
}

// abortWait is how long Abort waits for a write in progress before it
// closes without its ERR message: long enough for a write the peer is
// reading to finish, short enough not to wait on a peer that does not read.
const abortWait = 250 * time.Millisecond

// writeLock serialises writes to the connection. Unlike sync.Mutex it can
// be waited for with a bound (LockWithin). The zero value is unusable; use
// newWriteLock.
type writeLock chan struct{}

func newWriteLock() writeLock { return make(writeLock, 1) }

// Lock waits for the lock.
func (l writeLock) Lock() { l <- struct{}{} }

// Unlock releases the lock.
func (l writeLock) Unlock() { <-l }

// LockWithin waits at most d for the lock and reports whether it got it.
func (l writeLock) LockWithin(d time.Duration) bool {
	select {
	case l <- struct{}{}:
		return true
	default:
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case l <- struct{}{}:
		return true
	case <-timer.C:
		return false
	}
}

// write writes b; writeMu must be held unless no other goroutine can write.
// With Config.WriteTimeout it writes in pieces of at most a chunk, each
// within the timeout: a peer that takes nothing for that long fails the
// write (and the channel closes), one that reads slowly does not.
func (t *SecureTransport) write(b []byte) error {
	if t.cfg.WriteTimeout <= 0 {
		_, err := t.conn.Write(b)
		return err
	}
	piece := max(t.sendChunk, MinBufSize)
	for len(b) > 0 {
		n := min(len(b), piece)
		_ = t.conn.SetWriteDeadline(time.Now().Add(t.cfg.WriteTimeout))
		if _, err := t.conn.Write(b[:n]); err != nil {
			return fmt.Errorf("write (%v without progress at most): %w", t.cfg.WriteTimeout, err)
		}
		b = b[n:]
	}
	return nil
}

// readFrame reads one frame into t.rbuf. The body is valid until the next
// call.
func (t *SecureTransport) readFrame() (typ string, chunk byte, body []byte, err error) {
	if _, err := io.ReadFull(t.conn, t.hdr[:]); err != nil {
		return "", 0, nil, err
	}
	typ, chunk = string(t.hdr[:3]), t.hdr[3]
	size := binary.LittleEndian.Uint32(t.hdr[4:])
	switch {
	case size < frameHeaderLen:
		return "", 0, nil, t.fail(ua.StatusBadTCPMessageTypeInvalid, fmt.Errorf("%s%c of %d bytes", typ, chunk, size))
	case size > uint32(len(t.rbuf)):
		return "", 0, nil, t.fail(ua.StatusBadTCPMessageTooLarge, fmt.Errorf("%s%c of %d bytes, receive buffer %d", typ, chunk, size, len(t.rbuf)))
	}
	// The whole chunk stays contiguous in rbuf: secured chunks are opened
	// in place, header included.
	copy(t.rbuf, t.hdr[:])
	body = t.rbuf[frameHeaderLen:size]
	if _, err := io.ReadFull(t.conn, body); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return "", 0, nil, err
	}
	return typ, chunk, body, nil
}

// fail sends an ERR message with code, closes the connection and returns
// the error.
func (t *SecureTransport) fail(code ua.StatusCode, err error) error {
	t.log.Debug("closing channel: protocol error", "code", code, "err", err)
	_ = t.Abort(code)
	return &ProtocolError{Code: code, Err: err}
}

// reader reads the fixed parts of a chunk.
type reader struct {
	b   []byte
	err bool
}

func (r *reader) u32() uint32 {
	if len(r.b) < 4 {
		r.err = true
		return 0
	}
	v := binary.LittleEndian.Uint32(r.b)
	r.b = r.b[4:]
	return v
}

// bytes reads a ByteString or String (null is -1).
func (r *reader) bytes() []byte {
	n := int32(r.u32())
	if n < -1 || int(n) > len(r.b) {
		r.err = true
		return nil
	}
	if n <= 0 {
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

// Receive returns the next service request. OpenSecureChannel requests are
// answered here; abort chunks discard their request; a CloseSecureChannel
// request ends the channel (io.EOF). A request that arrived completely but
// cannot be decoded is returned with Err set. Protocol violations (bad
// framing, unknown channel or token, too many or too large chunks) are
// answered with an ERR message and return a *ProtocolError; the connection
// is then closed.
func (t *SecureTransport) Receive(ctx context.Context) (Message, error) {
	t.ReleaseGate()
	if t.cfg.EnforceLifetime {
		t.tokMu.Lock()
		if !t.outside.IsZero() {
			t.stalled += time.Since(t.outside)
			t.outside = time.Time{}
		}
		t.tokMu.Unlock()
		defer func() {
			t.tokMu.Lock()
			t.outside = time.Now()
			t.tokMu.Unlock()
		}()
	}
	for {
		typ, chunk, body, err := t.readFrame()
		if err != nil {
			if r := t.reason.Load(); r != nil {
				// A timer closed the channel: say why.
				return Message{}, r
			}
			return Message{}, err
		}
		switch typ {
		case "OPN":
			if err := t.openSecureChannel(chunk, body); err != nil {
				return Message{}, err
			}
		case "CLO":
			if t.sec != nil {
				if _, _, err := t.secureChunk(chunk, body); err != nil {
					return Message{}, err
				}
			}
			return Message{}, io.EOF
		case "MSG":
			msg, ok, err := t.message(chunk, body)
			if err != nil {
				return Message{}, err
			}
			if ok {
				return msg, nil
			}
		default:
			return Message{}, t.fail(ua.StatusBadTCPMessageTypeInvalid, fmt.Errorf("message type %q", typ))
		}
	}
}

// openSecureChannel serves an OpenSecureChannel request (Issue or Renew).
// With SecurityPolicy None the chunk is read and answered in the clear
// under the send gate; with another policy it is checked, verified and
// decrypted (readSecuredOpen), and the response signed and encrypted with
// the asymmetric algorithm and written in its turn.
func (t *SecureTransport) openSecureChannel(chunk byte, body []byte) error {
	if chunk != 'F' {
		return t.fail(ua.StatusBadTCPMessageTypeInvalid, fmt.Errorf("OPN%c", chunk))
	}
	r := reader{b: body}
	chID := r.u32()
	policy := r.bytes()
	senderCert := r.bytes()
	thumbprint := r.bytes()
	if r.err {
		return t.fail(ua.StatusBadDecodingError, errors.New("OPN header"))
	}
	var op openRequest
	if string(policy) == ua.SecurityPolicyURINone {
		if t.sec != nil {
			return t.fail(ua.StatusBadSecurityPolicyRejected, errors.New("Renew with policy None on a secured channel"))
		}
		_ = r.u32() // sequence number
		op.reqID = r.u32()
		if r.err {
			return t.fail(ua.StatusBadDecodingError, errors.New("OPN header"))
		}
		v, err := t.decode(bytes.Clone(r.b))
		if err != nil {
			return t.fail(ua.StatusBadDecodingError, fmt.Errorf("OpenSecureChannel: %w", err))
		}
		req, ok := v.(*ua.OpenSecureChannelRequest)
		if !ok {
			return t.fail(ua.StatusBadTCPMessageTypeInvalid, fmt.Errorf("OPN carries %T", v))
		}
		if req.SecurityMode != ua.MessageSecurityModeNone {
			return t.fail(ua.StatusBadSecurityModeRejected, fmt.Errorf("security mode %v", req.SecurityMode))
		}
		op.req = req
	} else {
		if t.cfg.Security == nil {
			return t.fail(ua.StatusBadSecurityPolicyRejected, fmt.Errorf("security policy %q", policy))
		}
		var err error
		if op, err = t.readSecuredOpen(body, string(policy), senderCert, thumbprint); err != nil {
			return err
		}
	}
	req := op.req
	if op.sec == nil {
		t.sendMu.Lock()
		defer t.sendMu.Unlock()
	}
	var serverNonce []byte
	var keys *symKeys
	if op.sec != nil {
		var err error
		if serverNonce, err = op.sec.asym.MakeNonce(); err != nil {
			return t.fail(ua.StatusBadTCPInternalError, fmt.Errorf("server nonce: %w", err))
		}
		sym, err := uasec.NewSymmetric(op.sec.policy, op.sec.mode, serverNonce, req.ClientNonce)
		if err != nil {
			return t.fail(uasec.Status(err), fmt.Errorf("symmetric keys: %w", err))
		}
		keys = &symKeys{sec: op.sec, sym: sym}
	}
	fail := func(code ua.StatusCode, err error) error {
		if op.sec == nil {
			return t.failLocked(code, err)
		}
		return t.fail(code, err)
	}
	t.tokMu.Lock()
	var refused error
	switch req.RequestType {
	case ua.SecurityTokenRequestTypeIssue:
		if t.open {
			refused = errors.New("second OpenSecureChannel Issue")
			break
		}
		t.token = t.cfg.IDs.TokenID
		t.sendTok = t.token
		t.sec = op.sec
		t.keys, t.sendKeys = keys, keys
	case ua.SecurityTokenRequestTypeRenew:
		if !t.open || chID != t.cfg.IDs.SecureChannelID {
			t.tokMu.Unlock()
			return fail(ua.StatusBadTCPSecureChannelUnknown, fmt.Errorf("Renew of channel %d", chID))
		}
		t.oldToken, t.oldKeys, t.oldExpires = t.token, t.keys, t.expires
		if t.token++; t.token == 0 {
			t.token = 1
		}
		t.keys = keys
	default:
		refused = fmt.Errorf("request type %v", req.RequestType)
	}
	token := t.token
	t.tokMu.Unlock()
	if refused != nil {
		return fail(ua.StatusBadRequestTypeInvalid, refused)
	}
	lifetime := req.RequestedLifetime
	if lifetime == 0 || lifetime > uint32(time.Hour/time.Millisecond) {
		lifetime = uint32(time.Hour / time.Millisecond)
	}
	minLifetime := uint32(10_000)
	if t.cfg.MinLifetime > 0 {
		minLifetime = uint32(t.cfg.MinLifetime / time.Millisecond)
	}
	lifetime = max(lifetime, minLifetime)
	now := time.Now()
	if serverNonce == nil {
		serverNonce = []byte{}
	}
	resp := &ua.OpenSecureChannelResponse{
		ResponseHeader: &ua.ResponseHeader{
			Timestamp:          now,
			RequestHandle:      req.RequestHeader.RequestHandle,
			ServiceDiagnostics: &ua.DiagnosticInfo{},
			AdditionalHeader:   ua.NewExtensionObject(nil),
		},
		SecurityToken: &ua.ChannelSecurityToken{
			ChannelID:       t.cfg.IDs.SecureChannelID,
			TokenID:         token,
			CreatedAt:       now,
			RevisedLifetime: lifetime,
		},
		ServerNonce: serverNonce,
	}
	payload, err := encodeService(resp)
	if err != nil {
		return fail(ua.StatusBadTCPInternalError, err)
	}
	if op.sec != nil {
		ticket, seq := t.reserve(1)
		b, err := t.sealedOpenResponse(op.sec, seq, op.reqID, payload)
		if err != nil {
			_ = t.writeInTurn(ticket, nil)
			return t.fail(ua.StatusBadTCPInternalError, err)
		}
		if err := t.writeInTurn(ticket, b); err != nil {
			return err
		}
	} else {
		// OPN chunk: channel id, asymmetric header (policy URI, no
		// certificate, no thumbprint), sequence header, body.
		b := binary.LittleEndian.AppendUint32(nil, t.cfg.IDs.SecureChannelID)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(ua.SecurityPolicyURINone)))
		b = append(b, ua.SecurityPolicyURINone...)
		b = binary.LittleEndian.AppendUint32(b, 0xffffffff)
		b = binary.LittleEndian.AppendUint32(b, 0xffffffff)
		b = binary.LittleEndian.AppendUint32(b, t.nextSeq())
		b = binary.LittleEndian.AppendUint32(b, op.reqID)
		b = append(b, payload...)
		t.writeMu.Lock()
		err := t.write(frame("OPN", 'F', b))
		t.writeMu.Unlock()
		if err != nil {
			return err
		}
	}
	t.log.Debug("security token issued", "type", req.RequestType, "token", token, "lifetime_ms", lifetime, "policy", string(policy))
	t.armExpiry(time.Duration(lifetime) * time.Millisecond)
	if !t.open {
		t.open = true
		// The handshake is over: the handshake deadline goes, and the
		// idle timeout takes over until a session is activated.
		_ = t.conn.SetDeadline(time.Time{})
		t.armIdle()
	}
	return nil
}

// armExpiry starts (or, on a renewal, moves) the expiry of the token just
// issued: 125 % of its lifetime from now (Config.EnforceLifetime).
func (t *SecureTransport) armExpiry(lifetime time.Duration) {
	if !t.cfg.EnforceLifetime {
		return
	}
	d := time.Duration(float64(lifetime) * expiryGrace)
	t.tokMu.Lock()
	defer t.tokMu.Unlock()
	if t.stopped {
		return
	}
	t.expires = t.readTime(time.Now()) + d
	if t.expiry == nil {
		t.expiry = time.AfterFunc(d, t.tokenExpired)
	} else {
		t.expiry.Reset(d)
	}
}

// tokenExpired runs when the current token's expiry timer fires: unless a
// renewal moved the expiry meanwhile, the channel is closed.
func (t *SecureTransport) tokenExpired() {
	t.tokMu.Lock()
	if t.stopped {
		t.tokMu.Unlock()
		return
	}
	if left := t.expires - t.readTime(time.Now()); left > 0 {
		// A renewal raced with the timer, or the reader stalled: wait
		// for the expiry (while the reader is paused, again and again,
		// at least minRecheck apart).
		t.expiry.Reset(max(left, minRecheck))
		t.tokMu.Unlock()
		return
	}
	t.tokMu.Unlock()
	t.closeFor(ua.StatusBadSecureChannelTokenUnknown, ErrTokenExpired)
}

// armIdle starts the idle timeout after the first OpenSecureChannel
// (Config.IdleTimeout). A channel that holds an activated session when
// the timer fires is checked again one IdleTimeout later: a channel is
// spared while it holds a session, not because it once did.
func (t *SecureTransport) armIdle() {
	if t.cfg.IdleTimeout <= 0 {
		return
	}
	t.tokMu.Lock()
	defer t.tokMu.Unlock()
	if t.stopped {
		return
	}
	t.idle = time.AfterFunc(t.cfg.IdleTimeout, t.idleCheck)
}

// idleCheck is the idle timer's check: it closes the channel with ERR
// BadTimeout unless it holds an activated session, else arms the timer
// again.
func (t *SecureTransport) idleCheck() {
	if t.cfg.Active == nil || !t.cfg.Active() {
		t.closeFor(ua.StatusBadTimeout, ErrIdle)
		return
	}
	t.tokMu.Lock()
	defer t.tokMu.Unlock()
	if !t.stopped {
		t.idle = time.AfterFunc(t.cfg.IdleTimeout, t.idleCheck)
	}
}

// closeFor closes the channel from one of its timers with an ERR message
// carrying code; Receive then returns a *ProtocolError with code and
// reason.
func (t *SecureTransport) closeFor(code ua.StatusCode, reason error) {
	if !t.reason.CompareAndSwap(nil, &ProtocolError{Code: code, Err: reason}) {
		return
	}
	t.log.Debug("closing channel", "code", code, "reason", reason)
	_ = t.Abort(code)
}

// Evict closes the channel with an ERR message carrying code because the
// server needs its connection for another client (the connection limit);
// Receive then returns a *ProtocolError with code and reason. It may be
// called from any goroutine.
func (t *SecureTransport) Evict(code ua.StatusCode, reason error) {
	t.closeFor(code, reason)
}

// Security returns the channel's security: None until a secured
// OpenSecureChannel was served.
func (t *SecureTransport) Security() ChannelSecurity {
	t.tokMu.Lock()
	sec := t.sec
	t.tokMu.Unlock()
	if sec == nil {
		return ChannelSecurity{PolicyURI: ua.SecurityPolicyURINone, Mode: ua.MessageSecurityModeNone}
	}
	return ChannelSecurity{PolicyURI: sec.policy, Mode: sec.mode, ClientCertificate: sec.clientCert, Asymmetric: sec.asym}
}

// ReleaseGate releases the send gate the reader took for the request it
// returned last (the crypto-in-gate fault); otherwise it does nothing. The
// channel calls it once the request's handler returned; Receive calls it
// too.
func (t *SecureTransport) ReleaseGate() {
	if t.gateHeld {
		t.gateHeld = false
		t.sendMu.Unlock()
	}
}

// secureChunk checks a MSG or CLO chunk's channel and token and, on a
// secured channel, verifies and decrypts it in place with its token's keys
// and checks its sequence number. body is the chunk after its 8-byte
// frame header, in rbuf. It returns the request id and the chunk's body.
func (t *SecureTransport) secureChunk(chunk byte, body []byte) (reqID uint32, data []byte, err error) {
	if len(body) < msgHeaderLen-frameHeaderLen {
		return 0, nil, t.fail(ua.StatusBadDecodingError, fmt.Errorf("chunk %c of %d bytes: no header", chunk, len(body)+frameHeaderLen))
	}
	r := reader{b: body}
	chID, token := r.u32(), r.u32()
	if chID != t.cfg.IDs.SecureChannelID {
		return 0, nil, t.fail(ua.StatusBadTCPSecureChannelUnknown, fmt.Errorf("secure channel %d", chID))
	}
	keys, err := t.checkToken(token)
	if err != nil {
		return 0, nil, err
	}
	if t.sec == nil {
		_, reqID = r.u32(), r.u32() // sequence number, request id
		return reqID, r.b, nil
	}
	return t.openMessage(t.rbuf[:frameHeaderLen+len(body)], keys)
}

// message handles a MSG chunk. It returns ok when a request is complete.
func (t *SecureTransport) message(chunk byte, body []byte) (Message, bool, error) {
	if !t.open {
		return Message{}, false, t.fail(ua.StatusBadTCPSecureChannelUnknown, errors.New("MSG before OpenSecureChannel"))
	}
	gate := t.cfg.CryptoInGate && t.sec != nil
	if gate {
		// Fault crypto-in-gate: the reader verifies and decrypts under the
		// send gate "to protect the cipher state", and keeps it while the
		// request is handed on.
		t.sendMu.Lock()
	}
	msg, ok, err := t.messageChunk(chunk, body)
	if gate {
		if ok && err == nil {
			t.gateHeld = true
		} else {
			t.sendMu.Unlock()
		}
	}
	return msg, ok, err
}

// messageChunk is message without the gate.
func (t *SecureTransport) messageChunk(chunk byte, body []byte) (Message, bool, error) {
	reqID, data, err := t.secureChunk(chunk, body)
	if err != nil {
		return Message{}, false, err
	}
	p := t.partial[reqID]
	switch chunk {
	case 'A':
		// The client gave up on this request.
		t.drop(reqID, p)
		return Message{}, false, nil
	case 'C':
		if p == nil {
			p = &partialMessage{}
			t.partial[reqID] = p
		}
		if err := t.checkSize(reqID, p, len(data), true); err != nil {
			return Message{}, false, err
		}
		if t.bufChunks+1 > t.lim.MaxBufferedChunks || t.bufBytes+len(data) > t.lim.MaxBufferedBytes {
			return Message{}, false, t.fail(ua.StatusBadTCPMessageTooLarge, fmt.Errorf("more than %d chunks or %d bytes of unfinished requests (%d requests)", t.lim.MaxBufferedChunks, t.lim.MaxBufferedBytes, len(t.partial)))
		}
		if !t.charge(len(data)) {
			// The unfinished chunks of all channels together are at
			// their share of the memory budget.
			return Message{}, false, t.fail(ua.StatusBadTCPNotEnoughResources, fmt.Errorf("unfinished chunks of all channels at their budget of %d bytes (this channel holds %d)", t.cfg.Budget.ClassLimit(budget.Chunks), t.bufBytes))
		}
		p.chunks++
		p.data = append(p.data, data...)
		t.bufChunks++
		t.bufBytes += len(data)
		return Message{}, false, nil
	case 'F':
		var msg []byte
		if p != nil {
			if err := t.checkSize(reqID, p, len(data), false); err != nil {
				return Message{}, false, err
			}
			msg = append(p.data, data...)
			t.drop(reqID, p)
		} else {
			// A copy: rbuf is reused, and decoded ByteStrings point into
			// the message.
			msg = bytes.Clone(data)
		}
		return t.request(reqID, msg), true, nil
	}
	return Message{}, false, t.fail(ua.StatusBadTCPMessageTypeInvalid, fmt.Errorf("chunk type %q", chunk))
}

// checkToken accepts the current token, and the previous one until the
// client uses the current one, and returns its keys (nil on a None
// channel). Once the client uses the current token, responses go out with
// it and its keys.
func (t *SecureTransport) checkToken(token uint32) (*symKeys, error) {
	t.tokMu.Lock()
	switch {
	case (token == t.token || token == t.oldToken && t.oldToken != 0) && t.expired(token):
		t.tokMu.Unlock()
		return nil, t.fail(ua.StatusBadSecureChannelTokenUnknown, fmt.Errorf("token %d expired", token))
	case token == t.token:
		// Once the client uses the new token, the old one is retired.
		t.sendTok, t.oldToken = token, 0
		t.sendKeys, t.oldKeys = t.keys, nil
		keys := t.keys
		t.tokMu.Unlock()
		return keys, nil
	case token == t.oldToken && t.oldToken != 0:
		keys := t.oldKeys
		t.tokMu.Unlock()
		return keys, nil
	}
	t.tokMu.Unlock()
	return nil, t.fail(ua.StatusBadSecureChannelTokenUnknown, fmt.Errorf("token %d", token))
}

// expired reports whether token (the current or the previous one) is past
// its expiry (Config.EnforceLifetime); tokMu held.
func (t *SecureTransport) expired(token uint32) bool {
	exp := t.expires
	if token != t.token {
		exp = t.oldExpires
	}
	return exp != 0 && t.readTime(time.Now()) > exp
}

// readTime is the time the reader has been reading (or waiting to read)
// at now since the transport started: the clock tokens expire by. tokMu
// held.
func (t *SecureTransport) readTime(now time.Time) time.Duration {
	stalled := t.stalled
	if !t.outside.IsZero() {
		stalled += now.Sub(t.outside)
	}
	return now.Sub(t.start) - stalled
}

// checkSize refuses a chunk of n bytes that would make request reqID
// exceed the message size or chunk count limits (an intermediate chunk
// still needs a final one after it).
func (t *SecureTransport) checkSize(reqID uint32, p *partialMessage, n int, intermediate bool) error {
	chunks := p.chunks + 1
	if intermediate {
		chunks++
	}
	if chunks > int(t.lim.MaxChunkCount) || len(p.data)+n > int(t.lim.MaxMessageSize) {
		return t.fail(ua.StatusBadRequestTooLarge, fmt.Errorf("request %d: more than %d chunks or %d bytes", reqID, t.lim.MaxChunkCount, t.lim.MaxMessageSize))
	}
	return nil
}

// drop forgets the unfinished request reqID.
func (t *SecureTransport) drop(reqID uint32, p *partialMessage) {
	if p == nil {
		return
	}
	t.bufChunks -= p.chunks
	t.bufBytes -= len(p.data)
	t.uncharge(len(p.data))
	delete(t.partial, reqID)
}

// charge charges n bytes of an unfinished chunk to Config.Budget; false
// if they do not fit or the channel is closed.
func (t *SecureTransport) charge(n int) bool {
	t.chargeMu.Lock()
	defer t.chargeMu.Unlock()
	if t.chargeClosed || !t.cfg.Budget.Charge(budget.Chunks, int64(n)) {
		return false
	}
	t.charged += int64(n)
	return true
}

// uncharge releases n charged bytes (the request completed or was
// aborted). After Close it does nothing: Close released them all.
func (t *SecureTransport) uncharge(n int) {
	t.chargeMu.Lock()
	defer t.chargeMu.Unlock()
	if t.chargeClosed {
		return
	}
	m := min(int64(n), t.charged)
	t.charged -= m
	t.cfg.Budget.Release(budget.Chunks, m)
}

// releaseCharges releases every byte still charged; later charges fail.
func (t *SecureTransport) releaseCharges() {
	t.chargeMu.Lock()
	defer t.chargeMu.Unlock()
	t.chargeClosed = true
	t.cfg.Budget.Release(budget.Chunks, t.charged)
	t.charged = 0
}

// decode decodes a service message body.
func (t *SecureTransport) decode(b []byte) (any, error) {
	if t.cfg.Unguarded {
		// Fault crash-on-decode: gopcua's decoder on its own. A negative
		// Variant array length panics here, on the channel's reader.
		_, v, err := ua.DecodeService(b)
		return v, err
	}
	return t.decoder.DecodeService(b)
}

// request decodes a complete request message.
func (t *SecureTransport) request(reqID uint32, b []byte) Message {
	v, err := t.decode(b)
	if err == nil {
		switch r := v.(type) {
		case *ua.OpenSecureChannelRequest, *ua.CloseSecureChannelRequest:
			err = fmt.Errorf("%T in a MSG chunk: %w", r, ua.StatusBadServiceUnsupported)
		case ua.Request:
			return Message{RequestID: reqID, Request: r, Size: len(b)}
		default:
			err = fmt.Errorf("%T is not a request: %w", r, ua.StatusBadServiceUnsupported)
		}
	}
	msg := Message{RequestID: reqID, Err: err}
	if h, herr := t.decoder.DecodeRequestHeader(b); herr == nil {
		msg.Handle = h.RequestHandle
	}
	return msg
}

// encodeService encodes a service structure with its four-byte type id.
func encodeService(v any) (b []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("channel: panic encoding %T: %v", v, p)
		}
	}()
	typeID := ua.ServiceTypeID(v)
	if typeID == 0 {
		return nil, fmt.Errorf("channel: %T is not a service", v)
	}
	b = []byte{byte(ua.NodeIDTypeFourByte), 0, byte(typeID), byte(typeID >> 8)}
	body, err := ua.Encode(v)
	if err != nil {
		return nil, fmt.Errorf("channel: encode %T: %w", v, err)
	}
	return append(b, body...), nil
}

// Send writes one response, in chunks that fit the client's receive buffer.
// A response above the client's max message size or chunk count is
// replaced by a ServiceFault BadResponseTooLarge.
func (t *SecureTransport) Send(ctx context.Context, reqID uint32, resp ua.Response) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return t.SendEncoded(ctx, reqID, t.Encode(reqID, resp))
}

// Encode encodes resp, the answer to request reqID, with its type id: a
// response that cannot be encoded is a ServiceFault BadInternalError, one
// above the client's max message size a ServiceFault BadResponseTooLarge.
// It is safe for concurrent use.
func (t *SecureTransport) Encode(reqID uint32, resp ua.Response) []byte {
	body, err := encodeService(resp)
	if err != nil {
		t.log.Error("cannot encode response", "request_id", reqID, "err", err)
		return t.faultBody(resp, ua.StatusBadInternalError)
	}
	if t.peerMaxMessage > 0 && len(body) > t.peerMaxMessage {
		t.log.Info("response too large for the client", "request_id", reqID, "type", fmt.Sprintf("%T", resp),
			"bytes", len(body), "max_message", t.peerMaxMessage)
		return t.faultBody(resp, ua.StatusBadResponseTooLarge)
	}
	return body
}

// SendEncoded writes the encoded response body (Encode's) to request
// reqID, in chunks that fit the client's receive buffer; one of more
// chunks than the client takes is replaced by a ServiceFault
// BadResponseTooLarge.
func (t *SecureTransport) SendEncoded(ctx context.Context, reqID uint32, body []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	maxBody := t.sendChunk - msgHeaderLen
	chunks := max(1, (len(body)+maxBody-1)/maxBody)
	if (t.peerMaxMessage > 0 && len(body) > t.peerMaxMessage) || (t.peerMaxChunks > 0 && chunks > t.peerMaxChunks) {
		t.log.Info("response too large for the client", "request_id", reqID,
			"bytes", len(body), "chunks", chunks, "max_message", t.peerMaxMessage, "max_chunks", t.peerMaxChunks)
		body = t.faultBodyFor(responseHandle(body), ua.StatusBadResponseTooLarge)
		chunks = 1
	}
	t.tokMu.Lock()
	tok, keys := t.sendTok, t.sendKeys
	t.tokMu.Unlock()
	if keys != nil {
		if room := keys.sym.MaxBody(t.sendChunk); room != maxBody {
			// The response was sized for a None chunk: recount.
			chunks = max(1, (len(body)+room-1)/room)
			if t.peerMaxChunks > 0 && chunks > t.peerMaxChunks {
				body = t.faultBodyFor(responseHandle(body), ua.StatusBadResponseTooLarge)
			}
		}
		return t.sendSecured(reqID, body, tok, keys, t.cfg.CryptoInGate)
	}
	t.sendMu.Lock()
	defer t.sendMu.Unlock()
	b := make([]byte, 0, len(body)+chunks*msgHeaderLen)
	for i := range chunks {
		part := body[i*maxBody : min(len(body), (i+1)*maxBody)]
		kind := byte('C')
		if i == chunks-1 {
			kind = 'F'
		}
		b = append(b, "MSG"...)
		b = append(b, kind)
		b = binary.LittleEndian.AppendUint32(b, uint32(msgHeaderLen+len(part)))
		b = binary.LittleEndian.AppendUint32(b, t.cfg.IDs.SecureChannelID)
		b = binary.LittleEndian.AppendUint32(b, tok)
		b = binary.LittleEndian.AppendUint32(b, t.nextSeq())
		b = binary.LittleEndian.AppendUint32(b, reqID)
		b = append(b, part...)
	}
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	return t.write(b)
}

// faultBody encodes a ServiceFault with code answering the request resp
// answers.
func (t *SecureTransport) faultBody(resp ua.Response, code ua.StatusCode) []byte {
	var handle uint32
	if resp != nil {
		if h := resp.Header(); h != nil {
			handle = h.RequestHandle
		}
	}
	return t.faultBodyFor(handle, code)
}

// responseHandle is the RequestHandle of an encoded response body: after
// its four-byte type id and the header's eight-byte Timestamp.
func responseHandle(body []byte) uint32 {
	if len(body) < 16 {
		return 0
	}
	return binary.LittleEndian.Uint32(body[12:16])
}

// faultBodyFor encodes a ServiceFault with code answering the request of
// handle.
func (t *SecureTransport) faultBodyFor(handle uint32, code ua.StatusCode) []byte {
	b, err := encodeService(&ua.ServiceFault{ResponseHeader: &ua.ResponseHeader{
		Timestamp:          time.Now(),
		RequestHandle:      handle,
		ServiceResult:      code,
		ServiceDiagnostics: &ua.DiagnosticInfo{},
		AdditionalHeader:   ua.NewExtensionObject(nil),
	}})
	if err != nil {
		panic(err) // a ServiceFault always encodes
	}
	return b
}

// nextSeq returns the next sequence number; sendMu held.
func (t *SecureTransport) nextSeq() uint32 {
	if t.seq++; t.seq > maxSequence || t.seq == 0 {
		t.seq = 1
	}
	return t.seq
}

// Abort sends an ERR message with code and closes the connection. If a
// response is being written, it waits up to abortWait for that write to
// finish; a write still blocked then (a peer that does not read) makes it
// close without the ERR message rather than wait longer.
func (t *SecureTransport) Abort(code ua.StatusCode) error {
	if t.writeMu.LockWithin(abortWait) {
		t.abortLocked(code)
		t.writeMu.Unlock()
	}
	return t.Close()
}

// failLocked is fail with sendMu held on a None channel: no other writer
// can hold writeMu.
func (t *SecureTransport) failLocked(code ua.StatusCode, err error) error {
	t.log.Debug("closing channel: protocol error", "code", code, "err", err)
	t.writeMu.Lock()
	t.abortLocked(code)
	t.writeMu.Unlock()
	_ = t.Close()
	return &ProtocolError{Code: code, Err: err}
}

// abortLocked writes an ERR message; writeMu held.
func (t *SecureTransport) abortLocked(code ua.StatusCode) {
	body, err := ua.Encode(&uacp.Error{ErrorCode: uint32(code), Reason: code.Error()})
	if err != nil {
		return
	}
	_ = t.conn.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = t.conn.Write(frame(uacp.MessageTypeError, 'F', body))
}

// Close closes the connection, stops the channel's timers and releases the
// budget its unfinished chunks held.
func (t *SecureTransport) Close() error {
	t.closeOnce.Do(func() {
		t.closeErr = t.conn.Close()
		t.tokMu.Lock()
		t.stopped = true
		if t.expiry != nil {
			t.expiry.Stop()
		}
		if t.idle != nil {
			t.idle.Stop()
		}
		t.tokMu.Unlock()
		t.releaseCharges()
	})
	return t.closeErr
}

// RemoteAddr returns the peer's address.
func (t *SecureTransport) RemoteAddr() net.Addr { return t.conn.RemoteAddr() }
