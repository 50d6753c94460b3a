package server

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gopcua/opcua"
	"github.com/gopcua/opcua/id"
	"github.com/gopcua/opcua/ua"
	"github.com/gopcua/opcua/uacp"

	"github.com/opcua-chaos/opcua-chaos/internal/uawire"
	"github.com/opcua-chaos/opcua-chaos/server/catalog"
)

// Regression tests of issue 14 (hostile and malformed traffic), over the
// wire. Defects: 1 a malformed request killed the process, 2 monitoring a
// diagnostics node deadlocked the server, 3 unfinished chunks were buffered
// without a bound, 4 another client's session could be taken over and
// failed logins were not slowed down, 5 responses ignored the client's
// receive buffer.

// testServer is a server run by runServer.
type testServer struct {
	*Server
	endpoint string // opc.tcp://host:port
	addr     string // host:port
	cancel   context.CancelFunc
	done     chan error
}

// runServer starts a server like startServer, and lets the test stop it
// and measure how long that takes.
func runServer(t testing.TB, cfg Config) *testServer {
	t.Helper()
	if cfg.Logger == nil {
		var w io.Writer = io.Discard
		if os.Getenv("OPCUA_TEST_LOG") != "" {
			w = testLogWriter{t}
		}
		cfg.Logger = slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	faults := testFaults(t)
	for f, on := range cfg.Faults {
		faults[f] = on
	}
	cfg.Faults = faults
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ts := &testServer{Server: srv, addr: l.Addr().String(), endpoint: "opc.tcp://" + l.Addr().String(), cancel: cancel, done: make(chan error, 1)}
	go func() { ts.done <- srv.Serve(ctx, l) }()
	t.Cleanup(func() { _, _ = ts.stop(10 * time.Second) })
	return ts
}

// stop cancels the server and waits up to limit for Serve to return. It
// returns how long that took and Serve's error (context.DeadlineExceeded
// if it did not return in time).
func (ts *testServer) stop(limit time.Duration) (time.Duration, error) {
	start := time.Now()
	ts.cancel()
	select {
	case err := <-ts.done:
		ts.done <- err // for a second stop
		return time.Since(start), err
	case <-time.After(limit):
		return time.Since(start), context.DeadlineExceeded
	}
}

// rawChannel dials the server with a raw client and opens a secure channel.
func rawChannel(t testing.TB, addr string, hel uacp.Hello) *uawire.Conn {
	t.Helper()
	c, err := uawire.Dial(addr, hel)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.Open(); err != nil {
		t.Fatalf("OpenSecureChannel: %v", err)
	}
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	return c
}

// rawHeader is the request header of raw requests.
func rawHeader(handle uint32) *ua.RequestHeader {
	return &ua.RequestHeader{
		AuthenticationToken: ua.NewTwoByteNodeID(0),
		Timestamp:           time.Unix(1700000000, 0),
		RequestHandle:       handle,
		TimeoutHint:         5000,
		AdditionalHeader:    ua.NewExtensionObject(nil),
	}
}

func encodeService(t testing.TB, v any) []byte {
	t.Helper()
	b, err := uawire.EncodeService(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// negativeVariantLength is the body of issue 14's crash: a WriteRequest
// whose value is an Int32 array Variant claiming -2 elements. gopcua's
// decoder panics on it (reflect.MakeSlice: negative len).
func negativeVariantLength(t testing.TB) []byte {
	b := encodeService(t, &ua.WriteRequest{RequestHeader: rawHeader(77), NodesToWrite: []*ua.WriteValue{{
		NodeID: ua.NewTwoByteNodeID(1), AttributeID: ua.AttributeIDValue,
		Value: &ua.DataValue{EncodingMask: ua.DataValueValue, Value: ua.MustVariant([]int32{0x5a5a5a5a})},
	}}})
	old := []byte{0x86, 1, 0, 0, 0, 0x5a, 0x5a, 0x5a, 0x5a}
	if bytes.Count(b, old) != 1 {
		t.Fatal("variant encoding not found")
	}
	return bytes.Replace(b, old, []byte{0x86, 0xfe, 0xff, 0xff, 0xff}, 1)
}

// hugeArrayClaim is a ReadRequest whose NodesToRead count claims 2^31-1
// elements (16 GiB of pointers to gopcua's decoder), with one element.
func hugeArrayClaim(t testing.TB) []byte {
	b := encodeService(t, &ua.ReadRequest{RequestHeader: rawHeader(78), NodesToRead: []*ua.ReadValueID{
		{NodeID: ua.NewTwoByteNodeID(7), AttributeID: 13, DataEncoding: &ua.QualifiedName{}},
	}})
	old := []byte{1, 0, 0, 0, 0, 7, 13, 0, 0, 0}
	if bytes.Count(b, old) != 1 {
		t.Fatal("array encoding not found")
	}
	return bytes.Replace(b, old, append(binary.LittleEndian.AppendUint32(nil, math.MaxInt32), 0, 7, 13, 0, 0, 0), 1)
}

// stillServes checks that the server answers a new gopcua client.
func stillServes(t *testing.T, endpoint string) {
	t.Helper()
	c := connect(t, endpoint, anonymous(t, endpoint))
	readValues(t, c, ua.NewNumericNodeID(0, id.Server_ServerStatus_State))
}

// TestIssue14MalformedRequestOverTheWire (defect 1): the request that
// killed the process is answered with a ServiceFault BadDecodingError
// carrying its RequestHandle, on a channel that stays open; nothing
// panicked; other clients are served.
func TestIssue14MalformedRequestOverTheWire(t *testing.T) {
	ts := runServer(t, Config{})
	c := rawChannel(t, ts.addr, uacp.Hello{})
	body := negativeVariantLength(t)
	t.Logf("malformed WriteRequest: MSG chunk of %d bytes", 24+len(body))
	reqID, err := c.SendBody(body)
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Receive()
	if err != nil {
		t.Fatalf("no answer to the malformed request: %v", err)
	}
	f, ok := r.Value.(*ua.ServiceFault)
	if !ok || r.RequestID != reqID || f.ResponseHeader.ServiceResult != ua.StatusBadDecodingError || f.ResponseHeader.RequestHandle != 77 {
		t.Fatalf("answer %T %+v to request %d, want ServiceFault BadDecodingError, handle 77, request %d", r.Value, r.Value, r.RequestID, reqID)
	}
	// The channel still serves.
	r, err = c.Call(&ua.GetEndpointsRequest{EndpointURL: ts.endpoint})
	if err != nil || r.Status() != ua.StatusOK {
		t.Fatalf("GetEndpoints on the same channel: %v %v", err, r)
	}
	stillServes(t, ts.endpoint)
	if n := ts.stats.decodingErrors.Load(); n != 1 {
		t.Errorf("%s = %d, want 1", NodeDecodingErrors, n)
	}
	if n := ts.stats.panics.Load(); n != 0 {
		t.Errorf("%d panics recovered: the guard should have refused the request before gopcua's decoder", n)
	}
}

// TestIssue14HugeArrayClaimOverTheWire (defect 1, allocation): a message
// claiming 2^31-1 elements is refused before anything is allocated for
// them: the server's allocations stay below 4 MiB.
func TestIssue14HugeArrayClaimOverTheWire(t *testing.T) {
	ts := runServer(t, Config{})
	c := rawChannel(t, ts.addr, uacp.Hello{})
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	if _, err := c.SendBody(hugeArrayClaim(t)); err != nil {
		t.Fatal(err)
	}
	r, err := c.Receive()
	runtime.ReadMemStats(&after)
	if err != nil || r.Status() != ua.StatusBadDecodingError {
		t.Fatalf("answer %v %v, want BadDecodingError", r, err)
	}
	grew := after.TotalAlloc - before.TotalAlloc
	t.Logf("2^31-1 element claim: %d bytes allocated while it was read and answered (heap %d → %d)", grew, before.HeapAlloc, after.HeapAlloc)
	if grew > 4<<20 {
		t.Errorf("%d bytes allocated, want < 4 MiB", grew)
	}
}

// createItems monitors nodes on subscription sub with the sampling
// interval ms.
func createItems(t *testing.T, c *opcua.Client, sub uint32, ms float64, nodes ...string) error {
	t.Helper()
	req := &ua.CreateMonitoredItemsRequest{SubscriptionID: sub, TimestampsToReturn: ua.TimestampsToReturnBoth}
	for i, n := range nodes {
		req.ItemsToCreate = append(req.ItemsToCreate, &ua.MonitoredItemCreateRequest{
			ItemToMonitor:       &ua.ReadValueID{NodeID: counter(n), AttributeID: ua.AttributeIDValue, DataEncoding: &ua.QualifiedName{}},
			MonitoringMode:      ua.MonitoringModeReporting,
			RequestedParameters: &ua.MonitoringParameters{ClientHandle: uint32(i), SamplingInterval: ms, QueueSize: 10, DiscardOldest: true, Filter: ua.NewExtensionObject(nil)},
		})
	}
	r, err := sendSvc(t, c, req)
	if err != nil {
		return err
	}
	for i, res := range r.(*ua.CreateMonitoredItemsResponse).Results {
		if res.StatusCode != ua.StatusOK {
			t.Errorf("monitoring %s: %v", nodes[i], res.StatusCode)
		}
	}
	return nil
}

// within runs f and fails the test if it takes longer than limit.
func within(t *testing.T, limit time.Duration, what string, f func() error) {
	t.Helper()
	errc := make(chan error, 1)
	go func() { errc <- f() }()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(limit):
		t.Fatalf("%s: no answer within %v (deadlock?)", what, limit)
	}
}

// TestIssue14MonitoringDiagnosticsNoDeadlock (defect 2): monitored items
// on ns=1;s=Subscription.Count and the Sampling.* nodes are sampled while
// CreateMonitoredItems, Reads of those nodes and DeleteSubscriptions keep
// answering; the server stops within its shutdown bound.
func TestIssue14MonitoringDiagnosticsNoDeadlock(t *testing.T) {
	ts := runServer(t, Config{ShutdownTimeout: 2 * time.Second})
	c := connect(t, ts.endpoint, anonymous(t, ts.endpoint))
	diag := []string{NodeSubscriptions, NodeMonitoredItems, NodeSamplingCycles, NodeSamplingSamples,
		NodeSamplingLate, NodeSamplingMissed, NodeSamplingMaxLateness}
	var subs []uint32
	for range 2 {
		r, err := sendSvc(t, c, &ua.CreateSubscriptionRequest{RequestedPublishingInterval: 10, RequestedLifetimeCount: 1000, RequestedMaxKeepAliveCount: 10, PublishingEnabled: true})
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, r.(*ua.CreateSubscriptionResponse).SubscriptionID)
	}
	within(t, 5*time.Second, "CreateMonitoredItems on the diagnostics nodes", func() error {
		if err := createItems(t, c, subs[0], 1, diag...); err != nil {
			return err
		}
		return createItems(t, c, subs[1], 5, diag...)
	})
	cycles := readInt(t, c, NodeSamplingCycles)
	deadline := time.Now().Add(time.Second)
	for i := 0; time.Now().Before(deadline); i++ {
		within(t, 3*time.Second, "CreateMonitoredItems while sampling", func() error {
			return createItems(t, c, subs[i%2], float64(1+i%3), NodeSubscriptions, NodeSamplingSamples)
		})
		within(t, 3*time.Second, "Read of Sampling.* and Subscription.*", func() error {
			readValues(t, c, counter(NodeSamplingCycles), counter(NodeSamplingMaxLateness), counter(NodeSubscriptions))
			return nil
		})
	}
	if now := readInt(t, c, NodeSamplingCycles); now <= cycles {
		t.Errorf("%s stayed at %d: the sampling groups stopped", NodeSamplingCycles, now)
	}
	within(t, 3*time.Second, "DeleteSubscriptions", func() error {
		_, err := sendSvc(t, c, &ua.DeleteSubscriptionsRequest{SubscriptionIDs: subs})
		return err
	})
	took, err := ts.stop(5 * time.Second)
	if err != nil {
		t.Fatalf("shutdown: %v after %v", err, took)
	}
	t.Logf("shutdown took %v", took)
}

// heapInuse returns the heap in use after a GC.
func heapInuse() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}

// TestIssue14IntermediateChunkFlood (defect 3): 20 000 intermediate chunks
// of 32 bytes, one request id each, on a session-less channel: the server
// closes the channel with ERR BadTcpMessageTooLarge once it holds
// MaxBufferedChunks of them, its heap does not grow, other clients are
// served.
func TestIssue14IntermediateChunkFlood(t *testing.T) {
	ts := runServer(t, Config{})
	c := rawChannel(t, ts.addr, uacp.Hello{})
	base := heapInuse()
	payload := make([]byte, 8) // 32-byte chunks
	sent := 0
	var werr error
	for i := range 20000 {
		if werr = c.Chunk('C', uint32(1000+i), payload); werr != nil {
			break
		}
		sent++
	}
	peak := heapInuse()
	_, _, _, err := c.ReadFrame()
	var em *uawire.ErrorMessage
	if !errors.As(err, &em) || em.Code != ua.StatusBadTCPMessageTooLarge {
		t.Fatalf("after %d chunks (write error %v): got %v, want ERR BadTcpMessageTooLarge", sent, werr, err)
	}
	if _, _, _, err := c.ReadFrame(); err == nil {
		t.Error("channel still open after the ERR message")
	}
	t.Logf("%d chunks written before the server closed the channel; heap in use %d → %d KiB", sent, base>>10, peak>>10)
	if peak > base+16<<20 {
		t.Errorf("heap grew by %d KiB", (peak-base)>>10)
	}
	stillServes(t, ts.endpoint)
}

// TestIssue14RequestTooLarge (defect 3, one request): more chunks than
// MaxChunkCount for one request close the channel with ERR
// BadRequestTooLarge; an abort chunk frees an unfinished request.
func TestIssue14RequestTooLarge(t *testing.T) {
	ts := runServer(t, Config{MaxChunkCount: 8, MaxBufferedChunks: 16})
	c := rawChannel(t, ts.addr, uacp.Hello{})
	// Seven chunks and an abort, twice over: never more than 16 held.
	for range 3 {
		for range 7 {
			if err := c.Chunk('C', 500, []byte("x")); err != nil {
				t.Fatal(err)
			}
		}
		if err := c.Chunk('A', 500, make([]byte, 8)); err != nil {
			t.Fatal(err)
		}
	}
	r, err := c.Call(&ua.GetEndpointsRequest{EndpointURL: ts.endpoint})
	if err != nil || r.Status() != ua.StatusOK {
		t.Fatalf("after aborted requests: %v %v", r, err)
	}
	for range 8 {
		if err := c.Chunk('C', 501, []byte("x")); err != nil {
			break
		}
	}
	_, _, _, err = c.ReadFrame()
	var em *uawire.ErrorMessage
	if !errors.As(err, &em) || em.Code != ua.StatusBadRequestTooLarge {
		t.Fatalf("got %v, want ERR BadRequestTooLarge", err)
	}
}

// rawCreateSession creates a session on c's channel and returns it.
func rawCreateSession(t *testing.T, c *opcua.Client) *rawSession {
	t.Helper()
	return createRaw(t, c)
}

// identity builds an identity token for a session's current server nonce.
type identity func(s *rawSession) any

// anonToken is the advertised anonymous identity.
func anonToken(*rawSession) any { return &ua.AnonymousIdentityToken{PolicyID: PolicyAnonymous} }

// userToken is a user-name identity with the password encrypted as the
// advertised policy asks, for the session's last server nonce.
func userToken(name, password string) identity {
	return func(s *rawSession) any { return s.user(name, password, s.nonce) }
}

// activate sends ActivateSession for session s on c's channel (which need
// not be the one that created it); a success moves s to the new server
// nonce.
func activate(t *testing.T, c *opcua.Client, s *rawSession, id identity) error {
	t.Helper()
	v := *s
	v.c = c
	err := v.activate(id(&v))
	if err == nil {
		s.nonce = v.nonce
	}
	return err
}

// TestIssue14SessionTakeover (defect 4): an activated session moves to
// another secure channel only with the same identity. An anonymous or
// other-user ActivateSession from a second channel gets
// BadIdentityChangeNotSupported and the owner keeps its session; the same
// user with the right password may move it (Part 4, 5.6.3).
func TestIssue14SessionTakeover(t *testing.T) {
	ts := runServer(t, Config{})
	owner := connect(t, ts.endpoint, anonymous(t, ts.endpoint))
	intruder := connect(t, ts.endpoint, anonymous(t, ts.endpoint))
	token := rawCreateSession(t, owner)
	if err := activate(t, owner, token, userToken("user1", "password")); err != nil {
		t.Fatalf("owner's activation: %v", err)
	}
	readOK := func(c *opcua.Client) error {
		_, err := sendRaw(t, c, statusReadRequest(), token.cs.AuthenticationToken)
		return err
	}
	for name, identity := range map[string]identity{
		"anonymous":      anonToken,
		"other user":     userToken("user2", "password1"),
		"wrong password": userToken("user1", "guess"),
	} {
		err := activate(t, intruder, token, identity)
		want := ua.StatusBadIdentityChangeNotSupported
		if name == "wrong password" {
			want = ua.StatusBadUserAccessDenied
		}
		if !errors.Is(err, want) {
			t.Errorf("%s takeover: err = %v, want %v", name, err, want)
		}
		if err := readOK(owner); err != nil {
			t.Fatalf("after the %s takeover attempt the owner's Read fails: %v", name, err)
		}
		if err := readOK(intruder); !errors.Is(err, ua.StatusBadSecureChannelIDInvalid) {
			t.Errorf("after the %s takeover attempt the intruder's Read: %v, want BadSecureChannelIdInvalid", name, err)
		}
	}
	// The same user may move the session to a new channel.
	if err := activate(t, intruder, token, userToken("user1", "password")); err != nil {
		t.Fatalf("transfer with the same identity: %v", err)
	}
	if err := readOK(intruder); err != nil {
		t.Errorf("Read on the new channel: %v", err)
	}
	if err := readOK(owner); !errors.Is(err, ua.StatusBadSecureChannelIDInvalid) {
		t.Errorf("Read on the old channel: %v, want BadSecureChannelIdInvalid", err)
	}
	// An anonymous session is not taken over by a user either.
	anon := rawCreateSession(t, owner)
	if err := activate(t, owner, anon, anonToken); err != nil {
		t.Fatal(err)
	}
	if err := activate(t, intruder, anon, userToken("user2", "password1")); !errors.Is(err, ua.StatusBadIdentityChangeNotSupported) {
		t.Errorf("user takes over an anonymous session: %v", err)
	}
}

// TestIssue14FailedLoginsDelayed (defect 4): after LoginFreeFailures
// failed logins from one peer, each further attempt waits (doubling up to
// the cap); pipelined guesses wait too, each at most the cap from its
// arrival (issue 32: no queue of timers), and beyond MaxHeldLoginsPerPeer
// they are refused BadTooManyOperations at once (pipelined under fresh
// user names: one user's are bounded by its budget, issue 44); other requests, of this
// client and others, are not held up; a success resets.
func TestIssue14FailedLoginsDelayed(t *testing.T) {
	const base, maxDelay = 40 * time.Millisecond, 160 * time.Millisecond
	ts := runServer(t, Config{LoginDelay: base, LoginDelayMax: maxDelay, LoginFreeFailures: 3})
	c := connect(t, ts.endpoint, anonymous(t, ts.endpoint))
	token := rawCreateSession(t, c)

	// Sequential guesses: free, free, free, then 40, 80, 160, 160 ms.
	var took []time.Duration
	for range 7 {
		start := time.Now()
		if err := activate(t, c, token, userToken("user1", "guess")); !errors.Is(err, ua.StatusBadUserAccessDenied) {
			t.Fatalf("guess: %v", err)
		}
		took = append(took, time.Since(start))
	}
	t.Logf("sequential failed logins answered after %v", took)
	for i, want := range []time.Duration{0, 0, 0, base, 2 * base, maxDelay, maxDelay} {
		if took[i] < want*8/10 {
			t.Errorf("attempt %d answered after %v, want ≥ %v", i+1, took[i], want)
		}
	}
	// Other requests are not held up meanwhile: 20 pipelined guesses, and
	// a Read on the same channel answers at once.
	var wg sync.WaitGroup
	start := time.Now()
	var last time.Duration
	var refused, early int
	var mu sync.Mutex
	for i := range 20 {
		wg.Go(func() {
			// a fresh user name each (issue 44): held by the peer's
			// key; one user's guesses in flight are bounded by the
			// user's failed-login budget instead
			err := activate(t, c, token, userToken(fmt.Sprintf("fresh%d", i), "guess"))
			mu.Lock()
			defer mu.Unlock()
			took := time.Since(start)
			last = max(last, took)
			switch {
			case errors.Is(err, ua.StatusBadTooManyOperations):
				refused++
			case took < maxDelay*8/10:
				early++
			}
		})
	}
	time.Sleep(20 * time.Millisecond)
	readStart := time.Now()
	if _, err := sendRaw(t, c, &ua.GetEndpointsRequest{}, nil); err != nil {
		t.Fatal(err)
	}
	other := connect(t, ts.endpoint, anonymous(t, ts.endpoint)) // another client logs in meanwhile
	readValues(t, other, ua.NewNumericNodeID(0, id.Server_ServerStatus_State))
	if d := time.Since(readStart); d > 2*time.Second {
		t.Errorf("other requests took %v while guesses were held back", d)
	}
	wg.Wait()
	t.Logf("20 pipelined guesses: %d refused, the last answered after %v", refused, last)
	if want := 20 - DefaultMaxHeldLogins; refused != want {
		t.Errorf("%d of 20 pipelined guesses refused, want %d (beyond MaxHeldLoginsPerPeer)", refused, want)
	}
	if early > 1 {
		// (the first may take the slot the peer key's last sequential
		// guess left it, less than the cap away)
		t.Errorf("%d pipelined guesses answered before the delay %v", early, maxDelay)
	}
	if last > 4*maxDelay {
		t.Errorf("20 pipelined guesses: the last answered after %v, want each delay at most %v from its arrival", last, maxDelay)
	}
	// The right password still works, and resets the peer.
	if err := activate(t, c, token, userToken("user1", "password")); err != nil {
		t.Fatalf("right password: %v", err)
	}
	start = time.Now()
	if err := activate(t, c, rawCreateSession(t, c), userToken("user1", "guess")); !errors.Is(err, ua.StatusBadUserAccessDenied) || time.Since(start) > base {
		t.Errorf("after a success a failure is free again: %v after %v", err, time.Since(start))
	}
	if n := ts.stats.loginsDelayed.Load(); n < 4+DefaultMaxHeldLogins {
		t.Errorf("%s = %d, want ≥ %d", NodeLoginsDelayed, n, 4+DefaultMaxHeldLogins)
	}
}

// TestIssue14LargeResponseChunked (defect 5): a Read of 10 000 values
// (about 1.5 MB) reaches a gopcua client in chunks within its 65 535-byte
// buffer; a raw client with an 8192-byte buffer gets chunks of at most
// 8192 bytes; a client whose MaxChunkCount or MaxMessageSize it exceeds
// gets a ServiceFault BadResponseTooLarge.
func TestIssue14LargeResponseChunked(t *testing.T) {
	ts := runServer(t, Config{})
	req := func() *ua.ReadRequest {
		r := &ua.ReadRequest{TimestampsToReturn: ua.TimestampsToReturnBoth}
		for range MaxNodesPerRead {
			r.NodesToRead = append(r.NodesToRead, &ua.ReadValueID{NodeID: ua.NewNumericNodeID(0, id.Server_ServerStatus), AttributeID: ua.AttributeIDValue, DataEncoding: &ua.QualifiedName{}})
		}
		return r
	}
	c := connect(t, ts.endpoint, anonymous(t, ts.endpoint))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := c.Read(ctx, req())
	if err != nil || len(resp.Results) != MaxNodesPerRead || resp.Results[9999].Status != ua.StatusOK {
		t.Fatalf("gopcua client Read of 10 000 values: %v", err)
	}

	small := rawChannel(t, ts.addr, uacp.Hello{ReceiveBufSize: 8192, SendBufSize: 8192})
	if err := small.Session(nil); err != nil {
		t.Fatal(err)
	}
	r, err := small.Call(req())
	if err != nil || r.Status() != ua.StatusOK {
		t.Fatalf("Read with an 8192-byte buffer: %v %v", r, err)
	}
	total := 0
	for _, n := range r.Chunks {
		total += n
		if n > 8192 {
			t.Fatalf("chunk of %d bytes against an 8192-byte receive buffer", n)
		}
	}
	t.Logf("10 000 values: %d bytes in %d chunks of ≤ 8192 bytes", total, len(r.Chunks))
	if len(r.Value.(*ua.ReadResponse).Results) != MaxNodesPerRead {
		t.Error("reassembled response incomplete")
	}

	for name, hel := range map[string]uacp.Hello{
		"max chunk count":  {ReceiveBufSize: 8192, SendBufSize: 8192, MaxChunkCount: 4},
		"max message size": {MaxMessageSize: 100_000},
	} {
		lim := rawChannel(t, ts.addr, hel)
		if err := lim.Session(nil); err != nil {
			t.Fatal(err)
		}
		r, err := lim.Call(req())
		if err != nil || r.Status() != ua.StatusBadResponseTooLarge {
			t.Errorf("%s: %v %v, want BadResponseTooLarge", name, r, err)
			continue
		}
		// The channel goes on.
		small := &ua.ReadRequest{NodesToRead: []*ua.ReadValueID{{NodeID: ua.NewNumericNodeID(0, id.Server_ServerStatus_State), AttributeID: ua.AttributeIDValue, DataEncoding: &ua.QualifiedName{}}}}
		if r, err := lim.Call(small); err != nil || r.Status() != ua.StatusOK {
			t.Errorf("%s: small Read after the fault: %v %v", name, r, err)
		}
	}
}

// TestConnectionLimit: beyond MaxConnections, with a session activated on
// every connection (else the oldest without one is evicted: see
// TestEvictAtConnectionLimit), a connection gets ERR
// BadMaxConnectionsReached; closing one makes room.
func TestConnectionLimit(t *testing.T) {
	ts := runServer(t, Config{MaxConnections: 2})
	var idle []net.Conn
	for range 2 {
		c := rawChannel(t, ts.addr, uacp.Hello{})
		if err := c.Session(nil); err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
	}
	waitFor(t, "two connections", func() bool { return ts.openConns.Load() == 2 })
	_, err := uawire.Dial(ts.addr, uacp.Hello{})
	var em *uawire.ErrorMessage
	if !errors.As(err, &em) || em.Code != ua.StatusBadMaxConnectionsReached {
		t.Fatalf("third connection: %v, want ERR BadMaxConnectionsReached", err)
	}
	idle[0].Close()
	waitFor(t, "a free slot", func() bool { return ts.openConns.Load() == 1 })
	c, err := uawire.Dial(ts.addr, uacp.Hello{})
	if err != nil {
		t.Fatalf("after closing one: %v", err)
	}
	c.Close()
	if n := ts.stats.refusedConns.Load(); n != 1 {
		t.Errorf("%s = %d, want 1", NodeRefused, n)
	}
}

// TestHandshakeTimeout: a connection that sends no Hello, or a Hello but
// no OpenSecureChannel, is closed after HandshakeTimeout.
func TestHandshakeTimeout(t *testing.T) {
	ts := runServer(t, Config{HandshakeTimeout: 200 * time.Millisecond})
	nc, err := net.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	hello, err := uawire.Dial(ts.addr, uacp.Hello{})
	if err != nil {
		t.Fatal(err)
	}
	defer hello.Close()
	for name, c := range map[string]net.Conn{"no Hello": nc, "no OpenSecureChannel": hello} {
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		start := time.Now()
		_, err := c.Read(make([]byte, 1))
		if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("%s: still open after %v (%v)", name, time.Since(start), err)
		}
	}
}

// flakyListener fails its first n Accepts with EMFILE.
type flakyListener struct {
	net.Listener
	mu sync.Mutex
	n  int
}

func (l *flakyListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	if l.n > 0 {
		l.n--
		l.mu.Unlock()
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	l.mu.Unlock()
	return l.Listener.Accept()
}

// TestAcceptSurvivesEMFILE: transient accept errors are backed off and the
// server keeps serving.
func TestAcceptSurvivesEMFILE(t *testing.T) {
	srv, err := New(Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fl := &flakyListener{Listener: l, n: 5}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, fl) }()
	stillServes(t, "opc.tcp://"+l.Addr().String())
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Serve: %v", err)
	}
}

// TestShutdownWithWedgedHandler: a handler that ignores its context does
// not keep Serve from returning: it returns ErrShutdownTimeout after
// ShutdownTimeout.
func TestShutdownWithWedgedHandler(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	ts := runServer(t, Config{ShutdownTimeout: 300 * time.Millisecond})
	ts.testHook = func(req ua.Request) {
		if r, ok := req.(*ua.ReadRequest); ok && r.NodesToRead[0].NodeID.StringID() == "Wedge" {
			<-release // ignores every context
		}
	}
	c := connect(t, ts.endpoint, anonymous(t, ts.endpoint))
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = c.Read(ctx, &ua.ReadRequest{NodesToRead: []*ua.ReadValueID{{NodeID: ua.NewStringNodeID(1, "Wedge"), AttributeID: ua.AttributeIDValue}}})
	}()
	waitFor(t, "the wedged worker", func() bool { return ts.busyWorkers.Load() == 1 })
	took, err := ts.stop(3 * time.Second)
	if !errors.Is(err, ErrShutdownTimeout) || took > 2*time.Second {
		t.Fatalf("Serve returned %v after %v, want ErrShutdownTimeout after ~300 ms", err, took)
	}
	t.Logf("Serve returned after %v", took)
}

// TestPanicInWorkerClosesOnlyItsChannel: a panicking request handler is
// answered with BadInternalError and its channel closed; the server and
// other clients go on.
func TestPanicInWorkerClosesOnlyItsChannel(t *testing.T) {
	ts := runServer(t, Config{})
	ts.testHook = func(req ua.Request) {
		if r, ok := req.(*ua.ReadRequest); ok && r.NodesToRead[0].NodeID.StringID() == "Panic" {
			panic("test panic")
		}
	}
	c := rawChannel(t, ts.addr, uacp.Hello{})
	if err := c.Session(nil); err != nil {
		t.Fatal(err)
	}
	r, err := c.Call(&ua.ReadRequest{NodesToRead: []*ua.ReadValueID{{NodeID: ua.NewStringNodeID(1, "Panic"), AttributeID: ua.AttributeIDValue, DataEncoding: &ua.QualifiedName{}}}})
	if err != nil || r.Status() != ua.StatusBadInternalError {
		t.Fatalf("answer %v %v, want BadInternalError", r, err)
	}
	_, _, _, err = c.ReadFrame()
	var em *uawire.ErrorMessage
	if !errors.As(err, &em) || em.Code != ua.StatusBadInternalError {
		t.Errorf("then %v, want ERR BadInternalError", err)
	}
	stillServes(t, ts.endpoint)
	if n := ts.stats.panics.Load(); n != 1 {
		t.Errorf("%s = %d, want 1", NodePanics, n)
	}
}

// TestUnactivatedSessionLimit: CreateSession beyond MaxUnactivatedSessions
// closes the oldest unactivated session to make room (the fault
// unactivated-refuse answers BadTooManySessions instead); unactivated
// sessions expire.
func TestUnactivatedSessionLimit(t *testing.T) {
	for _, refuse := range []bool{false, true} {
		t.Run(fmt.Sprintf("refuse=%v", refuse), func(t *testing.T) {
			cfg := Config{MaxUnactivatedSessions: 2, UnactivatedTimeout: 300 * time.Millisecond}
			if refuse {
				cfg.Faults = Faults{catalog.FaultUnactivatedRefuse: true}
			}
			ts := runServer(t, cfg)
			c := connect(t, ts.endpoint, anonymous(t, ts.endpoint))
			rawCreateSession(t, c)
			rawCreateSession(t, c)
			_, err := sendRaw(t, c, &ua.CreateSessionRequest{ClientDescription: &ua.ApplicationDescription{ApplicationName: ua.NewLocalizedText("x")}, SessionName: "third", ClientNonce: make([]byte, 32), RequestedSessionTimeout: 60000}, nil)
			switch {
			case refuse && !errors.Is(err, ua.StatusBadTooManySessions):
				t.Fatalf("third unactivated session under %s: %v, want BadTooManySessions", catalog.FaultUnactivatedRefuse, err)
			case !refuse && err != nil:
				t.Fatalf("third unactivated session: %v, want the oldest closed to make room", err)
			}
			if n := ts.sessions.Counts().Unactivated; n != 2 {
				t.Errorf("unactivated sessions = %d, want 2 (the limit)", n)
			}
			waitFor(t, "unactivated sessions to expire", func() bool { return ts.sessions.Counts().Unactivated == 0 })
			rawCreateSession(t, c)
			if n := readInt(t, c, NodeUnactivated); n != 1 {
				t.Errorf("%s = %d, want 1", NodeUnactivated, n)
			}
		})
	}
}

// TestLoadConfigLimits: the limits of issue 14 come from OPCUA_*
// variables; bad values name their variable.
func TestLoadConfigLimits(t *testing.T) {
	env := map[string]string{
		"OPCUA_MAX_CONNECTIONS":          "5",
		"OPCUA_HANDSHAKE_TIMEOUT":        "2s",
		"OPCUA_MAX_SESSIONS":             "50",
		"OPCUA_MAX_UNACTIVATED_SESSIONS": "7",
		"OPCUA_UNACTIVATED_TIMEOUT":      "3s",
		"OPCUA_MAX_MESSAGE_SIZE":         "100000",
		"OPCUA_MAX_CHUNK_COUNT":          "9",
		"OPCUA_MAX_BUFFERED_CHUNKS":      "11",
		"OPCUA_MAX_BUFFERED_BYTES":       "12345",
		"OPCUA_MAX_DECODE_DEPTH":         "20",
		"OPCUA_LOGIN_DELAY":              "50ms",
		"OPCUA_LOGIN_DELAY_MAX":          "1s",
		"OPCUA_LOGIN_FREE_FAILURES":      "2",
		"OPCUA_SHUTDOWN_TIMEOUT":         "4s",
		"OPCUA_FAULTS":                   "crash-on-decode,unbounded-idle",
	}
	cfg, err := LoadConfig(nil, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := Config{MaxConnections: 5, HandshakeTimeout: 2 * time.Second, MaxSessions: 50, MaxUnactivatedSessions: 7,
		UnactivatedTimeout: 3 * time.Second, MaxMessageSize: 100000, MaxChunkCount: 9, MaxBufferedChunks: 11,
		MaxBufferedBytes: 12345, MaxDecodeDepth: 20, LoginDelay: 50 * time.Millisecond, LoginDelayMax: time.Second,
		LoginFreeFailures: 2, ShutdownTimeout: 4 * time.Second}
	got := cfg
	got.Listen, got.Users, got.OwnerWeights, got.Faults, got.Quirks = "", nil, nil, nil, nil
	if !reflect.DeepEqual(got, want) {
		t.Errorf("limits %+v\nwant %+v", got, want)
	}
	if !cfg.Faults.Has(catalog.FaultCrashOnDecode) || !cfg.Faults.Has(catalog.FaultUnboundedIdle) {
		t.Errorf("faults %v", cfg.Faults)
	}
	for k, v := range map[string]string{
		"OPCUA_HANDSHAKE_TIMEOUT":   "-1s",
		"OPCUA_LOGIN_DELAY":         "soon",
		"OPCUA_MAX_CONNECTIONS":     "0",
		"OPCUA_MAX_BUFFERED_CHUNKS": "many",
	} {
		_, err := LoadConfig(nil, func(key string) string {
			if key == k {
				return v
			}
			return ""
		}, io.Discard)
		if err == nil || !strings.Contains(err.Error(), k) {
			t.Errorf("%s=%s: err = %v", k, v, err)
		}
	}
}
