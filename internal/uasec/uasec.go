// Package uasec implements UA Secure Conversation message security
// (OPC UA Part 6, 6.7) for either end of a secure channel: it seals and
// opens OpenSecureChannel chunks under the asymmetric algorithms of a
// security policy and MSG/CLO chunks under the symmetric keys derived from
// the two channel nonces.
//
// The package is side-agnostic: "local" is always the end that holds the
// object (its private key, its nonce) and "remote" the peer. It builds on
// gopcua's uapolicy for the asymmetric algorithms and implements the
// symmetric ones (HMAC-SHA256, AES-CBC) itself so that a chunk is signed,
// encrypted, decrypted and verified in place, without allocations.
//
// Supported policies: None, Basic256Sha256, Aes128_Sha256_RsaOaep and
// Aes256_Sha256_RsaPss.
package uasec

import (
	"errors"
	"math"

	"github.com/gopcua/opcua/ua"
)

// Sizes of the fixed parts of a chunk (Part 6, 6.7.2).
const (
	// MessageHeaderLen is the length of the message header: type, chunk
	// type, message size and secure channel id.
	MessageHeaderLen = 12
	// SymmetricHeaderLen is the length of the message header plus the
	// symmetric security header (the token id).
	SymmetricHeaderLen = MessageHeaderLen + 4
	// SequenceHeaderLen is the length of the sequence header: sequence
	// number and request id.
	SequenceHeaderLen = 8
	// SymmetricPrefixLen is the length of everything before the body of a
	// MSG or CLO chunk.
	SymmetricPrefixLen = SymmetricHeaderLen + SequenceHeaderLen
)

// Errors returned by Open, OpenOPN and the constructors. They are wrapped
// with context; test with errors.Is and map to a status code with Status.
var (
	// ErrShortChunk: the chunk is shorter than its headers, signature and
	// padding, or its size field does not match its length.
	ErrShortChunk = errors.New("chunk too short or size mismatch")
	// ErrMalformed: a header field cannot be decoded or the message type
	// is not the expected one.
	ErrMalformed = errors.New("malformed chunk header")
	// ErrDecrypt: the encrypted part is not a whole number of cipher
	// blocks or cannot be decrypted.
	ErrDecrypt = errors.New("decryption failed")
	// ErrSignature: the signature does not verify.
	ErrSignature = errors.New("signature invalid")
	// ErrPadding: the padding (after a valid signature) is inconsistent.
	ErrPadding = errors.New("padding invalid")
	// ErrPolicy: the security policy is unsupported or not the expected one.
	ErrPolicy = errors.New("security policy rejected")
	// ErrMode: the message security mode is invalid for the policy.
	ErrMode = errors.New("security mode rejected")
	// ErrCertificate: a certificate cannot be parsed, has an unusable key,
	// or is not the one expected (sender certificate or receiver
	// thumbprint).
	ErrCertificate = errors.New("certificate invalid")
	// ErrNonce: a nonce has the wrong length for the policy.
	ErrNonce = errors.New("nonce invalid")
	// ErrTooManyBlocks: an OPN chunk has more encrypted blocks than the
	// receiver decrypts (OpenOPNBounded); nothing was decrypted.
	ErrTooManyBlocks = errors.New("too many encrypted blocks")
)

// Status maps an error of this package to the status code a peer should
// answer with (Part 6, 6.7.6 and Part 4, 7.34): signature, padding and
// decryption failures are Bad_SecurityChecksFailed, a rejected policy is
// Bad_SecurityPolicyRejected, and so on. Unknown errors map to
// Bad_SecurityChecksFailed; nil maps to Good.
func Status(err error) ua.StatusCode {
	switch {
	case err == nil:
		return ua.StatusOK
	case errors.Is(err, ErrShortChunk), errors.Is(err, ErrMalformed):
		return ua.StatusBadDecodingError
	case errors.Is(err, ErrPolicy):
		return ua.StatusBadSecurityPolicyRejected
	case errors.Is(err, ErrMode):
		return ua.StatusBadSecurityModeRejected
	case errors.Is(err, ErrCertificate):
		return ua.StatusBadCertificateInvalid
	case errors.Is(err, ErrNonce):
		return ua.StatusBadNonceInvalid
	default:
		return ua.StatusBadSecurityChecksFailed
	}
}

// seqWrapAbove is the value a sequence number must exceed before it may
// wrap around (Part 6, 6.7.2.4: UInt32.MaxValue - 1024).
const seqWrapAbove = math.MaxUint32 - 1024

// NextSeq returns the sequence number to send after prev: prev+1, or 1
// once prev is above UInt32.MaxValue-1024 (Part 6, 6.7.2.4).
func NextSeq(prev uint32) uint32 {
	if prev > seqWrapAbove {
		return 1
	}
	return prev + 1
}

// SeqFollows reports whether got is a valid sequence number after prev:
// prev+1, or, once prev is above UInt32.MaxValue-1024, any value below 1024
// (the wrap around of Part 6, 6.7.2.4).
func SeqFollows(prev, got uint32) bool {
	if prev > seqWrapAbove && got < 1024 {
		return true
	}
	return prev != math.MaxUint32 && got == prev+1
}
