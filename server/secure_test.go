package server

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gopcua/opcua"
	"github.com/gopcua/opcua/id"
	"github.com/gopcua/opcua/ua"
	"github.com/gopcua/opcua/uacp"
	"github.com/gopcua/opcua/uapolicy"

	"github.com/opcua-chaos/opcua-chaos/internal/uasec"
	"github.com/opcua-chaos/opcua-chaos/server/catalog"
)

// testClientURI is the ApplicationUri of the test clients' certificates.
const testClientURI = "urn:opcua-chaos:server-test-client"

// clientCredentials returns a new RSA-2048 key and a self-signed client
// application instance certificate for appURI.
func clientCredentials(t testing.TB, appURI string) (*rsa.PrivateKey, []byte) {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(appURI)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(time.Now().UnixNano()),
		Subject:               pkix.Name{CommonName: "server test client"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageContentCommitment | x509.KeyUsageKeyEncipherment | x509.KeyUsageDataEncipherment,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		URIs:                  []*url.URL{u},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return key, der
}

// secureClient holds what a secured test client connects with.
type secureClient struct {
	policy string
	mode   ua.MessageSecurityMode
	key    *rsa.PrivateKey
	cert   []byte
}

// options returns gopcua options for a session over the secured endpoint
// of endpoint, with identity token type tok.
func (sc secureClient) options(t *testing.T, endpoint string, tok ua.UserTokenType) []opcua.Option {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	eps, err := opcua.GetEndpoints(ctx, endpoint, opcua.SecurityMode(ua.MessageSecurityModeNone), opcua.SecurityPolicy(ua.SecurityPolicyURINone))
	if err != nil {
		t.Fatalf("get endpoints: %v", err)
	}
	ep, err := opcua.SelectEndpoint(eps, sc.policy, sc.mode)
	if err != nil {
		t.Fatalf("select endpoint: %v", err)
	}
	ep.EndpointURL = endpoint
	return []opcua.Option{
		opcua.SecurityFromEndpoint(ep, tok),
		opcua.PrivateKey(sc.key),
		opcua.Certificate(sc.cert),
		opcua.ApplicationURI(testClientURI),
	}
}

// clientDescription describes the test client in CreateSession.
func clientDescription() *ua.ApplicationDescription {
	return &ua.ApplicationDescription{ApplicationURI: testClientURI, ApplicationName: &ua.LocalizedText{}, ApplicationType: ua.ApplicationTypeClient}
}

// securedCases are every offered policy with Sign and SignAndEncrypt.
func securedCases() []secureClient {
	var cs []secureClient
	for _, p := range SecurityPolicies {
		for _, m := range []ua.MessageSecurityMode{ua.MessageSecurityModeSign, ua.MessageSecurityModeSignAndEncrypt} {
			cs = append(cs, secureClient{policy: p, mode: m})
		}
	}
	return cs
}

func (sc secureClient) name() string {
	return strings.TrimPrefix(sc.policy, "http://opcfoundation.org/UA/SecurityPolicy#") + "/" + strings.TrimPrefix(sc.mode.String(), "MessageSecurityMode")
}

// TestSecuredChannels: for every policy × {Sign, SignAndEncrypt}, gopcua's
// client reads over an anonymous session, logs in with a user name (the
// password encrypted with the channel's policy), keeps reading across
// security token renewals (2 s lifetime), and a raw CreateSession gets a
// ServerSignature that verifies with the server certificate.
func TestSecuredChannels(t *testing.T) {
	endpoint, _ := startServer(t, Config{MinChannelLifetime: 2 * time.Second})
	key, cert := clientCredentials(t, testClientURI)
	for _, sc := range securedCases() {
		sc.key, sc.cert = key, cert
		t.Run(sc.name(), func(t *testing.T) {
			anon := sc.options(t, endpoint, ua.UserTokenTypeAnonymous)
			if !raceEnabled {
				// gopcua's own renewal races its send path (see
				// race_on_test.go), so under -race the token keeps the
				// server's lifetime and only the reads run; renewal under
				// load is tested with the harness's client in
				// fixtures/load/wire.
				anon = append(anon, opcua.Lifetime(2*time.Second))
			}
			c := connect(t, endpoint, anon...)
			if v := readValues(t, c, counter("FastCounter.1")); v[0].Status != ua.StatusOK {
				t.Fatalf("read: %v", v[0].Status)
			}
			// gopcua renews after 1 s (75 % of 2 s, in whole seconds):
			// reads go on with the new keys.
			deadline := time.Now().Add(3200 * time.Millisecond)
			reads := 0
			for time.Now().Before(deadline) {
				readValues(t, c, counter("FastCounter.1"))
				reads++
				time.Sleep(20 * time.Millisecond)
			}
			t.Logf("%d reads across renewals", reads)

			opts := append(sc.options(t, endpoint, ua.UserTokenTypeUserName), opcua.AuthUsername("user1", "password"))
			u := connect(t, endpoint, opts...)
			if v := readValues(t, u, counter("FastCounter.1")); v[0].Status != ua.StatusOK {
				t.Fatalf("read as user1: %v", v[0].Status)
			}
			bad := append(sc.options(t, endpoint, ua.UserTokenTypeUserName), opcua.AuthUsername("user1", "wrong"))
			if c, err := dial(endpoint, bad...); err == nil {
				_ = c.Close(context.Background())
				t.Errorf("wrong password accepted")
			}

			// The server signs the client certificate and nonce.
			nonce := make([]byte, 32)
			_, _ = rand.Read(nonce)
			resp, err := sendRaw(t, c, &ua.CreateSessionRequest{
				ClientDescription: clientDescription(),
				ClientCertificate: cert, ClientNonce: nonce, RequestedSessionTimeout: 10000,
			}, nil)
			if err != nil {
				t.Fatal(err)
			}
			cs := resp.(*ua.CreateSessionResponse)
			pub, err := uapolicy.PublicKey(cs.ServerCertificate)
			if err != nil {
				t.Fatal(err)
			}
			asym, err := uapolicy.Asymmetric(sc.policy, key, pub)
			if err != nil {
				t.Fatal(err)
			}
			if err := asym.VerifySignature(append(append([]byte{}, cert...), nonce...), cs.ServerSignature.Signature); err != nil {
				t.Errorf("ServerSignature does not verify: %v", err)
			}
			if cs.ServerSignature.Algorithm != asym.SignatureURI() {
				t.Errorf("ServerSignature algorithm %q, want %q", cs.ServerSignature.Algorithm, asym.SignatureURI())
			}
			// ActivateSession without the client's signature is refused.
			_, err = sendRaw(t, c, &ua.ActivateSessionRequest{
				ClientSignature:    &ua.SignatureData{Algorithm: asym.SignatureURI(), Signature: make([]byte, 256)},
				UserIdentityToken:  ua.NewExtensionObject(&ua.AnonymousIdentityToken{PolicyID: PolicyAnonymous}),
				UserTokenSignature: &ua.SignatureData{},
			}, cs.AuthenticationToken)
			if !errors.Is(err, ua.StatusBadApplicationSignatureInvalid) {
				t.Errorf("ActivateSession with a bad client signature: err = %v, want BadApplicationSignatureInvalid", err)
			}
			// A client certificate that is not the channel's is refused.
			_, other := clientCredentials(t, testClientURI)
			_, err = sendRaw(t, c, &ua.CreateSessionRequest{ClientDescription: clientDescription(), ClientCertificate: other, ClientNonce: nonce, RequestedSessionTimeout: 10000}, nil)
			if !errors.Is(err, ua.StatusBadCertificateInvalid) {
				t.Errorf("CreateSession with another certificate: err = %v, want BadCertificateInvalid", err)
			}
		})
	}
}

// TestSecurityModesOffered: OPCUA_SECURITY limits the endpoints, a bad
// value is an error naming it, and a None session is refused when None is
// not offered (the None channel still serves discovery).
func TestSecurityModesOffered(t *testing.T) {
	if _, err := LoadConfig(nil, func(k string) string {
		if k == "OPCUA_SECURITY" {
			return "none,encrypt"
		}
		return ""
	}, io.Discard); err == nil || !strings.Contains(err.Error(), "OPCUA_SECURITY") || !strings.Contains(err.Error(), `"encrypt"`) {
		t.Errorf("bad OPCUA_SECURITY: err = %v", err)
	}
	modes, err := ParseSecurityModes("sign-encrypt")
	if err != nil {
		t.Fatal(err)
	}
	endpoint, _ := startServer(t, Config{Security: modes})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	eps, err := opcua.GetEndpoints(ctx, endpoint)
	if err != nil {
		t.Fatal(err)
	}
	if len(eps) != len(SecurityPolicies) {
		t.Errorf("%d endpoints, want %d", len(eps), len(SecurityPolicies))
	}
	for _, ep := range eps {
		if ep.SecurityMode != ua.MessageSecurityModeSignAndEncrypt {
			t.Errorf("endpoint %s %v offered", ep.SecurityPolicyURI, ep.SecurityMode)
		}
	}
	if c, err := dial(endpoint); err == nil {
		_ = c.Close(ctx)
		t.Errorf("a None session connected with only sign-encrypt offered")
	}
	// Sign is not offered either: the channel is refused.
	key, cert := clientCredentials(t, testClientURI)
	sc := secureClient{policy: ua.SecurityPolicyURIBasic256Sha256, mode: ua.MessageSecurityModeSign, key: key, cert: cert}
	ep := eps[0]
	ep.EndpointURL = endpoint
	ep.SecurityMode = ua.MessageSecurityModeSign
	if c, err := dial(endpoint, opcua.SecurityFromEndpoint(ep, ua.UserTokenTypeAnonymous), opcua.PrivateKey(sc.key), opcua.Certificate(sc.cert)); err == nil {
		_ = c.Close(ctx)
		t.Errorf("a Sign channel opened with only sign-encrypt offered")
	}
}

// tamperProxy forwards one client connection to the server and, once
// armed, flips a byte in the signature of the next MSG chunk the client
// sends. It records the status code of an ERR message from the server.
type tamperProxy struct {
	addr    string
	mu      sync.Mutex
	armed   bool
	errCode ua.StatusCode
	done    chan struct{}
}

func newTamperProxy(t *testing.T, server string) *tamperProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	p := &tamperProxy{addr: l.Addr().String(), done: make(chan struct{})}
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", server)
		if err != nil {
			c.Close()
			return
		}
		go func() {
			defer c.Close()
			defer s.Close()
			p.pipe(c, s, true)
		}()
		go func() {
			defer close(p.done)
			defer c.Close()
			p.pipe(s, c, false)
		}()
	}()
	return p
}

// pipe copies frames from src to dst; toServer frames may be tampered
// with, from-server ERR frames are recorded.
func (p *tamperProxy) pipe(src, dst net.Conn, toServer bool) {
	var hdr [8]byte
	for {
		if _, err := io.ReadFull(src, hdr[:]); err != nil {
			return
		}
		body := make([]byte, binary.LittleEndian.Uint32(hdr[4:])-8)
		if _, err := io.ReadFull(src, body); err != nil {
			return
		}
		typ := string(hdr[:3])
		p.mu.Lock()
		if toServer && typ == "MSG" && p.armed {
			body[len(body)-1] ^= 0xff
			p.armed = false
		}
		if !toServer && typ == "ERR" && len(body) >= 4 {
			p.errCode = ua.StatusCode(binary.LittleEndian.Uint32(body))
		}
		p.mu.Unlock()
		if _, err := dst.Write(append(hdr[:], body...)); err != nil {
			return
		}
	}
}

// TestTamperedChunkClosesChannel: a MSG chunk whose last byte (signature
// or ciphertext) was changed fails its checks: the server answers ERR
// BadSecurityChecksFailed and closes the channel, under Sign and
// SignAndEncrypt.
func TestTamperedChunkClosesChannel(t *testing.T) {
	endpoint, _ := startServer(t, Config{})
	key, cert := clientCredentials(t, testClientURI)
	for _, mode := range []ua.MessageSecurityMode{ua.MessageSecurityModeSign, ua.MessageSecurityModeSignAndEncrypt} {
		sc := secureClient{policy: ua.SecurityPolicyURIBasic256Sha256, mode: mode, key: key, cert: cert}
		t.Run(sc.name(), func(t *testing.T) {
			opts := sc.options(t, endpoint, ua.UserTokenTypeAnonymous)
			p := newTamperProxy(t, strings.TrimPrefix(endpoint, "opc.tcp://"))
			c := connect(t, "opc.tcp://"+p.addr, opts...)
			readValues(t, c, counter("FastCounter.1"))
			p.mu.Lock()
			p.armed = true
			p.mu.Unlock()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err := c.Read(ctx, &ua.ReadRequest{NodesToRead: []*ua.ReadValueID{{NodeID: counter("FastCounter.1"), AttributeID: ua.AttributeIDValue}}})
			if err == nil {
				t.Fatal("tampered Read answered")
			}
			select {
			case <-p.done:
			case <-time.After(5 * time.Second):
				t.Fatal("server did not close the channel")
			}
			p.mu.Lock()
			defer p.mu.Unlock()
			if p.errCode != ua.StatusBadSecurityChecksFailed {
				t.Errorf("ERR %v, want BadSecurityChecksFailed", p.errCode)
			}
		})
	}
}

// pipelineRun is the outcome of pipelinedReads.
type pipelineRun struct {
	completed int64         // Reads answered
	want      int64         // Reads sent
	longest   time.Duration // longest time without a completion
}

// pipelinedReads runs conns connections of client (None when its policy is
// empty), each with depth Reads outstanding, per Reads per slot, against
// ts, and stops early once no Read completed for stall.
func pipelinedReads(t *testing.T, ts *testServer, client secureClient, conns, depth, per int, stall time.Duration) pipelineRun {
	t.Helper()
	var opts []opcua.Option
	if client.policy != "" {
		opts = client.options(t, ts.endpoint, ua.UserTokenTypeAnonymous)
	} else {
		opts = []opcua.Option{anonymous(t, ts.endpoint)}
	}
	clients := make([]*opcua.Client, conns)
	for i := range clients {
		c, err := dial(ts.endpoint, opts...)
		if err != nil {
			t.Fatalf("connect: %v", err)
		}
		clients[i] = c
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var completed atomic.Int64
	var last atomic.Int64 // unix nanos of the last completion
	last.Store(time.Now().UnixNano())
	var wg sync.WaitGroup
	for _, c := range clients {
		for range depth {
			wg.Go(func() {
				for range per {
					rctx, rcancel := context.WithTimeout(ctx, 30*time.Second)
					_, err := c.Read(rctx, &ua.ReadRequest{NodesToRead: []*ua.ReadValueID{{NodeID: counter("FastCounter.1"), AttributeID: ua.AttributeIDValue}}})
					rcancel()
					if err != nil {
						return
					}
					completed.Add(1)
					last.Store(time.Now().UnixNano())
				}
			})
		}
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	var run pipelineRun
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
watch:
	for {
		select {
		case <-done:
			break watch
		case <-tick.C:
			gap := time.Since(time.Unix(0, last.Load()))
			run.longest = max(run.longest, gap)
			if gap >= stall {
				break watch
			}
		}
	}
	// A stalled server is stopped first: closing its channels ends the
	// outstanding Reads, then the clients close without waiting.
	_, _ = ts.stop(10 * time.Second)
	cancel()
	for _, c := range clients {
		cctx, ccancel := context.WithTimeout(context.Background(), time.Second)
		_ = c.Close(cctx)
		ccancel()
	}
	wg.Wait()
	run.completed, run.want = completed.Load(), int64(conns*depth*per)
	return run
}

// TestFaultCryptoInGateStallsSecuredPipelines: 10 connections with 100
// pipelined Reads each stop completing (no completion for 2 s) over
// SignAndEncrypt under crypto-in-gate; they complete over SignAndEncrypt
// without it, over None with it, and one Read at a time per connection
// with it (the stall needs a pipeline deeper than the workers).
func TestFaultCryptoInGateStallsSecuredPipelines(t *testing.T) {
	key, cert := clientCredentials(t, testClientURI)
	enc := secureClient{policy: ua.SecurityPolicyURIBasic256Sha256, mode: ua.MessageSecurityModeSignAndEncrypt, key: key, cert: cert}
	const conns, depth, per = 10, 100, 3
	const stall = 2 * time.Second
	for _, tc := range []struct {
		name       string
		client     secureClient
		faults     Faults
		depth, per int
		stalls     bool
	}{
		{"SignAndEncrypt/crypto-in-gate", enc, Faults{catalog.FaultCryptoInGate: true}, depth, per, true},
		{"SignAndEncrypt", enc, nil, depth, per, false},
		{"None/crypto-in-gate", secureClient{}, Faults{catalog.FaultCryptoInGate: true}, depth, per, false},
		{"SignAndEncrypt/crypto-in-gate/one-at-a-time", enc, Faults{catalog.FaultCryptoInGate: true}, 1, 20, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := runServer(t, Config{Workers: 4, Faults: tc.faults})
			run := pipelinedReads(t, ts, tc.client, conns, tc.depth, tc.per, stall)
			t.Logf("%d of %d Reads completed, longest time without a completion %v", run.completed, run.want, run.longest.Round(time.Millisecond))
			switch {
			case tc.stalls && run.longest < stall:
				t.Errorf("no stall: longest gap %v, want ≥ %v", run.longest, stall)
			case !tc.stalls && (run.longest >= stall || run.completed != run.want):
				t.Errorf("stalled: %d of %d Reads, longest gap %v", run.completed, run.want, run.longest)
			}
		})
	}
}

// TestTransferSubscriptionsRule: Part 4's rule (5.14.7.1): a session of
// the same user takes a subscription; an anonymous session takes one of
// an anonymous session only with the same client ApplicationUri, over a
// Sign or SignAndEncrypt channel of its own, and created with the same
// client certificate (issue 44: a URI merely claimed, over None or in
// another certificate, is no identity); anything else is
// BadUserAccessDenied.
func TestTransferSubscriptionsRule(t *testing.T) {
	endpoint, _ := startServer(t, Config{Counters: 4})
	key, cert := clientCredentials(t, testClientURI)
	sign := secureClient{policy: ua.SecurityPolicyURIBasic256Sha256, mode: ua.MessageSecurityModeSign, key: key, cert: cert}
	const otherURI = "urn:opcua-chaos:other-client"
	otherKey, otherCert := clientCredentials(t, otherURI)
	other := secureClient{policy: sign.policy, mode: sign.mode, key: otherKey, cert: otherCert}
	thiefKey, thiefCert := clientCredentials(t, testClientURI) // claims the same ApplicationUri
	thief := secureClient{policy: sign.policy, mode: sign.mode, key: thiefKey, cert: thiefCert}
	noneAnon := func(appURI string) []opcua.Option {
		return []opcua.Option{anonymous(t, endpoint), opcua.ApplicationURI(appURI)}
	}
	signAnonAs := func(sc secureClient, appURI string) []opcua.Option {
		return append(sc.options(t, endpoint, ua.UserTokenTypeAnonymous), opcua.ApplicationURI(appURI))
	}
	signAnon := func(appURI string) []opcua.Option { return signAnonAs(sign, appURI) }
	signUser := func() []opcua.Option {
		return append(sign.options(t, endpoint, ua.UserTokenTypeUserName), opcua.AuthUsername("user1", "password"))
	}
	for _, tc := range []struct {
		name     string
		from, to []opcua.Option
		want     ua.StatusCode
	}{
		{"anonymous to anonymous over None", noneAnon(testClientURI), noneAnon(testClientURI), ua.StatusBadUserAccessDenied},
		{"anonymous to anonymous over Sign, same ApplicationUri", signAnon(testClientURI), signAnon(testClientURI), ua.StatusOK},
		{"anonymous over None to anonymous over Sign, same ApplicationUri", noneAnon(testClientURI), signAnon(testClientURI), ua.StatusBadUserAccessDenied},
		{"anonymous to anonymous over Sign, other ApplicationUri", signAnon(testClientURI), signAnonAs(other, otherURI), ua.StatusBadUserAccessDenied},
		{"anonymous to anonymous over Sign, same ApplicationUri in another certificate", signAnon(testClientURI), signAnonAs(thief, testClientURI), ua.StatusBadUserAccessDenied},
		{"anonymous to user", signAnon(testClientURI), signUser(), ua.StatusBadUserAccessDenied},
		{"user to anonymous", signUser(), signAnon(testClientURI), ua.StatusBadUserAccessDenied},
		{"user to the same user over None", []opcua.Option{asUser(t, endpoint, "user1", "password")}, []opcua.Option{asUser(t, endpoint, "user1", "password")}, ua.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			from := connect(t, endpoint, tc.from...)
			sub := subscribeCounter(t, from)
			to := connect(t, endpoint, tc.to...)
			r, err := sendSvc(t, to, &ua.TransferSubscriptionsRequest{SubscriptionIDs: []uint32{sub}})
			if err != nil {
				t.Fatal(err)
			}
			if got := r.(*ua.TransferSubscriptionsResponse).Results[0].StatusCode; got != tc.want {
				t.Errorf("transfer: %v, want %v", got, tc.want)
			}
		})
	}
}

// TestQuirkNoCertOnNone: under no-cert-on-none, CreateSession on a None
// channel without a client certificate returns no ServerCertificate (one
// with a client certificate still gets it, GetEndpoints always has it);
// without the quirk it is always returned.
func TestQuirkNoCertOnNone(t *testing.T) {
	_, cert := clientCredentials(t, testClientURI)
	for _, quirk := range []bool{true, false} {
		cfg := Config{}
		if quirk {
			cfg.Quirks = Quirks{catalog.QuirkNoCertOnNone: true}
		}
		endpoint, _ := startServer(t, cfg)
		c := connect(t, endpoint, anonymous(t, endpoint))
		nonce := make([]byte, 32)
		for _, clientCert := range [][]byte{nil, cert} {
			r, err := sendRaw(t, c, &ua.CreateSessionRequest{ClientDescription: clientDescription(), ClientCertificate: clientCert, ClientNonce: nonce, RequestedSessionTimeout: 10000}, nil)
			if err != nil {
				t.Fatal(err)
			}
			got := len(r.(*ua.CreateSessionResponse).ServerCertificate) > 0
			if want := !quirk || clientCert != nil; got != want {
				t.Errorf("quirk %v, client certificate %v: ServerCertificate returned %v, want %v", quirk, clientCert != nil, got, want)
			}
		}
		if ep := noneEndpoint(t, endpoint); len(ep.ServerCertificate) == 0 {
			t.Errorf("quirk %v: GetEndpoints without the certificate", quirk)
		}
	}
}

// TestQuirkTrustedCertsOnly: under trusted-certs-only a secured channel
// opens only with a client certificate found in the trust folder (DER or
// PEM, read at each OpenSecureChannel); an unknown one is refused with
// BadSecurityChecksFailed; None channels are unaffected. Without the quirk
// every certificate is accepted.
func TestQuirkTrustedCertsOnly(t *testing.T) {
	dir := t.TempDir()
	endpoint, _ := startServer(t, Config{Quirks: Quirks{catalog.QuirkTrustedCertsOnly: true}, TrustDir: dir})
	key, cert := clientCredentials(t, testClientURI)
	sc := secureClient{policy: ua.SecurityPolicyURIBasic256Sha256, mode: ua.MessageSecurityModeSignAndEncrypt, key: key, cert: cert}
	// gopcua's client reports the server's ERR message or the close
	// that follows it, whichever it reads first
	if c, err := dial(endpoint, sc.options(t, endpoint, ua.UserTokenTypeAnonymous)...); err == nil {
		_ = c.Close(t.Context())
		t.Fatal("an unknown certificate opened a secured channel")
	} else if !errors.Is(err, ua.StatusBadSecurityChecksFailed) && !errors.Is(err, io.EOF) {
		t.Fatalf("unknown certificate: %v, want BadSecurityChecksFailed or the connection closed", err)
	}
	connect(t, endpoint, anonymous(t, endpoint)) // None still opens
	if err := os.WriteFile(filepath.Join(dir, "client.pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert}), 0o644); err != nil {
		t.Fatal(err)
	}
	connect(t, endpoint, sc.options(t, endpoint, ua.UserTokenTypeAnonymous)...)

	plain, _ := startServer(t, Config{TrustDir: t.TempDir()})
	connect(t, plain, sc.options(t, plain, ua.UserTokenTypeAnonymous)...)
}

// sealedOPN is a well-formed OpenSecureChannel request to ep, signed and
// encrypted with key and cert, whose request header carries an
// AuditEntryId of audit bytes (0: a request of 2 blocks).
func sealedOPN(t *testing.T, ep *ua.EndpointDescription, key *rsa.PrivateKey, cert []byte, audit int) []byte {
	t.Helper()
	asym, err := uasec.NewAsymmetric(ep.SecurityPolicyURI, ep.SecurityMode, key, cert, ep.ServerCertificate)
	if err != nil {
		t.Fatal(err)
	}
	nonce, err := asym.MakeNonce()
	if err != nil {
		t.Fatal(err)
	}
	typeID, err := ua.Encode(ua.NewFourByteExpandedNodeID(0, id.OpenSecureChannelRequest_Encoding_DefaultBinary))
	if err != nil {
		t.Fatal(err)
	}
	req, err := ua.Encode(&ua.OpenSecureChannelRequest{
		RequestHeader: &ua.RequestHeader{AuthenticationToken: ua.NewTwoByteNodeID(0), Timestamp: time.Now(), RequestHandle: 1, TimeoutHint: 5000,
			AuditEntryID: strings.Repeat("a", audit), AdditionalHeader: ua.NewExtensionObject(nil)},
		RequestType: ua.SecurityTokenRequestTypeIssue, SecurityMode: ep.SecurityMode, ClientNonce: nonce, RequestedLifetime: 60000,
	})
	if err != nil {
		t.Fatal(err)
	}
	chunk, err := asym.SealOPN(nil, 0, 1, 1, append(typeID, req...))
	if err != nil {
		t.Fatal(err)
	}
	return chunk
}

// sendOPN sends chunk on a fresh connection to endpoint and returns the
// status of the server's answer (Good for an OPN response, the code of an
// ERR message) and how long it took.
func sendOPN(t *testing.T, endpoint string, chunk []byte) (ua.StatusCode, time.Duration) {
	t.Helper()
	resp, took, err := exchangeOPN(t, endpoint, chunk)
	var e *uacp.Error
	switch {
	case errors.As(err, &e):
		return ua.StatusCode(e.ErrorCode), took
	case err != nil:
		t.Fatalf("OpenSecureChannel answer: %v", err)
	case string(resp[:3]) != "OPN":
		t.Fatalf("OpenSecureChannel answered %q", resp[:3])
	}
	return ua.StatusOK, took
}

// exchangeOPN sends chunk on a fresh connection to endpoint and returns
// the server's answer (an error for an ERR message) and how long it took.
func exchangeOPN(t *testing.T, endpoint string, chunk []byte) ([]byte, time.Duration, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	conn, err := (&uacp.Dialer{}).Dial(ctx, endpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	start := time.Now()
	if _, err := conn.Write(chunk); err != nil {
		t.Fatal(err)
	}
	resp, err := conn.Receive()
	return resp, time.Since(start), err
}

// openSecuredRaw sends one OpenSecureChannel request of policy
// Basic256Sha256 and mode SignAndEncrypt to endpoint, signed and
// encrypted with key and cert, and returns the asymmetric security header
// of the server's response (its ReceiverCertificateThumbprint names the
// certificate the server sealed the response for).
func openSecuredRaw(t *testing.T, endpoint string, key *rsa.PrivateKey, cert []byte) uasec.OPNHeader {
	t.Helper()
	resp, _, err := exchangeOPN(t, endpoint, sealedOPN(t, secureEndpoint(t, endpoint), key, cert, 0))
	if err != nil {
		t.Fatalf("OpenSecureChannel response: %v", err)
	}
	h, err := uasec.ParseOPNHeader(resp)
	if err != nil {
		t.Fatalf("OpenSecureChannel response: %v", err)
	}
	return h
}

// TestFaultCertCachedAcrossChannels: a secured channel's
// OpenSecureChannel response is sealed for the certificate it was opened
// with, the second client's as the first's; under the fault
// cert-cached-across-channels a second client's response is sealed for
// the first client's certificate, and the first client is served as
// before.
func TestFaultCertCachedAcrossChannels(t *testing.T) {
	key1, cert1 := clientCredentials(t, testClientURI)
	key2, cert2 := clientCredentials(t, testClientURI+"-2")
	thumb1, thumb2 := uapolicy.Thumbprint(cert1), uapolicy.Thumbprint(cert2)
	for _, tc := range []struct {
		name   string
		faults Faults
		second []byte // the thumbprint the second client's response names
	}{
		{"clean", nil, thumb2},
		{"cached", Faults{catalog.FaultCertCachedAcrossChannels: true}, thumb1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			endpoint, _ := startServer(t, Config{Faults: tc.faults})
			if h := openSecuredRaw(t, endpoint, key1, cert1); !bytes.Equal(h.ReceiverThumbprint, thumb1) {
				t.Errorf("first client: response for thumbprint %x, want its own %x", h.ReceiverThumbprint, thumb1)
			}
			if h := openSecuredRaw(t, endpoint, key2, cert2); !bytes.Equal(h.ReceiverThumbprint, tc.second) {
				t.Errorf("second client: response for thumbprint %x, want %x (first client's %x)", h.ReceiverThumbprint, tc.second, thumb1)
			}
			if h := openSecuredRaw(t, endpoint, key1, cert1); !bytes.Equal(h.ReceiverThumbprint, thumb1) {
				t.Errorf("first client again: response for thumbprint %x, want its own %x", h.ReceiverThumbprint, thumb1)
			}
		})
	}
}

// TestClaimedURIRefused (issue 44, item 10): on a secured channel
// CreateSession with an ApplicationUri that is not the client
// certificate's subjectAltName URI is refused BadCertificateUriInvalid,
// and a self-signed certificate that names the victim's ApplicationUri
// does not take the victim's anonymous subscription
// (BadUserAccessDenied). Under claimed-uri-trusted the session is created
// and the subscription transferred: its data reaches the thief.
func TestClaimedURIRefused(t *testing.T) {
	for _, fault := range []bool{false, true} {
		t.Run(fmt.Sprintf("fault=%v", fault), func(t *testing.T) {
			endpoint, _ := startServer(t, Config{Counters: 4, Faults: Faults{catalog.FaultClaimedURITrusted: fault}})
			key, cert := clientCredentials(t, testClientURI)
			victim := secureClient{policy: ua.SecurityPolicyURIBasic256Sha256, mode: ua.MessageSecurityModeSignAndEncrypt, key: key, cert: cert}
			thiefKey, thiefCert := clientCredentials(t, testClientURI)
			thief := secureClient{policy: victim.policy, mode: victim.mode, key: thiefKey, cert: thiefCert}

			c, err := dial(endpoint, append(thief.options(t, endpoint, ua.UserTokenTypeAnonymous), opcua.ApplicationURI("urn:opcua-chaos:not-in-the-certificate"))...)
			switch {
			case !fault && !errors.Is(err, ua.StatusBadCertificateURIInvalid):
				t.Errorf("CreateSession with an ApplicationUri not in the certificate: %v, want BadCertificateUriInvalid", err)
			case fault && err != nil:
				t.Errorf("under the fault: CreateSession with an ApplicationUri not in the certificate: %v, want created", err)
			}
			if c != nil {
				closeChannel(t, c)
			}

			from := connect(t, endpoint, victim.options(t, endpoint, ua.UserTokenTypeAnonymous)...)
			sub := subscribeCounter(t, from)
			to := connect(t, endpoint, thief.options(t, endpoint, ua.UserTokenTypeAnonymous)...)
			r, err := sendSvc(t, to, &ua.TransferSubscriptionsRequest{SubscriptionIDs: []uint32{sub}})
			if err != nil {
				t.Fatal(err)
			}
			want := ua.StatusBadUserAccessDenied
			if fault {
				want = ua.StatusOK
			}
			if got := r.(*ua.TransferSubscriptionsResponse).Results[0].StatusCode; got != want {
				t.Errorf("transfer to a self-signed certificate claiming the ApplicationUri: %v, want %v", got, want)
			}
		})
	}
}
