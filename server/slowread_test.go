package server

import (
	"strings"
	"testing"
	"time"

	"github.com/gopcua/opcua/id"
	"github.com/gopcua/opcua/ua"

	"github.com/opcua-chaos/opcua-chaos/server/catalog"
)

// TestParseSlowRead: the switch takes a share, a duration or nothing
// (the default share); anything else, or a value on a switch that takes
// none, is refused with a line saying what it takes.
func TestParseSlowRead(t *testing.T) {
	for spec, want := range map[string]catalog.SlowRead{
		"slow-read":                {Share: catalog.DefaultSlowReadShare},
		"slow-read=5%":             {Share: 0.05},
		"slow-read=20us":           {Fixed: 20 * time.Microsecond},
		"unweighted,slow-read=1ms": {Fixed: time.Millisecond},
	} {
		fs, got, err := ParseFaultValues(spec)
		if err != nil || !fs.Has(catalog.FaultSlowRead) || got != want {
			t.Errorf("%s: %v %+v %v, want %+v", spec, fs, got, err, want)
		}
	}
	for spec, want := range map[string]string{
		"slow-read=fast": "want a share",
		"slow-read=0%":   "above 0",
		"slow-read=-1us": "duration above 0",
		"slow-read=1s":   "at most 100ms",
		"unweighted=3":   "takes no value",
		"slow-reads=10%": `unknown fault "slow-reads"`,
	} {
		if _, _, err := ParseFaultValues(spec); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err %v, want %q", spec, err, want)
		}
	}
}

// TestSlowReadEstimate: the CPU per Read is the process's CPU over a
// clean window's Reads; the windows between burn 4/3 of the share and
// never change it; a quiet clean window keeps the last estimate.
func TestSlowReadEstimate(t *testing.T) {
	var cpu time.Duration
	sr := newSlowRead(catalog.SlowRead{Share: 0.3})
	sr.cpu = func() (time.Duration, bool) { return cpu, true }
	end := func(reads int64, spent time.Duration) {
		sr.reads.Add(reads)
		cpu += spent
		sr.endWindow()
	}
	if sr.work() != 0 {
		t.Error("work before an estimate")
	}
	end(0, 0)                      // the first window starts
	end(1000, 50*time.Millisecond) // a clean window: 50 µs a Read
	if got := time.Duration(sr.perRead.Load()); got != 50*time.Microsecond {
		t.Errorf("per Read %v, want 50µs", got)
	}
	if got := sr.work(); got != 20*time.Microsecond {
		t.Errorf("work %v, want 0.3 × 4/3 of 50µs", got)
	}
	for range slowReadCleanEvery - 1 { // windows that burn: their CPU, however high, is not the estimate
		end(1000, 500*time.Millisecond)
	}
	if got := time.Duration(sr.perRead.Load()); got != 50*time.Microsecond || sr.work() != 0 || !sr.clean.Load() {
		t.Errorf("after the burning windows: per Read %v, work %v, clean %v", got, sr.work(), sr.clean.Load())
	}
	end(slowReadMinReads-1, time.Second) // a quiet clean window
	if got := time.Duration(sr.perRead.Load()); got != 50*time.Microsecond {
		t.Errorf("a quiet window changed the estimate to %v", got)
	}
	if got := newSlowRead(catalog.SlowRead{}).cfg.Share; got != catalog.DefaultSlowReadShare {
		t.Errorf("default share %g", got)
	}
	if got := newSlowRead(catalog.SlowRead{Fixed: time.Millisecond}).work(); got != time.Millisecond {
		t.Errorf("fixed work %v", got)
	}
}

// TestSlowReadBurnsCPU: the work is the process's CPU, not a wait, and
// costs about what it says (generous bounds: the machine is shared).
func TestSlowReadBurnsCPU(t *testing.T) {
	if _, ok := processCPU(); !ok {
		t.Skip("no process CPU clock on this system")
	}
	const n, d = 2000, 20 * time.Microsecond
	sr := newSlowRead(catalog.SlowRead{Fixed: d})
	before, _ := processCPU()
	var spun time.Duration
	for range n {
		spun += sr.burn(d)
	}
	after, _ := processCPU()
	used := after - before
	t.Logf("%d × burn(%v): %v of the process's CPU, %v spun", n, d, used, spun)
	if spun < n*d || used < n*d/2 || used > 3*spun {
		t.Errorf("%d × burn(%v) used %v of CPU and spun %v", n, d, used, spun)
	}
}

// TestSlowReadAddsCPU: with slow-read on, every Read costs the process
// about its set work more CPU (three times a Read's own, measured with the process's CPU clock,
// generous bounds: the client runs in this process too), and a share
// adds about that share of the measured CPU per Read; a Browse costs
// what it costs without the fault.
func TestSlowReadAddsCPU(t *testing.T) {
	if _, ok := processCPU(); !ok {
		t.Skip("no process CPU clock on this system")
	}
	value := &ua.ReadValueID{NodeID: ua.NewNumericNodeID(0, id.Server_ServerStatus_CurrentTime), AttributeID: ua.AttributeIDValue}
	objects := hierarchical(ua.NewNumericNodeID(0, id.ObjectsFolder))
	// perRequest is the process's CPU per request of n requests by f
	perRequest := func(n int, f func()) time.Duration {
		for range n / 4 { // warm up
			f()
		}
		a, _ := processCPU()
		for range n {
			f()
		}
		b, _ := processCPU()
		return (b - a) / time.Duration(n)
	}
	measure := func(spec string) (read, brow time.Duration, srv *Server) {
		fs, slow, err := ParseFaultValues(spec)
		if err != nil {
			t.Fatal(err)
		}
		endpoint, s := startServer(t, Config{Faults: fs, SlowRead: slow})
		c := connect(t, endpoint, anonymous(t, endpoint))
		// a share applies from the first estimate of the CPU per Read on
		for i := 0; s.slowRead != nil && s.slowRead.cfg.Share > 0 && s.slowRead.perRead.Load() == 0 && i < 20000; i++ {
			readValues(t, c, value.NodeID)
		}
		read = perRequest(2000, func() { readValues(t, c, value.NodeID) })
		brow = perRequest(1000, func() { browse(t, c, browseRequest(objects)) })
		return read, brow, s
	}
	offRead, offBrowse, _ := measure("")
	// the set work is three times a Read's own CPU, at least 400 µs: a
	// -race build's Read costs more than half a millisecond and its
	// measurement moves by as much again, which a smaller work would
	// drown in
	fixed := max(400*time.Microsecond, (3 * offRead).Round(100*time.Microsecond))
	onRead, onBrowse, _ := measure("slow-read=" + fixed.String())
	t.Logf("CPU per Read %v without the fault, %v with slow-read=%v; per Browse %v, %v", offRead, onRead, fixed, offBrowse, onBrowse)
	if added := onRead - offRead; added < fixed/2 || added > 3*fixed {
		t.Errorf("slow-read=%v added %v of CPU per Read", fixed, added)
	}
	if added := onBrowse - offBrowse; added > fixed/2 {
		t.Errorf("slow-read=%v added %v of CPU per Browse, which it must not touch", fixed, added)
	}

	shareRead, _, s := measure("slow-read=100%")
	est := time.Duration(s.slowRead.perRead.Load())
	t.Logf("slow-read=100%%: CPU per Read %v, its estimate of the CPU per Read %v", shareRead, est)
	if est <= 0 {
		t.Fatal("no estimate of the CPU per Read")
	}
	if added := shareRead - offRead; added < est*4/10 || added > est*25/10 {
		t.Errorf("slow-read=100%% added %v of CPU per Read, estimated CPU per Read %v", added, est)
	}
}
