package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gopcua/opcua"
	"github.com/gopcua/opcua/id"
	"github.com/gopcua/opcua/ua"

	"github.com/opcua-chaos/opcua-chaos/server/catalog"
)

// testFaults returns the fault switches named in OPCUA_TEST_FAULTS, so that
// every test can be run against a deliberately broken server:
//
//	OPCUA_TEST_FAULTS=serial-dispatch go test ./server/...
func testFaults(t testing.TB) Faults {
	t.Helper()
	fs, err := ParseFaults(os.Getenv("OPCUA_TEST_FAULTS"))
	if err != nil {
		t.Fatalf("OPCUA_TEST_FAULTS: %v", err)
	}
	return fs
}

type testLogWriter struct{ t testing.TB }

func (w testLogWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// startServer runs a server on 127.0.0.1:0 until the test ends and returns
// its endpoint URL. Faults from OPCUA_TEST_FAULTS are added to cfg.Faults.
func startServer(t testing.TB, cfg Config) (string, *Server) {
	t.Helper()
	ts := runServer(t, cfg)
	t.Cleanup(func() {
		if _, err := ts.stop(10 * time.Second); err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return ts.endpoint, ts.Server
}

// connect opens a client session; it is closed when the test ends.
func connect(t *testing.T, endpoint string, opts ...opcua.Option) *opcua.Client {
	t.Helper()
	c, err := dial(endpoint, opts...)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = c.Close(ctx)
	})
	return c
}

func dial(endpoint string, opts ...opcua.Option) (*opcua.Client, error) {
	opts = append([]opcua.Option{
		opcua.SecurityMode(ua.MessageSecurityModeNone),
		opcua.SecurityPolicy(ua.SecurityPolicyURINone),
		opcua.AutoReconnect(false),
		opcua.RequestTimeout(10 * time.Second),
	}, opts...)
	c, err := opcua.NewClient(endpoint, opts...)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Connect(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// noneEndpoint asks the server for its endpoints and returns the one with
// SecurityPolicy None, as a gopcua application does before it connects.
func noneEndpoint(t *testing.T, endpoint string) *ua.EndpointDescription {
	t.Helper()
	return endpointOf(t, endpoint, ua.SecurityPolicyURINone, ua.MessageSecurityModeNone)
}

// secureEndpoint returns endpoint's Basic256Sha256 SignAndEncrypt
// endpoint description.
func secureEndpoint(t *testing.T, endpoint string) *ua.EndpointDescription {
	t.Helper()
	return endpointOf(t, endpoint, ua.SecurityPolicyURIBasic256Sha256, ua.MessageSecurityModeSignAndEncrypt)
}

// endpointOf asks the server for its endpoints (on a channel of
// SecurityPolicy None) and returns the one of policy and mode.
func endpointOf(t *testing.T, endpoint, policy string, mode ua.MessageSecurityMode) *ua.EndpointDescription {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	eps, err := opcua.GetEndpoints(ctx, endpoint, opcua.SecurityMode(ua.MessageSecurityModeNone), opcua.SecurityPolicy(ua.SecurityPolicyURINone))
	if err != nil {
		t.Fatalf("get endpoints: %v", err)
	}
	ep, err := opcua.SelectEndpoint(eps, policy, mode)
	if err != nil {
		t.Fatalf("select endpoint: %v", err)
	}
	return ep
}

// anonymous is the option for an anonymous session with the advertised
// PolicyId, the way gopcua documents it (SecurityFromEndpoint).
func anonymous(t *testing.T, endpoint string) opcua.Option {
	t.Helper()
	return opcua.SecurityFromEndpoint(noneEndpoint(t, endpoint), ua.UserTokenTypeAnonymous)
}

// asUser is the option for a session as user name with password: the
// advertised PolicyId, the password encrypted with the server certificate
// as the token policy asks (gopcua's SecurityFromEndpoint and AuthUsername).
func asUser(t *testing.T, endpoint, name, password string) opcua.Option {
	t.Helper()
	sec := opcua.SecurityFromEndpoint(noneEndpoint(t, endpoint), ua.UserTokenTypeUserName)
	auth := opcua.AuthUsername(name, password)
	return func(cfg *opcua.Config) error {
		if err := sec(cfg); err != nil {
			return err
		}
		return auth(cfg)
	}
}

func readValues(t *testing.T, c *opcua.Client, ids ...*ua.NodeID) []*ua.DataValue {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := &ua.ReadRequest{TimestampsToReturn: ua.TimestampsToReturnBoth}
	for _, n := range ids {
		req.NodesToRead = append(req.NodesToRead, &ua.ReadValueID{NodeID: n, AttributeID: ua.AttributeIDValue})
	}
	resp, err := c.Read(ctx, req)
	if err != nil {
		t.Fatalf("read %v: %v", ids, err)
	}
	if len(resp.Results) != len(ids) {
		t.Fatalf("read: %d results for %d nodes", len(resp.Results), len(ids))
	}
	return resp.Results
}

func counter(name string) *ua.NodeID { return ua.NewStringNodeID(1, name) }

func TestReadServerStatusAndCounters(t *testing.T) {
	endpoint, _ := startServer(t, Config{})
	c := connect(t, endpoint, anonymous(t, endpoint))

	res := readValues(t, c,
		ua.NewNumericNodeID(0, id.Server_ServerStatus),
		ua.NewNumericNodeID(0, id.Server_ServerStatus_StartTime),
		ua.NewNumericNodeID(0, id.Server_ServerStatus_CurrentTime),
		ua.NewNumericNodeID(0, id.Server_ServerStatus_State),
		ua.NewNumericNodeID(0, id.Server_NamespaceArray),
		ua.NewNumericNodeID(0, id.Server_ServerDiagnostics_ServerDiagnosticsSummary_CurrentSessionCount),
		ua.NewNumericNodeID(0, id.Server_ServerDiagnostics_ServerDiagnosticsSummary),
		counter(NodeReads),
		counter(NodeSessions),
		ua.NewStringNodeID(1, "No.Such.Node"),
		ua.NewNumericNodeID(0, 999999),
	)
	for i, dv := range res[:9] {
		if dv.Status != ua.StatusOK {
			t.Errorf("result %d: status %v", i, dv.Status)
		}
	}
	eo, ok := res[0].Value.Value().(*ua.ExtensionObject)
	if !ok {
		t.Fatalf("ServerStatus: got %T", res[0].Value.Value())
	}
	st, ok := eo.Value.(*ua.ServerStatusDataType)
	if !ok {
		t.Fatalf("ServerStatus: got %T in extension object", eo.Value)
	}
	if st.State != ua.ServerStateRunning || st.StartTime.IsZero() || time.Since(st.CurrentTime).Abs() > time.Minute {
		t.Errorf("ServerStatus: %+v", st)
	}
	if got := res[3].Value.Value(); got != int32(0) {
		t.Errorf("State = %v (%T), want int32 0", got, got)
	}
	if ns, _ := res[4].Value.Value().([]string); len(ns) != 2 || ns[1] != NamespaceURI {
		t.Errorf("NamespaceArray = %v", res[4].Value.Value())
	}
	if got := res[5].Value.Value(); got != uint32(1) {
		t.Errorf("CurrentSessionCount = %v, want 1", got)
	}
	if got, _ := res[8].Value.Value().(int64); got != 1 {
		t.Errorf("%s = %v, want 1", NodeSessions, res[8].Value.Value())
	}
	for _, dv := range res[9:] {
		if dv.Status != ua.StatusBadNodeIDUnknown {
			t.Errorf("unknown node: status %v, want BadNodeIdUnknown", dv.Status)
		}
	}

	// Counter.Reads counts read operations: it grows by at least the 11
	// operations above (plus the client's namespace read).
	before, _ := res[7].Value.Value().(int64)
	after, _ := readValues(t, c, counter(NodeReads))[0].Value.Value().(int64)
	if after-before < 11 {
		t.Errorf("%s went from %d to %d, want +11 or more", NodeReads, before, after)
	}
}

// TestUsernameAuthentication: gopcua's client, configured from the
// endpoints, encrypts the password; a wrong password or an unknown user is
// BadUserAccessDenied.
func TestUsernameAuthentication(t *testing.T) {
	endpoint, _ := startServer(t, Config{Users: map[string]string{"alice": "secret"}})

	c := connect(t, endpoint, asUser(t, endpoint, "alice", "secret"))
	readValues(t, c, ua.NewNumericNodeID(0, id.Server_ServerStatus_State))

	_, err := dial(endpoint, asUser(t, endpoint, "alice", "wrong"))
	if !errors.Is(err, ua.StatusBadUserAccessDenied) {
		t.Errorf("bad password: err = %v, want BadUserAccessDenied", err)
	}
	_, err = dial(endpoint, asUser(t, endpoint, "mallory", "secret"))
	if !errors.Is(err, ua.StatusBadUserAccessDenied) {
		t.Errorf("unknown user: err = %v, want BadUserAccessDenied", err)
	}
}

func TestAnonymousRejectedWhenDisabled(t *testing.T) {
	endpoint, _ := startServer(t, Config{NoAnonymous: true})
	for _, p := range noneEndpoint(t, endpoint).UserIdentityTokens {
		if p.TokenType == ua.UserTokenTypeAnonymous {
			t.Errorf("anonymous token policy %q advertised", p.PolicyID)
		}
	}
	_, err := dial(endpoint, opcua.AuthAnonymous())
	if !errors.Is(err, ua.StatusBadIdentityTokenRejected) {
		t.Errorf("anonymous: err = %v, want BadIdentityTokenRejected", err)
	}
	// A client that configures no identity falls back to anonymous too.
	_, err = dial(endpoint)
	if !errors.Is(err, ua.StatusBadIdentityTokenRejected) {
		t.Errorf("no identity: err = %v, want BadIdentityTokenRejected", err)
	}
}

// sendRaw sends req on c's secure channel with the given authentication
// token and returns the service result.
func sendRaw(t testing.TB, c *opcua.Client, req ua.Request, token *ua.NodeID) (ua.Response, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var resp ua.Response
	err := c.SecureChannel().SendRequest(ctx, req, token, func(r ua.Response) error {
		resp = r
		return nil
	})
	return resp, err
}

func statusReadRequest() *ua.ReadRequest {
	return &ua.ReadRequest{NodesToRead: []*ua.ReadValueID{{
		NodeID:       ua.NewNumericNodeID(0, id.Server_ServerStatus_State),
		AttributeID:  ua.AttributeIDValue,
		DataEncoding: &ua.QualifiedName{}, // nil does not encode
	}}}
}

func TestAuthenticationTokenChecked(t *testing.T) {
	endpoint, _ := startServer(t, Config{})
	c := connect(t, endpoint, anonymous(t, endpoint))

	// A token the server never issued.
	_, err := sendRaw(t, c, statusReadRequest(), ua.NewByteStringNodeID(0, []byte("not-a-token")))
	if !errors.Is(err, ua.StatusBadSessionIDInvalid) {
		t.Errorf("wrong token: err = %v, want BadSessionIdInvalid", err)
	}
	// No token at all.
	_, err = sendRaw(t, c, statusReadRequest(), nil)
	if !errors.Is(err, ua.StatusBadSessionIDInvalid) {
		t.Errorf("no token: err = %v, want BadSessionIdInvalid", err)
	}
	// The client's own token works on the same channel.
	if err := c.Send(context.Background(), statusReadRequest(), func(ua.Response) error { return nil }); err != nil {
		t.Errorf("right token: %v", err)
	}

	// A created but not activated session.
	var created *ua.CreateSessionResponse
	resp, err := sendRaw(t, c, &ua.CreateSessionRequest{
		ClientDescription: &ua.ApplicationDescription{ApplicationName: ua.NewLocalizedText("raw")},
		SessionName:       "unactivated", ClientNonce: make([]byte, 32), RequestedSessionTimeout: 60000,
	}, nil)
	if err != nil {
		t.Fatalf("CreateSession: %v", err)
	}
	created = resp.(*ua.CreateSessionResponse)
	_, err = sendRaw(t, c, statusReadRequest(), created.AuthenticationToken)
	if !errors.Is(err, ua.StatusBadSessionNotActivated) {
		t.Errorf("unactivated: err = %v, want BadSessionNotActivated", err)
	}

	// An undecodable request gets BadDecodingError and the channel survives.
	_, err = sendRaw(t, c, &ua.ReadRequest{NodesToRead: []*ua.ReadValueID{{NodeID: ua.NewTwoByteNodeID(1)}}}, nil)
	if !errors.Is(err, ua.StatusBadDecodingError) {
		t.Errorf("undecodable: err = %v, want BadDecodingError", err)
	}

	// Unknown services get a ServiceFault.
	err = c.Send(context.Background(), &ua.BrowseNextRequest{ContinuationPoints: [][]byte{{1}}}, func(ua.Response) error { return nil })
	if !errors.Is(err, ua.StatusBadServiceUnsupported) {
		t.Errorf("BrowseNext: err = %v, want BadServiceUnsupported", err)
	}
}

func TestGetEndpointsAdvertisesRequestedURL(t *testing.T) {
	endpoint, _ := startServer(t, Config{})
	c := connect(t, endpoint, anonymous(t, endpoint))
	const viaProxy = "opc.tcp://toxiproxy:14840"
	resp, err := sendRaw(t, c, &ua.GetEndpointsRequest{EndpointURL: viaProxy}, nil)
	if err != nil {
		t.Fatal(err)
	}
	eps := resp.(*ua.GetEndpointsResponse).Endpoints
	// None, then Sign and SignAndEncrypt for each of three policies.
	if len(eps) != 1+2*len(SecurityPolicies) || eps[0].SecurityMode != ua.MessageSecurityModeNone {
		t.Fatalf("endpoints = %+v", eps)
	}
	for _, ep := range eps {
		if ep.EndpointURL != viaProxy {
			t.Errorf("endpoint %s %v: URL %q, want %q", ep.SecurityPolicyURI, ep.SecurityMode, ep.EndpointURL, viaProxy)
		}
	}
	var got []string
	for _, p := range eps[0].UserIdentityTokens {
		got = append(got, fmt.Sprintf("%v %s %s", p.TokenType, p.PolicyID, p.SecurityPolicyURI))
	}
	want := []string{
		fmt.Sprintf("%v %s %s", ua.UserTokenTypeAnonymous, PolicyAnonymous, ua.SecurityPolicyURINone),
		fmt.Sprintf("%v %s %s", ua.UserTokenTypeUserName, PolicyUserName, ua.SecurityPolicyURIBasic256Sha256),
	}
	if !slices.Equal(got, want) {
		t.Errorf("token policies = %q, want %q", got, want)
	}
	if len(eps[0].ServerCertificate) == 0 {
		t.Error("no server certificate advertised")
	}
}

// TestConcurrentSlowReads: two sessions each read Slow.50 at the same time;
// they overlap, so both finish well before two sequential reads would.
func TestConcurrentSlowReads(t *testing.T) {
	endpoint, _ := startServer(t, Config{})
	c1 := connect(t, endpoint, asUser(t, endpoint, "user1", "password"))
	c2 := connect(t, endpoint, asUser(t, endpoint, "user2", "password1"))
	slow := ua.NewStringNodeID(1, "Slow.50")

	single := time.Hour
	for range 3 {
		start := time.Now()
		readValues(t, c1, slow)
		single = min(single, time.Since(start))
	}
	if single < 50*time.Millisecond {
		t.Fatalf("Slow.50 took %v, want ≥ 50 ms", single)
	}

	both := time.Hour
	for range 3 {
		var wg sync.WaitGroup
		start := time.Now()
		for _, c := range []*opcua.Client{c1, c2} {
			wg.Go(func() { readValues(t, c, slow) })
		}
		wg.Wait()
		both = min(both, time.Since(start))
	}
	t.Logf("one Slow.50: %v, two concurrent: %v (ratio %.2f)", single, both, float64(both)/float64(single))
	if float64(both) > 1.8*float64(single) {
		t.Errorf("two concurrent Slow.50 reads took %v, one took %v: not served concurrently", both, single)
	}
}

func TestTimeoutHint(t *testing.T) {
	endpoint, _ := startServer(t, Config{})
	// gopcua puts its request timeout into TimeoutHint.
	c := connect(t, endpoint, anonymous(t, endpoint), opcua.RequestTimeout(200*time.Millisecond))
	req := &ua.ReadRequest{NodesToRead: []*ua.ReadValueID{{
		NodeID: ua.NewStringNodeID(1, "Slow.2000"), AttributeID: ua.AttributeIDValue,
	}}}
	_, err := c.Read(context.Background(), req)
	if !errors.Is(err, ua.StatusBadTimeout) {
		t.Errorf("err = %v, want BadTimeout", err)
	}
	// The client gives up by itself 250 ms after the hint; make sure the
	// server answered: it counts the requests it timed out.
	deadline := time.Now().Add(3 * time.Second)
	for {
		if n, _ := readValues(t, c, counter(NodeTimeouts))[0].Value.Value().(int64); n >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s stayed 0", NodeTimeouts)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestSessionTimeout(t *testing.T) {
	endpoint, srv := startServer(t, Config{})
	c := connect(t, endpoint, anonymous(t, endpoint), opcua.SessionTimeout(200*time.Millisecond))
	readValues(t, c, ua.NewNumericNodeID(0, id.Server_ServerStatus_State))
	deadline := time.Now().Add(3 * time.Second)
	for srv.sessions.Counts().Current != 0 {
		if time.Now().After(deadline) {
			t.Fatal("session did not time out within 3 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	_, err := c.Read(context.Background(), statusReadRequest())
	if !errors.Is(err, ua.StatusBadSessionIDInvalid) {
		t.Errorf("after timeout: err = %v, want BadSessionIdInvalid", err)
	}
	if n := srv.sessions.Counts().Timeouts; n != 1 {
		t.Errorf("timeouts = %d, want 1", n)
	}
}

func TestBusyNodeBurnsTime(t *testing.T) {
	endpoint, _ := startServer(t, Config{})
	c := connect(t, endpoint, anonymous(t, endpoint))
	start := time.Now()
	dv := readValues(t, c, ua.NewStringNodeID(1, "Busy.2000"))[0]
	if dv.Status != ua.StatusOK || dv.Value.Value() != int64(2000) {
		t.Errorf("Busy.2000 = %v %v", dv.Status, dv.Value.Value())
	}
	if d := time.Since(start); d < 2*time.Millisecond {
		t.Errorf("Busy.2000 took %v", d)
	}
}

func TestShutdownWithOpenSession(t *testing.T) {
	cfg := Config{Faults: testFaults(t), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, l) }()
	c, err := dial("opc.tcp://" + l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	// A slow read is in flight when the server stops.
	go func() {
		rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer rcancel()
		_, _ = c.Read(rctx, &ua.ReadRequest{NodesToRead: []*ua.ReadValueID{{NodeID: ua.NewStringNodeID(1, "Slow.10000"), AttributeID: ua.AttributeIDValue}}})
	}()
	time.Sleep(50 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return within 5 s of cancel")
	}
}

func TestLoadConfig(t *testing.T) {
	env := map[string]string{}
	getenv := func(k string) string { return env[k] }
	cfg, err := LoadConfig(nil, getenv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != DefaultListen || cfg.Users["heavy"] != "heavy" || cfg.OwnerWeights["heavy"] != 3 {
		t.Errorf("defaults: %+v", cfg)
	}
	env["OPCUA_LISTEN"] = "127.0.0.1:1234"
	env["OPCUA_FAULTS"] = "unweighted,turn-stall"
	cfg, err = LoadConfig(nil, getenv, io.Discard)
	if err != nil || cfg.Listen != "127.0.0.1:1234" || !cfg.Faults.Has(catalog.FaultTurnStall) {
		t.Errorf("env: %+v %v", cfg, err)
	}
	cfg, err = LoadConfig([]string{"-listen", "127.0.0.1:99"}, getenv, io.Discard)
	if err != nil || cfg.Listen != "127.0.0.1:99" {
		t.Errorf("flag over env: %+v %v", cfg, err)
	}
	for k, v := range map[string]string{
		"OPCUA_USERS":         "nopassword",
		"OPCUA_OWNER_WEIGHTS": "heavy:0",
		"OPCUA_FAULTS":        "nope",
		"OPCUA_WORKERS":       "-1",
		"OPCUA_BACKPRESSURE":  "10:20",
		"OPCUA_LISTEN":        "noport",
	} {
		env := map[string]string{k: v}
		_, err := LoadConfig(nil, func(k string) string { return env[k] }, io.Discard)
		if err == nil || !strings.Contains(err.Error(), strings.TrimPrefix(k, "")) && !strings.Contains(err.Error(), "listen") {
			t.Errorf("%s=%s: err = %v", k, v, err)
		}
	}
}
