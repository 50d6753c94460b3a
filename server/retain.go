package server

import (
	"context"
	"runtime/metrics"
	"time"
)

// Parameters of the quirk retain-freed-memory.
const (
	// retainEvery is how often the retained ballast is adjusted.
	retainEvery = 100 * time.Millisecond
	// retainChunk is the unit the ballast grows and shrinks by.
	retainChunk = 1 << 20
	// retainPage is the stride at which a new chunk is written, so that
	// every page of it is resident.
	retainPage = 4 << 10
)

// retainMetrics are the memory the Go runtime holds from the OS: every mapped
// class but the heap pages it released.
var retainMetrics = []string{"/memory/classes/total:bytes", "/memory/classes/heap/released:bytes"}

// runtimeHeld reads the memory the Go runtime holds from the OS, in bytes.
func runtimeHeld(samples []metrics.Sample) uint64 {
	metrics.Read(samples)
	total, released := samples[0].Value.Uint64(), samples[1].Value.Uint64()
	if released > total {
		return 0
	}
	return total - released
}

// ballast holds memory outside the Go heap, resident, in retainChunk
// pieces, so the garbage collector neither scans it nor paces by it.
type ballast struct{ chunks [][]byte }

// size is the ballast's size in bytes.
func (b *ballast) size() uint64 { return uint64(len(b.chunks)) * retainChunk }

// resize grows or shrinks the ballast to the whole chunks within want bytes.
func (b *ballast) resize(want uint64) {
	n := int(want / retainChunk)
	for len(b.chunks) > n {
		last := len(b.chunks) - 1
		freeChunk(b.chunks[last])
		b.chunks[last] = nil
		b.chunks = b.chunks[:last]
	}
	for len(b.chunks) < n {
		c := allocChunk()
		if c == nil {
			return
		}
		for i := 0; i < len(c); i += retainPage {
			c[i] = 1
		}
		b.chunks = append(b.chunks, c)
	}
}

// retainer tops the runtime's memory up to its peak with a ballast.
type retainer struct {
	peak uint64
	b    ballast
}

// step takes a reading of the memory the runtime holds and resizes the
// ballast to the peak so far minus it; it reports the ballast's size before
// and after.
func (r *retainer) step(held uint64) (before, after uint64) {
	r.peak = max(r.peak, held)
	before = r.b.size()
	r.b.resize(r.peak - held)
	return before, r.b.size()
}

// retainMemory is the quirk retain-freed-memory: like a C allocator that
// keeps the pages a burst freed, the process keeps the memory of its
// peak. Every retainEvery it reads what the Go runtime holds from the OS
// and tops it up with a ballast to the highest such reading so far; a later
// burst that needs the memory again shrinks the ballast as the runtime
// grows, so the process's memory rises only when a burst needs more than
// any before. The ballast is freed when ctx is done.
func (s *Server) retainMemory(ctx context.Context) {
	samples := make([]metrics.Sample, len(retainMetrics))
	for i, name := range retainMetrics {
		samples[i].Name = name
	}
	r := retainer{peak: runtimeHeld(samples)}
	defer r.b.resize(0)
	every(ctx, retainEvery, func(time.Time) {
		if before, after := r.step(runtimeHeld(samples)); after != before && (after == 0 || before == 0) {
			s.log.Info("retained freed memory (quirk retain-freed-memory)", "ballast_mib", after>>20, "peak_mib", r.peak>>20)
		}
	})
}
