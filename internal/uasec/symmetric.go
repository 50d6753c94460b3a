package uasec

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"hash"

	"github.com/gopcua/opcua/ua"
)

// symmetricSuite holds the symmetric parameters of a policy (Part 7).
type symmetricSuite struct {
	sigKeyLen int // DerivedSignatureKeyLength in bytes
	encKeyLen int // AES key length in bytes
	nonceLen  int // SecureChannelNonceLength
}

var symmetricSuites = map[string]symmetricSuite{
	ua.SecurityPolicyURIBasic256Sha256:      {sigKeyLen: 32, encKeyLen: 32, nonceLen: 32},
	ua.SecurityPolicyURIAes128Sha256RsaOaep: {sigKeyLen: 32, encKeyLen: 16, nonceLen: 32},
	ua.SecurityPolicyURIAes256Sha256RsaPss:  {sigKeyLen: 32, encKeyLen: 32, nonceLen: 32},
}

// symSigLen is the length of the HMAC-SHA256 signature of every supported
// policy.
const symSigLen = sha256.Size

// ivSetter is implemented by the standard library's CBC modes; it lets a
// chunk reuse one BlockMode instead of allocating one per chunk.
type ivSetter interface{ SetIV([]byte) }

// resetIV restarts the CBC chain of m at iv: every chunk of a token is
// encrypted with the token's initialization vector (Part 6, 6.7.5).
func resetIV(m cipher.BlockMode, iv []byte) {
	m.(ivSetter).SetIV(iv)
}

// Symmetric seals and opens MSG and CLO chunks of one security token under
// the keys derived from the channel nonces (Part 6, 6.7.5).
//
// Seal/SealAt may run concurrently with Open, but neither may run
// concurrently with itself: a channel has one writer and one reader.
type Symmetric struct {
	policy string
	mode   ua.MessageSecurityMode

	sendMAC hash.Hash
	sendEnc cipher.BlockMode
	sendIV  []byte
	recvMAC hash.Hash
	recvDec cipher.BlockMode
	recvIV  []byte
	macBuf  [symSigLen]byte
}

// NewSymmetric returns the symmetric security of a channel token. The
// local nonce is the one this end sent (the client's nonce on the client,
// the server's nonce on the server), the remote nonce the one the peer
// sent. Chunks this end seals use the keys derived with the remote nonce
// as secret and the local nonce as seed, chunks it opens those derived the
// other way round (Part 6, 6.7.5). Policy None (or mode None) needs no
// nonces and passes chunks through unprotected.
func NewSymmetric(policyURI string, mode ua.MessageSecurityMode, localNonce, remoteNonce []byte) (*Symmetric, error) {
	if policyURI == ua.SecurityPolicyURINone || mode == ua.MessageSecurityModeNone {
		if policyURI != ua.SecurityPolicyURINone || (mode != ua.MessageSecurityModeNone && mode != ua.MessageSecurityModeInvalid) {
			return nil, fmt.Errorf("new symmetric security: mode %v with policy %s: %w", mode, policyURI, ErrMode)
		}
		return &Symmetric{policy: policyURI, mode: ua.MessageSecurityModeNone}, nil
	}
	if mode != ua.MessageSecurityModeSign && mode != ua.MessageSecurityModeSignAndEncrypt {
		return nil, fmt.Errorf("new symmetric security: mode %v: %w", mode, ErrMode)
	}
	suite, ok := symmetricSuites[policyURI]
	if !ok {
		return nil, fmt.Errorf("new symmetric security: %s: %w", policyURI, ErrPolicy)
	}
	if len(localNonce) != suite.nonceLen || len(remoteNonce) != suite.nonceLen {
		return nil, fmt.Errorf("new symmetric security: nonce lengths %d and %d, want %d: %w",
			len(localNonce), len(remoteNonce), suite.nonceLen, ErrNonce)
	}
	keyLen := suite.sigKeyLen + suite.encKeyLen + aes.BlockSize
	send := pSHA256(remoteNonce, localNonce, keyLen)
	recv := pSHA256(localNonce, remoteNonce, keyLen)
	s := &Symmetric{
		policy:  policyURI,
		mode:    mode,
		sendMAC: hmac.New(sha256.New, send[:suite.sigKeyLen]),
		recvMAC: hmac.New(sha256.New, recv[:suite.sigKeyLen]),
		sendIV:  send[suite.sigKeyLen+suite.encKeyLen:],
		recvIV:  recv[suite.sigKeyLen+suite.encKeyLen:],
	}
	sendBlock, err := aes.NewCipher(send[suite.sigKeyLen : suite.sigKeyLen+suite.encKeyLen])
	if err != nil {
		return nil, fmt.Errorf("new symmetric security: %w", err)
	}
	recvBlock, err := aes.NewCipher(recv[suite.sigKeyLen : suite.sigKeyLen+suite.encKeyLen])
	if err != nil {
		return nil, fmt.Errorf("new symmetric security: %w", err)
	}
	s.sendEnc = cipher.NewCBCEncrypter(sendBlock, s.sendIV)
	s.recvDec = cipher.NewCBCDecrypter(recvBlock, s.recvIV)
	return s, nil
}

// pSHA256 is the P_SHA256 pseudo-random function of RFC 5246, 5.
func pSHA256(secret, seed []byte, n int) []byte {
	mac := hmac.New(sha256.New, secret)
	mac.Write(seed)
	a := mac.Sum(nil)
	out := make([]byte, 0, n+sha256.Size)
	for len(out) < n {
		mac.Reset()
		mac.Write(a)
		mac.Write(seed)
		out = mac.Sum(out)
		mac.Reset()
		mac.Write(a)
		a = mac.Sum(a[:0])
	}
	return out[:n:n]
}

// PolicyURI returns the security policy.
func (s *Symmetric) PolicyURI() string { return s.policy }

// Mode returns the message security mode (None for policy None).
func (s *Symmetric) Mode() ua.MessageSecurityMode { return s.mode }

func (s *Symmetric) encrypts() bool { return s.mode == ua.MessageSecurityModeSignAndEncrypt }
func (s *Symmetric) signs() bool    { return s.mode != ua.MessageSecurityModeNone }

// Overhead returns how many bytes a chunk carrying bodyLen body bytes
// needs besides the body: headers, padding and signature.
func (s *Symmetric) Overhead(bodyLen int) int {
	switch {
	case s.encrypts():
		n := SequenceHeaderLen + bodyLen + 1 + symSigLen
		return SymmetricHeaderLen + roundUp(n, aes.BlockSize) - bodyLen
	case s.signs():
		return SymmetricPrefixLen + symSigLen
	default:
		return SymmetricPrefixLen
	}
}

// MaxBody returns the largest body that fits one chunk of chunkSize bytes
// after headers, padding and signature.
func (s *Symmetric) MaxBody(chunkSize int) int {
	var n int
	switch {
	case s.encrypts():
		enc := (chunkSize - SymmetricHeaderLen) / aes.BlockSize * aes.BlockSize
		n = enc - SequenceHeaderLen - 1 - symSigLen
	case s.signs():
		n = chunkSize - SymmetricPrefixLen - symSigLen
	default:
		n = chunkSize - SymmetricPrefixLen
	}
	return max(n, 0)
}

func roundUp(n, b int) int { return (n + b - 1) / b * b }

// Seal appends to dst one complete chunk of message type msgType ("MSG"
// or "CLO") and chunk type chunkType ('C', 'F' or 'A') carrying body,
// signed (Sign) or signed and encrypted (SignAndEncrypt). dst may be a
// batch buffer that already holds other chunks.
func (s *Symmetric) Seal(dst []byte, msgType string, chunkType byte, channelID, tokenID, seq, reqID uint32, body []byte) []byte {
	start := len(dst)
	dst = AppendSymmetricHeader(dst, msgType, chunkType, channelID, tokenID, seq, reqID)
	dst = append(dst, body...)
	return s.SealAt(dst, start)
}

// AppendSymmetricHeader appends the message header (size still zero),
// symmetric security header and sequence header of a MSG or CLO chunk to
// dst. Append the body and call SealAt to finish the chunk.
func AppendSymmetricHeader(dst []byte, msgType string, chunkType byte, channelID, tokenID, seq, reqID uint32) []byte {
	dst = append(dst, msgType[0], msgType[1], msgType[2], chunkType)
	dst = binary.LittleEndian.AppendUint32(dst, 0)
	dst = binary.LittleEndian.AppendUint32(dst, channelID)
	dst = binary.LittleEndian.AppendUint32(dst, tokenID)
	dst = binary.LittleEndian.AppendUint32(dst, seq)
	return binary.LittleEndian.AppendUint32(dst, reqID)
}

// SealAt finishes the chunk that starts at buf[start]: buf[start:] holds
// the headers (as AppendSymmetricHeader writes them, any size) and the
// body. SealAt sets the message size, appends padding and signature and
// encrypts in place; it returns the extended buffer, reallocated only when
// cap(buf) is too small for Overhead.
func (s *Symmetric) SealAt(buf []byte, start int) []byte {
	if !s.signs() {
		binary.LittleEndian.PutUint32(buf[start+4:], uint32(len(buf)-start))
		return buf
	}
	if s.encrypts() {
		n := len(buf) - start - SymmetricHeaderLen
		pad := roundUp(n+1+symSigLen, aes.BlockSize) - (n + 1 + symSigLen)
		for i := 0; i <= pad; i++ {
			buf = append(buf, byte(pad))
		}
	}
	binary.LittleEndian.PutUint32(buf[start+4:], uint32(len(buf)-start+symSigLen))
	s.sendMAC.Reset()
	s.sendMAC.Write(buf[start:])
	buf = s.sendMAC.Sum(buf)
	if s.encrypts() {
		p := buf[start+SymmetricHeaderLen:]
		resetIV(s.sendEnc, s.sendIV)
		s.sendEnc.CryptBlocks(p, p)
	}
	return buf
}

// Open verifies and, under SignAndEncrypt, decrypts one complete MSG or
// CLO chunk in place (the chunk's bytes are overwritten with the
// plaintext) and returns its token id, sequence number, request id and
// body; body aliases chunk. The signature is checked in constant time
// before the padding is looked at.
func (s *Symmetric) Open(chunk []byte) (tokenID, seq, reqID uint32, body []byte, err error) {
	least := SymmetricPrefixLen
	if s.signs() {
		least += symSigLen
	}
	if len(chunk) < least || int(binary.LittleEndian.Uint32(chunk[4:])) != len(chunk) {
		return 0, 0, 0, nil, fmt.Errorf("open chunk of %d bytes: %w", len(chunk), ErrShortChunk)
	}
	tokenID = binary.LittleEndian.Uint32(chunk[12:])
	end := len(chunk)
	if s.encrypts() {
		p := chunk[SymmetricHeaderLen:]
		if len(p)%aes.BlockSize != 0 {
			return 0, 0, 0, nil, fmt.Errorf("open chunk: %d encrypted bytes: %w", len(p), ErrDecrypt)
		}
		resetIV(s.recvDec, s.recvIV)
		s.recvDec.CryptBlocks(p, p)
	}
	if s.signs() {
		end -= symSigLen
		s.recvMAC.Reset()
		s.recvMAC.Write(chunk[:end])
		if !hmac.Equal(s.recvMAC.Sum(s.macBuf[:0]), chunk[end:]) {
			return 0, 0, 0, nil, fmt.Errorf("open chunk: %w", ErrSignature)
		}
	}
	if s.encrypts() {
		pad := int(chunk[end-1])
		if end-pad-1 < SymmetricPrefixLen {
			return 0, 0, 0, nil, fmt.Errorf("open chunk: padding %d: %w", pad, ErrPadding)
		}
		for _, b := range chunk[end-pad-1 : end] {
			if int(b) != pad {
				return 0, 0, 0, nil, fmt.Errorf("open chunk: padding %d: %w", pad, ErrPadding)
			}
		}
		end -= pad + 1
	}
	seq = binary.LittleEndian.Uint32(chunk[16:])
	reqID = binary.LittleEndian.Uint32(chunk[20:])
	return tokenID, seq, reqID, chunk[SymmetricPrefixLen:end], nil
}
