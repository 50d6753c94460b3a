//go:build race

package server

// raceEnabled reports a -race build: real-time measurements at full scale
// are skipped there, the race detector slows the client and server down
// too much to hold 100 Hz for 1024 items on a small machine.
const raceEnabled = true
