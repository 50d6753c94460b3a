package server

// Issue 32 (resource exhaustion), requests and strings: queued requests are
// charged to the memory budget by size, a Read over MaxNodesPerRead is
// refused on arrival, per-session client strings are capped and charged,
// and the service-time nodes can be switched off.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/gopcua/opcua"
	"github.com/gopcua/opcua/ua"

	"github.com/opcua-chaos/opcua-chaos/server/catalog"
	"github.com/opcua-chaos/opcua-chaos/server/internal/budget"
)

// bigRead is a compliant Read of n cheap nodes.
func bigRead(n int) *ua.ReadRequest {
	r := &ua.ReadRequest{}
	for range n {
		r.NodesToRead = append(r.NodesToRead, &ua.ReadValueID{
			NodeID: counter(NodeReads), AttributeID: ua.AttributeIDValue, DataEncoding: &ua.QualifiedName{},
		})
	}
	return r
}

// pinWorkers starts n Slow reads of ms on c and waits until they hold all
// n workers.
func pinWorkers(t *testing.T, srv *Server, c *opcua.Client, n, ms int) []<-chan error {
	t.Helper()
	var out []<-chan error
	for range n {
		out = append(out, asyncRead(c, slowRead(ms)))
	}
	waitFor(t, fmt.Sprintf("%d busy workers", n), func() bool { return srv.busyWorkers.Load() == int64(n) })
	return out
}

// stillRunning reports whether none of the reads in errcs has answered.
func stillRunning(errcs []<-chan error) bool {
	for _, errc := range errcs {
		if len(errc) > 0 {
			return false
		}
	}
	return true
}

// TestQueueBudgetRefusesBeyondShare: behind pinned workers, large compliant
// Reads are queued while their bytes fit in the budget's Queue share; the
// rest are answered BadResourceUnavailable at once, never queued. Every
// charge is given back once the reads are answered. Under no-byte-budget
// all are queued.
func TestQueueBudgetRefusesBeyondShare(t *testing.T) {
	const reads, nodes = 30, 1000
	for _, fault := range []bool{false, true} {
		t.Run(fmt.Sprintf("no-byte-budget=%v", fault), func(t *testing.T) {
			cfg := Config{Workers: 2, MemoryBudget: 8 << 20}
			if fault {
				cfg.Faults = Faults{catalog.FaultNoByteBudget: true}
			}
			endpoint, srv := startServer(t, cfg)
			c := connect(t, endpoint, anonymous(t, endpoint))
			pinned := pinWorkers(t, srv, c, 2, 2000)

			var errcs []<-chan error
			for range reads {
				errcs = append(errcs, asyncRead(c, bigRead(nodes)))
			}
			waitFor(t, "every read queued or refused", func() bool {
				return int64(srv.queue.Stats().Queued)+srv.budget.Refused(budget.Queue) == reads
			})
			queued := srv.queue.Stats().Queued
			charged := srv.budget.UsedBy(budget.Queue)
			if !stillRunning(pinned) {
				t.Fatal("the pinned reads finished early: the test did not see the queue behind busy workers")
			}
			if fault {
				if queued != reads {
					t.Errorf("no-byte-budget: %d of %d reads queued, want all", queued, reads)
				}
			} else {
				share := srv.budget.ClassLimit(budget.Queue)
				if queued == 0 || queued == reads {
					t.Errorf("%d of %d reads of %d nodes queued with a Queue share of %d bytes: want some, not all", queued, reads, nodes, share)
				}
				if charged > share || charged < int64(queued)*nodes*readValueCost {
					t.Errorf("Memory.Charged.queue = %d with %d reads queued: want within [%d, %d]", charged, queued, int64(queued)*nodes*readValueCost, share)
				}
			}
			var refused int
			for i, errc := range errcs {
				switch err := waitErr(t, errc, "read"); {
				case err == nil:
				case errors.Is(err, ua.StatusBadResourceUnavailable) && !fault:
					refused++
				default:
					t.Errorf("read %d: %v", i, err)
				}
			}
			if refused != reads-queued {
				t.Errorf("%d reads refused BadResourceUnavailable, want %d (not queued)", refused, reads-queued)
			}
			for _, errc := range pinned {
				if err := waitErr(t, errc, "pinned read"); err != nil {
					t.Errorf("pinned read: %v", err)
				}
			}
			waitFor(t, "the queue's charge back to 0", func() bool { return srv.budget.UsedBy(budget.Queue) == 0 })
			res := readValues(t, c, counter(NodeMemoryBudget), counter("Memory.Refused.queue"), counter("Memory.Charged.queue"))
			wantLimit := int64(8 << 20)
			if fault {
				wantLimit = 0
			}
			if got, _ := res[0].Value.Value().(int64); got != wantLimit {
				t.Errorf("Memory.Budget = %v, want %d", res[0].Value.Value(), wantLimit)
			}
			if got, _ := res[1].Value.Value().(int64); got != int64(refused) {
				t.Errorf("Memory.Refused.queue = %v, want %d", res[1].Value.Value(), refused)
			}
			// The Read of the nodes is itself charged while it runs: one
			// small request, nothing left from the load.
			if got, _ := res[2].Value.Value().(int64); got > 4096 {
				t.Errorf("Memory.Charged.queue = %v after the load, want only the reading request's", res[2].Value.Value())
			}
		})
	}
}

// TestQueueChargesReleased: a queued request's charge comes back exactly
// once whichever way it ends: run, cancelled by Cancel, cancelled by
// CloseSession, or cancelled because its connection dropped. Afterwards
// (sessions closed too) the budget reads 0.
func TestQueueChargesReleased(t *testing.T) {
	endpoint, srv := startServer(t, Config{Workers: 1, MemoryBudget: 8 << 20})
	pin := connect(t, endpoint, asUser(t, endpoint, "user1", "password"))
	canceller := connect(t, endpoint, asUser(t, endpoint, "user2", "password1"))
	closer, err := dial(endpoint, asUser(t, endpoint, "user2", "password1"))
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close(context.Background())
	p := newProxy(t, srv.Addr().String())
	// Its session outlives the dropped connection; a short timeout ends it.
	dropped, err := dial(p.endpoint(), asUser(t, endpoint, "user1", "password"), opcua.SessionTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer dropped.Close(context.Background())

	pinned := pinWorkers(t, srv, pin, 1, 2000)
	var ran, answered []<-chan error
	for range 5 {
		ran = append(ran, asyncRead(pin, bigRead(100)))
		answered = append(answered, asyncRead(canceller, bigRead(100)))
		answered = append(answered, asyncRead(closer, bigRead(100)))
		asyncRead(dropped, bigRead(100))
	}
	waitFor(t, "20 queued requests", func() bool { return srv.queue.Stats().Queued == 20 })
	if got := srv.budget.UsedBy(budget.Queue); got < 20*100*readValueCost {
		t.Errorf("Memory.Charged.queue = %d with 20 reads of 100 nodes queued, want ≥ %d", got, 20*100*readValueCost)
	}
	// Cancel: the handles of every queued read; only canceller's match
	// its session.
	var cancelled uint32
	for _, h := range queuedHandles(srv) {
		var resp *ua.CancelResponse
		err := canceller.Send(context.Background(), &ua.CancelRequest{RequestHandle: h}, func(r ua.Response) error {
			resp, _ = r.(*ua.CancelResponse)
			return nil
		})
		if err != nil || resp == nil {
			t.Fatalf("Cancel: %v", err)
		}
		cancelled += resp.CancelCount
	}
	if cancelled != 5 {
		t.Errorf("Cancel cancelled %d reads, want 5", cancelled)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := closer.Close(ctx); err != nil {
		t.Errorf("close: %v", err)
	}
	p.kill()
	waitFor(t, "5 requests left queued", func() bool { return srv.queue.Stats().Queued == 5 })
	if !stillRunning(pinned) {
		t.Fatal("the pinned read finished early: cancellations were not checked behind a busy worker")
	}
	for _, errc := range answered {
		if err := waitErr(t, errc, "cancelled read"); err == nil {
			t.Error("a cancelled read was answered Good")
		}
	}
	for _, errc := range append(ran, pinned...) {
		if err := waitErr(t, errc, "read"); err != nil {
			t.Errorf("read: %v", err)
		}
	}
	waitFor(t, "the queue's charge back to 0", func() bool { return srv.budget.UsedBy(budget.Queue) == 0 })
	for _, c := range []*opcua.Client{pin, canceller} {
		_ = c.Close(ctx)
	}
	waitFor(t, "every session gone", func() bool { return srv.sessions.Counts().Current == 0 })
	waitFor(t, "the whole budget back to 0", func() bool { return srv.budget.Used() == 0 })
}

// TestReadLimitOnArrival: a Read of MaxNodesPerRead+1 nodes is answered
// BadTooManyOperations at once while every worker is pinned.
func TestReadLimitOnArrival(t *testing.T) {
	endpoint, srv := startServer(t, Config{Workers: 1})
	c := connect(t, endpoint, anonymous(t, endpoint))
	pinned := pinWorkers(t, srv, c, 1, 2000)
	err := waitErr(t, asyncRead(c, bigRead(MaxNodesPerRead+1)), "over-limit read")
	running := stillRunning(pinned)
	if !errors.Is(err, ua.StatusBadTooManyOperations) {
		t.Errorf("Read of %d nodes: err = %v, want BadTooManyOperations", MaxNodesPerRead+1, err)
	}
	if !running {
		t.Error("the over-limit Read was answered only after the pinned worker freed: the limit was checked by the worker, not on arrival")
	}
	if err := waitErr(t, pinned[0], "pinned read"); err != nil {
		t.Errorf("pinned read: %v", err)
	}
	// The limit itself is allowed.
	if _, err := c.Read(context.Background(), bigRead(MaxNodesPerRead)); err != nil {
		t.Errorf("Read of %d nodes: %v", MaxNodesPerRead, err)
	}
}

// TestSessionStringsCapped: a 1 MiB session name and long ApplicationUri
// are kept cut to MaxStringLength on a rune boundary, and the EndpointUrl
// echo is cut too; each session is charged what it keeps, a session that
// does not fit is refused BadResourceUnavailable, and closing gives the
// charge back. Under long-session-strings the strings are kept whole and
// nothing is charged.
func TestSessionStringsCapped(t *testing.T) {
	const maxLen = 65535 // odd: the 2-byte runes of the name end at 65534
	name := strings.Repeat("é", 1<<19)
	appURI := "urn:" + strings.Repeat("x", 1<<16)
	for _, fault := range []bool{false, true} {
		t.Run(fmt.Sprintf("long-session-strings=%v", fault), func(t *testing.T) {
			cfg := Config{MemoryBudget: 8 << 20, MaxStringLength: maxLen}
			if fault {
				cfg.Faults = Faults{catalog.FaultLongSessionStrings: true}
			}
			endpoint, srv := startServer(t, cfg)
			c := newRawChannel(t, endpoint)
			keptName, keptURI := name[:maxLen-1], appURI[:maxLen]
			fit := int(srv.budget.ClassLimit(budget.Sessions) / sessionCost(keptName, keptURI))
			if fault {
				keptName, keptURI, fit = name, appURI, fit+1
			}
			var tokens []*ua.NodeID
			for i := range fit + 1 {
				url := "opc.tcp://localhost:4840"
				if !fault && i == 0 {
					url = "opc.tcp://" + strings.Repeat("h", 1<<16)
				}
				resp, err := sendRaw(t, c, &ua.CreateSessionRequest{
					ClientDescription:       &ua.ApplicationDescription{ApplicationURI: appURI, ApplicationName: ua.NewLocalizedText("raw")},
					EndpointURL:             url,
					SessionName:             name,
					ClientNonce:             make([]byte, 32),
					RequestedSessionTimeout: 60000,
				}, nil)
				if i == fit && !fault {
					if !errors.Is(err, ua.StatusBadResourceUnavailable) {
						t.Errorf("session %d beyond the Sessions share: err = %v, want BadResourceUnavailable", i+1, err)
					}
					break
				}
				if err != nil {
					t.Fatalf("CreateSession %d: %v", i+1, err)
				}
				cs := resp.(*ua.CreateSessionResponse)
				tokens = append(tokens, cs.AuthenticationToken)
				sess := srv.sessions.Lookup(cs.AuthenticationToken)
				if sess == nil {
					t.Fatal("the new session is unknown")
				}
				if sess.Name != keptName || sess.ClientAppURI() != keptURI || !utf8.ValidString(sess.Name) {
					t.Errorf("session keeps a name of %d bytes (valid UTF-8: %v) and an ApplicationUri of %d, want %d and %d",
						len(sess.Name), utf8.ValidString(sess.Name), len(sess.ClientAppURI()), len(keptName), len(keptURI))
				}
				for _, ep := range cs.ServerEndpoints {
					if !fault && len(ep.EndpointURL) > maxLen {
						t.Errorf("EndpointUrl echoed with %d bytes, want ≤ %d", len(ep.EndpointURL), maxLen)
						break
					}
				}
			}
			wantCharged := int64(len(tokens)) * sessionCost(keptName, keptURI)
			if fault {
				wantCharged = 0
			}
			if got := srv.budget.UsedBy(budget.Sessions); got != wantCharged {
				t.Errorf("Memory.Charged.sessions = %d with %d sessions, want %d", got, len(tokens), wantCharged)
			}
			for _, tok := range tokens {
				if _, err := sendRaw(t, c, &ua.CloseSessionRequest{DeleteSubscriptions: true}, tok); err != nil {
					t.Errorf("CloseSession: %v", err)
				}
			}
			if got := srv.budget.UsedBy(budget.Sessions); got != 0 {
				t.Errorf("Memory.Charged.sessions = %d after every session closed, want 0", got)
			}
		})
	}
}

// TestTruncate: client strings are cut on a rune boundary and copied.
func TestTruncate(t *testing.T) {
	for _, tc := range []struct {
		in    string
		limit int
		want  string
	}{
		{"abc", 0, "abc"},
		{"abc", 3, "abc"},
		{"abcd", 3, "abc"},
		{"héllo", 2, "h"},
		{"héllo", 3, "hé"},
		{"a😀b", 4, "a"},
		{"a😀b", 5, "a😀"},
		{"😀", 1, ""},
	} {
		if got := truncate(tc.in, tc.limit); got != tc.want {
			t.Errorf("truncate(%q, %d) = %q, want %q", tc.in, tc.limit, got, tc.want)
		}
	}
}

// TestNoServiceTimeNodes: with NoServiceTimeNodes (OPCUA_SERVICE_TIME_NODES
// =false) the Slow and Busy nodes are unknown; by default they are served.
func TestNoServiceTimeNodes(t *testing.T) {
	for _, off := range []bool{false, true} {
		endpoint, _ := startServer(t, Config{NoServiceTimeNodes: off})
		c := connect(t, endpoint, anonymous(t, endpoint))
		res := readValues(t, c, counter("Slow.10"), counter("Busy.10"), counter(NodeReads))
		want := ua.StatusOK
		if off {
			want = ua.StatusBadNodeIDUnknown
		}
		for i, dv := range res[:2] {
			if dv.Status != want {
				t.Errorf("NoServiceTimeNodes=%v: node %d status %v, want %v", off, i, dv.Status, want)
			}
		}
		if res[2].Status != ua.StatusOK {
			t.Errorf("NoServiceTimeNodes=%v: %s status %v", off, NodeReads, res[2].Status)
		}
	}
}

// TestLoadConfigBudgetAndServiceTimeNodes: OPCUA_MEMORY_BUDGET and
// OPCUA_SERVICE_TIME_NODES are parsed, and bad values name their variable.
func TestLoadConfigBudgetAndServiceTimeNodes(t *testing.T) {
	load := func(env map[string]string) (Config, error) {
		return LoadConfig(nil, func(k string) string { return env[k] }, io.Discard)
	}
	cfg, err := load(map[string]string{"OPCUA_MEMORY_BUDGET": "8388608", "OPCUA_SERVICE_TIME_NODES": "false"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MemoryBudget != 8<<20 || !cfg.NoServiceTimeNodes {
		t.Errorf("MemoryBudget %d, NoServiceTimeNodes %v; want %d, true", cfg.MemoryBudget, cfg.NoServiceTimeNodes, 8<<20)
	}
	for v, off := range map[string]bool{"": false, "true": false, "1": false, "0": true, "no": true, "FALSE": true} {
		cfg, err := load(map[string]string{"OPCUA_SERVICE_TIME_NODES": v})
		if err != nil || cfg.NoServiceTimeNodes != off {
			t.Errorf("OPCUA_SERVICE_TIME_NODES=%q: NoServiceTimeNodes %v, err %v; want %v", v, cfg.NoServiceTimeNodes, err, off)
		}
	}
	if cfg, err := load(nil); err != nil || cfg.MemoryBudget != 0 {
		t.Errorf("no OPCUA_MEMORY_BUDGET: %d, %v; want 0 (New fills in the default)", cfg.MemoryBudget, err)
	}
	for k, v := range map[string]string{
		"OPCUA_MEMORY_BUDGET":      "1000",
		"OPCUA_SERVICE_TIME_NODES": "maybe",
	} {
		if _, err := load(map[string]string{k: v}); err == nil || !strings.Contains(err.Error(), k) {
			t.Errorf("%s=%s: err = %v, want one naming it", k, v, err)
		}
	}
	if _, err := load(map[string]string{"OPCUA_MEMORY_BUDGET": "lots"}); err == nil {
		t.Error("OPCUA_MEMORY_BUDGET=lots accepted")
	}
}
