package channel

import (
	"bytes"
	"crypto/rsa"
	"errors"
	"fmt"
	"sync"

	"github.com/gopcua/opcua/ua"

	"github.com/opcua-chaos/opcua-chaos/internal/uasec"
)

// Security is what a transport needs to accept secured channels: the
// server's application instance certificate and key, and the policies and
// modes it offers.
//
// The reference server AUTO-ACCEPTS every well-formed client certificate:
// there is no trust list. A client certificate only has to parse as X.509
// and carry an RSA key of a size the policy allows (2048 to 4096 bits for
// the policies offered here); neither its issuer, its validity period nor
// its ApplicationUri are checked. A server as it ships would check them.
type Security struct {
	// Certificate is the server's DER certificate.
	Certificate []byte
	// PrivateKey is its key.
	PrivateKey *rsa.PrivateKey
	// Offers reports whether the server offers SecurityPolicy policyURI
	// with mode. SecurityPolicy None is always accepted on a channel (for
	// discovery), whatever Offers says.
	Offers func(policyURI string, mode ua.MessageSecurityMode) bool
	// Trusts, when set, reports whether the client certificate (DER) is
	// trusted; an untrusted one is refused at OpenSecureChannel with
	// BadSecurityChecksFailed. Nil trusts every well-formed certificate.
	Trusts func(cert []byte) bool
	// ChannelCertificate, when set, returns the certificate a new secured
	// channel takes as its client's, given sent, the one its first
	// OpenSecureChannel was verified with: the fault
	// cert-cached-across-channels returns the first one the server ever
	// saw. The response and everything after it is signed and encrypted
	// for the certificate returned. Nil takes sent.
	ChannelCertificate func(sent []byte) []byte
}

// offersPolicy reports whether any secured mode of policy is offered.
func (s *Security) offersPolicy(policy string) bool {
	return s != nil && s.Offers != nil &&
		(s.Offers(policy, ua.MessageSecurityModeSign) || s.Offers(policy, ua.MessageSecurityModeSignAndEncrypt))
}

// ChannelSecurity is the security of an open secure channel.
type ChannelSecurity struct {
	// PolicyURI is the channel's SecurityPolicy (ua.SecurityPolicyURINone
	// before the first OpenSecureChannel).
	PolicyURI string
	// Mode is the channel's MessageSecurityMode (None on a None channel).
	Mode ua.MessageSecurityMode
	// ClientCertificate is the DER certificate the client opened the
	// channel with; nil on a None channel.
	ClientCertificate []byte
	// Asymmetric signs with the server's key and verifies with the
	// client's (and decrypts with the server's key); nil on a None
	// channel.
	Asymmetric *uasec.Asymmetric
}

// Secured reports whether the channel signs its messages.
func (c ChannelSecurity) Secured() bool {
	return c.Mode == ua.MessageSecurityModeSign || c.Mode == ua.MessageSecurityModeSignAndEncrypt
}

// Sizes of RSA keys the offered policies allow (Basic256Sha256,
// Aes128_Sha256_RsaOaep, Aes256_Sha256_RsaPss).
const (
	minRSABits = 2048
	maxRSABits = 4096
)

// secState is the security of a secured channel, fixed by its first
// OpenSecureChannel.
type secState struct {
	policy     string
	mode       ua.MessageSecurityMode
	clientCert []byte
	// asym opens and seals the channel's OPN chunks and makes the session
	// signatures. OPN chunks are signed and encrypted in both modes; the
	// channel's mode is mode.
	asym *uasec.Asymmetric
}

func (s *secState) encrypt() bool { return s.mode == ua.MessageSecurityModeSignAndEncrypt }

// clientKey checks a client certificate: well-formed X.509 with an RSA key
// of an allowed size.
func clientKey(der []byte) (*rsa.PublicKey, error) {
	pub, err := uasec.CertificateKey(der, "client certificate")
	if err != nil {
		return nil, err
	}
	if bits := pub.N.BitLen(); bits < minRSABits || bits > maxRSABits {
		return nil, fmt.Errorf("client certificate key of %d bits, want %d to %d", bits, minRSABits, maxRSABits)
	}
	return pub, nil
}

// reserve reserves the sequence numbers of n chunks of a secured channel
// and a ticket for writing them: tickets are written in the order they
// were taken, so the numbers go out in order, while the chunks are signed
// and encrypted outside any lock.
func (t *SecureTransport) reserve(n int) (ticket uint64, first uint32) {
	t.turnMu.Lock()
	defer t.turnMu.Unlock()
	ticket = t.nextTicket
	t.nextTicket++
	first = t.nextSeq()
	for range n - 1 {
		t.nextSeq()
	}
	return ticket, first
}

// seqAfter returns the sequence number after seq (Part 6, 6.7.2.4: it
// wraps to 1 after maxSequence).
func seqAfter(seq uint32) uint32 {
	if seq >= maxSequence {
		return 1
	}
	return seq + 1
}

// writeInTurn waits for ticket's turn and writes b (nothing if b is nil),
// then passes the turn on. A writer ahead that blocks on a slow peer holds
// the turn, as it would hold a lock.
func (t *SecureTransport) writeInTurn(ticket uint64, b []byte) error {
	t.turnMu.Lock()
	for t.served != ticket {
		t.turnCond.Wait()
	}
	t.turnMu.Unlock()
	var err error
	if b != nil {
		t.writeMu.Lock()
		err = t.write(b)
		t.writeMu.Unlock()
	}
	t.turnMu.Lock()
	t.served++
	t.turnCond.Broadcast()
	t.turnMu.Unlock()
	return err
}

// sendSecured writes a response body in signed (and encrypted) chunks.
// The sequence numbers are reserved under a short lock; the chunks are
// sealed outside it, and written when their ticket's turn comes. Under the
// crypto-in-gate fault, the whole of it runs under the send gate.
func (t *SecureTransport) sendSecured(reqID uint32, body []byte, tok uint32, keys *symKeys, faultGate bool) error {
	if faultGate {
		// Fault crypto-in-gate: sign and encrypt holding the send gate.
		t.sendMu.Lock()
		defer t.sendMu.Unlock()
	}
	room := keys.sym.MaxBody(t.sendChunk)
	chunks := max(1, (len(body)+room-1)/room)
	ticket, seq := t.reserve(chunks)
	out := make([]byte, 0, len(body)+chunks*keys.sym.Overhead(room))
	keys.sealMu.Lock()
	for i := range chunks {
		part := body[i*room : min(len(body), (i+1)*room)]
		kind := byte('C')
		if i == chunks-1 {
			kind = 'F'
		}
		out = keys.sym.Seal(out, "MSG", kind, t.cfg.IDs.SecureChannelID, tok, seq, reqID, part)
		seq = seqAfter(seq)
	}
	keys.sealMu.Unlock()
	return t.writeInTurn(ticket, out)
}

// symKeys are the symmetric keys of one security token (uasec).
type symKeys struct {
	sec *secState
	sym *uasec.Symmetric
	// sealMu keeps two Seals of the token apart (uasec's Symmetric reuses
	// its MAC and cipher state): only the channel's writer seals, so it is
	// uncontended; it is not the send gate.
	sealMu sync.Mutex
}

// openRequest is an OpenSecureChannel request taken from its chunk.
type openRequest struct {
	req   *ua.OpenSecureChannelRequest
	reqID uint32
	sec   *secState // nil for SecurityPolicy None
}

// readSecuredOpen checks, verifies and decrypts a secured OPN chunk with
// uasec's Asymmetric; body is the chunk after its frame header, in rbuf,
// and policy, senderCert and thumbprint come from its asymmetric security
// header.
func (t *SecureTransport) readSecuredOpen(body []byte, policy string, senderCert, thumbprint []byte) (openRequest, error) {
	s := t.cfg.Security
	if !s.offersPolicy(policy) {
		return openRequest{}, t.fail(ua.StatusBadSecurityPolicyRejected, fmt.Errorf("security policy %q", policy))
	}
	if t.open && (t.sec == nil || t.sec.policy != policy) {
		return openRequest{}, t.fail(ua.StatusBadSecurityPolicyRejected, fmt.Errorf("Renew with policy %q on a channel with another", policy))
	}
	if !bytes.Equal(thumbprint, t.thumbprint) {
		// The request is not encrypted with our key.
		return openRequest{}, t.fail(ua.StatusBadCertificateInvalid, fmt.Errorf("receiver thumbprint %x is not our certificate's", thumbprint))
	}
	// The blocks to decrypt are counted, bounded and admitted before
	// anything else costs the server a private-key operation.
	chunk := t.rbuf[:frameHeaderLen+len(body)]
	h, err := uasec.ParseOPNHeader(chunk)
	if err != nil {
		return openRequest{}, t.fail(uasec.Status(err), err)
	}
	keyLen := s.PrivateKey.Size()
	blocks := (len(chunk) - h.Len + keyLen - 1) / keyLen
	if limit := t.cfg.MaxOPNBlocks; limit > 0 && blocks > limit {
		return openRequest{}, t.fail(ua.StatusBadSecurityChecksFailed, fmt.Errorf("OpenSecureChannel of %d encrypted blocks, at most %d: %w", blocks, limit, uasec.ErrTooManyBlocks))
	}
	if t.cfg.AdmitOPN != nil && !t.cfg.AdmitOPN(blocks) {
		return openRequest{}, t.fail(ua.StatusBadTCPServerTooBusy, fmt.Errorf("OpenSecureChannel of %d encrypted blocks over the peer's budget of RSA work", blocks))
	}
	if _, err := clientKey(senderCert); err != nil {
		return openRequest{}, t.fail(ua.StatusBadCertificateInvalid, err)
	}
	if !t.open && s.Trusts != nil && !s.Trusts(senderCert) {
		// Part 4, 6.1.3 (trust list check); Part 6 answers a failed
		// OpenSecureChannel check without saying which
		return openRequest{}, t.fail(ua.StatusBadSecurityChecksFailed, errors.New("client certificate not in the trust list"))
	}
	if t.open && !bytes.Equal(senderCert, t.sec.clientCert) {
		return openRequest{}, t.fail(ua.StatusBadCertificateInvalid, errors.New("Renew with another client certificate"))
	}
	var asym *uasec.Asymmetric
	if t.open {
		asym = t.sec.asym
	} else {
		asym, err = uasec.NewAsymmetric(policy, ua.MessageSecurityModeSignAndEncrypt, s.PrivateKey, s.Certificate, bytes.Clone(senderCert))
		if err != nil {
			return openRequest{}, t.fail(uasec.Status(err), err)
		}
	}
	_, seq, reqID, payload, err := asym.OpenOPNBounded(chunk, t.cfg.MaxOPNBlocks)
	if err != nil {
		return openRequest{}, t.fail(uasec.Status(err), err)
	}
	// An OPN chunk sets the expected sequence number, as open62541 does:
	// gopcua's client renews on a copy of its counter.
	t.rseq, t.rseqSet = seq, true
	v, err := t.decode(payload)
	if err != nil {
		return openRequest{}, t.fail(ua.StatusBadDecodingError, fmt.Errorf("OpenSecureChannel: %w", err))
	}
	req, ok := v.(*ua.OpenSecureChannelRequest)
	if !ok {
		return openRequest{}, t.fail(ua.StatusBadTCPMessageTypeInvalid, fmt.Errorf("OPN carries %T", v))
	}
	switch {
	case req.SecurityMode != ua.MessageSecurityModeSign && req.SecurityMode != ua.MessageSecurityModeSignAndEncrypt,
		!s.Offers(policy, req.SecurityMode),
		t.open && req.SecurityMode != t.sec.mode:
		return openRequest{}, t.fail(ua.StatusBadSecurityModeRejected, fmt.Errorf("security mode %v with %s", req.SecurityMode, policy))
	}
	if len(req.ClientNonce) != asym.NonceLength() {
		return openRequest{}, t.fail(ua.StatusBadNonceInvalid, fmt.Errorf("client nonce of %d bytes, want %d", len(req.ClientNonce), asym.NonceLength()))
	}
	sec := t.sec
	if sec == nil {
		sec = &secState{policy: policy, mode: req.SecurityMode, clientCert: bytes.Clone(senderCert), asym: asym}
		if s.ChannelCertificate != nil {
			if sec, err = s.cachedCertificate(sec); err != nil {
				return openRequest{}, t.fail(uasec.Status(err), err)
			}
		}
	}
	return openRequest{req: req, reqID: reqID, sec: sec}, nil
}

// cachedCertificate is sec with the client certificate ChannelCertificate
// gives for sec's own in place of it (the fault
// cert-cached-across-channels), and an Asymmetric that seals for it.
func (s *Security) cachedCertificate(sec *secState) (*secState, error) {
	cert := s.ChannelCertificate(sec.clientCert)
	if bytes.Equal(cert, sec.clientCert) {
		return sec, nil
	}
	asym, err := uasec.NewAsymmetric(sec.policy, ua.MessageSecurityModeSignAndEncrypt, s.PrivateKey, s.Certificate, bytes.Clone(cert))
	if err != nil {
		return nil, err
	}
	return &secState{policy: sec.policy, mode: sec.mode, clientCert: bytes.Clone(cert), asym: asym}, nil
}

// sealedOpenResponse builds the OPN chunk answering a secured
// OpenSecureChannel: asymmetric header (policy, our certificate, the client
// certificate's thumbprint), sequence header, payload, signed and
// encrypted with the asymmetric algorithm.
func (t *SecureTransport) sealedOpenResponse(sec *secState, seq, reqID uint32, payload []byte) ([]byte, error) {
	b, err := sec.asym.SealOPN(nil, t.cfg.IDs.SecureChannelID, seq, reqID, payload)
	if err != nil {
		return nil, err
	}
	if len(b) > t.sendChunk {
		return nil, fmt.Errorf("OPN response of %d bytes above the client's receive buffer %d", len(b), t.sendChunk)
	}
	return b, nil
}

// openMessage verifies (and decrypts) a MSG or CLO chunk of a secured
// channel in place and checks its sequence number. It returns the request
// id and the chunk's body.
func (t *SecureTransport) openMessage(chunk []byte, keys *symKeys) (reqID uint32, body []byte, err error) {
	_, seq, reqID, body, err := keys.sym.Open(chunk)
	if err != nil {
		return 0, nil, t.fail(uasec.Status(err), err)
	}
	// Each chunk's number is the last one plus 1; past maxSequence it
	// wraps to a number below 1024 (Part 6, 6.7.2.4).
	next := uint64(t.rseq) + 1
	if t.rseqSet && uint64(seq) != next && !(next > maxSequence && seq < 1024) {
		return 0, nil, t.fail(ua.StatusBadSequenceNumberInvalid, fmt.Errorf("sequence number %d after %d", seq, t.rseq))
	}
	t.rseq, t.rseqSet = seq, true
	return reqID, body, nil
}
