package server

import (
	"testing"
	"time"

	"github.com/opcua-chaos/opcua-chaos/server/catalog"
)

// TestTrickleOwed: 4 KiB per whole second of wall time, about 14 MiB an
// hour, none before the first second.
func TestTrickleOwed(t *testing.T) {
	for _, tc := range []struct {
		elapsed time.Duration
		want    int64
	}{
		{0, 0},
		{999 * time.Millisecond, 0},
		{time.Second, 4096},
		{2500 * time.Millisecond, 2 * 4096},
		{time.Hour, 3600 * 4096},
	} {
		if got := trickleOwed(tc.elapsed); got != tc.want {
			t.Errorf("trickleOwed(%v) = %d, want %d", tc.elapsed, got, tc.want)
		}
	}
	if perHour := float64(trickleOwed(time.Hour)) / (1 << 20); perHour < 14 || perHour > 14.1 {
		t.Errorf("%.2f MiB an hour, want about 14", perHour)
	}
}

// TestTrickleLeakFault: trickle-leak is selectable by name (OPCUA_FAULTS);
// with it the server keeps memory by the wall clock without serving a
// single request, without it nothing.
func TestTrickleLeakFault(t *testing.T) {
	fs, err := ParseFaults(string(catalog.FaultTrickleLeak))
	if err != nil || !fs.Has(catalog.FaultTrickleLeak) {
		t.Fatalf("ParseFaults(trickle-leak) = %v, %v", fs, err)
	}
	_, on := startServer(t, Config{Faults: fs})
	_, off := startServer(t, Config{})
	deadline := time.Now().Add(10 * time.Second)
	for on.trickle.size() < 2*TrickleLeakPerSecond && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	// the servers started before the wait; allow a tick of scheduling
	if got := on.trickle.size(); got < 2*TrickleLeakPerSecond || got > 4*TrickleLeakPerSecond {
		t.Errorf("kept %d bytes in about 2 s, want %d a second", got, TrickleLeakPerSecond)
	}
	if got := off.trickle.size(); got != 0 {
		t.Errorf("kept %d bytes without the fault", got)
	}
	if got := on.leak.size(); got != 0 {
		t.Errorf("the per-request leak kept %d bytes under trickle-leak", got)
	}
}
