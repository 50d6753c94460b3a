package server

import (
	"context"
	"time"
)

// trickleOwed is what the trickle-leak fault owes after elapsed wall
// time: TrickleLeakPerSecond for every whole second.
func trickleOwed(elapsed time.Duration) int64 {
	return int64(elapsed/time.Second) * TrickleLeakPerSecond
}

// trickleLeak is the fault trickle-leak: every period it keeps, for good
// and resident (leak.retain), what trickleOwed says the time since it
// started owes beyond what it kept, so the leak follows the wall clock
// (a late tick catches up) and not the load. It stops keeping more when
// ctx ends; what it kept stays with the server.
func (s *Server) trickleLeak(ctx context.Context, period time.Duration) {
	start := time.Now()
	every(ctx, period, func(now time.Time) {
		if n := trickleOwed(now.Sub(start)) - s.trickle.size(); n > 0 {
			s.trickle.retain(int(n))
		}
	})
}
