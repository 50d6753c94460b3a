package fairqueue

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// withFaults applies the queue faults named in OPCUA_TEST_FAULTS (the
// server's fault names) to opts, so every test can be run against a
// deliberately broken queue:
//
//	OPCUA_TEST_FAULTS=turn-stall go test ./server/internal/fairqueue
func withFaults(t *testing.T, opts Options) Options {
	t.Helper()
	for _, name := range strings.Split(os.Getenv("OPCUA_TEST_FAULTS"), ",") {
		switch strings.TrimSpace(name) {
		case "unweighted":
			opts.Unweighted = true
		case "turn-stall":
			opts.TurnStall = true
		case "lost-wakeup":
			opts.LostWakeup = true
		case "cancel-leak":
			opts.CancelLeak = true
		case "cancel-double":
			opts.CancelDouble = true
		case "cancel-strands":
			opts.CancelStrands = true
		}
	}
	return opts
}

func weights(w map[string]int) func(string) int {
	return func(o string) int { return w[o] }
}

// checkDrained asserts that nothing is queued and every slot is back.
func checkDrained[T any](t *testing.T, q *Queue[T]) {
	t.Helper()
	st := q.Stats()
	if st.Queued != 0 || st.Charged != 0 {
		t.Errorf("queue not drained: queued=%d slots held=%d (want 0, 0)", st.Queued, st.Charged)
	}
	for _, o := range q.Owners() {
		if o.Queued != 0 || o.Charged != 0 {
			t.Errorf("owner %s: queued=%d slots held=%d (want 0, 0)", o.Owner, o.Queued, o.Charged)
		}
		if o.Enqueued != o.Dispatched+o.Cancelled {
			t.Errorf("owner %s: enqueued %d != dispatched %d + cancelled %d", o.Owner, o.Enqueued, o.Dispatched, o.Cancelled)
		}
	}
}

func mustEnqueue[T any](t *testing.T, q *Queue[T], owner string, v T) *Entry[T] {
	t.Helper()
	e, err := q.Enqueue(owner, v)
	if err != nil {
		t.Fatalf("enqueue %s: %v", owner, err)
	}
	return e
}

func dequeue[T any](t *testing.T, q *Queue[T]) *Entry[T] {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	e, err := q.Dequeue(ctx)
	if err != nil {
		t.Fatalf("dequeue: %v", err)
	}
	return e
}

// TestWeightedRoundsKeepOwnerFIFO: A (weight 2) sends 1–4, B (weight 1)
// sends 5–6; one worker serves 1,2,5,3,4,6.
func TestWeightedRoundsKeepOwnerFIFO(t *testing.T) {
	q := New[int](withFaults(t, Options{Weight: weights(map[string]int{"A": 2, "B": 1})}))
	for i := 1; i <= 4; i++ {
		mustEnqueue(t, q, "A", i)
	}
	for i := 5; i <= 6; i++ {
		mustEnqueue(t, q, "B", i)
	}
	var got []int
	for range 6 {
		got = append(got, dequeue(t, q).Value)
	}
	if want := []int{1, 2, 5, 3, 4, 6}; !slices.Equal(got, want) {
		t.Errorf("service order %v, want %v", got, want)
	}
	checkDrained(t, q)
}

// measureWeightedShare runs one window: both owners backlogged with
// perOwner requests, 8 workers, the first `measured` dispatches counted.
// It returns heavy/light.
func measureWeightedShare(t *testing.T, perOwner, measured int) (heavy, light int) {
	t.Helper()
	q := New[int](withFaults(t, Options{
		Limit:      2 * perOwner,
		OwnerLimit: perOwner,
		Weight:     weights(map[string]int{"heavy": 3, "light": 1}),
	}))
	for i := range perOwner {
		mustEnqueue(t, q, "heavy", i)
		mustEnqueue(t, q, "light", i)
	}
	var taken atomic.Int64
	var nHeavy, nLight atomic.Int64
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 8 {
		wg.Go(func() {
			for taken.Load() < int64(measured) {
				e, err := q.Dequeue(ctx)
				if err != nil {
					return
				}
				// Count by dispatch order, not by who got here first.
				if e.TakeSeq() > uint64(measured) {
					return
				}
				taken.Add(1)
				// Service time: a 1 ms preemption stall is then worth
				// several rounds, as with real requests.
				time.Sleep(serviceTime)
				if e.Owner() == "heavy" {
					nHeavy.Add(1)
				} else {
					nLight.Add(1)
				}
			}
		})
	}
	wg.Wait()
	heavy, light = int(nHeavy.Load()), int(nLight.Load())
	// Both owners must still have been backlogged when the window closed.
	if heavy >= perOwner || light >= perOwner {
		t.Errorf("window not backlogged: heavy=%d light=%d of %d each", heavy, light, perOwner)
	}
	// Drain and check that every slot came back.
	for q.Stats().Queued > 0 {
		dequeue(t, q)
	}
	checkDrained(t, q)
	return heavy, light
}

// serviceTime is how long a request takes in the weighted share test.
const serviceTime = 300 * time.Microsecond

// TestWeightedShareUnderConcurrentWorkers: weights 1:3 under 8 concurrent
// workers; the median heavy/light ratio of 3 windows is within 2.5–3.5.
func TestWeightedShareUnderConcurrentWorkers(t *testing.T) {
	const perOwner, measured = 480, 560
	var ratios []float64
	var windows []string
	for range 3 {
		h, l := measureWeightedShare(t, perOwner, measured)
		r := float64(h) / float64(max(l, 1))
		ratios = append(ratios, r)
		windows = append(windows, fmt.Sprintf("heavy=%d light=%d (%.2f)", h, l, r))
	}
	sorted := slices.Clone(ratios)
	sort.Float64s(sorted)
	median := sorted[1]
	t.Logf("windows: %s; median %.2f", strings.Join(windows, "; "), median)
	if median < 2.5 || median > 3.5 {
		t.Errorf("median heavy/light ratio %.2f outside 2.5–3.5; windows: %s", median, strings.Join(windows, "; "))
	}
}

// TestNoLostWakeups: 8 workers wait; in each round 4 producers enqueue a
// small burst at once. Every request must be served without a further
// arrival: a request stuck for a second means a lost wakeup.
func TestNoLostWakeups(t *testing.T) {
	q := New[int](withFaults(t, Options{}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var served atomic.Int64
	var workers sync.WaitGroup
	for range 8 {
		workers.Go(func() {
			for {
				_, err := q.Dequeue(ctx)
				if err != nil {
					return
				}
				served.Add(1)
			}
		})
	}
	defer func() { cancel(); workers.Wait() }()

	const rounds = 400
	rng := rand.New(rand.NewPCG(1, 2))
	var sent int64
	deadline := time.Now().Add(20 * time.Second)
	for r := range rounds {
		bursts := [4]int{}
		for p := range bursts {
			bursts[p] = 1 + rng.IntN(3)
			sent += int64(bursts[p])
		}
		var start sync.WaitGroup
		start.Add(1)
		var producers sync.WaitGroup
		for p := range 4 {
			producers.Go(func() {
				start.Wait()
				for i := range bursts[p] {
					mustEnqueue(t, q, fmt.Sprintf("p%d", p), i)
				}
			})
		}
		start.Done()
		producers.Wait()
		stuck := time.Now().Add(time.Second)
		for served.Load() < sent {
			if time.Now().After(stuck) {
				t.Fatalf("round %d: %d request(s) queued for 1 s with idle workers and no further arrivals (lost wakeup); waiting workers=%d",
					r, sent-served.Load(), q.Stats().Waiting)
			}
			time.Sleep(20 * time.Microsecond)
		}
		if time.Now().After(deadline) {
			t.Logf("stopping after %d rounds (time bound)", r+1)
			break
		}
	}
	checkDrained(t, q)
}

// TestCancelRacingDequeue: cancellation races dequeue; every request is
// completed exactly once (by a worker or by Cancel) and every slot returns.
func TestCancelRacingDequeue(t *testing.T) {
	const n = 4000
	q := New[int](withFaults(t, Options{Limit: n, Weight: weights(map[string]int{"a": 2})}))
	entries := make([]*Entry[int], n)
	completions := make([]atomic.Int32, n)
	for i := range n {
		entries[i] = mustEnqueue(t, q, []string{"a", "b", "c"}[i%3], i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	var done, lastTaken atomic.Int64
	var wg sync.WaitGroup
	var start sync.WaitGroup
	start.Add(1)
	for range 8 {
		wg.Go(func() {
			start.Wait()
			for done.Load() < n {
				dctx, dcancel := context.WithTimeout(ctx, 50*time.Millisecond)
				e, err := q.Dequeue(dctx)
				dcancel()
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					continue
				}
				lastTaken.Store(int64(e.Value))
				completions[e.Value].Add(1)
				done.Add(1)
				runtime.Gosched() // give the cancellers a chance
			}
		})
	}
	// Two cancellers chase the workers: they cancel the requests just
	// behind the last one dispatched, racing the workers and each other.
	for c := range 2 {
		wg.Go(func() {
			start.Wait()
			rng := rand.New(rand.NewPCG(uint64(c), 3))
			for done.Load() < n && ctx.Err() == nil {
				i := int(lastTaken.Load()) + 1 + rng.IntN(6)
				if i < n && q.Cancel(entries[i]) {
					completions[i].Add(1)
					done.Add(1)
				}
			}
		})
	}
	start.Done()
	wg.Wait()
	// A request that was cancelled but still dispatched shows up late:
	// drain the queue.
	for {
		dctx, dcancel := context.WithTimeout(ctx, 20*time.Millisecond)
		e, err := q.Dequeue(dctx)
		dcancel()
		if err != nil {
			break
		}
		completions[e.Value].Add(1)
	}
	var twice, never int
	for i := range completions {
		switch c := completions[i].Load(); {
		case c == 0:
			never++
		case c > 1:
			twice++
		}
	}
	if twice > 0 || never > 0 {
		t.Errorf("%d requests completed more than once, %d never (of %d)", twice, never, n)
	}
	st := q.Stats()
	t.Logf("cancelled=%d dispatched=%d", st.Cancelled, st.Dispatched)
	if st.Cancelled == 0 || st.Dispatched == 0 {
		t.Errorf("no race: cancelled=%d dispatched=%d", st.Cancelled, st.Dispatched)
	}
	checkDrained(t, q)
}

// TestStopWhileWorkersWaitAndAdmissionsRace: Stop wakes every waiting
// worker, fails later admissions with ErrStopped, and claims every queued
// request exactly once.
func TestStopWhileWorkersWaitAndAdmissionsRace(t *testing.T) {
	q := New[int](withFaults(t, Options{Limit: 100000}))
	var served sync.Map
	var workers sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	workerErrs := make(chan error, 8)
	for range 8 {
		workers.Go(func() {
			for {
				e, err := q.Dequeue(ctx)
				if err != nil {
					workerErrs <- err
					return
				}
				if _, dup := served.LoadOrStore(e.Value, "worker"); dup {
					t.Errorf("request %d served twice", e.Value)
				}
				time.Sleep(10 * time.Microsecond)
			}
		})
	}
	var admitted sync.Map
	var next atomic.Int64
	var producers sync.WaitGroup
	var stopErrs atomic.Int64
	for p := range 4 {
		producers.Go(func() {
			for {
				v := int(next.Add(1))
				_, err := q.Enqueue(fmt.Sprintf("p%d", p), v)
				if errors.Is(err, ErrStopped) {
					stopErrs.Add(1)
					return
				}
				if err != nil {
					t.Errorf("enqueue: %v", err)
					return
				}
				admitted.Store(v, true)
			}
		})
	}
	time.Sleep(20 * time.Millisecond)
	stopped := q.Stop()
	for _, e := range stopped {
		if _, dup := served.LoadOrStore(e.Value, "stop"); dup {
			t.Errorf("request %d served and also returned by Stop", e.Value)
		}
	}
	producers.Wait()
	waitDone := make(chan struct{})
	go func() { workers.Wait(); close(waitDone) }()
	select {
	case <-waitDone:
	case <-time.After(5 * time.Second):
		t.Fatal("workers still waiting 5 s after Stop")
	}
	close(workerErrs)
	for err := range workerErrs {
		if !errors.Is(err, ErrStopped) {
			t.Errorf("worker returned %v, want ErrStopped", err)
		}
	}
	if stopErrs.Load() != 4 {
		t.Errorf("%d producers saw ErrStopped, want 4", stopErrs.Load())
	}
	var lost int
	admitted.Range(func(k, _ any) bool {
		if _, ok := served.Load(k); !ok {
			lost++
		}
		return true
	})
	if lost > 0 {
		t.Errorf("%d admitted requests neither served nor returned by Stop", lost)
	}
	if _, err := q.Dequeue(context.Background()); !errors.Is(err, ErrStopped) {
		t.Errorf("Dequeue after Stop: %v, want ErrStopped", err)
	}
	t.Logf("served by workers or Stop; %d returned by Stop", len(stopped))
	checkDrained(t, q)
}

// TestStress50Owners16Workers: 50 owners, 16 workers, random
// cancellations. Exactly-once completion, per-owner FIFO dispatch order,
// all slots back.
func TestStress50Owners16Workers(t *testing.T) {
	const owners, perOwner = 50, 200
	w := map[string]int{}
	for i := range owners {
		w[fmt.Sprintf("o%02d", i)] = 1 + i%4
	}
	q := New[int](withFaults(t, Options{Limit: owners * perOwner, OwnerLimit: perOwner, Weight: weights(w)}))
	n := owners * perOwner
	entries := make([]atomic.Pointer[Entry[int]], n)
	completions := make([]atomic.Int32, n)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var dispatchedMu sync.Mutex
	var dispatched []*Entry[int]
	var done atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for done.Load() < int64(n) {
				dctx, dcancel := context.WithTimeout(ctx, 50*time.Millisecond)
				e, err := q.Dequeue(dctx)
				dcancel()
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					continue
				}
				completions[e.Value].Add(1)
				dispatchedMu.Lock()
				dispatched = append(dispatched, e)
				dispatchedMu.Unlock()
				done.Add(1)
			}
		})
	}
	var producers sync.WaitGroup
	for o := range owners {
		producers.Go(func() {
			name := fmt.Sprintf("o%02d", o)
			for i := range perOwner {
				v := o*perOwner + i
				e, err := q.Enqueue(name, v)
				for errors.Is(err, ErrOwnerFull) || errors.Is(err, ErrFull) {
					if ctx.Err() != nil {
						t.Errorf("owner %s: queue stayed full", name)
						return
					}
					time.Sleep(100 * time.Microsecond)
					e, err = q.Enqueue(name, v)
				}
				if err != nil {
					t.Errorf("enqueue: %v", err)
					return
				}
				entries[v].Store(e)
			}
		})
	}
	// Cancel random requests while everything runs.
	cancellers := sync.WaitGroup{}
	for c := range 4 {
		cancellers.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(c), 7))
			for done.Load() < int64(n) && ctx.Err() == nil {
				v := rng.IntN(n)
				if q.Cancel(entries[v].Load()) {
					completions[v].Add(1)
					done.Add(1)
				}
				if rng.IntN(16) == 0 {
					time.Sleep(10 * time.Microsecond)
				}
			}
		})
	}
	producers.Wait()
	cancellers.Wait()
	wg.Wait()
	if ctx.Err() != nil {
		t.Fatalf("stress run did not finish in time: done %d of %d, stats %+v", done.Load(), n, q.Stats())
	}
	var twice, never int
	for i := range completions {
		switch c := completions[i].Load(); {
		case c == 0:
			never++
		case c > 1:
			twice++
		}
	}
	if twice > 0 || never > 0 {
		t.Errorf("%d requests completed more than once, %d never (of %d)", twice, never, n)
	}
	// Per-owner FIFO: within an owner, dispatch order is admission order.
	sort.Slice(dispatched, func(i, j int) bool { return dispatched[i].TakeSeq() < dispatched[j].TakeSeq() })
	last := map[string]int{}
	for _, e := range dispatched {
		if prev, ok := last[e.Owner()]; ok && e.Value < prev {
			t.Errorf("owner %s: request %d dispatched after %d", e.Owner(), e.Value, prev)
			break
		}
		last[e.Owner()] = e.Value
	}
	st := q.Stats()
	t.Logf("dispatched %d, cancelled %d", st.Dispatched, st.Cancelled)
	checkDrained(t, q)
}

func TestLimits(t *testing.T) {
	q := New[int](withFaults(t, Options{Limit: 4, OwnerLimit: 3}))
	for i := range 3 {
		mustEnqueue(t, q, "a", i)
	}
	if _, err := q.Enqueue("a", 3); !errors.Is(err, ErrOwnerFull) {
		t.Errorf("owner ceiling: %v, want ErrOwnerFull", err)
	}
	e := mustEnqueue(t, q, "b", 4)
	if _, err := q.Enqueue("c", 5); !errors.Is(err, ErrFull) {
		t.Errorf("total bound: %v, want ErrFull", err)
	}
	if !q.Cancel(e) {
		t.Fatal("cancel of a queued entry failed")
	}
	if q.Cancel(e) {
		t.Error("second cancel claimed the entry again")
	}
	// The cancelled request's slot is back.
	mustEnqueue(t, q, "c", 5)
	if st, _ := q.Owner("a"); st.Rejected != 1 {
		t.Errorf("owner a rejected = %d, want 1", st.Rejected)
	}
	for q.Stats().Queued > 0 {
		dequeue(t, q)
	}
	checkDrained(t, q)
}

// TestEmptiedCountsOwnersRunningDry: an owner's Emptied counter rises each
// time its last queued request leaves (dispatch or cancel), never while it
// stays backlogged. The fairness suites use it as a precondition.
func TestEmptiedCountsOwnersRunningDry(t *testing.T) {
	q := New[int](withFaults(t, Options{Weight: func(string) int { return 3 }}))
	want := func(owner string, n int64, when string) {
		t.Helper()
		if st, _ := q.Owner(owner); st.Emptied != n {
			t.Fatalf("owner %s emptied = %d %s, want %d", owner, st.Emptied, when, n)
		}
	}
	for i := range 4 {
		mustEnqueue(t, q, "a", i)
	}
	for range 3 {
		dequeue(t, q)
	}
	want("a", 0, "with one request still queued")
	dequeue(t, q)
	want("a", 1, "after the last dispatch")
	// Refill and keep topping up: never dry while backlogged.
	mustEnqueue(t, q, "a", 10)
	for i := range 20 {
		mustEnqueue(t, q, "a", 11+i)
		dequeue(t, q)
	}
	want("a", 1, "while backlogged")
	// A cancel that takes an owner's last request also empties it.
	if e := mustEnqueue(t, q, "b", 99); !q.Cancel(e) {
		t.Fatal("cancel failed")
	}
	want("b", 1, "after its only request was cancelled")
	for q.Stats().Queued > 0 {
		dequeue(t, q)
	}
	want("a", 2, "after draining")
	checkDrained(t, q)
}

// TestCancelledEntriesDropValues: Read+Cancel churn behind a queued head
// (workers pinned) neither keeps the cancelled values nor grows the owner's
// FIFO without bound, and the queued entries keep their order.
func TestCancelledEntriesDropValues(t *testing.T) {
	q := New[*[]byte](withFaults(t, Options{Limit: 100}))
	big := func() *[]byte { b := make([]byte, 1024); return &b }
	head, err := q.Enqueue("a", big())
	if err != nil {
		t.Fatal(err)
	}
	var kept []*Entry[*[]byte]
	for i := range 10000 {
		e, err := q.Enqueue("a", big())
		if err != nil {
			t.Fatal(err)
		}
		if i%1000 == 0 {
			kept = append(kept, e) // a few stay queued among the cancelled
			continue
		}
		if !q.Cancel(e) {
			t.Fatalf("Cancel %d failed", i)
		}
		if e.Value != nil {
			t.Fatalf("cancelled entry %d still holds its value", i)
		}
	}
	q.mu.Lock()
	fifo := len(q.owners["a"].fifo)
	q.mu.Unlock()
	if limit := 2*compactAfter + 2*(len(kept)+1); fifo > limit {
		t.Errorf("owner's FIFO holds %d entries after 10 000 Enqueue+Cancel pairs, want ≤ %d", fifo, limit)
	}
	want := append([]*Entry[*[]byte]{head}, kept...)
	for i, w := range want {
		e, err := q.take()
		if err != nil || e != w {
			t.Fatalf("take %d = %v (seq %d), %v; want seq %d", i, e, seqOf(e), err, w.Seq())
		}
		if e.Value == nil {
			t.Errorf("dispatched entry %d lost its value", i)
		}
	}
	if e, _ := q.take(); e != nil {
		t.Errorf("a cancelled entry was dispatched: seq %d", e.Seq())
	}
	checkDrained(t, q)
}

func seqOf[T any](e *Entry[T]) uint64 {
	if e == nil {
		return 0
	}
	return e.Seq()
}

// TestCancelStrandsFault: under the cancel-strands fault, the compaction a
// Cancel runs drops the queued head from the FIFO: it is never dispatched,
// stays queued and holds its slot, while the requests queued after it are
// dispatched in order (only a Cancel of it, as the server's CloseSession
// runs, claims it).
func TestCancelStrandsFault(t *testing.T) {
	q := New[int](Options{Limit: 1000, CancelStrands: true})
	head := mustEnqueue(t, q, "a", -1)
	later := mustEnqueue(t, q, "a", -2)
	for i := range 2*compactAfter + 1 {
		if !q.Cancel(mustEnqueue(t, q, "a", i)) {
			t.Fatalf("Cancel %d failed", i)
		}
	}
	if e, _ := q.take(); e != later {
		t.Fatalf("take = seq %d, want the request queued after the head (seq %d)", seqOf(e), later.Seq())
	}
	if e, _ := q.take(); e != nil {
		t.Fatalf("take = seq %d, want nothing: the head is stranded", e.Seq())
	}
	if st := q.Stats(); st.Queued != 1 || st.Charged != 1 {
		t.Errorf("queued=%d slots held=%d, want the stranded head's 1, 1", st.Queued, st.Charged)
	}
	if !q.Cancel(head) {
		t.Error("Cancel of the stranded head failed")
	}
	checkDrained(t, q)
}
