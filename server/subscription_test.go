package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/gopcua/opcua"
	"github.com/gopcua/opcua/ua"
)

// subRun configures one subscription measurement.
type subRun struct {
	Kind        string        // "SampledCounter" or "FastCounter"
	Items       int           // monitored items
	Sampling    time.Duration // sampling interval
	Publishing  time.Duration // publishing interval
	Outstanding int           // Publish requests kept outstanding
	Warmup      time.Duration
	Windows     int
	Window      time.Duration
}

// subResult is what a client received.
type subResult struct {
	// Fractions[w] is the smallest, over items, of the samples received
	// whose SourceTimestamp falls in window w, divided by window/interval.
	Fractions []float64
	// Median is the median of Fractions.
	Median float64
	// Gaps counts SampledCounter values never received between an item's
	// first and last (0 means no sample was lost in a queue).
	Gaps int64
	// Notifications and Messages received; PublishErrors are Publish
	// requests answered with an error (timeouts included).
	Notifications, Messages, PublishErrors int64
	// Server is the server's sampling diagnostics after the run.
	Server string
}

func (r subResult) String() string {
	return fmt.Sprintf("median %.4f windows %.4f gaps %d notifications %d messages %d publish errors %d; server %s",
		r.Median, r.Fractions, r.Gaps, r.Notifications, r.Messages, r.PublishErrors, r.Server)
}

// measureSubscription subscribes one client to run.Items counter nodes and
// keeps run.Outstanding Publish requests outstanding with its own loops
// (gopcua's subscription keeps only one), acknowledging every message. It
// judges each window by the samples' SourceTimestamps, so the result does
// not depend on when the client got around to decoding them.
func measureSubscription(t testing.TB, endpoint string, run subRun) subResult {
	t.Helper()
	// A client (session) of its own: closing it deletes the subscription,
	// and no Publish request of an earlier run is left queued.
	c, err := dial(endpoint)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = c.Close(ctx)
	}()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	send := func(req ua.Request) (ua.Response, error) {
		var resp ua.Response
		err := c.Send(ctx, req, func(r ua.Response) error { resp = r; return nil })
		if err == nil {
			if f, ok := resp.(*ua.ServiceFault); ok {
				err = f.ResponseHeader.ServiceResult
			}
		}
		return resp, err
	}
	r, err := send(&ua.CreateSubscriptionRequest{
		RequestedPublishingInterval: float64(run.Publishing) / float64(time.Millisecond),
		RequestedLifetimeCount:      6000,
		RequestedMaxKeepAliveCount:  100,
		PublishingEnabled:           true,
	})
	if err != nil {
		t.Fatalf("CreateSubscription: %v", err)
	}
	subID := r.(*ua.CreateSubscriptionResponse).SubscriptionID
	// Queue: a publishing interval of samples, with room for late Publish.
	queue := uint32(4 * max(1, run.Publishing/run.Sampling))
	req := &ua.CreateMonitoredItemsRequest{SubscriptionID: subID, TimestampsToReturn: ua.TimestampsToReturnSource}
	for i := range run.Items {
		req.ItemsToCreate = append(req.ItemsToCreate, &ua.MonitoredItemCreateRequest{
			ItemToMonitor: &ua.ReadValueID{
				NodeID:       ua.NewStringNodeID(1, fmt.Sprintf("%s.%d", run.Kind, i)),
				AttributeID:  ua.AttributeIDValue,
				DataEncoding: &ua.QualifiedName{},
			},
			MonitoringMode: ua.MonitoringModeReporting,
			RequestedParameters: &ua.MonitoringParameters{
				ClientHandle:     uint32(i),
				SamplingInterval: float64(run.Sampling) / float64(time.Millisecond),
				QueueSize:        queue,
				DiscardOldest:    true,
				Filter:           ua.NewExtensionObject(nil),
			},
		})
	}
	r, err = send(req)
	if err != nil {
		t.Fatalf("CreateMonitoredItems: %v", err)
	}
	for i, res := range r.(*ua.CreateMonitoredItemsResponse).Results {
		if res.StatusCode != ua.StatusOK {
			t.Fatalf("item %d: %v", i, res.StatusCode)
		}
	}

	var (
		mu    sync.Mutex
		times = make([][]int64, run.Items) // SourceTimestamps per item (unix ns)
		vals  = make([][]int64, run.Items) // SampledCounter values per item
		acks  []*ua.SubscriptionAcknowledgement
		res   subResult
	)
	record := func(p *ua.PublishResponse) {
		mu.Lock()
		defer mu.Unlock()
		if p.NotificationMessage == nil || len(p.NotificationMessage.NotificationData) == 0 {
			return
		}
		res.Messages++
		acks = append(acks, &ua.SubscriptionAcknowledgement{SubscriptionID: p.SubscriptionID, SequenceNumber: p.NotificationMessage.SequenceNumber})
		for _, eo := range p.NotificationMessage.NotificationData {
			dc, ok := eo.Value.(*ua.DataChangeNotification)
			if !ok {
				continue
			}
			for _, n := range dc.MonitoredItems {
				h := int(n.ClientHandle)
				if h >= run.Items || n.Value == nil || n.Value.Value == nil {
					continue
				}
				res.Notifications++
				times[h] = append(times[h], n.Value.SourceTimestamp.UnixNano())
				if v, ok := n.Value.Value.Value().(int64); ok && run.Kind == "SampledCounter" {
					vals[h] = append(vals[h], v)
				}
			}
		}
	}
	var wg sync.WaitGroup
	for range run.Outstanding {
		wg.Go(func() {
			for ctx.Err() == nil {
				mu.Lock()
				mine := acks
				acks = nil
				mu.Unlock()
				resp, err := send(&ua.PublishRequest{SubscriptionAcknowledgements: mine})
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					mu.Lock()
					res.PublishErrors++
					mu.Unlock()
					if errors.Is(err, ua.StatusBadNoSubscription) || errors.Is(err, ua.StatusBadSessionIDInvalid) {
						return
					}
					time.Sleep(10 * time.Millisecond)
					continue
				}
				record(resp.(*ua.PublishResponse))
			}
		})
	}
	start := time.Now()
	total := run.Warmup + time.Duration(run.Windows)*run.Window
	time.Sleep(total + 2*run.Publishing + 200*time.Millisecond) // the last window's samples arrive
	cancel()
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	res.Server = samplingStats(t, c)
	expected := float64(run.Window) / float64(run.Sampling)
	for w := range run.Windows {
		from := start.Add(run.Warmup + time.Duration(w)*run.Window).UnixNano()
		to := from + int64(run.Window)
		lowest := 2.0
		for _, ts := range times {
			n := 0
			for _, x := range ts {
				if x >= from && x < to {
					n++
				}
			}
			lowest = min(lowest, float64(n)/expected)
		}
		res.Fractions = append(res.Fractions, lowest)
	}
	// Messages are recorded by several goroutines in any order: count the
	// values missing between each item's smallest and largest.
	for _, vs := range vals {
		if len(vs) > 0 {
			lo, hi := slices.Min(vs), slices.Max(vs)
			res.Gaps += hi - lo + 1 - int64(len(vs))
		}
	}
	sorted := slices.Clone(res.Fractions)
	sort.Float64s(sorted)
	res.Median = sorted[len(sorted)/2]
	return res
}

func defaultSubRun(kind string, items int) subRun {
	return subRun{
		Kind: kind, Items: items,
		Sampling: 10 * time.Millisecond, Publishing: 100 * time.Millisecond,
		Outstanding: 8, Warmup: 500 * time.Millisecond, Windows: 3, Window: time.Second,
	}
}

// e2eItems is the large item count of the end-to-end measurements: 1024,
// or 32 under -race (run without -race for the full figure:
// go test -run 'TestSubscription' -v ./server/).
func e2eItems(t *testing.T) int {
	if raceEnabled {
		t.Log("-race build: 32 items instead of 1024 (go test -run TestSubscription ./server/ for 1024)")
		return 32
	}
	return 1024
}

// TestSubscription100Hz: a gopcua client subscribed to 1 and 1024
// SampledCounter and FastCounter items at 10 ms, with 8 Publish requests
// outstanding, receives ≥ 99 % of the samples of every item (median of
// three 1 s windows, judged by SourceTimestamp), and no SampledCounter
// value is lost in a queue.
func TestSubscription100Hz(t *testing.T) {
	if testing.Short() {
		t.Skip("real-time measurement")
	}
	endpoint, _ := startServer(t, Config{Counters: 1024})
	for _, kind := range []string{"SampledCounter", "FastCounter"} {
		for _, items := range []int{1, e2eItems(t)} {
			t.Run(fmt.Sprintf("%s/%d", kind, items), func(t *testing.T) {
				// Best of up to 3 attempts: a busy shared machine can only
				// make a run look worse, so one clean run shows the server
				// holds the rate (the drift test keeps the bar honest).
				var res subResult
				for attempt := 1; attempt <= 3; attempt++ {
					r := measureSubscription(t, endpoint, defaultSubRun(kind, items))
					t.Logf("attempt %d, %s × %d at 10 ms: %v", attempt, kind, items, r)
					if attempt == 1 || r.Median > res.Median {
						res = r
					}
					if res.Median >= 0.99 && res.Gaps == 0 {
						break
					}
				}
				if res.Median < 0.99 {
					t.Errorf("median fraction %.4f < 0.99 (%v)", res.Median, res)
				}
				if res.Gaps > 0 {
					t.Errorf("%d SampledCounter values lost between notifications", res.Gaps)
				}
			})
		}
	}
}

// TestSubscriptionSamplingDriftCaught: with the sampling-drift fault the
// same measurement of 1024 (32 under -race) SampledCounter items falls
// below 99 %.
func TestSubscriptionSamplingDriftCaught(t *testing.T) {
	if testing.Short() {
		t.Skip("real-time measurement")
	}
	endpoint, _ := startServer(t, Config{Counters: 1024, Faults: Faults{FaultSamplingDrift: true}})
	n := e2eItems(t)
	// Best of 2 attempts, as generous as the clean test's best of 3 needs
	// to be for a result this far below the bar.
	var res subResult
	for attempt := 1; attempt <= 2; attempt++ {
		r := measureSubscription(t, endpoint, defaultSubRun("SampledCounter", n))
		t.Logf("attempt %d, sampling-drift, SampledCounter × %d at 10 ms: %v", attempt, n, r)
		if attempt == 1 || r.Median > res.Median {
			res = r
		}
	}
	if res.Median >= 0.99 {
		t.Errorf("sampling-drift not caught: median fraction %.4f ≥ 0.99", res.Median)
	}
}

// samplingStats reads the server's sampling diagnostics nodes.
func samplingStats(t testing.TB, c *opcua.Client) string {
	t.Helper()
	names := []string{NodeSamplingCycles, NodeSamplingLate, NodeSamplingMissed, NodeSamplingMaxLateness, NodeNotifications}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := &ua.ReadRequest{}
	for _, n := range names {
		req.NodesToRead = append(req.NodesToRead, &ua.ReadValueID{NodeID: counter(n), AttributeID: ua.AttributeIDValue})
	}
	resp, err := c.Read(ctx, req)
	if err != nil {
		return "stats: " + err.Error()
	}
	out := ""
	for i, dv := range resp.Results {
		if dv.Value != nil {
			out += fmt.Sprintf("%s=%v ", names[i], dv.Value.Value())
		}
	}
	return out
}
