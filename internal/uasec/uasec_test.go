package uasec

import (
	"bytes"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/big"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gopcua/opcua/ua"
	"github.com/gopcua/opcua/uapolicy"
)

var policies = []string{
	ua.SecurityPolicyURIBasic256Sha256,
	ua.SecurityPolicyURIAes128Sha256RsaOaep,
	ua.SecurityPolicyURIAes256Sha256RsaPss,
}

var modes = []ua.MessageSecurityMode{ua.MessageSecurityModeSign, ua.MessageSecurityModeSignAndEncrypt}

type keyPair struct {
	cert []byte
	key  *rsa.PrivateKey
}

var (
	keysMu sync.Mutex
	keys   = map[string]keyPair{}
)

// testKey returns a self-signed certificate and key of the given size,
// cached per name so the suite generates each once.
func testKey(t testing.TB, name string, bits int) keyPair {
	t.Helper()
	keysMu.Lock()
	defer keysMu.Unlock()
	if kp, ok := keys[name]; ok {
		return kp
	}
	key, err := rsa.GenerateKey(rand.Reader, bits)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keys[name] = keyPair{der, key}
	return keys[name]
}

func nonce(t testing.TB) []byte {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// pair returns the client's and the server's Symmetric of one token.
func pair(t testing.TB, policy string, mode ua.MessageSecurityMode) (cli, srv *Symmetric, cn, sn []byte) {
	t.Helper()
	cn, sn = nonce(t), nonce(t)
	cli, err := NewSymmetric(policy, mode, cn, sn)
	if err != nil {
		t.Fatal(err)
	}
	srv, err = NewSymmetric(policy, mode, sn, cn)
	if err != nil {
		t.Fatal(err)
	}
	return cli, srv, cn, sn
}

func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + 3)
	}
	return b
}

func TestSymmetricRoundTrip(t *testing.T) {
	for _, policy := range policies {
		for _, mode := range modes {
			t.Run(fmt.Sprintf("%s/%v", uapolicyShort(policy), mode), func(t *testing.T) {
				cli, srv, _, _ := pair(t, policy, mode)
				for _, chunkSize := range []int{8192, 65535} {
					for _, dir := range []struct {
						name     string
						from, to *Symmetric
					}{{"client-to-server", cli, srv}, {"server-to-client", srv, cli}} {
						for n := 0; n <= 3000; n += 1 + n/7 {
							if n > dir.from.MaxBody(chunkSize) {
								t.Fatalf("body %d > MaxBody(%d)", n, chunkSize)
							}
							body := pattern(n)
							pre := []byte("previous chunk")
							chunk := dir.from.Seal(append([]byte(nil), pre...), "MSG", 'F', 7, 9, uint32(n+1), 11, body)
							if !bytes.Equal(chunk[:len(pre)], pre) {
								t.Fatal("Seal changed what dst held")
							}
							chunk = chunk[len(pre):]
							if got, want := len(chunk), n+dir.from.Overhead(n); got != want {
								t.Fatalf("%s: chunk of body %d is %d bytes, Overhead says %d", dir.name, n, got, want)
							}
							if len(chunk) > chunkSize {
								t.Fatalf("chunk %d > %d", len(chunk), chunkSize)
							}
							readable := n >= 16 && bytes.Contains(chunk, body)
							if mode == ua.MessageSecurityModeSign && n > 0 && !readable && n >= 16 {
								t.Fatalf("Sign: body not readable in chunk")
							}
							if mode == ua.MessageSecurityModeSignAndEncrypt && readable {
								t.Fatalf("SignAndEncrypt: body readable in chunk")
							}
							tok, seq, req, got, err := dir.to.Open(chunk)
							if err != nil {
								t.Fatalf("%s: open body %d: %v", dir.name, n, err)
							}
							if tok != 9 || seq != uint32(n+1) || req != 11 || !bytes.Equal(got, body) {
								t.Fatalf("%s: open body %d: token %d seq %d req %d body equal %v", dir.name, n, tok, seq, req, bytes.Equal(got, body))
							}
						}
					}
				}
			})
		}
	}
}

func TestMaxBodyFits(t *testing.T) {
	for _, policy := range policies {
		for _, mode := range modes {
			cli, srv, _, _ := pair(t, policy, mode)
			for _, cs := range []int{8192, 65535, 8193, 8200} {
				m := cli.MaxBody(cs)
				c := cli.Seal(nil, "MSG", 'C', 1, 1, 1, 1, pattern(m))
				if len(c) > cs {
					t.Fatalf("%s %v: MaxBody(%d)=%d gives a chunk of %d", policy, mode, cs, m, len(c))
				}
				if c2 := cli.Seal(nil, "MSG", 'C', 1, 1, 1, 1, pattern(m+1)); len(c2) <= cs {
					t.Fatalf("%s %v: MaxBody(%d)=%d is not the largest (%d fits)", policy, mode, cs, m, m+1)
				}
				if _, _, _, _, err := srv.Open(c); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

func TestSymmetricTamper(t *testing.T) {
	for _, policy := range policies {
		for _, mode := range modes {
			cli, srv, _, _ := pair(t, policy, mode)
			body := pattern(100)
			ref := cli.Seal(nil, "MSG", 'F', 7, 9, 1, 11, body)
			sig := len(ref) - symSigLen
			places := map[string]int{"header": 9, "token": 13, "sequence": 17, "body": 30, "signature": sig + 3}
			if mode == ua.MessageSecurityModeSignAndEncrypt {
				places["padding"] = sig - 1
			}
			for what, at := range places {
				c := append([]byte(nil), ref...)
				c[at] ^= 0x10
				if _, _, _, _, err := srv.Open(c); err == nil {
					t.Errorf("%s %v: flipped bit in %s accepted", policy, mode, what)
				} else if Status(err) != ua.StatusBadSecurityChecksFailed {
					t.Errorf("%s %v: flipped bit in %s: %v maps to %v", policy, mode, what, err, Status(err))
				}
			}
			c := append([]byte(nil), ref...)
			if _, _, _, _, err := srv.Open(c[:len(c)-1]); !errors.Is(err, ErrShortChunk) {
				t.Errorf("truncated chunk: %v", err)
			}
			if _, _, _, _, err := srv.Open(c[:20]); !errors.Is(err, ErrShortChunk) {
				t.Errorf("short chunk: %v", err)
			}
			// A chunk from the wrong direction (its own keys) fails.
			c = append([]byte(nil), ref...)
			if _, _, _, _, err := cli.Open(c); err == nil {
				t.Errorf("%s %v: client opened its own chunk", policy, mode)
			}
		}
	}
}

// TestPaddingErrorAfterValidSignature forges a chunk with a valid signature
// but inconsistent padding: Open must say padding, not signature.
func TestPaddingErrorAfterValidSignature(t *testing.T) {
	cli, srv, _, _ := pair(t, ua.SecurityPolicyURIBasic256Sha256, ua.MessageSecurityModeSignAndEncrypt)
	// Body of 10 bytes: 8+10+1+32 = 51 rounds up to 64, so PaddingSize
	// is 13 and 14 bytes of 13 follow the body; spoil one of them.
	c := AppendSymmetricHeader(nil, "MSG", 'F', 1, 1, 1, 1)
	c = append(c, pattern(10)...)
	for range 14 {
		c = append(c, 13)
	}
	c[len(c)-5] = 0
	binary.LittleEndian.PutUint32(c[4:], uint32(len(c)+symSigLen))
	cli.sendMAC.Reset()
	cli.sendMAC.Write(c)
	c = cli.sendMAC.Sum(c)
	resetIV(cli.sendEnc, cli.sendIV)
	cli.sendEnc.CryptBlocks(c[SymmetricHeaderLen:], c[SymmetricHeaderLen:])
	_, _, _, _, err := srv.Open(c)
	if !errors.Is(err, ErrPadding) {
		t.Fatalf("got %v, want ErrPadding", err)
	}
	if Status(err) != ua.StatusBadSecurityChecksFailed {
		t.Fatalf("status %v", Status(err))
	}
}

// TestSymmetricInteropUapolicy checks the key derivation and chunk layout
// against gopcua's own algorithms, as its uasc package applies them: a
// chunk sealed here is verified and decrypted with uapolicy.Symmetric, and
// a chunk sealed with uapolicy.Symmetric is opened here.
func TestSymmetricInteropUapolicy(t *testing.T) {
	for _, policy := range policies {
		for _, mode := range modes {
			cli, _, cn, sn := pair(t, policy, mode)
			gsrv, err := uapolicy.Symmetric(policy, sn, cn)
			if err != nil {
				t.Fatal(err)
			}
			body := pattern(333)
			c := cli.Seal(nil, "MSG", 'F', 5, 6, 7, 8, body)
			b := append([]byte(nil), c...)
			if mode == ua.MessageSecurityModeSignAndEncrypt {
				p, err := gsrv.Decrypt(b[SymmetricHeaderLen:])
				if err != nil {
					t.Fatal(err)
				}
				b = append(b[:SymmetricHeaderLen], p...)
			}
			if err := gsrv.VerifySignature(b[:len(b)-symSigLen], b[len(b)-symSigLen:]); err != nil {
				t.Fatalf("%s %v: gopcua rejects our signature: %v", policy, mode, err)
			}
			if !bytes.Equal(b[SymmetricPrefixLen:SymmetricPrefixLen+len(body)], body) {
				t.Fatalf("%s %v: gopcua decrypts another body", policy, mode)
			}

			// The other way: gopcua seals as the server (uasc's signAndEncrypt).
			g := AppendSymmetricHeader(nil, "MSG", 'F', 5, 6, 7, 8)
			g = append(g, body...)
			if mode == ua.MessageSecurityModeSignAndEncrypt {
				ptbs := gsrv.PlaintextBlockSize()
				pad := ptbs - ((len(g[SymmetricHeaderLen:]) + gsrv.SignatureLength() + 1) % ptbs)
				for i := 0; i <= pad; i++ {
					g = append(g, byte(pad))
				}
			}
			binary.LittleEndian.PutUint32(g[4:], uint32(len(g)+gsrv.SignatureLength()))
			sig, err := gsrv.Signature(g)
			if err != nil {
				t.Fatal(err)
			}
			g = append(g, sig...)
			if mode == ua.MessageSecurityModeSignAndEncrypt {
				p, err := gsrv.Encrypt(g[SymmetricHeaderLen:])
				if err != nil {
					t.Fatal(err)
				}
				g = append(g[:SymmetricHeaderLen], p...)
			}
			_, _, _, got, err := cli.Open(g)
			if err != nil || !bytes.Equal(got, body) {
				t.Fatalf("%s %v: open gopcua's chunk: %v", policy, mode, err)
			}
		}
	}
}

func TestNone(t *testing.T) {
	s, err := NewSymmetric(ua.SecurityPolicyURINone, ua.MessageSecurityModeNone, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	body := pattern(50)
	c := s.Seal(nil, "MSG", 'F', 1, 2, 3, 4, body)
	if len(c) != SymmetricPrefixLen+50 || s.Overhead(50) != SymmetricPrefixLen || s.MaxBody(8192) != 8192-SymmetricPrefixLen {
		t.Fatalf("None adds bytes: %d", len(c))
	}
	if _, _, _, got, err := s.Open(c); err != nil || !bytes.Equal(got, body) {
		t.Fatal(err)
	}
	a, err := NewAsymmetric(ua.SecurityPolicyURINone, ua.MessageSecurityModeNone, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	o, err := a.SealOPN(nil, 0, 1, 2, body)
	if err != nil {
		t.Fatal(err)
	}
	h, seq, req, got, err := a.OpenOPN(o)
	if err != nil || seq != 1 || req != 2 || !bytes.Equal(got, body) || h.PolicyURI != ua.SecurityPolicyURINone {
		t.Fatalf("None OPN: %v %d %d", err, seq, req)
	}
	if _, err := NewSymmetric(ua.SecurityPolicyURINone, ua.MessageSecurityModeSign, nil, nil); !errors.Is(err, ErrMode) {
		t.Fatalf("None with Sign: %v", err)
	}
	if _, err := NewSymmetric(ua.SecurityPolicyURIBasic256Sha256, ua.MessageSecurityModeSign, nonce(t), nonce(t)[:16]); !errors.Is(err, ErrNonce) {
		t.Fatalf("short nonce: %v", err)
	}
	if _, err := NewSymmetric(ua.SecurityPolicyURIBasic128Rsa15, ua.MessageSecurityModeSign, nonce(t), nonce(t)); !errors.Is(err, ErrPolicy) {
		t.Fatalf("unsupported policy: %v", err)
	}
}

func asymPair(t testing.TB, policy string, mode ua.MessageSecurityMode, cliKey, srvKey keyPair) (cli, srv *Asymmetric) {
	t.Helper()
	cli, err := NewAsymmetric(policy, mode, cliKey.key, cliKey.cert, srvKey.cert)
	if err != nil {
		t.Fatal(err)
	}
	srv, err = NewAsymmetric(policy, mode, srvKey.key, srvKey.cert, cliKey.cert)
	if err != nil {
		t.Fatal(err)
	}
	return cli, srv
}

func TestAsymmetricRoundTrip(t *testing.T) {
	sizes := []struct {
		name      string
		cli, srv  keyPair
		bodyLens  []int
		extraNote string
	}{
		{"2048", testKey(t, "client2048", 2048), testKey(t, "server2048", 2048), []int{0, 1, 100, 189, 190, 191, 500, 3000}, ""},
		{"3072-server", testKey(t, "client2048", 2048), testKey(t, "server3072", 3072), []int{0, 100, 700}, "extra padding"},
		{"3072-client", testKey(t, "client3072", 3072), testKey(t, "server2048", 2048), []int{0, 100, 700}, "extra padding"},
	}
	for _, sz := range sizes {
		for _, policy := range policies {
			for _, mode := range modes {
				cli, srv := asymPair(t, policy, mode, sz.cli, sz.srv)
				for _, n := range sz.bodyLens {
					body := pattern(n)
					for _, dir := range []struct {
						from, to *Asymmetric
					}{{cli, srv}, {srv, cli}} {
						c, err := dir.from.SealOPN(nil, 3, 4, 5, body)
						if err != nil {
							t.Fatal(err)
						}
						if n >= 16 && bytes.Contains(c, body) {
							t.Fatalf("%s %s %v: OPN body readable (OPN is always encrypted)", sz.name, policy, mode)
						}
						h, err := ParseOPNHeader(c)
						if err != nil || h.PolicyURI != policy || !bytes.Equal(h.SenderCert, dir.from.localCert) {
							t.Fatalf("parse header: %v", err)
						}
						h, seq, req, got, err := dir.to.OpenOPN(c)
						if err != nil {
							t.Fatalf("%s %s %v body %d: %v", sz.name, policy, mode, n, err)
						}
						if h.ChannelID != 3 || seq != 4 || req != 5 || !bytes.Equal(got, body) {
							t.Fatalf("%s %s %v body %d: wrong content", sz.name, policy, mode, n)
						}
					}
				}
			}
		}
	}
}

func TestAsymmetricTamper(t *testing.T) {
	ck, sk := testKey(t, "client2048", 2048), testKey(t, "server2048", 2048)
	other := testKey(t, "other2048", 2048)
	for _, policy := range policies {
		cli, srv := asymPair(t, policy, ua.MessageSecurityModeSignAndEncrypt, ck, sk)
		c, err := cli.SealOPN(nil, 0, 1, 1, pattern(80))
		if err != nil {
			t.Fatal(err)
		}
		h, _ := ParseOPNHeader(c)
		for _, at := range []int{9, h.Len - 30, h.Len + 3, len(c) - 2} {
			d := append([]byte(nil), c...)
			d[at] ^= 1
			if _, _, _, _, err := srv.OpenOPN(d); err == nil {
				t.Errorf("%s: flipped bit at %d accepted", policy, at)
			}
		}
		// A server that is not the receiver: thumbprint mismatch.
		_, wrong := asymPair(t, policy, ua.MessageSecurityModeSignAndEncrypt, ck, other)
		if _, _, _, _, err := wrong.OpenOPN(c); !errors.Is(err, ErrCertificate) {
			t.Errorf("%s: wrong receiver: %v", policy, err)
		}
		// A client that expects another server certificate.
		cli2, _ := asymPair(t, policy, ua.MessageSecurityModeSignAndEncrypt, ck, other)
		r, err := srv.SealOPN(nil, 0, 1, 1, pattern(80))
		if err != nil {
			t.Fatal(err)
		}
		if _, _, _, _, err := cli2.OpenOPN(r); !errors.Is(err, ErrCertificate) {
			t.Errorf("%s: unexpected server certificate: %v", policy, err)
		}
		// Policy mismatch.
		for _, p2 := range policies {
			if p2 == policy {
				continue
			}
			_, s2 := asymPair(t, p2, ua.MessageSecurityModeSignAndEncrypt, ck, sk)
			if _, _, _, _, err := s2.OpenOPN(c); !errors.Is(err, ErrPolicy) || Status(err) != ua.StatusBadSecurityPolicyRejected {
				t.Errorf("%s read as %s: %v", policy, p2, err)
			}
			break
		}
	}
}

func TestSessionSignature(t *testing.T) {
	ck, sk := testKey(t, "client2048", 2048), testKey(t, "server2048", 2048)
	for _, policy := range policies {
		cli, srv := asymPair(t, policy, ua.MessageSecurityModeSign, ck, sk)
		cn, sn := nonce(t), nonce(t)
		// CreateSession: the server signs client cert ‖ client nonce.
		sd, err := srv.SessionSignature(cn)
		if err != nil {
			t.Fatal(err)
		}
		if err := cli.VerifySessionSignature(cn, sd); err != nil {
			t.Fatalf("%s: %v", policy, err)
		}
		if err := cli.VerifySessionSignature(sn, sd); !errors.Is(err, ErrSignature) {
			t.Fatalf("%s: wrong nonce accepted: %v", policy, err)
		}
		// The same signature through gopcua's algorithm.
		g, _ := uapolicy.Asymmetric(policy, ck.key, &sk.key.PublicKey)
		if err := g.VerifySignature(append(append([]byte(nil), ck.cert...), cn...), sd.Signature); err != nil {
			t.Fatalf("%s: gopcua rejects the session signature: %v", policy, err)
		}
		if sd.Algorithm != g.SignatureURI() {
			t.Fatalf("algorithm %q", sd.Algorithm)
		}
	}
}

func TestSeq(t *testing.T) {
	if NextSeq(1) != 2 || NextSeq(math.MaxUint32-1024) != math.MaxUint32-1023 || NextSeq(math.MaxUint32-1023) != 1 {
		t.Fatal("NextSeq")
	}
	for _, c := range []struct {
		prev, got uint32
		ok        bool
	}{{1, 2, true}, {1, 1, false}, {1, 3, false}, {5, 4, false}, {math.MaxUint32 - 1000, 0, true},
		{math.MaxUint32 - 1000, 1023, true}, {math.MaxUint32 - 1000, 1024, false}, {math.MaxUint32 - 2000, 1, false},
		{math.MaxUint32, 0, true}, {math.MaxUint32 - 1, math.MaxUint32, true}} {
		if SeqFollows(c.prev, c.got) != c.ok {
			t.Errorf("SeqFollows(%d, %d) != %v", c.prev, c.got, c.ok)
		}
	}
	for p := uint32(math.MaxUint32 - 1100); p != 5; p = NextSeq(p) {
		if !SeqFollows(p, NextSeq(p)) {
			t.Fatalf("NextSeq(%d) does not follow", p)
		}
	}
}

func TestSealOpenNoAllocs(t *testing.T) {
	cli, srv, _, _ := pair(t, ua.SecurityPolicyURIAes256Sha256RsaPss, ua.MessageSecurityModeSignAndEncrypt)
	buf := make([]byte, 0, 4096)
	body := pattern(100)
	allocs := testing.AllocsPerRun(100, func() {
		c := cli.Seal(buf[:0], "MSG", 'F', 1, 2, 3, 4, body)
		if _, _, _, _, err := srv.Open(c); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("Seal+Open allocates %v times per chunk", allocs)
	}
}

func uapolicyShort(uri string) string {
	return uri[len("http://opcfoundation.org/UA/SecurityPolicy#"):]
}

func BenchmarkSealOpen(b *testing.B) {
	for _, policy := range append([]string{ua.SecurityPolicyURINone}, policies...) {
		for _, mode := range modes {
			if policy == ua.SecurityPolicyURINone {
				if mode == ua.MessageSecurityModeSignAndEncrypt {
					continue
				}
				mode = ua.MessageSecurityModeNone
			}
			b.Run(fmt.Sprintf("%s/%v", uapolicyShort(policy), mode), func(b *testing.B) {
				var cli, srv *Symmetric
				if policy == ua.SecurityPolicyURINone {
					cli, _ = NewSymmetric(policy, mode, nil, nil)
					srv = cli
				} else {
					cli, srv, _, _ = pair(b, policy, mode)
				}
				buf := make([]byte, 0, 4096)
				body := pattern(100)
				b.ReportAllocs()
				for b.Loop() {
					c := cli.Seal(buf[:0], "MSG", 'F', 1, 2, 3, 4, body)
					if _, _, _, _, err := srv.Open(c); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

func TestCertificateKey(t *testing.T) {
	kp := testKey(t, "client", 2048)
	pub, err := CertificateKey(kp.cert, "client certificate")
	if err != nil || !pub.Equal(&kp.key.PublicKey) {
		t.Fatalf("CertificateKey = %v, %v; want the certificate's key", pub, err)
	}
	if _, err := CertificateKey([]byte("not DER"), "client certificate"); err == nil || !strings.HasPrefix(err.Error(), "client certificate: ") {
		t.Errorf("CertificateKey of no certificate: %v, want an error naming the client certificate", err)
	}
}

// TestOpenOPNBounded: an OPN chunk of more encrypted blocks than the bound
// is refused with ErrTooManyBlocks (Status Bad_SecurityChecksFailed)
// before anything is decrypted; within the bound, and with no bound, it
// opens as OpenOPN does.
func TestOpenOPNBounded(t *testing.T) {
	cli, srv := asymPair(t, ua.SecurityPolicyURIBasic256Sha256, ua.MessageSecurityModeSignAndEncrypt, testKey(t, "client", 2048), testKey(t, "server", 2048))
	body := pattern(4000)
	c, err := cli.SealOPN(nil, 0, 1, 1, body)
	if err != nil {
		t.Fatal(err)
	}
	h, err := ParseOPNHeader(c)
	if err != nil {
		t.Fatal(err)
	}
	n := srv.EncryptedBlocks(c, h)
	if n < 19 || n > 21 {
		t.Fatalf("%d encrypted blocks for a 4000-byte body, want about 20", n)
	}
	if _, _, _, _, err := srv.OpenOPNBounded(c, n-1); !errors.Is(err, ErrTooManyBlocks) || Status(err) != ua.StatusBadSecurityChecksFailed {
		t.Errorf("%d blocks at a bound of %d: %v (%v), want ErrTooManyBlocks, BadSecurityChecksFailed", n, n-1, err, Status(err))
	}
	for _, bound := range []int{n, 0} {
		if _, _, _, got, err := srv.OpenOPNBounded(c, bound); err != nil || !bytes.Equal(got, body) {
			t.Errorf("bound %d: %v", bound, err)
		}
	}
}
