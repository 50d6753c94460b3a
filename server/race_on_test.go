//go:build race

package server

// raceEnabled reports a -race build: real-time measurements at full scale
// are skipped there, the race detector slows the client and server down
// too much to hold 100 Hz for 1024 items on a small machine; and gopcua
// v0.8.0's client renews its security token while its send path reads the
// channel state without a lock (scheduleRenewal against
// SendRequestWithTimeout, a race inside gopcua), so its clients do not
// renew under -race.
const raceEnabled = true
