package server

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/opcua-chaos/opcua-chaos/server/catalog"
)

// Parameters of the slow-read fault's estimate of the CPU per Read.
const (
	// slowReadWindow is how long one window of Reads lasts: the estimate
	// is taken at the end of a clean one.
	slowReadWindow = 250 * time.Millisecond
	// slowReadMinReads is the fewest Reads a clean window needs for an
	// estimate; a quieter window (idle, or between loads) leaves it as
	// it was, so idle CPU never counts as Reads'.
	slowReadMinReads = 50
	// slowReadCleanEvery makes every 4th window clean: its Reads burn
	// nothing, and the estimate is taken from them alone, so the fault's
	// work, and what it does to the server's batching, never feeds back
	// into the estimate. The other windows burn 4/3 of the share, so the
	// share holds over any whole number of cycles.
	slowReadCleanEvery = 4
)

// slowReadFault is the slow-read fault: every Read request burns busy
// CPU work after it is served, a share of the server's CPU per Read (as
// the harness measures it: the process's CPU over the Reads served, in
// the clean windows) or a set duration. The work is spun on the Read's
// worker (burn), so it is CPU, not a wait.
type slowReadFault struct {
	cfg catalog.SlowRead
	// reads counts the Reads served.
	reads atomic.Int64
	// perRead is the last estimate of the CPU per Read without the
	// fault's work, in ns (0 until a clean window had enough Reads).
	perRead atomic.Int64
	// next is when the current window ends (unix ns); clean is set while
	// it is a clean one.
	next  atomic.Int64
	clean atomic.Bool
	// sink keeps the spin's arithmetic from being optimised away.
	sink atomic.Uint64

	mu        sync.Mutex // one goroutine ends a window
	burning   int        // windows that burn before the next clean one
	lastCPU   time.Duration
	lastReads int64
	started   bool
	cpu       func() (time.Duration, bool) // the process's CPU time
}

// newSlowRead returns the fault's state for cfg (zero: the default).
func newSlowRead(cfg catalog.SlowRead) *slowReadFault {
	if cfg == (catalog.SlowRead{}) {
		cfg.Share = catalog.DefaultSlowReadShare
	}
	sr := &slowReadFault{cfg: cfg, cpu: processCPU}
	sr.clean.Store(true)
	return sr
}

// work returns the CPU work one Read gets now: the fixed value, or the
// share of the estimate scaled to the windows that burn (none in a
// clean one).
func (sr *slowReadFault) work() time.Duration {
	if sr.cfg.Share == 0 {
		return sr.cfg.Fixed
	}
	if sr.clean.Load() {
		return 0
	}
	k := float64(slowReadCleanEvery)
	return time.Duration(sr.cfg.Share * k / (k - 1) * float64(sr.perRead.Load()))
}

// read is called once a Read request was served: it counts it, ends the
// window when its time is up, and burns the Read's work.
func (sr *slowReadFault) read() {
	sr.reads.Add(1)
	if sr.cfg.Share > 0 && time.Now().UnixNano() >= sr.next.Load() && sr.mu.TryLock() {
		sr.endWindow()
		sr.mu.Unlock()
	}
	if d := sr.work(); d > 0 {
		sr.burn(d)
	}
}

// endWindow ends the current window (sr.mu held): a clean one with
// enough Reads gives the estimate, the process's CPU over its Reads, and
// slowReadCleanEvery−1 windows that burn follow it; a clean one without
// (a quiet one, or the first) is followed by another clean one.
func (sr *slowReadFault) endWindow() {
	sr.next.Store(time.Now().Add(slowReadWindow).UnixNano())
	cpu, ok := sr.cpu()
	if !ok {
		return
	}
	reads := sr.reads.Load()
	switch n := reads - sr.lastReads; {
	case !sr.clean.Load():
		sr.burning--
	case sr.started && n >= slowReadMinReads && cpu > sr.lastCPU:
		sr.perRead.Store(int64(cpu-sr.lastCPU) / n)
		sr.burning = slowReadCleanEvery - 1
	}
	sr.started = true
	sr.lastCPU, sr.lastReads = cpu, reads
	sr.clean.Store(sr.burning <= 0)
}

// burn spins for d of wall time on the calling goroutine and returns the
// time spun. The clock is the monotonic one, read without a system call
// (a thread CPU clock costs one per reading, more than a short spin); a
// spin of microseconds is rarely descheduled, so its wall time is its
// CPU.
func (sr *slowReadFault) burn(d time.Duration) time.Duration {
	start := time.Now()
	x := sr.sink.Load() | 1
	for {
		for range 32 {
			x = x*6364136223846793005 + 1442695040888963407
		}
		if spent := time.Since(start); spent >= d {
			sr.sink.Store(x)
			return spent
		}
	}
}
