package uasec

import (
	"bytes"
	"crypto/rsa"
	"crypto/x509"
	"encoding/binary"
	"fmt"

	"github.com/gopcua/opcua/ua"
	"github.com/gopcua/opcua/uapolicy"
)

// OPNHeader is the unencrypted part of an OpenSecureChannel chunk: the
// secure channel id and the asymmetric security header (Part 6, 6.7.2.3).
type OPNHeader struct {
	ChannelID          uint32
	PolicyURI          string
	SenderCert         []byte
	ReceiverThumbprint []byte
	// Len is the length of the message header plus the asymmetric
	// security header: where the (possibly encrypted) sequence header
	// starts.
	Len int
}

// ParseOPNHeader decodes the message header and asymmetric security header
// of an OPN chunk without decrypting anything: a server reads the policy
// URI and the sender certificate from it before it can build its
// Asymmetric. The returned slices alias chunk.
func ParseOPNHeader(chunk []byte) (OPNHeader, error) {
	var h OPNHeader
	if len(chunk) < MessageHeaderLen || string(chunk[:3]) != "OPN" {
		return h, fmt.Errorf("parse OPN header: %w", ErrMalformed)
	}
	if int(binary.LittleEndian.Uint32(chunk[4:])) != len(chunk) {
		return h, fmt.Errorf("parse OPN header: size field %d, chunk %d bytes: %w",
			binary.LittleEndian.Uint32(chunk[4:]), len(chunk), ErrShortChunk)
	}
	h.ChannelID = binary.LittleEndian.Uint32(chunk[8:])
	pos := MessageHeaderLen
	var uri []byte
	var err error
	if uri, pos, err = readByteString(chunk, pos); err != nil {
		return h, fmt.Errorf("parse OPN header: policy uri: %w", err)
	}
	h.PolicyURI = string(uri)
	if h.SenderCert, pos, err = readByteString(chunk, pos); err != nil {
		return h, fmt.Errorf("parse OPN header: sender certificate: %w", err)
	}
	if h.ReceiverThumbprint, pos, err = readByteString(chunk, pos); err != nil {
		return h, fmt.Errorf("parse OPN header: receiver thumbprint: %w", err)
	}
	h.Len = pos
	return h, nil
}

func readByteString(b []byte, pos int) ([]byte, int, error) {
	if len(b) < pos+4 {
		return nil, pos, ErrShortChunk
	}
	n := int32(binary.LittleEndian.Uint32(b[pos:]))
	pos += 4
	if n < 0 {
		return nil, pos, nil
	}
	if len(b)-pos < int(n) {
		return nil, pos, ErrShortChunk
	}
	return b[pos : pos+int(n) : pos+int(n)], pos + int(n), nil
}

func appendByteString(b, s []byte) []byte {
	if s == nil {
		return binary.LittleEndian.AppendUint32(b, 0xffffffff)
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}

// Asymmetric seals and opens the OpenSecureChannel chunks of one channel
// end: signed with the local private key and encrypted with the remote
// certificate's public key whenever the policy is not None, in mode Sign
// as well as SignAndEncrypt (Part 6, 6.7.2.3). It also makes the session
// signatures of CreateSession/ActivateSession (Part 4, 5.6.2 and 5.6.3).
// Its methods may be called concurrently.
type Asymmetric struct {
	policy      string
	mode        ua.MessageSecurityMode
	algo        *uapolicy.EncryptionAlgorithm
	localCert   []byte
	remoteCert  []byte
	remoteThumb []byte
	localThumb  []byte
	localKeyLen int
}

// CertificateKey returns the RSA public key of a DER certificate; whose
// names the certificate in the errors ("server certificate has a
// *ecdsa.PublicKey key, want RSA").
func CertificateKey(der []byte, whose string) (*rsa.PublicKey, error) {
	c, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", whose, err)
	}
	pub, ok := c.PublicKey.(*rsa.PublicKey)
	if !ok {
		return nil, fmt.Errorf("%s has a %T key, want RSA", whose, c.PublicKey)
	}
	return pub, nil
}

// NewAsymmetric returns the asymmetric security of a channel end. localKey
// and localCert are this end's; remoteCert is the peer's certificate (DER):
// on a client the server certificate from the endpoint, on a server the
// SenderCert of the client's OPN (see ParseOPNHeader). For policy None all
// of them may be nil.
func NewAsymmetric(policyURI string, mode ua.MessageSecurityMode, localKey *rsa.PrivateKey, localCert, remoteCert []byte) (*Asymmetric, error) {
	a := &Asymmetric{policy: policyURI, mode: mode, localCert: localCert, remoteCert: remoteCert}
	if policyURI == ua.SecurityPolicyURINone {
		if mode != ua.MessageSecurityModeNone && mode != ua.MessageSecurityModeInvalid {
			return nil, fmt.Errorf("new asymmetric security: mode %v with policy None: %w", mode, ErrMode)
		}
		a.mode = ua.MessageSecurityModeNone
		a.algo, _ = uapolicy.Asymmetric(policyURI, nil, nil)
		return a, nil
	}
	if _, ok := symmetricSuites[policyURI]; !ok {
		return nil, fmt.Errorf("new asymmetric security: %s: %w", policyURI, ErrPolicy)
	}
	if mode != ua.MessageSecurityModeSign && mode != ua.MessageSecurityModeSignAndEncrypt {
		return nil, fmt.Errorf("new asymmetric security: mode %v: %w", mode, ErrMode)
	}
	if localKey == nil || len(localCert) == 0 || len(remoteCert) == 0 {
		return nil, fmt.Errorf("new asymmetric security: %s needs a local key, a local and a remote certificate: %w", policyURI, ErrCertificate)
	}
	remoteKey, err := CertificateKey(remoteCert, "remote certificate")
	if err != nil {
		return nil, fmt.Errorf("new asymmetric security: %v: %w", err, ErrCertificate)
	}
	a.algo, err = uapolicy.Asymmetric(policyURI, localKey, remoteKey)
	if err != nil {
		return nil, fmt.Errorf("new asymmetric security: %v: %w", err, ErrCertificate)
	}
	a.remoteThumb = uapolicy.Thumbprint(remoteCert)
	a.localThumb = uapolicy.Thumbprint(localCert)
	a.localKeyLen = localKey.PublicKey.Size()
	return a, nil
}

// PolicyURI returns the security policy.
func (a *Asymmetric) PolicyURI() string { return a.policy }

// Mode returns the message security mode.
func (a *Asymmetric) Mode() ua.MessageSecurityMode { return a.mode }

// RemoteCertificate returns the peer's certificate (DER) the Asymmetric
// was built with.
func (a *Asymmetric) RemoteCertificate() []byte { return a.remoteCert }

// NonceLength returns the channel nonce length of the policy (0 for None).
func (a *Asymmetric) NonceLength() int { return a.algo.NonceLength() }

// MakeNonce returns a fresh random channel nonce of NonceLength bytes.
func (a *Asymmetric) MakeNonce() ([]byte, error) {
	n, err := a.algo.MakeNonce()
	if err != nil {
		return nil, fmt.Errorf("make nonce: %w", err)
	}
	return n, nil
}

// SignatureURI returns the URI of the asymmetric signature algorithm, for
// SignatureData.Algorithm.
func (a *Asymmetric) SignatureURI() string { return a.algo.SignatureURI() }

// Sign signs data with the local private key (e.g. remote certificate ‖
// remote nonce for a session signature). Policy None returns nil.
func (a *Asymmetric) Sign(data []byte) ([]byte, error) {
	if a.policy == ua.SecurityPolicyURINone {
		return nil, nil
	}
	sig, err := a.algo.Signature(data)
	if err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	return sig, nil
}

// Verify checks that sig is the remote end's signature of data. Policy
// None accepts anything.
func (a *Asymmetric) Verify(data, sig []byte) error {
	if a.policy == ua.SecurityPolicyURINone {
		return nil
	}
	if err := a.algo.VerifySignature(data, sig); err != nil {
		return fmt.Errorf("verify signature: %v: %w", err, ErrSignature)
	}
	return nil
}

// SessionSignature returns the session signature this end sends: over
// the remote certificate followed by the remote nonce (Part 4, 5.6.2: the
// server signs client certificate ‖ client nonce; 5.6.3: the client signs
// server certificate ‖ server nonce).
func (a *Asymmetric) SessionSignature(remoteNonce []byte) (*ua.SignatureData, error) {
	if a.policy == ua.SecurityPolicyURINone {
		return &ua.SignatureData{}, nil
	}
	sig, err := a.Sign(concat(a.remoteCert, remoteNonce))
	if err != nil {
		return nil, err
	}
	return &ua.SignatureData{Algorithm: a.SignatureURI(), Signature: sig}, nil
}

// VerifySessionSignature checks the peer's session signature, which covers
// the local certificate followed by the local nonce.
func (a *Asymmetric) VerifySessionSignature(localNonce []byte, sd *ua.SignatureData) error {
	if a.policy == ua.SecurityPolicyURINone {
		return nil
	}
	if sd == nil || len(sd.Signature) == 0 {
		return fmt.Errorf("verify session signature: missing: %w", ErrSignature)
	}
	return a.Verify(concat(a.localCert, localNonce), sd.Signature)
}

func concat(a, b []byte) []byte {
	out := make([]byte, 0, len(a)+len(b))
	return append(append(out, a...), b...)
}

// extraPadding reports whether chunks encrypted with a key of keyLen bytes
// carry the ExtraPaddingSize byte (keys above 2048 bits).
func extraPadding(keyLen int) bool { return keyLen > 256 }

// SealOPN appends to dst one complete, final OPN chunk carrying body: the
// message header, the asymmetric security header (policy URI, local
// certificate, thumbprint of the remote certificate) and the sequence
// header, body, padding and signature, signed and encrypted unless the
// policy is None.
func (a *Asymmetric) SealOPN(dst []byte, channelID, seq, reqID uint32, body []byte) ([]byte, error) {
	start := len(dst)
	dst = append(dst, 'O', 'P', 'N', 'F', 0, 0, 0, 0)
	dst = binary.LittleEndian.AppendUint32(dst, channelID)
	dst = appendByteString(dst, []byte(a.policy))
	if a.policy == ua.SecurityPolicyURINone {
		dst = appendByteString(dst, nil)
		dst = appendByteString(dst, nil)
	} else {
		dst = appendByteString(dst, a.localCert)
		dst = appendByteString(dst, a.remoteThumb)
	}
	hdrEnd := len(dst)
	dst = binary.LittleEndian.AppendUint32(dst, seq)
	dst = binary.LittleEndian.AppendUint32(dst, reqID)
	dst = append(dst, body...)
	if a.policy == ua.SecurityPolicyURINone {
		binary.LittleEndian.PutUint32(dst[start+4:], uint32(len(dst)-start))
		return dst, nil
	}
	ptbs := a.algo.PlaintextBlockSize()
	sigLen := a.algo.SignatureLength()
	extra := extraPadding(a.algo.BlockSize())
	padBytes := 1
	if extra {
		padBytes = 2
	}
	n := len(dst) - hdrEnd
	pad := (ptbs - (n+sigLen+padBytes)%ptbs) % ptbs
	for i := 0; i <= pad; i++ {
		dst = append(dst, byte(pad))
	}
	if extra {
		dst = append(dst, byte(pad>>8))
	}
	plainLen := len(dst) - hdrEnd + sigLen
	encLen := plainLen / ptbs * a.algo.BlockSize()
	binary.LittleEndian.PutUint32(dst[start+4:], uint32(hdrEnd-start+encLen))
	sig, err := a.algo.Signature(dst[start:])
	if err != nil {
		return nil, fmt.Errorf("seal OPN: sign: %w", err)
	}
	dst = append(dst, sig...)
	enc, err := a.algo.Encrypt(dst[hdrEnd:])
	if err != nil {
		return nil, fmt.Errorf("seal OPN: encrypt: %w", err)
	}
	return append(dst[:hdrEnd], enc...), nil
}

// OpenOPN verifies and decrypts one complete OPN chunk and returns its
// header, sequence number, request id and body. It checks that the policy
// URI is this Asymmetric's, that the receiver thumbprint is the local
// certificate's and that the sender certificate is the expected remote
// one. body is a fresh slice; chunk is not modified.
//
// Every block is decrypted before the signature is checked: an OPN chunk
// is signed, then encrypted (Part 6, 6.7.2.3), so its signature is the
// end of the encrypted plaintext and cannot be verified before all of it
// was decrypted, one RSA private-key operation a block. A peer that sends
// a chunk of many blocks (a 65 KB chunk is 256 blocks of RSA-2048) makes
// the receiver work that much for nothing; a server bounds the blocks
// first (OpenOPNBounded).
func (a *Asymmetric) OpenOPN(chunk []byte) (h OPNHeader, seq, reqID uint32, body []byte, err error) {
	return a.OpenOPNBounded(chunk, 0)
}

// EncryptedBlocks returns the number of RSA blocks of the encrypted part of
// an OPN chunk whose asymmetric header is h, with this Asymmetric's local
// key (0 for policy None): what decrypting it costs, in private-key
// operations.
func (a *Asymmetric) EncryptedBlocks(chunk []byte, h OPNHeader) int {
	if a.policy == ua.SecurityPolicyURINone || a.localKeyLen == 0 || len(chunk) < h.Len {
		return 0
	}
	return (len(chunk) - h.Len + a.localKeyLen - 1) / a.localKeyLen
}

// OpenOPNBounded is OpenOPN refusing, before it decrypts anything, a
// chunk of more than maxBlocks encrypted blocks (0: no bound) with an
// error wrapping ErrTooManyBlocks (Status: Bad_SecurityChecksFailed). A
// real OpenSecureChannel request fits in a few blocks: its sequence
// header, a short request with the client nonce, padding and a signature
// of at most 512 bytes.
func (a *Asymmetric) OpenOPNBounded(chunk []byte, maxBlocks int) (h OPNHeader, seq, reqID uint32, body []byte, err error) {
	h, err = ParseOPNHeader(chunk)
	if err != nil {
		return h, 0, 0, nil, err
	}
	if h.PolicyURI != a.policy {
		return h, 0, 0, nil, fmt.Errorf("open OPN: policy %s, want %s: %w", h.PolicyURI, a.policy, ErrPolicy)
	}
	if a.policy == ua.SecurityPolicyURINone {
		if len(chunk) < h.Len+SequenceHeaderLen {
			return h, 0, 0, nil, fmt.Errorf("open OPN: %w", ErrShortChunk)
		}
		p := chunk[h.Len:]
		return h, binary.LittleEndian.Uint32(p), binary.LittleEndian.Uint32(p[4:]), p[SequenceHeaderLen:], nil
	}
	if !bytes.Equal(h.ReceiverThumbprint, a.localThumb) {
		return h, 0, 0, nil, fmt.Errorf("open OPN: receiver thumbprint %x is not the local certificate's %x: %w",
			h.ReceiverThumbprint, a.localThumb, ErrCertificate)
	}
	if !bytes.Equal(h.SenderCert, a.remoteCert) {
		return h, 0, 0, nil, fmt.Errorf("open OPN: sender certificate (thumbprint %x) is not the expected %x: %w",
			uapolicy.Thumbprint(h.SenderCert), a.remoteThumb, ErrCertificate)
	}
	enc := chunk[h.Len:]
	if n := a.EncryptedBlocks(chunk, h); maxBlocks > 0 && n > maxBlocks {
		return h, 0, 0, nil, fmt.Errorf("open OPN: %d encrypted blocks, at most %d: %w", n, maxBlocks, ErrTooManyBlocks)
	}
	if len(enc) == 0 || len(enc)%a.localKeyLen != 0 {
		return h, 0, 0, nil, fmt.Errorf("open OPN: %d encrypted bytes, key %d bytes: %w", len(enc), a.localKeyLen, ErrDecrypt)
	}
	plain, err := a.algo.Decrypt(enc)
	if err != nil {
		return h, 0, 0, nil, fmt.Errorf("open OPN: %v: %w", err, ErrDecrypt)
	}
	sigLen := a.algo.RemoteSignatureLength()
	if len(plain) < SequenceHeaderLen+1+sigLen {
		return h, 0, 0, nil, fmt.Errorf("open OPN: %d plaintext bytes: %w", len(plain), ErrShortChunk)
	}
	signed := make([]byte, 0, h.Len+len(plain))
	signed = append(append(signed, chunk[:h.Len]...), plain[:len(plain)-sigLen]...)
	if err := a.algo.VerifySignature(signed, plain[len(plain)-sigLen:]); err != nil {
		return h, 0, 0, nil, fmt.Errorf("open OPN: %v: %w", err, ErrSignature)
	}
	p := plain[:len(plain)-sigLen]
	pad := int(p[len(p)-1])
	padBytes := pad + 1
	if extraPadding(a.localKeyLen) {
		pad = pad<<8 | int(p[len(p)-2])
		padBytes = pad + 2
	}
	if len(p)-padBytes < SequenceHeaderLen {
		return h, 0, 0, nil, fmt.Errorf("open OPN: padding %d: %w", pad, ErrPadding)
	}
	for _, b := range p[len(p)-padBytes : len(p)-padBytes+pad+1] {
		if b != byte(pad) {
			return h, 0, 0, nil, fmt.Errorf("open OPN: padding %d: %w", pad, ErrPadding)
		}
	}
	p = p[:len(p)-padBytes]
	return h, binary.LittleEndian.Uint32(p), binary.LittleEndian.Uint32(p[4:]), p[SequenceHeaderLen:], nil
}
