package subscription

import (
	"context"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"
)

// SampleTime is the time of one sampling cycle.
type SampleTime struct {
	// Mono is the monotonic time the cycle started (Clock.Now).
	Mono time.Duration
	// Wall is the wall-clock time of Mono.
	Wall time.Time
	// Deadline is the grid point the cycle was due at.
	Deadline time.Duration
}

// Target is something the sampler samples: a monitored item.
type Target interface {
	// Sample takes one sample. It runs on the sampler's goroutine of the
	// target's interval group and must not block.
	Sample(t SampleTime)
}

// Sampler samples targets at fixed rates. Targets with the same sampling
// interval form a group served by one goroutine with one timer: sample k of
// the group is due at t0 + k·interval on the monotonic clock (absolute
// deadlines). A late cycle samples at once and the next deadline stays on the
// grid, so lateness never accumulates; grid points missed entirely are
// skipped and counted.
//
// With Drift (the sampling-drift fault, seed 003's bug) a group instead waits
// one interval after each cycle finished, so timer overshoot and sampling
// time add up on every cycle. With Skips (the sampler-skips fault) a group
// never samples the targets at positions ≡ SkipResidue (mod SkipModulus).
type Sampler struct {
	clock  Clock
	faults SamplerFaults
	log    *slog.Logger
	ctx    context.Context

	mu     sync.Mutex
	groups map[time.Duration]*group
	closed bool
	wg     sync.WaitGroup
	// totals of groups that ended
	done GroupStats
}

// GroupStats are the counters of one interval group (or their sum).
type GroupStats struct {
	// Interval is the group's sampling interval (0 in sums).
	Interval time.Duration
	// Targets is the number of targets in the group now.
	Targets int
	// Cycles is the number of sampling cycles run.
	Cycles int64
	// Samples is the number of Sample calls made.
	Samples int64
	// Late counts cycles that started more than one interval after their
	// deadline.
	Late int64
	// Missed counts grid points skipped because a cycle was that late.
	Missed int64
	// MaxLateness is the largest delay of a cycle start past its deadline.
	MaxLateness time.Duration
	// Busy is the total time spent sampling.
	Busy time.Duration
}

func (s *GroupStats) add(o GroupStats) {
	s.Targets += o.Targets
	s.Cycles += o.Cycles
	s.Samples += o.Samples
	s.Late += o.Late
	s.Missed += o.Missed
	s.MaxLateness = max(s.MaxLateness, o.MaxLateness)
	s.Busy += o.Busy
}

type group struct {
	interval time.Duration
	t0       time.Duration
	cancel   context.CancelFunc

	mu      sync.Mutex
	targets []Target
	index   map[Target]int
	stats   GroupStats
}

// SamplerFaults are the sampler's fault switches.
type SamplerFaults struct {
	// Drift is the sampling-drift fault: wait one interval after each
	// cycle instead of keeping absolute deadlines.
	Drift bool
	// Skips is the sampler-skips fault: never sample the targets at
	// positions ≡ SkipResidue (mod SkipModulus) of a group.
	Skips bool
}

// The sampler-skips fault skips the targets at positions ≡ SkipResidue (mod
// SkipModulus) of each group: positions 7, 71, 135, …, 16 of 1024 targets
// added together. Positions follow the order targets were added; removing
// one moves the last target into its place.
const (
	SkipModulus = 64
	SkipResidue = 7
)

// NewSampler returns a sampler whose groups run until ctx ends or Close,
// with the given fault switches on.
func NewSampler(ctx context.Context, clock Clock, faults SamplerFaults, log *slog.Logger) *Sampler {
	if log == nil {
		log = slog.Default()
	}
	return &Sampler{clock: clock, faults: faults, log: log, ctx: ctx, groups: make(map[time.Duration]*group)}
}

// Add starts sampling t every interval (> 0). Adding a target twice to the
// same interval is a no-op.
func (s *Sampler) Add(t Target, interval time.Duration) {
	if interval <= 0 {
		interval = time.Millisecond
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	g := s.groups[interval]
	if g == nil {
		ctx, cancel := context.WithCancel(s.ctx)
		g = &group{interval: interval, t0: s.clock.Now(), cancel: cancel, index: make(map[Target]int)}
		g.stats.Interval = interval
		s.groups[interval] = g
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.run(ctx, g)
		}()
		s.log.Debug("sampling group started", "interval", interval, "drift", s.faults.Drift, "skips", s.faults.Skips)
	}
	g.mu.Lock()
	if _, dup := g.index[t]; !dup {
		g.index[t] = len(g.targets)
		g.targets = append(g.targets, t)
	}
	g.mu.Unlock()
}

// Remove stops sampling t at interval. A group left empty stops.
func (s *Sampler) Remove(t Target, interval time.Duration) {
	if interval <= 0 {
		interval = time.Millisecond
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.groups[interval]
	if g == nil {
		return
	}
	g.mu.Lock()
	if i, ok := g.index[t]; ok {
		last := len(g.targets) - 1
		g.targets[i] = g.targets[last]
		g.index[g.targets[i]] = i
		g.targets[last] = nil
		g.targets = g.targets[:last]
		delete(g.index, t)
	}
	empty := len(g.targets) == 0
	st := g.stats
	g.mu.Unlock()
	if empty {
		g.cancel()
		delete(s.groups, interval)
		st.Targets = 0
		s.done.add(st)
		s.log.Debug("sampling group stopped", "interval", interval)
	}
}

// Close stops every group and waits for their goroutines.
func (s *Sampler) Close() {
	s.mu.Lock()
	s.closed = true
	for iv, g := range s.groups {
		g.cancel()
		delete(s.groups, iv)
	}
	s.mu.Unlock()
	s.wg.Wait()
}

// Stats returns the counters of each running group and the sum over all
// groups, including the ones that ended.
func (s *Sampler) Stats() (groups []GroupStats, total GroupStats) {
	s.mu.Lock()
	defer s.mu.Unlock()
	total = s.done
	for _, g := range s.groups {
		g.mu.Lock()
		st := g.stats
		st.Targets = len(g.targets)
		g.mu.Unlock()
		groups = append(groups, st)
		total.add(st)
	}
	total.Interval = 0
	return groups, total
}

// sample takes one sample of t. A target that panics is logged and no
// longer sampled; the group goes on.
func (s *Sampler) sample(g *group, t Target, st SampleTime) {
	defer func() {
		if p := recover(); p != nil {
			s.log.Error("panic while sampling: target removed", "interval", g.interval, "panic", p, "stack", string(debug.Stack()))
			s.Remove(t, g.interval)
		}
	}()
	t.Sample(st)
}

// NextDeadline returns the grid deadline that follows a cycle which was due
// at deadline and started at now: deadline + interval, or, when the cycle
// started an interval or more late, the first grid point after now. It also
// returns how many grid points were skipped.
func NextDeadline(t0, interval, deadline, now time.Duration) (next time.Duration, missed int64) {
	next = deadline + interval
	if next > now {
		return next, 0
	}
	k := (now-t0)/interval + 1
	next = t0 + k*interval
	return next, int64((next-deadline)/interval) - 1
}

func (s *Sampler) run(ctx context.Context, g *group) {
	deadline := g.t0 + g.interval
	var targets []Target // this cycle's targets, reused
	for {
		now, _, err := s.clock.SleepUntil(ctx, deadline, nil)
		if err != nil {
			return
		}
		st := SampleTime{Mono: now, Wall: s.clock.Wall(now), Deadline: deadline}
		g.mu.Lock()
		targets = append(targets[:0], g.targets...)
		g.mu.Unlock()
		// Sample without holding any lock of the sampler: a target may
		// read the sampler's own statistics (the Subscription.* and
		// Sampling.* diagnostics nodes), and Stats takes the sampler's
		// and every group's lock. Sampling under g.mu deadlocked the
		// server as soon as such a node was monitored (issue 14). A
		// target removed meanwhile may be sampled once more; items
		// ignore samples once disabled or deleted.
		var sampled int64
		for i, t := range targets {
			if s.faults.Skips && i%SkipModulus == SkipResidue {
				// Fault sampler-skips: this target is never sampled.
				continue
			}
			s.sample(g, t, st)
			sampled++
		}
		clear(targets)
		g.mu.Lock()
		g.stats.Cycles++
		g.stats.Samples += sampled
		lateness := now - deadline
		g.stats.MaxLateness = max(g.stats.MaxLateness, lateness)
		g.mu.Unlock()
		end := s.clock.Now()
		var missed int64
		if s.faults.Drift {
			// Fault sampling-drift: wait one interval after each sample
			// (relative delay), the bug of seed 003.
			deadline = end + g.interval
		} else {
			deadline, missed = NextDeadline(g.t0, g.interval, deadline, now)
		}
		g.mu.Lock()
		g.stats.Busy += end - now
		if lateness >= g.interval {
			g.stats.Late++
		}
		g.stats.Missed += missed
		g.mu.Unlock()
	}
}
