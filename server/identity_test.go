package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha1"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"math/big"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/gopcua/opcua"
	"github.com/gopcua/opcua/ua"
	"github.com/gopcua/opcua/uapolicy"

	"github.com/opcua-chaos/opcua-chaos/server/catalog"
)

const rsaOAEP = "http://www.w3.org/2001/04/xmlenc#rsa-oaep"

// rawSession is a session created over the wire on a bare gopcua secure
// channel, activated with hand-made identity tokens.
type rawSession struct {
	t     testing.TB
	c     *opcua.Client
	cs    *ua.CreateSessionResponse
	nonce []byte // the last server nonce
}

// newRawChannel opens a secure channel (no session) to endpoint.
func newRawChannel(t testing.TB, endpoint string) *opcua.Client {
	t.Helper()
	c, err := opcua.NewClient(endpoint, opcua.SecurityMode(ua.MessageSecurityModeNone),
		opcua.SecurityPolicy(ua.SecurityPolicyURINone), opcua.AutoReconnect(false))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Dial(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// createRaw sends CreateSession on c's channel.
func createRaw(t testing.TB, c *opcua.Client) *rawSession {
	t.Helper()
	resp, err := sendRaw(t, c, &ua.CreateSessionRequest{
		ClientDescription:       &ua.ApplicationDescription{ApplicationName: ua.NewLocalizedText("raw")},
		SessionName:             "raw",
		ClientNonce:             make([]byte, 32),
		RequestedSessionTimeout: 60000,
	}, nil)
	if err != nil {
		t.Fatalf("CreateSession: %v", err)
	}
	cs := resp.(*ua.CreateSessionResponse)
	if len(cs.ServerNonce) < 32 || len(cs.ServerCertificate) == 0 {
		t.Fatalf("CreateSession: nonce of %d bytes, certificate of %d", len(cs.ServerNonce), len(cs.ServerCertificate))
	}
	return &rawSession{t: t, c: c, cs: cs, nonce: cs.ServerNonce}
}

// activate sends ActivateSession with tok (nil for a null token) and keeps
// the new server nonce on success.
func (r *rawSession) activate(tok any) error {
	r.t.Helper()
	eo := ua.NewExtensionObject(nil)
	if tok != nil {
		eo = ua.NewExtensionObject(tok)
	}
	resp, err := sendRaw(r.t, r.c, &ua.ActivateSessionRequest{
		ClientSignature:    &ua.SignatureData{},
		UserIdentityToken:  eo,
		UserTokenSignature: &ua.SignatureData{},
	}, r.cs.AuthenticationToken)
	if err != nil {
		return err
	}
	as := resp.(*ua.ActivateSessionResponse)
	if len(as.ServerNonce) < 32 || bytes.Equal(as.ServerNonce, r.nonce) {
		r.t.Errorf("ActivateSession: server nonce %x after %x, want a new one", as.ServerNonce, r.nonce)
	}
	r.nonce = as.ServerNonce
	return nil
}

// read reads the server state with the session.
func (r *rawSession) read() error {
	r.t.Helper()
	_, err := sendRaw(r.t, r.c, statusReadRequest(), r.cs.AuthenticationToken)
	return err
}

// serverKey returns the RSA public key of the server certificate.
func (r *rawSession) serverKey() *rsa.PublicKey {
	r.t.Helper()
	cert, err := x509.ParseCertificate(r.cs.ServerCertificate)
	if err != nil {
		r.t.Fatal(err)
	}
	return cert.PublicKey.(*rsa.PublicKey)
}

// plainSecret is the legacy token secret before encryption: length,
// password, nonce.
func plainSecret(password string, nonce []byte) []byte {
	b := binary.LittleEndian.AppendUint32(nil, uint32(len(password)+len(nonce)))
	return append(append(b, password...), nonce...)
}

// encrypt encrypts a plain secret with the server key for policy.
func (r *rawSession) encrypt(policy string, plain []byte) []byte {
	r.t.Helper()
	enc, err := uapolicy.Asymmetric(policy, nil, r.serverKey())
	if err != nil {
		r.t.Fatal(err)
	}
	secret, err := enc.Encrypt(plain)
	if err != nil {
		r.t.Fatal(err)
	}
	return secret
}

// user returns a user-name token the way the policy asks for it: the
// advertised PolicyId, the password and nonce encrypted with RSA-OAEP.
func (r *rawSession) user(name, password string, nonce []byte) *ua.UserNameIdentityToken {
	return &ua.UserNameIdentityToken{
		PolicyID:            PolicyUserName,
		UserName:            name,
		Password:            r.encrypt(UserNameSecurityPolicy, plainSecret(password, nonce)),
		EncryptionAlgorithm: rsaOAEP,
	}
}

// TestIdentityTokenRejections: every identity token a real server rejects
// is rejected with the status real servers give, and the session stays
// unactivated; the right token then activates it.
func TestIdentityTokenRejections(t *testing.T) {
	endpoint, srv := startServer(t, Config{Users: map[string]string{"alice": "secret"}})
	c := newRawChannel(t, endpoint)
	other := createRaw(t, c) // a second session, for its nonce

	for _, tc := range []struct {
		name string
		tok  func(r *rawSession) any
		want ua.StatusCode
	}{
		{"anonymous with empty PolicyId", func(*rawSession) any { return &ua.AnonymousIdentityToken{} }, ua.StatusBadIdentityTokenInvalid},
		{"anonymous with gopcua's default PolicyId", func(*rawSession) any { return &ua.AnonymousIdentityToken{PolicyID: "Anonymous"} }, ua.StatusBadIdentityTokenInvalid},
		{"anonymous with the user-name PolicyId", func(*rawSession) any { return &ua.AnonymousIdentityToken{PolicyID: PolicyUserName} }, ua.StatusBadIdentityTokenInvalid},
		{"user name with unknown PolicyId", func(r *rawSession) any {
			tok := r.user("alice", "secret", r.nonce)
			tok.PolicyID = "username"
			return tok
		}, ua.StatusBadIdentityTokenInvalid},
		{"plain password", func(*rawSession) any {
			return &ua.UserNameIdentityToken{PolicyID: PolicyUserName, UserName: "alice", Password: []byte("secret")}
		}, ua.StatusBadIdentityTokenInvalid},
		{"plain password claiming RSA-OAEP", func(*rawSession) any {
			return &ua.UserNameIdentityToken{PolicyID: PolicyUserName, UserName: "alice", Password: []byte("secret"), EncryptionAlgorithm: rsaOAEP}
		}, ua.StatusBadIdentityTokenInvalid},
		{"wrong algorithm URI", func(r *rawSession) any {
			tok := r.user("alice", "secret", r.nonce)
			tok.EncryptionAlgorithm = "http://opcfoundation.org/UA/security/rsa-oaep-sha2-256"
			return tok
		}, ua.StatusBadIdentityTokenInvalid},
		{"encrypted with RSA-OAEP-SHA256 (Aes256Sha256RsaPss)", func(r *rawSession) any {
			tok := r.user("alice", "secret", r.nonce)
			tok.Password = r.encrypt(ua.SecurityPolicyURIAes256Sha256RsaPss, plainSecret("secret", r.nonce))
			return tok
		}, ua.StatusBadIdentityTokenInvalid},
		{"secret that does not decrypt", func(*rawSession) any {
			junk := make([]byte, 256)
			_, _ = rand.Read(junk)
			return &ua.UserNameIdentityToken{PolicyID: PolicyUserName, UserName: "alice", Password: junk, EncryptionAlgorithm: rsaOAEP}
		}, ua.StatusBadIdentityTokenInvalid},
		{"bad length field", func(r *rawSession) any {
			plain := plainSecret("secret", r.nonce)
			plain[0]++
			secret, err := rsa.EncryptOAEP(sha1.New(), rand.Reader, r.serverKey(), plain, nil)
			if err != nil {
				t.Fatal(err)
			}
			return &ua.UserNameIdentityToken{PolicyID: PolicyUserName, UserName: "alice", Password: secret, EncryptionAlgorithm: rsaOAEP}
		}, ua.StatusBadIdentityTokenInvalid},
		{"no nonce", func(r *rawSession) any { return r.user("alice", "secret", nil) }, ua.StatusBadIdentityTokenInvalid},
		{"another session's nonce", func(r *rawSession) any { return r.user("alice", "secret", other.nonce) }, ua.StatusBadIdentityTokenInvalid},
		{"wrong password", func(r *rawSession) any { return r.user("alice", "wrong", r.nonce) }, ua.StatusBadUserAccessDenied},
		{"unknown user", func(r *rawSession) any { return r.user("mallory", "secret", r.nonce) }, ua.StatusBadUserAccessDenied},
		{"X509 token (not offered)", func(*rawSession) any { return &ua.X509IdentityToken{PolicyID: PolicyUserName} }, ua.StatusBadIdentityTokenInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := createRaw(t, c)
			before := srv.stats.securityRejected.Load()
			err := r.activate(tc.tok(r))
			if !errors.Is(err, tc.want) {
				t.Errorf("err = %v, want %v", err, tc.want)
			}
			if got := srv.stats.securityRejected.Load() - before; got != 1 {
				t.Errorf("SecurityRejectedSessionCount +%d, want +1", got)
			}
			if err := r.read(); !errors.Is(err, ua.StatusBadSessionNotActivated) {
				t.Errorf("read after rejection: err = %v, want BadSessionNotActivated", err)
			}
			// The rejection kept the nonce: the right token still works.
			if err := r.activate(r.user("alice", "secret", r.nonce)); err != nil {
				t.Fatalf("right token after the rejection: %v", err)
			}
			if err := r.read(); err != nil {
				t.Errorf("read: %v", err)
			}
		})
	}
}

// TestIdentityTokenNonce: each ActivateSession issues a new server nonce and
// a secret must carry the last one: reusing the CreateSession nonce after
// an activation (a replay) is rejected.
func TestIdentityTokenNonce(t *testing.T) {
	endpoint, _ := startServer(t, Config{Users: map[string]string{"alice": "secret"}})
	r := createRaw(t, newRawChannel(t, endpoint))
	created := r.nonce
	first := r.user("alice", "secret", created)
	if err := r.activate(first); err != nil {
		t.Fatal(err)
	}
	if err := r.activate(first); !errors.Is(err, ua.StatusBadIdentityTokenInvalid) {
		t.Errorf("replayed token: err = %v, want BadIdentityTokenInvalid", err)
	}
	if err := r.activate(r.user("alice", "secret", created)); !errors.Is(err, ua.StatusBadIdentityTokenInvalid) {
		t.Errorf("stale nonce: err = %v, want BadIdentityTokenInvalid", err)
	}
	if err := r.activate(r.user("alice", "secret", r.nonce)); err != nil {
		t.Errorf("last nonce: %v", err)
	}
	// Anonymous activations rotate the nonce too (on a session of their
	// own: an activated session keeps its identity).
	a := createRaw(t, newRawChannel(t, endpoint))
	for i := range 2 {
		before := a.nonce
		if err := a.activate(&ua.AnonymousIdentityToken{PolicyID: PolicyAnonymous}); err != nil {
			t.Fatal(err)
		}
		if bytes.Equal(a.nonce, before) || len(a.nonce) == 0 {
			t.Errorf("anonymous activation %d kept the server nonce", i+1)
		}
	}
}

// TestIdentityTokenAccepted: the tokens the endpoints advertise activate a
// session, and the session belongs to its user.
func TestIdentityTokenAccepted(t *testing.T) {
	long := strings.Repeat("x", 600) // a secret of several RSA blocks
	endpoint, srv := startServer(t, Config{Users: map[string]string{"alice": "secret", "bob": "", "carol": long}})
	c := newRawChannel(t, endpoint)
	for _, tc := range []struct {
		name, user string
		tok        func(r *rawSession) any
	}{
		{"null token counts as anonymous", "", func(*rawSession) any { return nil }},
		{"anonymous", "", func(*rawSession) any { return &ua.AnonymousIdentityToken{PolicyID: PolicyAnonymous} }},
		{"user name", "alice", func(r *rawSession) any { return r.user("alice", "secret", r.nonce) }},
		{"empty password", "bob", func(r *rawSession) any { return r.user("bob", "", r.nonce) }},
		{"long password", "carol", func(r *rawSession) any { return r.user("carol", long, r.nonce) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := createRaw(t, c)
			if err := r.activate(tc.tok(r)); err != nil {
				t.Fatal(err)
			}
			if err := r.read(); err != nil {
				t.Errorf("read: %v", err)
			}
			sess := srv.sessions.Lookup(r.cs.AuthenticationToken)
			if _, user, _ := sess.State(); user != tc.user {
				t.Errorf("session user %q, want %q", user, tc.user)
			}
		})
	}
}

// TestServerCertificate: the generated certificate names the
// ApplicationUri, holds an RSA-2048 key and is the one in the endpoints and
// in CreateSession; a configured key and certificate are used as given.
func TestServerCertificate(t *testing.T) {
	endpoint, _ := startServer(t, Config{})
	ep := noneEndpoint(t, endpoint)
	cert, err := x509.ParseCertificate(ep.ServerCertificate)
	if err != nil {
		t.Fatal(err)
	}
	if len(cert.URIs) != 1 || cert.URIs[0].String() != ApplicationURI {
		t.Errorf("certificate URIs %v, want %s", cert.URIs, ApplicationURI)
	}
	if pub, ok := cert.PublicKey.(*rsa.PublicKey); !ok || pub.N.BitLen() != 2048 {
		t.Errorf("certificate key %T, want RSA-2048", cert.PublicKey)
	}
	if err := cert.CheckSignature(cert.SignatureAlgorithm, cert.RawTBSCertificate, cert.Signature); err != nil {
		t.Errorf("not self-signed: %v", err)
	}
	r := createRaw(t, newRawChannel(t, endpoint))
	if !bytes.Equal(r.cs.ServerCertificate, ep.ServerCertificate) {
		t.Error("CreateSession's certificate differs from the endpoint's")
	}
	for _, e := range r.cs.ServerEndpoints {
		if !bytes.Equal(e.ServerCertificate, ep.ServerCertificate) {
			t.Error("CreateSession's endpoints carry another certificate")
		}
	}

	key, der, err := selfSigned(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	endpoint, _ = startServer(t, Config{PrivateKey: key, Certificate: der, Users: map[string]string{"alice": "secret"}})
	if got := noneEndpoint(t, endpoint).ServerCertificate; !bytes.Equal(got, der) {
		t.Error("configured certificate not advertised")
	}
	connect(t, endpoint, asUser(t, endpoint, "alice", "secret"))
}

func TestServerCertificateConfigErrors(t *testing.T) {
	key, der, err := selfSigned(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	otherKey, _, err := selfSigned(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	smallKey, err := rsa.GenerateKey(rand.Reader, 1024)
	if err != nil {
		t.Fatal(err)
	}
	small := selfSignedFor(t, smallKey, cert(t, der).URIs)
	noURI := selfSignedFor(t, key, nil)
	for _, tc := range []struct {
		name string
		key  *rsa.PrivateKey
		cert []byte
		want string
	}{
		{"key without certificate", key, nil, "set both or neither"},
		{"certificate without key", nil, der, "set both or neither"},
		{"junk certificate", key, []byte("junk"), "certificate"},
		{"another key's certificate", otherKey, der, "not PrivateKey's"},
		{"1024-bit key", smallKey, small, "1024 bits"},
		{"no ApplicationUri", key, noURI, "no URI " + ApplicationURI},
	} {
		_, err := New(Config{PrivateKey: tc.key, Certificate: tc.cert})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}

// selfSignedFor returns a self-signed DER certificate for key naming uris.
func selfSignedFor(t *testing.T, key *rsa.PrivateKey, uris []*url.URL) []byte {
	t.Helper()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), URIs: uris, NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func cert(tb testing.TB, der []byte) *x509.Certificate {
	tb.Helper()
	c, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// BenchmarkAuthenticate measures the server's identity check of
// ActivateSession: anonymous, and a user name whose password is decrypted
// with the RSA-2048 server key (Basic256Sha256: RSA-OAEP).
func BenchmarkAuthenticate(b *testing.B) {
	srv, err := New(Config{Users: map[string]string{"alice": "secret"}})
	if err != nil {
		b.Fatal(err)
	}
	nonce := make([]byte, 32)
	_, _ = rand.Read(nonce)
	pub := cert(b, srv.creds.cert).PublicKey.(*rsa.PublicKey)
	secret, err := rsa.EncryptOAEP(sha1.New(), rand.Reader, pub, plainSecret("secret", nonce), nil)
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		tok  any
	}{
		{"anonymous", &ua.AnonymousIdentityToken{PolicyID: PolicyAnonymous}},
		{"username-basic256sha256", &ua.UserNameIdentityToken{PolicyID: PolicyUserName, UserName: "alice", Password: secret, EncryptionAlgorithm: rsaOAEP}},
	} {
		eo := ua.NewExtensionObject(bc.tok)
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				if _, code, why := srv.authenticate(eo, nonce, ua.SecurityPolicyURINone); code != ua.StatusOK {
					b.Fatal(code, why)
				}
			}
		})
	}
}

// BenchmarkActivateSession measures one ActivateSession round trip on
// loopback (re-activating one session, each time against the nonce the
// last activation returned): anonymous, and a user name whose password the
// client encrypts and the server decrypts.
func BenchmarkActivateSession(b *testing.B) {
	endpoint, _ := startServer(b, Config{Users: map[string]string{"alice": "secret"}})
	r := createRaw(b, newRawChannel(b, endpoint))
	for _, bc := range []struct {
		name string
		tok  func() any
	}{
		{"anonymous", func() any { return &ua.AnonymousIdentityToken{PolicyID: PolicyAnonymous} }},
		{"username-basic256sha256", func() any { return r.user("alice", "secret", r.nonce) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				if err := r.activate(bc.tok()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestSecretBlockLimit: a secret of MaxSecretBlocks RSA blocks is
// decrypted (and checked), one of a block more is refused without
// decrypting, unless the fault rsa-blocks-unbounded is on.
func TestSecretBlockLimit(t *testing.T) {
	for _, fault := range []bool{false, true} {
		cfg := Config{Users: map[string]string{"alice": "secret"}, MaxSecretBlocks: 2}
		if fault {
			cfg.Faults = Faults{catalog.FaultRSABlocksUnbounded: true}
		}
		srv, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		nonce := make([]byte, 32)
		_, _ = rand.Read(nonce)
		enc, err := uapolicy.Asymmetric(UserNameSecurityPolicy, nil, &srv.creds.key.PublicKey)
		if err != nil {
			t.Fatal(err)
		}
		k := srv.creds.key.Size()
		for _, blocks := range []int{2, 3} {
			// The right password, padded to fill the blocks.
			password := "secret"
			plain := plainSecret(password, nonce)
			pad := blocks*(k-42) - len(plain)
			plain = plainSecret(password+strings.Repeat("x", pad), nonce)
			secret, err := enc.Encrypt(plain)
			if err != nil {
				t.Fatal(err)
			}
			if n := srv.secretBlocks(secret); n != blocks {
				t.Fatalf("secret of %d blocks, want %d", n, blocks)
			}
			tok := ua.NewExtensionObject(&ua.UserNameIdentityToken{PolicyID: PolicyUserName, UserName: "alice", Password: secret, EncryptionAlgorithm: rsaOAEP})
			_, code, why := srv.authenticate(tok, nonce, ua.SecurityPolicyURINone)
			// Decrypted, the padded password is wrong: BadUserAccessDenied.
			want := ua.StatusBadUserAccessDenied
			if blocks > cfg.MaxSecretBlocks && !fault {
				want = ua.StatusBadIdentityTokenInvalid
			}
			if code != want {
				t.Errorf("fault=%v, secret of %d blocks (MaxSecretBlocks %d): %v (%s), want %v", fault, blocks, cfg.MaxSecretBlocks, code, why, want)
			}
		}
	}
}
