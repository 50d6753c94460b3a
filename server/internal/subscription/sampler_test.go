package subscription

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/gopcua/opcua/ua"
)

// costTarget records its sample times and burns fake time, like a sampling
// pass over many items would.
type costTarget struct {
	clock *FakeClock
	cost  time.Duration
	mu    sync.Mutex
	times []SampleTime
}

func (c *costTarget) Sample(t SampleTime) {
	c.mu.Lock()
	c.times = append(c.times, t)
	c.mu.Unlock()
	c.clock.Advance(c.cost)
}

type gridResult struct {
	cycles   int
	offGrid  int           // deadlines not on t0 + k·interval
	fraction float64       // cycles / grid points elapsed
	missed   int64         // grid points the sampler reported skipped
	span     time.Duration // last deadline − t0
	next     time.Duration // the deadline pending at the end
}

// runFakeGrid runs one sampling group on a fake clock for n cycles. Every
// cycle wakes up late by a random overshoot of up to maxOvershoot, costs
// `cost` of fake time, and every lateEvery-th cycle is woken 2.5 intervals
// late.
func runFakeGrid(t *testing.T, drift bool, n int, interval, maxOvershoot, cost time.Duration, lateEvery int) gridResult {
	t.Helper()
	clk := NewFakeClock(time.Unix(1_700_000_000, 0))
	clk.Set(time.Second) // t0 away from zero
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := NewSampler(ctx, clk, SamplerFaults{Drift: drift}, nil)
	defer s.Close()
	tgt := &costTarget{clock: clk, cost: cost}
	t0 := clk.Now()
	s.Add(tgt, interval)
	rng := rand.New(rand.NewPCG(1, 2))
	var res gridResult
	var last time.Duration
	for i := range n {
		ds, err := clk.WaitForSleepers(1, 5*time.Second)
		if err != nil {
			t.Fatalf("cycle %d: %v", i, err)
		}
		d := ds[0]
		if (d-t0)%interval != 0 {
			res.offGrid++
		}
		if d <= last {
			t.Fatalf("cycle %d: deadline %v not after %v", i, d, last)
		}
		last = d
		wake := d + time.Duration(rng.Int64N(int64(maxOvershoot)+1))
		if lateEvery > 0 && i%lateEvery == lateEvery-1 {
			wake = d + 5*interval/2
		}
		clk.Set(wake)
	}
	ds, err := clk.WaitForSleepers(1, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	res.next = ds[0]
	tgt.mu.Lock()
	res.cycles = len(tgt.times)
	tgt.mu.Unlock()
	_, total := s.Stats()
	res.missed = total.Missed
	res.span = last - t0
	res.fraction = float64(res.cycles) / float64(res.span/interval)
	return res
}

// TestSamplerDeadlinesStayOnGrid: over 10 000 cycles with random timer
// overshoot, sampling cost and occasional very late wake-ups, every deadline
// is t0 + k·interval, and cycles plus skipped points account for every grid
// point.
func TestSamplerDeadlinesStayOnGrid(t *testing.T) {
	const n = 10_000
	iv := 10 * time.Millisecond
	r := runFakeGrid(t, false, n, iv, 2*time.Millisecond, 300*time.Microsecond, 1000)
	if r.offGrid != 0 {
		t.Errorf("%d of %d deadlines off the grid", r.offGrid, n)
	}
	// Grid points before the pending deadline were each sampled or skipped.
	points := int64((r.next-time.Second)/iv) - 1
	if got := int64(r.cycles) + r.missed; got != points {
		t.Errorf("cycles %d + missed %d = %d, want %d grid points", r.cycles, r.missed, got, points)
	}
	// Each 2.5-interval wake-up skips exactly 2 points.
	if want := int64(2 * (n / 1000)); r.missed != want {
		t.Errorf("missed %d grid points, want %d", r.missed, want)
	}
	if r.fraction < 0.99 {
		t.Errorf("sampled fraction %.4f < 0.99", r.fraction)
	}
	t.Logf("clean: %d cycles over %d grid points, fraction %.4f, missed %d", r.cycles, points, r.fraction, r.missed)
}

// TestSamplerDriftFaultLeavesGrid: the same run with the sampling-drift
// fault drifts off the grid and loses samples (the seed 003 bug).
func TestSamplerDriftFaultLeavesGrid(t *testing.T) {
	const n = 2000
	r := runFakeGrid(t, true, n, 10*time.Millisecond, 2*time.Millisecond, 300*time.Microsecond, 0)
	if r.offGrid < n/2 {
		t.Errorf("drift: only %d of %d deadlines off the grid", r.offGrid, n)
	}
	if r.fraction >= 0.97 {
		t.Errorf("drift: fraction %.4f, want < 0.97", r.fraction)
	}
	t.Logf("drift: fraction %.4f, %d of %d deadlines off the grid", r.fraction, r.offGrid, n)
}

func TestNextDeadline(t *testing.T) {
	ms := time.Millisecond
	for _, c := range []struct {
		deadline, now, want time.Duration
		missed              int64
	}{
		{10 * ms, 10 * ms, 20 * ms, 0},
		{10 * ms, 19 * ms, 20 * ms, 0},
		{10 * ms, 20 * ms, 30 * ms, 1},
		{10 * ms, 25 * ms, 30 * ms, 1},
		{10 * ms, 51 * ms, 60 * ms, 4},
	} {
		got, missed := NextDeadline(0, 10*ms, c.deadline, c.now)
		if got != c.want || missed != c.missed {
			t.Errorf("NextDeadline(0, 10ms, %v, %v) = %v, %d; want %v, %d", c.deadline, c.now, got, missed, c.want, c.missed)
		}
	}
}

// samplingRun measures SampledCounter deltas of items sampled on the real
// clock: for each window, the smallest per-item fraction delta/(window/iv);
// it returns the median over windows and every window's value.
func samplingRun(t *testing.T, drift bool, items int, iv time.Duration, windows int, window time.Duration) (float64, []float64) {
	t.Helper()
	clk := NewRealClock()
	ctrs := NewCounters(1, items, clk)
	m := New(context.Background(), Options{Clock: clk, Source: ctrs, SamplingDrift: drift})
	defer m.Close()
	s, _ := m.Session("test")
	cs := s.CreateSubscription(&ua.CreateSubscriptionRequest{
		RequestHeader: &ua.RequestHeader{}, RequestedPublishingInterval: 1000, PublishingEnabled: true,
	}).(*ua.CreateSubscriptionResponse)
	req := &ua.CreateMonitoredItemsRequest{RequestHeader: &ua.RequestHeader{}, SubscriptionID: cs.SubscriptionID, TimestampsToReturn: ua.TimestampsToReturnSource}
	for i := range items {
		req.ItemsToCreate = append(req.ItemsToCreate, &ua.MonitoredItemCreateRequest{
			ItemToMonitor:  &ua.ReadValueID{NodeID: ua.NewStringNodeID(1, SampledCounterPrefix+itoa(i)), AttributeID: ua.AttributeIDValue},
			MonitoringMode: ua.MonitoringModeReporting,
			RequestedParameters: &ua.MonitoringParameters{
				ClientHandle: uint32(i), SamplingInterval: float64(iv) / float64(time.Millisecond), QueueSize: 1, DiscardOldest: true,
			},
		})
	}
	resp := s.CreateMonitoredItems(req).(*ua.CreateMonitoredItemsResponse)
	for i, r := range resp.Results {
		if r.StatusCode != ua.StatusOK {
			t.Fatalf("item %d: %v", i, r.StatusCode)
		}
	}
	// snapshot waits for a cycle to finish (the last item's counter moves)
	// and copies every counter with the time.
	snapshot := func() ([]int64, time.Time) {
		lastIdx := items - 1
		before := ctrs.Sampled(lastIdx)
		deadline := time.Now().Add(time.Second)
		for ctrs.Sampled(lastIdx) == before && time.Now().Before(deadline) {
			time.Sleep(100 * time.Microsecond)
		}
		at := time.Now()
		out := make([]int64, items)
		for i := range out {
			out[i] = ctrs.Sampled(i)
		}
		return out, at
	}
	time.Sleep(300 * time.Millisecond) // warm-up
	prev, prevAt := snapshot()
	var fracs []float64
	for range windows {
		time.Sleep(window)
		cur, at := snapshot()
		expected := float64(at.Sub(prevAt)) / float64(iv)
		lowest := 2.0
		for i := range cur {
			lowest = min(lowest, float64(cur[i]-prev[i])/expected)
		}
		fracs = append(fracs, lowest)
		prev, prevAt = cur, at
	}
	_, st := m.Sampler().Stats()
	t.Logf("sampler: %d cycles, %d late, %d missed, max lateness %v, busy %v per cycle",
		st.Cycles, st.Late, st.Missed, st.MaxLateness, st.Busy/time.Duration(max(st.Cycles, 1)))
	sorted := slices.Clone(fracs)
	sort.Float64s(sorted)
	return sorted[len(sorted)/2], fracs
}

func itoa(i int) string { return strconv.Itoa(i) }

// TestSampling100Hz: 1 and 1024 SampledCounter items at 10 ms on the real
// clock take ≥ 99 % of their samples (the smallest item's fraction per 1 s
// window, median of 5 windows, best of up to 3 runs).
func TestSampling100Hz(t *testing.T) {
	if testing.Short() {
		t.Skip("real-clock measurement")
	}
	for _, items := range []int{1, 1024} {
		// Best of up to 3 attempts: a busy shared machine only makes a run
		// look worse; the drift test below keeps the bar honest.
		var med float64
		var all []float64
		for attempt := 1; attempt <= 3 && med < 0.99; attempt++ {
			m, a := samplingRun(t, false, items, 10*time.Millisecond, 5, time.Second)
			t.Logf("attempt %d, clean, %d items at 10 ms: median %.4f, windows %.4f", attempt, items, m, a)
			if m > med {
				med, all = m, a
			}
		}
		if med < 0.99 {
			t.Errorf("%d items: median fraction %.4f < 0.99 (windows %.4f)", items, med, all)
		}
	}
}

// TestSamplingDriftFaultCaught: the same measurement with the
// sampling-drift fault fails the 99 % criterion.
func TestSamplingDriftFaultCaught(t *testing.T) {
	if testing.Short() {
		t.Skip("real-clock measurement")
	}
	var med float64
	var all []float64
	for attempt := 1; attempt <= 2; attempt++ {
		m, a := samplingRun(t, true, 1024, 10*time.Millisecond, 3, time.Second)
		t.Logf("attempt %d, sampling-drift, 1024 items at 10 ms: median %.4f, windows %.4f", attempt, m, a)
		if m > med {
			med, all = m, a
		}
	}
	if med >= 0.99 {
		t.Errorf("sampling-drift not caught: median fraction %.4f ≥ 0.99 (windows %.4f)", med, all)
	}
}

// BenchmarkSampleCycle1024 is one sampling pass over 1024 SampledCounter
// items.
func BenchmarkSampleCycle1024(b *testing.B) {
	clk := NewRealClock()
	ctrs := NewCounters(1, 1024, clk)
	var items []*MonitoredItem
	for i := range 1024 {
		read, _ := ctrs.Resolve(ua.NewStringNodeID(1, SampledCounterPrefix+itoa(i)), ua.AttributeIDValue)
		items = append(items, &MonitoredItem{read: read, mode: ua.MonitoringModeReporting, active: true, ts: ua.TimestampsToReturnBoth, discardOldest: true, size: 10})
	}
	b.ResetTimer()
	for range b.N {
		now := clk.Now()
		st := SampleTime{Mono: now, Wall: clk.Wall(now), Deadline: now}
		for _, it := range items {
			it.Sample(st)
		}
	}
}

// statsTarget reads its own sampler's statistics in every sample, as a
// monitored item on ns=1;s=Subscription.Count or Sampling.* does.
type statsTarget struct {
	s       *Sampler
	samples chan struct{}
}

func (st *statsTarget) Sample(SampleTime) {
	st.s.Stats()
	select {
	case st.samples <- struct{}{}:
	default:
	}
}

// TestSamplingOwnStatsNoDeadlock: a target that reads the sampler's
// statistics while it is sampled keeps being sampled, and Add, Remove,
// Stats and Close keep working (issue 14: the group sampled under its lock
// and Stats took it again).
func TestSamplingOwnStatsNoDeadlock(t *testing.T) {
	s := NewSampler(context.Background(), NewRealClock(), SamplerFaults{}, nil)
	tgt := &statsTarget{s: s, samples: make(chan struct{}, 1)}
	s.Add(tgt, time.Millisecond)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 20 {
			<-tgt.samples
			other := &statsTarget{s: s, samples: make(chan struct{}, 1)}
			s.Add(other, time.Duration(1+i%2)*time.Millisecond)
			s.Stats()
			s.Remove(other, time.Duration(1+i%2)*time.Millisecond)
		}
		s.Remove(tgt, time.Millisecond)
		s.Close()
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("sampler deadlocked: 20 samples, Add, Remove, Stats and Close did not finish within 5 s")
	}
}

// panicTarget panics when sampled.
type panicTarget struct{}

func (panicTarget) Sample(SampleTime) { panic("sample") }

// TestSamplingPanicRemovesTarget: a target that panics is dropped; the
// group samples the others on.
func TestSamplingPanicRemovesTarget(t *testing.T) {
	s := NewSampler(context.Background(), NewRealClock(), SamplerFaults{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer s.Close()
	ok := &statsTarget{s: s, samples: make(chan struct{}, 1)}
	s.Add(panicTarget{}, time.Millisecond)
	s.Add(ok, time.Millisecond)
	for range 5 {
		select {
		case <-ok.samples:
		case <-time.After(5 * time.Second):
			t.Fatal("the group stopped sampling after a panic")
		}
	}
	if groups, _ := s.Stats(); len(groups) != 1 || groups[0].Targets != 1 {
		t.Errorf("groups %+v, want one group with the one good target", groups)
	}
}

// countTarget counts its samples.
type countTarget struct {
	mu sync.Mutex
	n  int
}

func (c *countTarget) Sample(SampleTime) {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
}

func (c *countTarget) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// TestSamplerSkipsFault: with the sampler-skips fault a group never samples
// its targets at positions ≡ SkipResidue (mod SkipModulus) and samples every
// other one each cycle; without it every target is sampled each cycle. A
// lone target (position 0) is sampled either way.
func TestSamplerSkipsFault(t *testing.T) {
	const targets, cycles = 2*SkipModulus + 10, 5
	iv := 10 * time.Millisecond
	for _, skips := range []bool{false, true} {
		t.Run(fmt.Sprintf("skips=%v", skips), func(t *testing.T) {
			clk := NewFakeClock(time.Unix(1_700_000_000, 0))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s := NewSampler(ctx, clk, SamplerFaults{Skips: skips}, nil)
			defer s.Close()
			group := make([]*countTarget, targets)
			for i := range group {
				group[i] = &countTarget{}
				s.Add(group[i], iv)
			}
			lone := &countTarget{}
			s.Add(lone, 2*iv) // a group of its own
			for range 2 * cycles {
				if _, err := clk.Step(2, 5*time.Second); err != nil {
					t.Fatal(err)
				}
			}
			// Step returns once both groups sleep again: every cycle has
			// finished.
			ran := group[targets-1].count()
			var skipped []int
			for i, c := range group {
				switch n := c.count(); {
				case n == 0:
					skipped = append(skipped, i)
				case n != ran:
					t.Errorf("target %d sampled %d times, want %d", i, n, ran)
				}
			}
			var want []int
			if skips {
				for i := SkipResidue; i < targets; i += SkipModulus {
					want = append(want, i)
				}
			}
			if !slices.Equal(skipped, want) {
				t.Errorf("never sampled: %v, want %v", skipped, want)
			}
			if lone.count() == 0 {
				t.Errorf("the lone target of its own group was never sampled")
			}
			_, total := s.Stats()
			t.Logf("skips=%v: %d cycles of the big group, never sampled %v, samples %d", skips, ran, skipped, total.Samples)
		})
	}
}
