package server

import (
	"errors"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/gopcua/opcua/id"
	"github.com/gopcua/opcua/ua"
	"github.com/gopcua/opcua/uacp"

	"github.com/opcua-chaos/opcua-chaos/internal/uawire"
	"github.com/opcua-chaos/opcua-chaos/server/catalog"
	"github.com/opcua-chaos/opcua-chaos/server/internal/budget"
)

// Regression tests of issue 32 (resource exhaustion), transport side:
// unfinished chunks charged to the memory budget across all channels, the
// idle timeout after OpenSecureChannel, the token lifetime enforced, and
// eviction of session-less connections at the connection limit.

// exhaustBudget is the memory budget of these tests: its chunks share is
// 1 MiB, half of one channel's MaxBufferedBytes (2 MiB).
const exhaustBudget = 4 << 20

// chunkData is the body of one full intermediate chunk of a raw client
// (65535-byte receive buffer, 24-byte header).
const chunkData = 0xffff - 24

// chunksPerConn intermediate chunks per connection: 4 connections fit in the
// chunks share (4 × 4 × 65511 B < 1 MiB), a 5th chunk of a 5th does not.
const chunksPerConn = 4

// statusRead is a small Read of the server state, without a session (it
// is answered with a ServiceFault BadSessionIdInvalid).
func statusRead() *ua.ReadRequest {
	return &ua.ReadRequest{NodesToRead: []*ua.ReadValueID{{
		NodeID: ua.NewNumericNodeID(0, id.Server_ServerStatus_State), AttributeID: ua.AttributeIDValue, DataEncoding: &ua.QualifiedName{},
	}}}
}

// holdChunks opens n raw channels and sends chunksPerConn intermediate
// chunks of one unfinished request (id 100) on each, then a complete small
// request whose answer shows that the server read and kept the chunks
// before it.
func holdChunks(t *testing.T, addr string, n int) []*uawire.Conn {
	t.Helper()
	payload := make([]byte, chunkData)
	conns := make([]*uawire.Conn, n)
	for i := range conns {
		c := rawChannel(t, addr, uacp.Hello{})
		conns[i] = c
		for range chunksPerConn {
			if err := c.Chunk('C', 100, payload); err != nil {
				t.Fatalf("channel %d: %v", i, err)
			}
		}
		if _, err := c.Call(statusRead()); err != nil {
			t.Fatalf("channel %d holding %d chunks: %v", i, chunksPerConn, err)
		}
	}
	return conns
}

// TestChunksChargedAcrossChannels: unfinished chunks of all channels are
// charged to the budget's chunks share; once it is full a channel's next
// chunk is refused with ERR BadTcpNotEnoughResources and the channel
// closed, while a new client is served. Aborting, completing and closing
// release the charges: the budget returns to 0.
func TestChunksChargedAcrossChannels(t *testing.T) {
	ts := runServer(t, Config{MemoryBudget: exhaustBudget})
	conns := holdChunks(t, ts.addr, chunksPerConn)
	held := int64(chunksPerConn * chunksPerConn * chunkData)
	if u := ts.budget.UsedBy(budget.Chunks); u != held {
		t.Fatalf("chunks charged = %d, want %d", u, held)
	}
	// One more chunk, on a fifth channel, does not fit. (Nothing else is
	// sent after it: a server closing with unread data would reset the
	// connection, and the ERR message could be lost.)
	extra := rawChannel(t, ts.addr, uacp.Hello{})
	if err := extra.Chunk('C', 100, make([]byte, chunkData)); err != nil {
		t.Fatal(err)
	}
	if code, _ := awaitClose(t, extra, 5*time.Second); code != ua.StatusBadTCPNotEnoughResources {
		t.Fatalf("channel beyond the chunks share closed with %v, want ERR BadTcpNotEnoughResources", code)
	}
	waitFor(t, "the refused channel's charges released", func() bool { return ts.budget.UsedBy(budget.Chunks) == held })
	if limit := ts.budget.ClassLimit(budget.Chunks); held > limit {
		t.Fatalf("test setup: %d bytes held above the share %d", held, limit)
	}
	if n := ts.budget.Refused(budget.Chunks); n < 1 {
		t.Errorf("refused chunk charges = %d, want ≥ 1", n)
	}
	// A new client is served (its session closes with the subtest).
	t.Run("new client", func(t *testing.T) { stillServes(t, ts.endpoint) })

	// An abort chunk releases its request's chunks.
	if err := conns[0].Chunk('A', 100, nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the aborted request's charge released", func() bool {
		return ts.budget.UsedBy(budget.Chunks) == held-chunksPerConn*chunkData
	})
	// A final chunk completes the request (not a valid body: it is
	// answered with a ServiceFault) and releases it.
	if err := conns[1].Chunk('F', 100, make([]byte, 8)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the completed request's charge released", func() bool {
		return ts.budget.UsedBy(budget.Chunks) == held-2*chunksPerConn*chunkData
	})
	// Closing a channel releases what it held.
	for _, c := range conns[2:] {
		c.Close()
	}
	waitFor(t, "the closed channels' charges released", func() bool { return ts.budget.UsedBy(budget.Chunks) == 0 })
	for _, c := range conns[:2] {
		c.Close()
	}
	waitFor(t, "budget back to 0", func() bool { return ts.budget.Used() == 0 })
}

// TestFaultChunksPerChannelOnly: with chunks-per-channel-only nothing is
// charged, and the channels together hold more than the chunks share.
func TestFaultChunksPerChannelOnly(t *testing.T) {
	ts := runServer(t, Config{MemoryBudget: exhaustBudget, Faults: Faults{catalog.FaultChunksPerChannelOnly: true}})
	n := 2 * (chunksPerConn + 1)
	conns := holdChunks(t, ts.addr, n)
	for i, c := range conns {
		stillOpen(t, c, 20*time.Millisecond, fmt.Sprintf("channel %d holding its chunks under the fault", i))
	}
	if held, limit := int64(n*chunksPerConn*chunkData), ts.budget.ClassLimit(budget.Chunks); held <= limit {
		t.Fatalf("test setup: %d bytes held, not above the share %d", held, limit)
	}
	if u := ts.budget.UsedBy(budget.Chunks); u != 0 {
		t.Errorf("chunks charged = %d, want 0 under the fault", u)
	}
}

// awaitClose reads from c until the server closes it or within elapses. It
// returns the ERR message's code (0 if closed without one) and how long it
// took; it fails the test if c is still open.
func awaitClose(t *testing.T, c *uawire.Conn, within time.Duration) (ua.StatusCode, time.Duration) {
	t.Helper()
	start := time.Now()
	code, err := closed(c, within)
	if err != nil {
		t.Fatal(err)
	}
	return code, time.Since(start)
}

// closed reads from c until the server closes it and returns the ERR
// message's code (0 if closed without one), or an error if c is still
// open after within.
func closed(c *uawire.Conn, within time.Duration) (ua.StatusCode, error) {
	_ = c.SetReadDeadline(time.Now().Add(within))
	for {
		_, _, _, err := c.ReadFrame()
		var em *uawire.ErrorMessage
		switch {
		case err == nil:
			continue // a late response
		case errors.As(err, &em):
			return em.Code, nil
		case errors.Is(err, os.ErrDeadlineExceeded):
			return 0, fmt.Errorf("still open after %v", within)
		default:
			return 0, nil // EOF or connection reset
		}
	}
}

// stillOpen checks that c gets nothing, not even a close, for d.
func stillOpen(t *testing.T, c *uawire.Conn, d time.Duration, what string) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(d))
	if _, _, _, err := c.ReadFrame(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("%s: %v, want still open", what, err)
	}
	_ = c.SetReadDeadline(time.Time{})
}

// TestIdleTimeoutAfterOpen: a channel opened without an activated session
// is closed with ERR BadTimeout IdleTimeout after its OpenSecureChannel; a
// channel with an activated session stays open; under idle-after-open
// neither is closed.
func TestIdleTimeoutAfterOpen(t *testing.T) {
	const idle = 300 * time.Millisecond
	for _, fault := range []bool{false, true} {
		t.Run(fmt.Sprintf("fault=%v", fault), func(t *testing.T) {
			ts := runServer(t, Config{IdleTimeout: idle, Faults: Faults{catalog.FaultIdleAfterOpen: fault}})
			active := rawChannel(t, ts.addr, uacp.Hello{})
			if err := active.Session(nil); err != nil {
				t.Fatal(err)
			}
			idler := rawChannel(t, ts.addr, uacp.Hello{})
			opened := time.Now()
			if fault {
				stillOpen(t, idler, 3*idle, "idle channel under the fault")
			} else {
				code, _ := awaitClose(t, idler, 10*idle)
				took := time.Since(opened)
				if code != ua.StatusBadTimeout {
					t.Errorf("idle channel closed with %v, want ERR BadTimeout", code)
				}
				if took < idle*9/10 {
					t.Errorf("idle channel closed after %v, before the idle timeout %v", took, idle)
				}
				t.Logf("idle channel closed after %v", took)
			}
			stillOpen(t, active, idle, "channel with an activated session")
			if r, err := active.Call(statusRead()); err != nil || r.Status() != ua.StatusOK {
				t.Errorf("Read on the active channel: %v %v", r, err)
			}
		})
	}
}

// openLifetime sends an OpenSecureChannel of kind asking for lifetime on
// c and sets c's channel and token ids (uawire.Conn always asks for an hour).
func openLifetime(t *testing.T, c *uawire.Conn, kind ua.SecurityTokenRequestType, lifetime time.Duration, reqID uint32) time.Duration {
	t.Helper()
	body, err := uawire.EncodeService(&ua.OpenSecureChannelRequest{
		RequestHeader:     rawHeader(reqID),
		RequestType:       kind,
		SecurityMode:      ua.MessageSecurityModeNone,
		ClientNonce:       []byte{},
		RequestedLifetime: uint32(lifetime / time.Millisecond),
	})
	if err != nil {
		t.Fatal(err)
	}
	// the sequence number is the request id (not checked under None)
	if _, err := c.Write(uawire.OpenFrame(c.ChannelID, reqID, reqID, body)); err != nil {
		t.Fatal(err)
	}
	for {
		typ, chunk, body, err := c.ReadFrame()
		if err != nil {
			t.Fatalf("OpenSecureChannel: %v", err)
		}
		if typ != "OPN" {
			continue // a late response
		}
		ch, err := uawire.ParseBody(typ, chunk, body)
		if err != nil {
			t.Fatal(err)
		}
		v, err := uawire.DecodeService(ch.Body)
		if err != nil {
			t.Fatal(err)
		}
		tok := v.(*ua.OpenSecureChannelResponse).SecurityToken
		c.ChannelID, c.TokenID = tok.ChannelID, tok.TokenID
		return time.Duration(tok.RevisedLifetime) * time.Millisecond
	}
}

// TestTokenLifetimeEnforced: a channel (with an activated session) whose
// token is not renewed within 125 % of its lifetime is closed with ERR
// BadSecureChannelTokenUnknown; one renewed at 75 % stays open and
// serves; under idle-after-open tokens never expire.
func TestTokenLifetimeEnforced(t *testing.T) {
	const lifetime = 200 * time.Millisecond
	for _, fault := range []bool{false, true} {
		t.Run(fmt.Sprintf("fault=%v", fault), func(t *testing.T) {
			ts := runServer(t, Config{MinChannelLifetime: lifetime, Faults: Faults{catalog.FaultIdleAfterOpen: fault}})
			dial := func() (*uawire.Conn, time.Time) {
				c, err := uawire.Dial(ts.addr, uacp.Hello{})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				_ = c.SetDeadline(time.Now().Add(10 * time.Second))
				if got := openLifetime(t, c, ua.SecurityTokenRequestTypeIssue, lifetime, 1000); got != lifetime {
					t.Fatalf("revised lifetime %v, want %v", got, lifetime)
				}
				opened := time.Now()
				if err := c.Session(nil); err != nil {
					t.Fatal(err)
				}
				_ = c.SetDeadline(time.Time{})
				return c, opened
			}
			stale, opened := dial()
			// The stale channel's close is timed while the other one renews.
			type closing struct {
				code ua.StatusCode
				at   time.Time
				err  error
			}
			staleDone := make(chan closing, 1)
			if !fault {
				go func() {
					code, err := closed(stale, 10*lifetime)
					staleDone <- closing{code, time.Now(), err}
				}()
			}
			renewed, _ := dial()
			// renewed renews at 75 % and reads, for 4 lifetimes.
			for i := range 5 {
				time.Sleep(lifetime * 3 / 4)
				openLifetime(t, renewed, ua.SecurityTokenRequestTypeRenew, lifetime, uint32(2000+i))
				if r, err := renewed.Call(statusRead()); err != nil || r.Status() != ua.StatusOK {
					t.Fatalf("Read after renewal %d: %v %v", i+1, r, err)
				}
			}
			if fault {
				stillOpen(t, stale, lifetime, "unrenewed channel under the fault")
				if r, err := stale.Call(statusRead()); err != nil || r.Status() != ua.StatusOK {
					t.Errorf("Read with the old token under the fault: %v %v", r, err)
				}
				return
			}
			cl := <-staleDone // within 10 lifetimes: the read deadline
			if cl.err != nil {
				t.Fatalf("unrenewed channel: %v", cl.err)
			}
			took := cl.at.Sub(opened)
			if cl.code != ua.StatusBadSecureChannelTokenUnknown {
				t.Errorf("unrenewed channel closed with %v, want ERR BadSecureChannelTokenUnknown", cl.code)
			}
			if took > 3*lifetime {
				t.Errorf("unrenewed channel closed after %v, long after 125 %% of its lifetime", took)
			}
			if took < lifetime*5/4 {
				t.Errorf("unrenewed channel closed after %v, before 125 %% of its lifetime", took)
			}
			t.Logf("unrenewed channel closed %v after its OpenSecureChannel", took)
		})
	}
}

// TestEvictAtConnectionLimit: with MaxConnections channels open and no
// session activated on any, a new client connects, opens a session and
// reads: the oldest idle channel is evicted (ERR BadTcpNotEnoughResources)
// and counted. Under idle-after-open the new client is refused
// (BadMaxConnectionsReached).
func TestEvictAtConnectionLimit(t *testing.T) {
	const limit = 20
	for _, fault := range []bool{false, true} {
		t.Run(fmt.Sprintf("fault=%v", fault), func(t *testing.T) {
			ts := runServer(t, Config{MaxConnections: limit, Faults: Faults{catalog.FaultIdleAfterOpen: fault}})
			idle := make([]*uawire.Conn, limit)
			for i := range idle {
				idle[i] = rawChannel(t, ts.addr, uacp.Hello{})
			}
			waitFor(t, "the idle channels", func() bool { return ts.openConns.Load() == limit })
			victim, err := uawire.Dial(ts.addr, uacp.Hello{})
			if fault {
				var em *uawire.ErrorMessage
				if !errors.As(err, &em) || em.Code != ua.StatusBadMaxConnectionsReached {
					t.Fatalf("new client under the fault: %v, want ERR BadMaxConnectionsReached", err)
				}
				if n := ts.stats.evictedConns.Load(); n != 0 {
					t.Errorf("%s = %d under the fault, want 0", NodeEvicted, n)
				}
				return
			}
			if err != nil {
				t.Fatalf("new client at the limit: %v", err)
			}
			defer victim.Close()
			logIn(t, victim)
			if r, err := victim.Call(statusRead()); err != nil || r.Status() != ua.StatusOK {
				t.Fatalf("new client's Read: %v %v", r, err)
			}
			if code, _ := awaitClose(t, idle[0], 5*time.Second); code != ua.StatusBadTCPNotEnoughResources {
				t.Errorf("oldest idle channel closed with %v, want ERR BadTcpNotEnoughResources", code)
			}
			stillOpen(t, idle[1], 50*time.Millisecond, "second oldest idle channel")
			if n := ts.stats.evictedConns.Load(); n != 1 {
				t.Errorf("%s = %d, want 1", NodeEvicted, n)
			}
			if n := ts.stats.refusedConns.Load(); n != 0 {
				t.Errorf("%s = %d, want 0", NodeRefused, n)
			}
			waitFor(t, "the evicted connection gone", func() bool { return ts.openConns.Load() == limit })
		})
	}
}

// TestEvictSparesActivated: at the limit, a connection that never sent
// Hello (the oldest) is evicted before channels opened later, and a
// connection with an activated session never is: with every connection
// activated the new one is refused.
func TestEvictSparesActivated(t *testing.T) {
	ts := runServer(t, Config{MaxConnections: 2})
	nc, err := net.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	waitFor(t, "the silent connection", func() bool { return ts.openConns.Load() == 1 })
	a := rawChannel(t, ts.addr, uacp.Hello{})
	if err := a.Session(nil); err != nil {
		t.Fatal(err)
	}
	b := rawChannel(t, ts.addr, uacp.Hello{}) // evicts the silent one
	_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := nc.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("silent connection: %v, want closed", err)
	}
	if err := b.Session(nil); err != nil {
		t.Fatal(err)
	}
	_, err = uawire.Dial(ts.addr, uacp.Hello{})
	var em *uawire.ErrorMessage
	if !errors.As(err, &em) || em.Code != ua.StatusBadMaxConnectionsReached {
		t.Fatalf("new client with every connection activated: %v, want ERR BadMaxConnectionsReached", err)
	}
	for name, c := range map[string]*uawire.Conn{"a": a, "b": b} {
		if r, err := c.Call(statusRead()); err != nil || r.Status() != ua.StatusOK {
			t.Errorf("activated channel %s after the refusal: %v %v", name, r, err)
		}
	}
	if n := ts.stats.evictedConns.Load(); n != 1 {
		t.Errorf("%s = %d, want 1", NodeEvicted, n)
	}
}

// TestExpiredOldTokenRefused: after a renewal the previous token is
// accepted until it expires (125 % of its lifetime after its issue); a
// message carrying it later is refused with ERR
// BadSecureChannelTokenUnknown although the channel's new token is valid.
func TestExpiredOldTokenRefused(t *testing.T) {
	const lifetime = 400 * time.Millisecond
	ts := runServer(t, Config{MinChannelLifetime: lifetime})
	c, err := uawire.Dial(ts.addr, uacp.Hello{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	openLifetime(t, c, ua.SecurityTokenRequestTypeIssue, lifetime, 1000)
	issued, old := time.Now(), c.TokenID
	time.Sleep(lifetime * 3 / 4)
	openLifetime(t, c, ua.SecurityTokenRequestTypeRenew, lifetime, 1001)
	c.TokenID = old // the client goes on with the previous token
	if r, err := c.Call(statusRead()); err != nil {
		t.Fatalf("previous token before its expiry: %v %v", r, err)
	}
	time.Sleep(time.Until(issued.Add(lifetime*5/4 + 50*time.Millisecond)))
	_, err = c.Call(statusRead())
	var em *uawire.ErrorMessage
	if !errors.As(err, &em) || em.Code != ua.StatusBadSecureChannelTokenUnknown {
		t.Fatalf("previous token after its expiry: %v, want ERR BadSecureChannelTokenUnknown", err)
	}
}

// closeRawSession closes c's session (CloseSession) and forgets its token.
func closeRawSession(t *testing.T, c *uawire.Conn) {
	t.Helper()
	r, err := c.Call(&ua.CloseSessionRequest{DeleteSubscriptions: true})
	if err != nil || r.Status() != ua.StatusOK {
		t.Fatalf("CloseSession: %v %v", r, err)
	}
	c.Token = nil
}

// TestClosedSessionsNotSpared (issue 44, item 2): connections that
// activated a session and closed it hold no session; at the connection
// limit the oldest of them is evicted for a new client, and the idle
// timeout closes them, while a connection that still holds its session
// is spared by both. Under once-activated-spared they are spared for
// good: the new client is refused BadMaxConnectionsReached and the idle
// channels stay open.
func TestClosedSessionsNotSpared(t *testing.T) {
	const (
		limit = 4
		idle  = 400 * time.Millisecond
	)
	for _, fault := range []bool{false, true} {
		t.Run(fmt.Sprintf("fault=%v", fault), func(t *testing.T) {
			ts := runServer(t, Config{MaxConnections: limit, IdleTimeout: idle,
				Faults: Faults{catalog.FaultOnceActivatedSpared: fault}})
			holder := rawChannel(t, ts.addr, uacp.Hello{})
			if err := holder.Session(nil); err != nil {
				t.Fatal(err)
			}
			closers := make([]*uawire.Conn, limit-1)
			for i := range closers {
				closers[i] = rawChannel(t, ts.addr, uacp.Hello{})
				if err := closers[i].Session(nil); err != nil {
					t.Fatal(err)
				}
				closeRawSession(t, closers[i])
			}
			waitFor(t, "the connections", func() bool { return ts.openConns.Load() == limit })
			victim, err := uawire.Dial(ts.addr, uacp.Hello{})
			if fault {
				var em *uawire.ErrorMessage
				if !errors.As(err, &em) || em.Code != ua.StatusBadMaxConnectionsReached {
					t.Fatalf("new client under the fault: %v, want ERR BadMaxConnectionsReached", err)
				}
				stillOpen(t, closers[1], 3*idle, "idle channel whose session was closed, under the fault")
			} else {
				if err != nil {
					t.Fatalf("new client at the limit: %v", err)
				}
				defer victim.Close()
				logIn(t, victim)
				if code, _ := awaitClose(t, closers[0], 5*time.Second); code != ua.StatusBadTCPNotEnoughResources {
					t.Errorf("oldest channel without a session closed with %v, want ERR BadTcpNotEnoughResources", code)
				}
				if code, _ := awaitClose(t, closers[1], 10*idle); code != ua.StatusBadTimeout {
					t.Errorf("idle channel whose session was closed: %v, want ERR BadTimeout", code)
				}
			}
			if r, err := holder.Call(statusRead()); err != nil || r.Status() != ua.StatusOK {
				t.Errorf("Read on the channel that holds its session: %v %v", r, err)
			}
		})
	}
}

// logIn opens a secure channel and an activated session on a new
// client's connection c within 10 s.
func logIn(t *testing.T, c *uawire.Conn) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if err := c.Open(); err != nil {
		t.Fatalf("new client's OpenSecureChannel: %v", err)
	}
	if err := c.Session(nil); err != nil {
		t.Fatalf("new client's session: %v", err)
	}
}
