package channel

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"errors"
	"fmt"
	"math/big"
	"testing"
	"time"

	"github.com/gopcua/opcua/ua"
	"github.com/gopcua/opcua/uacp"
	"github.com/gopcua/opcua/uapolicy"

	"github.com/opcua-chaos/opcua-chaos/internal/uawire"
)

// credentials returns an RSA-2048 key and a self-signed certificate.
func credentials(t *testing.T) (*rsa.PrivateKey, []byte) {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "channel test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return key, der
}

// rawSecure is a byte-level client of a secured channel.
type rawSecure struct {
	c                *uawire.Conn
	policy           string
	mode             ua.MessageSecurityMode
	key              *rsa.PrivateKey
	cert, serverCert []byte
	chID, token      uint32
	seq, reqID       uint32
	sym              *uapolicy.EncryptionAlgorithm
}

// securedPair accepts a channel offering policy with Sign and
// SignAndEncrypt and returns its transport and a raw client for mode.
func securedPair(t *testing.T, policy string, mode ua.MessageSecurityMode) (*SecureTransport, *rawSecure) {
	t.Helper()
	skey, scert := credentials(t)
	ckey, ccert := credentials(t)
	sec := &Security{Certificate: scert, PrivateKey: skey, Offers: func(p string, m ua.MessageSecurityMode) bool {
		return p == policy && m != ua.MessageSecurityModeNone
	}}
	st, c := pair(t, Config{IDs: IDs{SecureChannelID: 5, SequenceNumber: 1, TokenID: 3}, Security: sec}, uacp.Hello{ReceiveBufSize: 8192, SendBufSize: 8192})
	return st, &rawSecure{c: c, policy: policy, mode: mode, key: ckey, cert: ccert, serverCert: scert, seq: 100}
}

func (r *rawSecure) asym(t *testing.T) *uapolicy.EncryptionAlgorithm {
	t.Helper()
	pub, err := uapolicy.PublicKey(r.serverCert)
	if err != nil {
		t.Fatal(err)
	}
	a, err := uapolicy.Asymmetric(r.policy, r.key, pub)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func appendBytes(b, v []byte) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(len(v)))
	return append(b, v...)
}

// sendOpen writes an OPN chunk with thumbprint (nil: the server
// certificate's) and mode.
func (r *rawSecure) sendOpen(t *testing.T, kind ua.SecurityTokenRequestType, mode ua.MessageSecurityMode, thumbprint []byte) []byte {
	t.Helper()
	if thumbprint == nil {
		thumbprint = uapolicy.Thumbprint(r.serverCert)
	}
	nonce := make([]byte, 32)
	_, _ = rand.Read(nonce)
	payload, err := uawire.EncodeService(&ua.OpenSecureChannelRequest{
		RequestHeader: &ua.RequestHeader{AuthenticationToken: ua.NewTwoByteNodeID(0), Timestamp: time.Now(), AdditionalHeader: ua.NewExtensionObject(nil)},
		RequestType:   kind, SecurityMode: mode, ClientNonce: nonce, RequestedLifetime: 60000,
	})
	if err != nil {
		t.Fatal(err)
	}
	b := append([]byte("OPNF"), 0, 0, 0, 0)
	b = binary.LittleEndian.AppendUint32(b, r.chID)
	b = appendBytes(b, []byte(r.policy))
	b = appendBytes(b, r.cert)
	b = appendBytes(b, thumbprint)
	hdrLen := len(b)
	r.seq++
	r.reqID++
	b = binary.LittleEndian.AppendUint32(b, r.seq)
	b = binary.LittleEndian.AppendUint32(b, r.reqID)
	b = append(b, payload...)
	if b, err = seal(b, hdrLen, r.asym(t), true, false); err != nil {
		t.Fatal(err)
	}
	if _, err := r.c.Write(b); err != nil {
		t.Fatal(err)
	}
	return nonce
}

// readOpen reads the OPN response and derives the token's keys.
func (r *rawSecure) readOpen(t *testing.T, nonce []byte) {
	t.Helper()
	typ, _, body, err := r.c.ReadFrame()
	if err != nil || typ != "OPN" {
		t.Fatalf("OPN response: %s %v", typ, err)
	}
	rd := reader{b: body}
	r.chID = rd.u32()
	_, _, _ = rd.bytes(), rd.bytes(), rd.bytes()
	hdrLen := len(body) - len(rd.b) + frameHeaderLen
	hdr := append([]byte("OPNF"), binary.LittleEndian.AppendUint32(nil, uint32(len(body)+frameHeaderLen))...)
	hdr = append(hdr, body[:hdrLen-frameHeaderLen]...)
	plain, err := unseal(hdr, rd.b, r.asym(t), true, false)
	if err != nil {
		t.Fatal(err)
	}
	_, v, err := ua.DecodeService(plain[seqHeaderLen:])
	if err != nil {
		t.Fatal(err)
	}
	resp := v.(*ua.OpenSecureChannelResponse)
	r.token = resp.SecurityToken.TokenID
	if r.sym, err = uapolicy.Symmetric(r.policy, nonce, resp.ServerNonce); err != nil {
		t.Fatal(err)
	}
}

// sendMsg writes a request in one MSG chunk with sequence number seq (0:
// the next one).
func (r *rawSecure) sendMsg(t *testing.T, req ua.Request, seq uint32) {
	t.Helper()
	payload, err := uawire.EncodeService(req)
	if err != nil {
		t.Fatal(err)
	}
	if seq == 0 {
		r.seq++
		seq = r.seq
	}
	r.reqID++
	b := append([]byte("MSGF"), 0, 0, 0, 0)
	b = binary.LittleEndian.AppendUint32(b, r.chID)
	b = binary.LittleEndian.AppendUint32(b, r.token)
	b = binary.LittleEndian.AppendUint32(b, seq)
	b = binary.LittleEndian.AppendUint32(b, r.reqID)
	b = append(b, payload...)
	if b, err = seal(b, symHeaderLen, r.sym, r.mode == ua.MessageSecurityModeSignAndEncrypt, false); err != nil {
		t.Fatal(err)
	}
	if _, err := r.c.Write(b); err != nil {
		t.Fatal(err)
	}
}

// readMsg reads the chunks of one response and returns its body and the
// token of its chunks.
func (r *rawSecure) readMsg(t *testing.T) (body []byte, token uint32, chunks int) {
	t.Helper()
	for {
		typ, kind, b, err := r.c.ReadFrame()
		if err != nil || typ != "MSG" {
			t.Fatalf("response: %s %v", typ, err)
		}
		if len(b)+frameHeaderLen > int(r.c.Ack.ReceiveBufSize) {
			t.Errorf("chunk of %d bytes above the buffer %d", len(b)+frameHeaderLen, r.c.Ack.ReceiveBufSize)
		}
		hdr := append([]byte("MSG"), kind)
		hdr = binary.LittleEndian.AppendUint32(hdr, uint32(len(b)+frameHeaderLen))
		hdr = append(hdr, b[:8]...)
		token = binary.LittleEndian.Uint32(b[4:])
		plain, err := unseal(hdr, b[8:], r.sym, r.mode == ua.MessageSecurityModeSignAndEncrypt, false)
		if err != nil {
			t.Fatal(err)
		}
		body = append(body, plain[seqHeaderLen:]...)
		chunks++
		if kind == 'F' {
			return body, token, chunks
		}
	}
}

func getEndpoints() *ua.GetEndpointsRequest {
	return &ua.GetEndpointsRequest{RequestHeader: &ua.RequestHeader{AuthenticationToken: ua.NewTwoByteNodeID(0), Timestamp: time.Now(), AdditionalHeader: ua.NewExtensionObject(nil)}}
}

// receive runs st.Receive once in the background.
func receive(st *SecureTransport) <-chan error {
	errc := make(chan error, 1)
	go func() {
		m, err := st.Receive(context.Background())
		if err == nil && m.Request == nil {
			err = errors.New("no request")
		}
		errc <- err
	}()
	return errc
}

// TestSecuredRoundTrip: for each policy and mode, a raw client opens a
// channel, its request is verified (and decrypted), a response of several
// chunks comes back in chunks that fit the client's buffer, signed (and
// encrypted); after a Renew the server accepts the old token and answers
// with it until the client uses the new one.
func TestSecuredRoundTrip(t *testing.T) {
	for _, policy := range []string{ua.SecurityPolicyURIBasic256Sha256, ua.SecurityPolicyURIAes128Sha256RsaOaep, ua.SecurityPolicyURIAes256Sha256RsaPss} {
		for _, mode := range []ua.MessageSecurityMode{ua.MessageSecurityModeSign, ua.MessageSecurityModeSignAndEncrypt} {
			t.Run(policy[len("http://opcfoundation.org/UA/SecurityPolicy#"):]+"/"+mode.String(), func(t *testing.T) {
				st, c := securedPair(t, policy, mode)
				errc := receive(st)
				c.readOpen(t, c.sendOpen(t, ua.SecurityTokenRequestTypeIssue, mode, nil))
				c.sendMsg(t, getEndpoints(), 0)
				if err := <-errc; err != nil {
					t.Fatal(err)
				}
				if sec := st.Security(); sec.PolicyURI != policy || sec.Mode != mode {
					t.Errorf("Security() = %s %v", sec.PolicyURI, sec.Mode)
				}
				go func() { _ = st.Send(context.Background(), c.reqID, bigResponse(200)) }()
				body, token, chunks := c.readMsg(t)
				if _, v, err := ua.DecodeService(body); err != nil || len(v.(*ua.ReadResponse).Results) != 200 {
					t.Fatalf("response: %v", err)
				}
				if chunks < 3 || token != 3 {
					t.Errorf("%d chunks with token %d", chunks, token)
				}

				// Renew: the old token still works, and answers use it.
				errc = receive(st)
				oldToken, oldKeys := c.token, c.sym
				c.readOpen(t, c.sendOpen(t, ua.SecurityTokenRequestTypeRenew, mode, nil))
				newToken, newKeys := c.token, c.sym
				c.token, c.sym = oldToken, oldKeys
				c.sendMsg(t, getEndpoints(), 0)
				if err := <-errc; err != nil {
					t.Fatalf("request with the old token after Renew: %v", err)
				}
				go func() { _ = st.Send(context.Background(), c.reqID, bigResponse(1)) }()
				if _, token, _ := c.readMsg(t); token != oldToken {
					t.Errorf("answer with token %d before the client used the new one, want %d", token, oldToken)
				}
				c.token, c.sym = newToken, newKeys
				errc = receive(st)
				c.sendMsg(t, getEndpoints(), 0)
				if err := <-errc; err != nil {
					t.Fatalf("request with the new token: %v", err)
				}
				go func() { _ = st.Send(context.Background(), c.reqID, bigResponse(1)) }()
				if _, token, _ := c.readMsg(t); token != newToken {
					t.Errorf("answer with token %d, want the new %d", token, newToken)
				}
			})
		}
	}
}

// TestSecuredProtocolErrors: a skipped sequence number, an OPN for another
// certificate's key, a mode not offered and a tampered chunk close the
// channel with their status codes.
func TestSecuredProtocolErrors(t *testing.T) {
	policy := ua.SecurityPolicyURIBasic256Sha256
	enc := ua.MessageSecurityModeSignAndEncrypt
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, c *rawSecure)
		want ua.StatusCode
	}{
		{"sequence gap", func(t *testing.T, c *rawSecure) {
			c.readOpen(t, c.sendOpen(t, ua.SecurityTokenRequestTypeIssue, enc, nil))
			c.sendMsg(t, getEndpoints(), c.seq+2)
		}, ua.StatusBadSequenceNumberInvalid},
		{"thumbprint", func(t *testing.T, c *rawSecure) {
			c.sendOpen(t, ua.SecurityTokenRequestTypeIssue, enc, make([]byte, 20))
		}, ua.StatusBadCertificateInvalid},
		{"mode None in a secured OPN", func(t *testing.T, c *rawSecure) {
			c.sendOpen(t, ua.SecurityTokenRequestTypeIssue, ua.MessageSecurityModeNone, nil)
		}, ua.StatusBadSecurityModeRejected},
		{"tampered signature", func(t *testing.T, c *rawSecure) {
			c.readOpen(t, c.sendOpen(t, ua.SecurityTokenRequestTypeIssue, enc, nil))
			c.sym = mustSymmetric(t, policy)
			c.sendMsg(t, getEndpoints(), 0)
		}, ua.StatusBadSecurityChecksFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, c := securedPair(t, policy, enc)
			errc := receive(st)
			tc.run(t, c)
			var pe *ProtocolError
			if err := <-errc; !errors.As(err, &pe) || pe.Code != tc.want {
				t.Fatalf("Receive: %v, want %v", err, tc.want)
			}
			var em *uawire.ErrorMessage
			if _, _, _, err := c.c.ReadFrame(); !errors.As(err, &em) || em.Code != tc.want {
				t.Errorf("got %v, want ERR %v", err, tc.want)
			}
		})
	}
}

// mustSymmetric returns keys from random nonces: not the channel's.
func mustSymmetric(t *testing.T, policy string) *uapolicy.EncryptionAlgorithm {
	t.Helper()
	a, b := make([]byte, 32), make([]byte, 32)
	_, _ = rand.Read(a)
	_, _ = rand.Read(b)
	sym, err := uapolicy.Symmetric(policy, a, b)
	if err != nil {
		t.Fatal(err)
	}
	return sym
}

// seal (the raw client's) signs, pads and encrypts one chunk in place. b holds the chunk from
// its message header to the end of its body, message size not yet set;
// the first hdrLen bytes (message and security headers) stay plain. With
// encrypt, the padding makes the encrypted part whole plaintext blocks;
// extraPad adds the ExtraPaddingSize byte (an asymmetric key above 2048
// bits). It returns the chunk to write.
func seal(b []byte, hdrLen int, algo *uapolicy.EncryptionAlgorithm, encrypt, extraPad bool) ([]byte, error) {
	sigLen := algo.SignatureLength()
	if encrypt {
		pb := algo.PlaintextBlockSize()
		padBytes := 1
		if extraPad {
			padBytes = 2
		}
		n := len(b) - hdrLen + sigLen + padBytes
		pad := (pb - n%pb) % pb
		for range pad + 1 {
			b = append(b, byte(pad))
		}
		if extraPad {
			b = append(b, byte(pad>>8))
		}
		encLen := (len(b) - hdrLen + sigLen) / pb * algo.BlockSize()
		binary.LittleEndian.PutUint32(b[4:], uint32(hdrLen+encLen))
	} else {
		binary.LittleEndian.PutUint32(b[4:], uint32(len(b)+sigLen))
	}
	sig, err := algo.Signature(b)
	if err != nil {
		return nil, fmt.Errorf("sign chunk: %w", err)
	}
	b = append(b, sig...)
	if !encrypt {
		return b, nil
	}
	enc, err := algo.Encrypt(b[hdrLen:])
	if err != nil {
		return nil, fmt.Errorf("encrypt chunk: %w", err)
	}
	return append(b[:hdrLen], enc...), nil
}

// errChecks is why a chunk fails its security checks.
var errChecks = errors.New("security checks failed")

// unseal (the raw client's) decrypts and verifies a chunk: hdr is its plain part (message and
// security headers, as received), rest what follows. It returns the
// plaintext from the sequence header to the end of the body (padding and
// signature removed). extraPad says the sender added an ExtraPaddingSize
// byte (our asymmetric key is above 2048 bits).
func unseal(hdr, rest []byte, algo *uapolicy.EncryptionAlgorithm, encrypt, extraPad bool) ([]byte, error) {
	plain := rest
	if encrypt {
		if len(rest) == 0 || len(rest)%algo.BlockSize() != 0 {
			return nil, fmt.Errorf("%w: %d encrypted bytes, block size %d", errChecks, len(rest), algo.BlockSize())
		}
		var err error
		if plain, err = algo.Decrypt(rest); err != nil {
			return nil, fmt.Errorf("%w: decrypt: %v", errChecks, err)
		}
	}
	sigLen := algo.RemoteSignatureLength()
	if len(plain) < seqHeaderLen+sigLen {
		return nil, fmt.Errorf("%w: chunk too short for its signature", errChecks)
	}
	signed := make([]byte, 0, len(hdr)+len(plain)-sigLen)
	signed = append(append(signed, hdr...), plain[:len(plain)-sigLen]...)
	if err := algo.VerifySignature(signed, plain[len(plain)-sigLen:]); err != nil {
		return nil, fmt.Errorf("%w: signature: %v", errChecks, err)
	}
	plain = plain[:len(plain)-sigLen]
	if !encrypt {
		return plain, nil
	}
	n := len(plain)
	if n < 1 {
		return nil, fmt.Errorf("%w: no padding", errChecks)
	}
	pad := int(plain[n-1])
	strip := pad + 1
	if extraPad {
		if n < 2 {
			return nil, fmt.Errorf("%w: no padding", errChecks)
		}
		pad = pad<<8 | int(plain[n-2])
		strip = pad + 2
	}
	if strip > n-seqHeaderLen {
		return nil, fmt.Errorf("%w: padding of %d bytes in %d", errChecks, pad, n)
	}
	return plain[:n-strip], nil
}

// TestSecuredSequenceWrap: after maxSequence the client's numbers wrap to
// one below 1024, which the server accepts, and go on from there.
func TestSecuredSequenceWrap(t *testing.T) {
	st, c := securedPair(t, ua.SecurityPolicyURIBasic256Sha256, ua.MessageSecurityModeSignAndEncrypt)
	c.seq = maxSequence - 1 // the OPN chunk is maxSequence
	errc := receive(st)
	c.readOpen(t, c.sendOpen(t, ua.SecurityTokenRequestTypeIssue, c.mode, nil))
	c.sendMsg(t, getEndpoints(), 1)
	if err := <-errc; err != nil {
		t.Fatalf("first number after the wrap: %v", err)
	}
	errc = receive(st)
	c.sendMsg(t, getEndpoints(), 2)
	if err := <-errc; err != nil {
		t.Fatalf("second number after the wrap: %v", err)
	}
}
