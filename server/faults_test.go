package server

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gopcua/opcua"
	"github.com/gopcua/opcua/ua"
	"github.com/gopcua/opcua/uacp"

	"github.com/opcua-chaos/opcua-chaos/internal/uawire"
	"github.com/opcua-chaos/opcua-chaos/server/catalog"
)

// childEnv makes this test binary run TestServerChild as a server process
// with the fault switches in the variable ("none" for none).
const childEnv = "OPCUA_TEST_SERVER_CHILD"

// TestServerChild is the server process of TestFaultCrashOnDecode; it is
// skipped unless childEnv is set. It prints "listen <addr>" and serves for
// at most 30 s.
func TestServerChild(t *testing.T) {
	spec := os.Getenv(childEnv)
	if spec == "" {
		t.Skip("child process of TestFaultCrashOnDecode")
	}
	if spec == "none" {
		spec = ""
	}
	faults, err := ParseFaults(spec)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Config{Faults: faults, Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("listen %s\n", l.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := srv.Serve(ctx, l); err != nil {
		t.Fatal(err)
	}
}

// child is a server process started by startChild.
type child struct {
	cmd    *exec.Cmd
	addr   string
	mu     sync.Mutex
	output bytes.Buffer  // stdout and stderr
	exited chan struct{} // closed when the process has exited
	err    error         // its exit error, once exited is closed
}

func (c *child) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.output.Write(p)
}

func (c *child) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.output.String()
}

// startChild runs this test binary as a server process with faults.
func startChild(t *testing.T, faults string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", "^TestServerChild$", "-test.v")
	cmd.Env = append(os.Environ(), childEnv+"="+faults, "OPCUA_TEST_FAULTS=")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, exited: make(chan struct{})}
	cmd.Stderr = c
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-c.exited
	})
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(c, line)
			if a, ok := strings.CutPrefix(line, "listen "); ok {
				addr <- a
			}
		}
		c.err = cmd.Wait()
		close(c.exited)
	}()
	select {
	case c.addr = <-addr:
	case <-time.After(30 * time.Second):
		t.Fatalf("server child did not start: %s", c)
	}
	return c
}

// TestFaultCrashOnDecode: with crash-on-decode the malformed request of
// issue 14 kills the server process (gopcua's panic, unrecovered); without
// it, the same process answers and lives on. The server runs in a child
// process, so the crash does not take the test binary with it.
func TestFaultCrashOnDecode(t *testing.T) {
	if testing.Short() {
		t.Skip("starts server processes")
	}
	for _, faults := range []string{"none", string(catalog.FaultCrashOnDecode)} {
		t.Run(faults, func(t *testing.T) {
			srv := startChild(t, faults)
			c, err := uawire.Dial(srv.addr, uacp.Hello{})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if err := c.Open(); err != nil {
				t.Fatal(err)
			}
			_ = c.SetDeadline(time.Now().Add(20 * time.Second))
			if _, err := c.SendBody(negativeVariantLength(t)); err != nil {
				t.Fatal(err)
			}
			r, rerr := c.Receive()
			if faults == "none" {
				if rerr != nil || r.Status() != ua.StatusBadDecodingError {
					t.Fatalf("answer %v %v, want BadDecodingError\n%s", r, rerr, srv)
				}
				select {
				case <-srv.exited:
					t.Fatalf("server process exited (%v)\n%s", srv.err, srv)
				case <-time.After(200 * time.Millisecond):
				}
				return
			}
			if rerr == nil {
				t.Fatalf("the crash-on-decode server answered %v", r.Value)
			}
			select {
			case <-srv.exited:
				var ee *exec.ExitError
				if !errors.As(srv.err, &ee) || !strings.Contains(srv.String(), "negative len") {
					t.Fatalf("exit %v, want a crash with gopcua's panic\n%s", srv.err, srv)
				}
				t.Logf("server process died: %v", srv.err)
			case <-time.After(20 * time.Second):
				t.Fatalf("the crash-on-decode server process did not die\n%s", srv)
			}
		})
	}
}

// TestFaultUnboundedIdle: with unbounded-idle, connections that never send
// Hello outlive the handshake timeout and the connection limit does not
// apply (without it: TestHandshakeTimeout, TestConnectionLimit).
func TestFaultUnboundedIdle(t *testing.T) {
	ts := runServer(t, Config{HandshakeTimeout: 100 * time.Millisecond, MaxConnections: 1, Faults: Faults{catalog.FaultUnboundedIdle: true}})
	var idle []net.Conn
	for range 3 {
		nc, err := net.Dial("tcp", ts.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		idle = append(idle, nc)
	}
	time.Sleep(500 * time.Millisecond) // five handshake timeouts
	for i, nc := range idle {
		_ = nc.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if _, err := nc.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("idle connection %d: %v, want still open", i, err)
		}
	}
	if n := ts.openConns.Load(); n != 3 {
		t.Errorf("%d connections served, want 3 (no limit)", n)
	}
	c, err := uawire.Dial(ts.addr, uacp.Hello{})
	if err != nil {
		t.Fatalf("fourth connection refused: %v", err)
	}
	c.Close()
}

// TestFaultPerSessionOwners: without per-session-owners the Reads of two
// sessions of user1 share one fair queue owner, user1; with it each session
// is an owner of its own (its session id), and the per-owner diagnostics
// of user1 read 0.
func TestFaultPerSessionOwners(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("fault=%v", on), func(t *testing.T) {
			endpoint, srv := startServer(t, Config{Faults: Faults{catalog.FaultPerSessionOwners: on}})
			a := connect(t, endpoint, asUser(t, endpoint, "user1", "password"))
			b := connect(t, endpoint, asUser(t, endpoint, "user1", "password"))
			readValues(t, a, counter(NodeRequests))
			readValues(t, b, counter(NodeRequests))
			var owners []string
			for _, o := range srv.queue.Owners() {
				owners = append(owners, o.Owner)
			}
			enqueued := readInt(t, a, OwnerNode("user1", "Enqueued"))
			if !on {
				if len(owners) != 1 || owners[0] != "user1" || enqueued < 2 {
					t.Fatalf("owners %q, Owner.user1.Enqueued %d; want only user1, with ≥ 2 Reads", owners, enqueued)
				}
				return
			}
			if len(owners) != 2 || !strings.HasPrefix(owners[0], "ns=1;i=") || !strings.HasPrefix(owners[1], "ns=1;i=") {
				t.Fatalf("owners %q, want two session ids", owners)
			}
			if enqueued != 0 {
				t.Fatalf("Owner.user1.Enqueued = %d, want 0 (owners are sessions)", enqueued)
			}
		})
	}
}

// TestFaultCancelTotal: Cancel's CancelCount is the number of requests
// this call cancelled (1, 1, then 0 for a handle found nowhere); with
// cancel-running-total it is the server's running total (1, 2, 2).
func TestFaultCancelTotal(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("fault=%v", on), func(t *testing.T) {
			endpoint, srv := startServer(t, Config{Workers: 1, Faults: Faults{catalog.FaultCancelTotal: on}})
			c := connect(t, endpoint, asUser(t, endpoint, "user1", "password"))
			cancelCount := func(handle uint32) uint32 {
				t.Helper()
				r, err := sendSvc(t, c, &ua.CancelRequest{RequestHandle: handle})
				if err != nil {
					t.Fatalf("Cancel: %v", err)
				}
				return r.(*ua.CancelResponse).CancelCount
			}
			var got []uint32
			for range 2 {
				running := occupyWorker(t, srv, c, 300)
				queued := asyncRead(c, slowRead(1))
				waitFor(t, "a queued request", func() bool { return len(queuedHandles(srv)) == 1 })
				got = append(got, cancelCount(queuedHandles(srv)[0]))
				if err := waitErr(t, queued, "cancelled read"); !errors.Is(err, ua.StatusBadRequestCancelledByClient) {
					t.Fatalf("cancelled read: %v", err)
				}
				if err := waitErr(t, running, "running read"); err != nil {
					t.Fatalf("running read: %v", err)
				}
			}
			got = append(got, cancelCount(0xfffffff0))
			want := []uint32{1, 1, 0}
			if on {
				want = []uint32{1, 2, 2}
			}
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("CancelCounts %v, want %v", got, want)
			}
		})
	}
}

// TestFaultCancelWrongHandle: a Cancel naming a queued request's handle
// cancels it (CancelCount 1, the Read answered
// BadRequestCancelledByClient); with cancel-wrong-handle it cancels
// nothing (CancelCount 0) and the Read runs once the worker is free.
func TestFaultCancelWrongHandle(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("fault=%v", on), func(t *testing.T) {
			endpoint, srv := startServer(t, Config{Workers: 1, Faults: Faults{catalog.FaultCancelWrongHandle: on}})
			c := connect(t, endpoint, asUser(t, endpoint, "user1", "password"))
			running := occupyWorker(t, srv, c, 300)
			queued := asyncRead(c, slowRead(1))
			waitFor(t, "a queued request", func() bool { return len(queuedHandles(srv)) == 1 })
			r, err := sendSvc(t, c, &ua.CancelRequest{RequestHandle: queuedHandles(srv)[0]})
			if err != nil {
				t.Fatalf("Cancel: %v", err)
			}
			count := r.(*ua.CancelResponse).CancelCount
			qerr := waitErr(t, queued, "queued read")
			if err := waitErr(t, running, "running read"); err != nil {
				t.Fatalf("running read: %v", err)
			}
			if !on {
				if count != 1 || !errors.Is(qerr, ua.StatusBadRequestCancelledByClient) {
					t.Fatalf("CancelCount %d, queued read %v; want 1 and BadRequestCancelledByClient", count, qerr)
				}
				return
			}
			if count != 0 || qerr != nil {
				t.Fatalf("CancelCount %d, queued read %v; want 0 and the read served", count, qerr)
			}
		})
	}
}

// TestFaultSessionsNeverExpire: a session idle past its 200 ms timeout is
// closed (BadSessionIdInvalid afterwards); with sessions-never-expire it
// stays open and serves the next Read.
func TestFaultSessionsNeverExpire(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("fault=%v", on), func(t *testing.T) {
			endpoint, srv := startServer(t, Config{Faults: Faults{catalog.FaultSessionsNeverExpire: on}})
			c := connect(t, endpoint, anonymous(t, endpoint), opcua.SessionTimeout(200*time.Millisecond))
			readValues(t, c, counter(NodeRequests))
			time.Sleep(800 * time.Millisecond) // four timeouts, many sweeps
			counts := srv.sessions.Counts()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_, err := c.Read(ctx, statusReadRequest())
			if !on {
				if counts.Current != 0 || counts.Timeouts != 1 || !errors.Is(err, ua.StatusBadSessionIDInvalid) {
					t.Fatalf("sessions %+v, Read after the timeout: %v; want it closed", counts, err)
				}
				return
			}
			if counts.Current != 1 || counts.Timeouts != 0 || err != nil {
				t.Fatalf("sessions %+v, Read after the timeout: %v; want it open", counts, err)
			}
		})
	}
}

// publishLoop creates a subscription (1 ms publishing interval) with one
// reporting item on node (sampling 1 ms, queue 1000) and sends Publish
// requests one at a time, none acknowledged, until done says stop or 5 s
// pass. It returns the subscription id.
func publishLoop(t *testing.T, c *opcua.Client, node string, done func(*ua.PublishResponse) bool) uint32 {
	t.Helper()
	r, err := sendSvc(t, c, &ua.CreateSubscriptionRequest{RequestedPublishingInterval: 1, RequestedMaxKeepAliveCount: 1000, RequestedLifetimeCount: 10000, PublishingEnabled: true})
	if err != nil {
		t.Fatal(err)
	}
	sub := r.(*ua.CreateSubscriptionResponse).SubscriptionID
	r, err = sendSvc(t, c, &ua.CreateMonitoredItemsRequest{
		SubscriptionID: sub, TimestampsToReturn: ua.TimestampsToReturnBoth,
		ItemsToCreate: []*ua.MonitoredItemCreateRequest{{
			ItemToMonitor:       &ua.ReadValueID{NodeID: counter(node), AttributeID: ua.AttributeIDValue, DataEncoding: &ua.QualifiedName{}},
			MonitoringMode:      ua.MonitoringModeReporting,
			RequestedParameters: &ua.MonitoringParameters{ClientHandle: 1, SamplingInterval: 1, QueueSize: 1000, DiscardOldest: true, Filter: ua.NewExtensionObject(nil)},
		}},
	})
	if err != nil || r.(*ua.CreateMonitoredItemsResponse).Results[0].StatusCode != ua.StatusOK {
		t.Fatalf("CreateMonitoredItems: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		r, err := sendSvc(t, c, &ua.PublishRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if done(r.(*ua.PublishResponse)) {
			return sub
		}
	}
	t.Fatal("publish loop did not finish within 5 s")
	return 0
}

// TestFaultSkippedSequence: a subscription's data messages are numbered
// 1, 2, 3, … without a gap; with skipped-sequence SkipSequenceEvery (50)
// is never used: 49 is followed by 51, 50 is never listed available, a
// keep-alive never announces it, and Republish of it is
// BadMessageNotAvailable.
func TestFaultSkippedSequence(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("fault=%v", on), func(t *testing.T) {
			endpoint, _ := startServer(t, Config{Counters: 4, Faults: Faults{catalog.FaultSkippedSequence: on}})
			c := connect(t, endpoint)
			var seqs []uint32
			sub := publishLoop(t, c, "FastCounter.0", func(p *ua.PublishResponse) bool {
				msg := p.NotificationMessage
				if len(msg.NotificationData) > 0 {
					seqs = append(seqs, msg.SequenceNumber)
				}
				if on && (msg.SequenceNumber == SkipSequenceEvery || slices.Contains(p.AvailableSequenceNumbers, SkipSequenceEvery)) {
					t.Fatalf("sequence number %d sent or announced: message %d (%d notifications), available %v",
						SkipSequenceEvery, msg.SequenceNumber, len(msg.NotificationData), p.AvailableSequenceNumbers)
				}
				return len(seqs) > 0 && seqs[len(seqs)-1] > SkipSequenceEvery+1
			})
			for i := 1; i < len(seqs); i++ {
				want := seqs[i-1] + 1
				if on && want%SkipSequenceEvery == 0 {
					want++
				}
				if seqs[i] != want {
					t.Fatalf("message %d after %d, want %d; sequence %v", seqs[i], seqs[i-1], want, seqs)
				}
			}
			_, err := sendSvc(t, c, &ua.RepublishRequest{SubscriptionID: sub, RetransmitSequenceNumber: SkipSequenceEvery})
			if on != errors.Is(err, ua.StatusBadMessageNotAvailable) {
				t.Fatalf("Republish of %d: %v", SkipSequenceEvery, err)
			}
		})
	}
}

// TestFaultDuplicateSamples: SampledCounter.0 (its value is the number of
// the sample) arrives as 1, 2, 3, … with no value twice; with
// duplicate-samples the values DuplicateSampleEvery (200) and 400 arrive
// twice, with the same source timestamp, and no other value does.
func TestFaultDuplicateSamples(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("fault=%v", on), func(t *testing.T) {
			endpoint, _ := startServer(t, Config{Counters: 4, Faults: Faults{catalog.FaultDuplicateSamples: on}})
			c := connect(t, endpoint)
			var vals []*ua.DataValue
			publishLoop(t, c, "SampledCounter.0", func(p *ua.PublishResponse) bool {
				for _, d := range p.NotificationMessage.NotificationData {
					if dc, ok := d.Value.(*ua.DataChangeNotification); ok {
						for _, mi := range dc.MonitoredItems {
							vals = append(vals, mi.Value)
						}
					}
				}
				return len(vals) > 0 && vals[len(vals)-1].Value.Value().(int64) > 2*DuplicateSampleEvery
			})
			var twice []int64
			for i := 1; i < len(vals); i++ {
				prev, v := vals[i-1].Value.Value().(int64), vals[i].Value.Value().(int64)
				switch {
				case v == prev && vals[i].SourceTimestamp.Equal(vals[i-1].SourceTimestamp):
					twice = append(twice, v)
				case v != prev+1:
					t.Fatalf("value %d after %d", v, prev)
				}
			}
			var want []int64
			if on {
				want = []int64{DuplicateSampleEvery, 2 * DuplicateSampleEvery}
			}
			if fmt.Sprint(twice) != fmt.Sprint(want) {
				t.Fatalf("values received twice %v, want %v", twice, want)
			}
		})
	}
}

// TestFaultSampleAtPublish: an item of SampledCounter.0 asked for at 10 ms
// in a subscription publishing every 100 ms is answered 10 ms either way;
// its samples come about 10 ms apart, with sample-at-publish about 100 ms
// apart, each one more than the last (the counter still counts samples).
func TestFaultSampleAtPublish(t *testing.T) {
	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("fault=%v", on), func(t *testing.T) {
			endpoint, _ := startServer(t, Config{Counters: 4, Faults: Faults{catalog.FaultSampleAtPublish: on}})
			c := connect(t, endpoint)
			r, err := sendSvc(t, c, &ua.CreateSubscriptionRequest{RequestedPublishingInterval: 100, RequestedMaxKeepAliveCount: 100, RequestedLifetimeCount: 1000, PublishingEnabled: true})
			if err != nil {
				t.Fatal(err)
			}
			sub := r.(*ua.CreateSubscriptionResponse).SubscriptionID
			r, err = sendSvc(t, c, &ua.CreateMonitoredItemsRequest{
				SubscriptionID: sub, TimestampsToReturn: ua.TimestampsToReturnSource,
				ItemsToCreate: []*ua.MonitoredItemCreateRequest{{
					ItemToMonitor:       &ua.ReadValueID{NodeID: counter("SampledCounter.0"), AttributeID: ua.AttributeIDValue, DataEncoding: &ua.QualifiedName{}},
					MonitoringMode:      ua.MonitoringModeReporting,
					RequestedParameters: &ua.MonitoringParameters{ClientHandle: 1, SamplingInterval: 10, QueueSize: 100, DiscardOldest: true, Filter: ua.NewExtensionObject(nil)},
				}},
			})
			if err != nil {
				t.Fatal(err)
			}
			if res := r.(*ua.CreateMonitoredItemsResponse).Results[0]; res.StatusCode != ua.StatusOK || res.RevisedSamplingInterval != 10 {
				t.Fatalf("CreateMonitoredItems: %v, revised %v ms, want 10", res.StatusCode, res.RevisedSamplingInterval)
			}
			var vals []*ua.DataValue
			for deadline := time.Now().Add(5 * time.Second); len(vals) < 12 && time.Now().Before(deadline); {
				r, err := sendSvc(t, c, &ua.PublishRequest{})
				if err != nil {
					t.Fatal(err)
				}
				for _, d := range r.(*ua.PublishResponse).NotificationMessage.NotificationData {
					if dc, ok := d.Value.(*ua.DataChangeNotification); ok {
						for _, mi := range dc.MonitoredItems {
							vals = append(vals, mi.Value)
						}
					}
				}
			}
			if len(vals) < 12 {
				t.Fatalf("%d samples in 5 s", len(vals))
			}
			// after the initial sample: the sampler's
			vals = vals[1:]
			for i := 1; i < len(vals); i++ {
				if prev, v := vals[i-1].Value.Value().(int64), vals[i].Value.Value().(int64); v != prev+1 {
					t.Fatalf("value %d after %d: the counter must move by one per sample", v, prev)
				}
			}
			period := vals[len(vals)-1].SourceTimestamp.Sub(vals[0].SourceTimestamp) / time.Duration(len(vals)-1)
			if want := map[bool]time.Duration{false: 10 * time.Millisecond, true: 100 * time.Millisecond}[on]; period < want*8/10 || period > want*13/10 {
				t.Fatalf("samples every %v, want about %v", period, want)
			}
		})
	}
}
