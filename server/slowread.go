package server

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/opcua-chaos/opcua-chaos/server/catalog"
)

// Parameters of the slow-read fault's estimate of the CPU per Read.
const (
	// slowReadWindow is how often the estimate is taken again, from the
	// process's CPU time and the Reads served since the last one.
	slowReadWindow = 250 * time.Millisecond
	// slowReadMinReads is the fewest Reads a window needs for an
	// estimate; a quieter window (idle, or between loads) starts the
	// next one without changing it, so idle CPU never counts as Reads'.
	slowReadMinReads = 50
)

// slowReadFault is the slow-read fault: every Read request burns busy CPU
// work after it is served, a share of the server's CPU per Read (as the
// harness measures it: the process's CPU over the Reads served, the
// fault's own work left out) or a set duration. The work is spun on the
// Read's worker, timed by the thread's CPU clock where there is one, so
// it is CPU, not a wait.
type slowReadFault struct {
	cfg catalog.SlowRead
	// reads counts the Reads served; burnt sums the work added, in ns.
	reads, burnt atomic.Int64
	// perRead is the last estimate of the CPU per Read without the
	// fault's work, in ns (0 until a window had enough Reads).
	perRead atomic.Int64
	// next is when the next window ends (unix ns).
	next atomic.Int64
	// sink keeps the spin's arithmetic from being optimised away.
	sink atomic.Uint64

	mu                       sync.Mutex // one goroutine takes an estimate
	lastCPU                  time.Duration
	lastReads, lastBurnt     int64
	cpu                      func() (time.Duration, bool) // the process's CPU time
	threadCPU                func() (time.Duration, bool) // the calling thread's
	windowStarted, estimated bool
}

// newSlowRead returns the fault's state for cfg (zero: the default).
func newSlowRead(cfg catalog.SlowRead) *slowReadFault {
	if cfg == (catalog.SlowRead{}) {
		cfg.Share = catalog.DefaultSlowReadShare
	}
	return &slowReadFault{cfg: cfg, cpu: processCPU, threadCPU: threadCPU}
}

// work returns the CPU work one Read gets now.
func (sr *slowReadFault) work() time.Duration {
	return sr.cfg.Fixed + time.Duration(sr.cfg.Share*float64(sr.perRead.Load()))
}

// read is called once a Read request was served: it counts it, takes a
// new estimate when a window ended, and burns the Read's work.
func (sr *slowReadFault) read() {
	sr.reads.Add(1)
	if sr.cfg.Share > 0 && time.Now().UnixNano() >= sr.next.Load() && sr.mu.TryLock() {
		sr.estimate()
		sr.mu.Unlock()
	}
	if d := sr.work(); d > 0 {
		sr.burnt.Add(int64(sr.burn(d)))
	}
}

// estimate ends a window (sr.mu held): with enough Reads in it, the CPU
// per Read is the process's CPU less the fault's work over the Reads.
func (sr *slowReadFault) estimate() {
	now := time.Now()
	sr.next.Store(now.Add(slowReadWindow).UnixNano())
	cpu, ok := sr.cpu()
	if !ok {
		return
	}
	reads, burnt := sr.reads.Load(), sr.burnt.Load()
	if n := reads - sr.lastReads; sr.windowStarted && n >= slowReadMinReads {
		if own := cpu - sr.lastCPU - time.Duration(burnt-sr.lastBurnt); own > 0 {
			sr.perRead.Store(int64(own) / n)
		}
	}
	sr.windowStarted = true
	sr.lastCPU, sr.lastReads, sr.lastBurnt = cpu, reads, burnt
}

// burn spins for d of the thread's CPU time (of wall time where the
// thread's clock cannot be read) and returns the time spun.
func (sr *slowReadFault) burn(d time.Duration) time.Duration {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	clock := sr.threadCPU
	if _, ok := clock(); !ok {
		clock = func() (time.Duration, bool) { return time.Duration(time.Now().UnixNano()), true }
	}
	start, _ := clock()
	x := sr.sink.Load() | 1
	for {
		for range 256 {
			x = x*6364136223846793005 + 1442695040888963407
		}
		now, _ := clock()
		if spent := now - start; spent >= d {
			sr.sink.Store(x)
			return spent
		}
	}
}
