package subscription

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"
)

// Clock is the monotonic clock the sampler and the publishing loops run on.
// Times are durations since the clock's epoch; Wall converts one to wall
// time for timestamps.
type Clock interface {
	// Now returns the monotonic time since the clock's epoch.
	Now() time.Duration
	// Wall returns the wall-clock time of a monotonic reading.
	Wall(t time.Duration) time.Time
	// SleepUntil blocks until Now() ≥ deadline and returns Now(). It
	// returns early with woken true when wake fires (wake may be nil), or
	// with ctx's error when ctx ends.
	SleepUntil(ctx context.Context, deadline time.Duration, wake <-chan struct{}) (now time.Duration, woken bool, err error)
}

// RealClock is the process's monotonic clock.
type RealClock struct {
	epoch time.Time
	pool  sync.Pool // *time.Timer
}

// NewRealClock returns a clock whose epoch is now.
func NewRealClock() *RealClock { return &RealClock{epoch: time.Now()} }

// Now returns the monotonic time since the epoch.
func (c *RealClock) Now() time.Duration { return time.Since(c.epoch) }

// Wall returns the epoch's wall time plus t.
func (c *RealClock) Wall(t time.Duration) time.Time { return c.epoch.Add(t) }

// SleepUntil implements Clock with one pooled timer per sleeper.
func (c *RealClock) SleepUntil(ctx context.Context, deadline time.Duration, wake <-chan struct{}) (time.Duration, bool, error) {
	d := deadline - c.Now()
	if d <= 0 {
		if err := ctx.Err(); err != nil {
			return c.Now(), false, err
		}
		return c.Now(), false, nil
	}
	t, _ := c.pool.Get().(*time.Timer)
	if t == nil {
		t = time.NewTimer(d)
	} else {
		t.Reset(d)
	}
	defer func() {
		t.Stop() // Go ≥ 1.23: no stale value after Stop
		c.pool.Put(t)
	}()
	select {
	case <-t.C:
		// The runtime may fire a hair early relative to our reading.
		for now := c.Now(); now < deadline; now = c.Now() {
			time.Sleep(deadline - now)
		}
		return c.Now(), false, nil
	case <-wake:
		return c.Now(), true, nil
	case <-ctx.Done():
		return c.Now(), false, ctx.Err()
	}
}

// FakeClock is a Clock for tests: time moves only by Advance or Set, and
// tests can wait for the loops sleeping on it.
type FakeClock struct {
	mu      sync.Mutex
	now     time.Duration
	wall0   time.Time
	waiters []*fakeWaiter
	changed chan struct{} // closed and replaced when waiters change
}

type fakeWaiter struct {
	deadline time.Duration
	ch       chan time.Duration
}

// NewFakeClock returns a fake clock at time 0 whose wall epoch is wall0.
func NewFakeClock(wall0 time.Time) *FakeClock {
	return &FakeClock{wall0: wall0, changed: make(chan struct{})}
}

// Now returns the fake time.
func (c *FakeClock) Now() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Wall returns the wall epoch plus t.
func (c *FakeClock) Wall(t time.Duration) time.Time { return c.wall0.Add(t) }

// SleepUntil implements Clock.
func (c *FakeClock) SleepUntil(ctx context.Context, deadline time.Duration, wake <-chan struct{}) (time.Duration, bool, error) {
	c.mu.Lock()
	if c.now >= deadline {
		now := c.now
		c.mu.Unlock()
		return now, false, ctx.Err()
	}
	w := &fakeWaiter{deadline: deadline, ch: make(chan time.Duration, 1)}
	c.waiters = append(c.waiters, w)
	c.signalLocked()
	c.mu.Unlock()
	select {
	case now := <-w.ch:
		return now, false, nil
	case <-wake:
		return c.drop(w), true, nil
	case <-ctx.Done():
		return c.drop(w), false, ctx.Err()
	}
}

func (c *FakeClock) drop(w *fakeWaiter) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if i := slices.Index(c.waiters, w); i >= 0 {
		c.waiters = slices.Delete(c.waiters, i, i+1)
		c.signalLocked()
	}
	return c.now
}

func (c *FakeClock) signalLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// Advance moves the clock forward by d and wakes the sleepers due.
func (c *FakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.setLocked(c.now + d)
}

// Set moves the clock to t (never backwards) and wakes the sleepers due.
func (c *FakeClock) Set(t time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.setLocked(t)
}

func (c *FakeClock) setLocked(t time.Duration) {
	if t < c.now {
		return
	}
	c.now = t
	kept := c.waiters[:0]
	woke := false
	for _, w := range c.waiters {
		if w.deadline <= t {
			w.ch <- t
			woke = true
		} else {
			kept = append(kept, w)
		}
	}
	clear(c.waiters[len(kept):])
	c.waiters = kept
	if woke {
		c.signalLocked()
	}
}

// ErrWaitTimeout is returned by WaitForSleepers when the sleepers did not
// show up in time.
var ErrWaitTimeout = errors.New("fake clock: timed out waiting for sleepers")

// WaitForSleepers blocks until at least n goroutines sleep on the clock (or
// timeout of real time passes) and returns their deadlines, sorted.
func (c *FakeClock) WaitForSleepers(n int, timeout time.Duration) ([]time.Duration, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		c.mu.Lock()
		if len(c.waiters) >= n {
			ds := make([]time.Duration, len(c.waiters))
			for i, w := range c.waiters {
				ds[i] = w.deadline
			}
			c.mu.Unlock()
			slices.Sort(ds)
			return ds, nil
		}
		ch := c.changed
		c.mu.Unlock()
		select {
		case <-ch:
		case <-t.C:
			return nil, ErrWaitTimeout
		}
	}
}

// Step waits until n goroutines sleep on the clock, moves the clock to the
// earliest of their deadlines (or leaves it if that is past), waits until n
// goroutines sleep again, and returns the new time. It makes a fake-clock
// test deterministic when exactly n loops run.
func (c *FakeClock) Step(n int, timeout time.Duration) (time.Duration, error) {
	ds, err := c.WaitForSleepers(n, timeout)
	if err != nil {
		return 0, err
	}
	c.Set(ds[0])
	if _, err := c.WaitForSleepers(n, timeout); err != nil {
		return 0, err
	}
	return c.Now(), nil
}
