//go:build !linux

package server

import "time"

// processCPU is the process's CPU time: not read on this system (the
// slow-read fault's share is then 0; a fixed value still applies).
func processCPU() (time.Duration, bool) { return 0, false }
