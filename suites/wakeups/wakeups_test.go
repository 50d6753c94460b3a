package wakeups_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"

	"github.com/opcua-chaos/opcua-chaos/fixtures/check"
	"github.com/opcua-chaos/opcua-chaos/fixtures/history"
	"github.com/opcua-chaos/opcua-chaos/fixtures/load"
	"github.com/opcua-chaos/opcua-chaos/fixtures/scenario"
	"github.com/opcua-chaos/opcua-chaos/fixtures/spec"
	"github.com/opcua-chaos/opcua-chaos/server/catalog"
	"github.com/opcua-chaos/opcua-chaos/toxics"
)

const property = "wakeups"

// h runs the suite's scenarios; spec.Bootstrap fills it before the first
// spec.
var h = spec.Bootstrap()

func TestWakeups(t *testing.T) { spec.RunSuite(t, property) }

// maxStall is the longest time requests may be outstanding with nothing
// completing (issue: no stall window ≥ 500 ms). The idle gaps of the bursty
// profile are longer, so a request stranded until the next burst shows.
const maxStall = 500 * time.Millisecond

// catches are the reference server's faults every spec is aimed at under
// baseline: a parked worker that misses its wakeup, responses lost on a
// live connection.
var catches = []catalog.Fault{catalog.FaultLostWakeup, catalog.FaultLostResponse}

// headOfLineCatches are the head-of-line spec's: catches, and a server
// that serves one request at a time (serial-dispatch), which only a slow
// request next to fast ones shows: the other specs' Reads take
// microseconds, and one goroutine serving them all stalls nobody. The
// spec needs Slow.<ms>, so without test nodes the fault matrix skips
// serial-dispatch saying so.
var headOfLineCatches = append(slices.Clone(catches), catalog.FaultSerialDispatch)

// secured are the conditions of the rows under SignAndEncrypt: the
// baseline, with every client on SignAndEncrypt channels.
var secured = toxics.Secured(toxics.SecuritySignEncrypt, toxics.Baseline)

// securedShapesCatches are the faults the ample capacity's shapes under
// SignAndEncrypt are aimed at (their None row is aimed at catches):
// response crypto under the channel's send gate, which stalls the 1×200
// and 10×100 pipelines on secured channels only.
var securedShapesCatches = []catalog.Fault{catalog.FaultCryptoInGate}

// securedShapes are the rows under SignAndEncrypt of the shapes table of
// capacity: the ample capacity's in the CI profile (SignAndEncrypt breaks
// deep pipelines first), the scarce capacity's in the nightly.
func securedShapes(capacity string, decorators ...any) []TableEntry {
	if capacity == "ample" {
		return spec.Entries(secured, securedShapesCatches, decorators...)
	}
	return spec.Entries(secured, nil, append(decorators, spec.Nightly)...)
}

// stallCheck is the wakeup property: every request completes within a
// bounded time, and no group (check.BySession or check.ByRun) waits
// maxStall with requests outstanding and nothing completing.
func stallCheck(name, groupBy string, kinds ...history.Kind) check.Spec {
	return check.Spec{Name: name, Config: check.StallConfig{
		GroupBy: groupBy, MaxStall: maxStall, Kinds: kinds,
		// Bounded: queueing behind at most a few hundred requests of a
		// few ms each, plus 2×(20±5) ms of link latency.
		MaxLatency: 3 * time.Second,
	}}
}

// exactlyOnce is every request answered once: a request the server never
// answers on a live connection expires after the request timeout (10 s,
// far beyond MaxLatency) and is named a lost response, not a stall.
func exactlyOnce(name string) check.Spec {
	return check.Spec{Name: name, Config: check.ExactlyOnceConfig{Kinds: []history.Kind{history.KindRead}}}
}

// wakeup is the scenario name under cond with the wakeup checks (named
// after it; progress judged per groupBy) and the reference server's
// worker pool set to workers (0: its default; other targets ignore it),
// driven by loads one after another, each on the target's channel
// security (scenario.Profile: a session refused at the target's limit is
// an answer, one refused below it a failure the sessions check judges).
func wakeup(name string, cond toxics.Condition, workers int, groupBy string, loads ...scenario.Load) scenario.Scenario {
	s := scenario.Scenario{
		Property: property, Name: name, Condition: cond, Loads: loads,
		Labels: map[string]string{"workers": fmt.Sprint(workers)},
		Checks: []check.Spec{stallCheck(name, groupBy, history.KindRead),
			{Name: name + "-errors", Config: check.ErrorBudgetConfig{}}, exactlyOnce(name + "-exactly-once"), check.NoFailedSessions(name + "-sessions")},
	}
	if workers > 0 {
		s.Server = map[string]string{"OPCUA_WORKERS": fmt.Sprint(workers)}
	}
	return s
}

// nemesisSchedule keeps every request moving through a seeded nemesis
// schedule. Nothing in the schedule closes a connection: every request
// completes exactly once, none fails, and no session waits 2 s with
// requests outstanding and nothing completing.
func nemesisSchedule(runFor time.Duration) scenario.Scenario {
	return scenario.Scenario{
		Property: property, Name: "nemesis", Condition: toxics.Scheduled, Schedule: runFor - 5*time.Second,
		Checks: []check.Spec{
			{Name: "nemesis-stall", Config: check.StallConfig{GroupBy: check.BySession, MaxStall: 2 * time.Second, Kinds: []history.Kind{history.KindRead}}},
			{Name: "nemesis-errors", Config: check.ErrorBudgetConfig{}},
			{Name: "nemesis-exactly-once", Config: check.ExactlyOnceConfig{Kinds: []history.Kind{history.KindRead}}},
			check.NoFailedSessions("nemesis-sessions"),
		},
		Loads: []scenario.Load{scenario.Pipeline{Name: "nemesis", Sessions: 10, Outstanding: 50, Sizing: scenario.AsAsked, Duration: runFor, RequestTimeout: 30 * time.Second}},
	}
}

// bursty completes bursts separated by idle gaps, with few workers that
// park often. 4 s: every session wakes the server 3–6 times (idle gaps of
// 0.6–1.2 s), 18–36 wakeups of parked workers per spec; a lost one stalls
// its session for the rest of the run. The gaps are drawn from the run's
// seed: replay with --seed.
func bursty(cond toxics.Condition) scenario.Scenario {
	return wakeup("bursty", cond, 2, check.BySession, scenario.Profile{Seeded: burstyProfile})
}

// burstyProfile draws bursty's sessions from seed, and describes their
// idle gaps for the history's label.
func burstyProfile(seed int64) (load.Profile, string) {
	rng := rand.New(rand.NewPCG(uint64(seed), 0x5eed))
	p := load.Profile{Name: "bursty", Duration: 4 * time.Second}
	gaps := map[string]float64{}
	for i := range 6 {
		idle := time.Duration(600+rng.IntN(600)) * time.Millisecond
		active := time.Duration(20+rng.IntN(80)) * time.Millisecond
		name := fmt.Sprintf("burst%02d", i)
		gaps["idle_ms."+name] = float64(idle.Milliseconds())
		p.Sessions = append(p.Sessions, load.Session{
			Name: name,
			Open: &load.OpenLoop{Rate: 200, Active: active, Idle: idle, Burst: 1 + rng.IntN(8), MaxOutstanding: 200},
		})
	}
	return p, fmt.Sprint(gaps)
}

// shapes completes pipelines of shapes 1×200, 10×100 and 64×1 with the
// server's capacity (its worker pool: 0 is its default, ample). 1.5 s a
// shape: every worker parks and wakes thousands of times in it (a few ms
// a request); the lost-wakeup fault stalled the pipeline within the first
// shape at 2 s a shape.
//
// Each shape's sessions are sized to the target's session limit
// (scenario.SizeDown): against a server with room for fewer
// sessions than a shape opens (S2OPC's 20), the shape opens what the
// limit leaves, named after it (64×1 becomes 18×1) and recorded; the
// reference server's limit leaves every shape as it is.
//
// Progress is judged over the whole server: with one worker, 1 000
// requests queue in one owner's FIFO in blocks of a session's pipeline,
// so a session waits for the other sessions' blocks (≈ 900 requests,
// 200–500 ms under 0.5 CPU) without any wakeup being lost. The seed's
// stall (an emptied owner left with no turn) stops the whole pipeline; a
// session starved for good fails MaxLatency.
func shapes(capacity string, workers int) func(toxics.Condition) scenario.Scenario {
	return func(cond toxics.Condition) scenario.Scenario {
		var loads []scenario.Load
		for _, shape := range []struct{ sessions, outstanding int }{{1, 200}, {10, 100}, {64, 1}} {
			loads = append(loads, scenario.Pipeline{Sessions: shape.sessions, Outstanding: shape.outstanding, Sizing: scenario.SizeDown, Duration: 1500 * time.Millisecond})
		}
		return wakeup("shapes-"+capacity, cond, workers, check.ByRun, loads...)
	}
}

// lockstep answers every round of lockstep requests, the server drained
// between rounds. 4 sessions send 2 requests each at once, and the next
// round only when all 8 are answered: every round ends with the server's
// queue empty and its workers parked, so a request a parked worker was
// never woken for has no later arrival to rescue it. In the other
// scenarios arrivals never stop, and the same fault stalls only when the
// race falls on the last request before a pause. Hundreds of rounds a
// second at baseline, ~20 under latency; the in-process reference server
// with the lost-wakeup fault stranded a request in 12 of 12 runs of 1.5 s
// (2 and 8 workers, 1–4 requests a session).
//
// A round still waiting after a second gets a nudge: one more request,
// which wakes a parked worker. A stranded request is then answered, 1 s
// late, and the stall check names the wait a stall a nudge ended (a lost
// wakeup); a response the server dropped is not brought by it and stays a
// lost response at the request timeout (3 s, well past the nudge). A
// clean round takes milliseconds (~100 ms under latency+cpu), so a clean
// server is never nudged; a wait of 1 s is twice maxStall and fails the
// stall check anyway.
//
// Where the target has service-time nodes, the nudge is a read of
// nudgeService: a request stranded in the server's queue is served as
// soon as the nudge arrives, well before the nudge's own response, while
// a response the channel writer held goes out with the nudge's. The
// nudges check (first) names which (check.Nudges); with a fast nudge it
// names a lost wakeup without a culprit.
func lockstep(cond toxics.Condition) scenario.Scenario {
	p := load.Profile{Name: "lockstep", Duration: time.Second, Lockstep: true,
		Nudge: time.Second, RequestTimeout: 3 * time.Second,
		Sessions: load.Sessions(4, "step", load.Session{Outstanding: 2})}
	if h.Setup.Target.ServiceTime {
		nudge := load.SlowRead(nudgeService)
		p.NudgeRequest = &nudge
	}
	s := wakeup("lockstep", cond, 0, check.ByRun, scenario.Profile{Profile: p})
	s.Checks = append([]check.Spec{{Name: "lockstep-nudges", Config: check.NudgesConfig{Kinds: []history.Kind{history.KindRead}}}}, s.Checks...)
	return s
}

// nudgeService is the service time of the lockstep's nudge where the
// target has Slow.<ms> nodes: four times check.DefaultNudgeService,
// far above a fast read's latency under every CI condition, and well
// inside the request timeout.
const nudgeService = 200 * time.Millisecond

// headOfLine keeps serving fast requests while other sessions' slow
// requests run: 4 sessions keep one 1 s request each in flight; a server
// that serves requests one at a time (head-of-line blocking) leaves the
// fast session waiting a second. 3 s: three rounds of the slow requests;
// serial dispatch stalls the fast session a whole second in each.
func headOfLine(cond toxics.Condition) scenario.Scenario {
	// Slow.<ms> Reads: a target without them is skipped
	return wakeup("head-of-line", cond, 0, check.BySession, scenario.Profile{Profile: load.Profile{
		Name: "head-of-line", Duration: 3 * time.Second,
		Sessions: append(load.Sessions(4, "slow", load.Session{Outstanding: 1, Requests: []load.Request{load.SlowRead(time.Second)}}),
			load.Session{Name: "fast", Outstanding: 4}),
	}})
}

var _ = Describe("No lost wakeups", spec.Property(property), func() {
	It("keeps every request moving through a seeded nemesis schedule", Label("soak"), spec.Condition(toxics.Scheduled.Name), func(ctx SpecContext) {
		h.Run(ctx, nemesisSchedule(spec.SoakFor()))
	}, spec.SoakTimeout(2*time.Minute))

	DescribeTable("completes bursts separated by idle gaps, with few workers that park often", h.Scenario(bursty),
		spec.Entries(toxics.CI(), catches, SpecTimeout(time.Minute)),
		spec.Entries(secured, nil, SpecTimeout(time.Minute), spec.Nightly))

	for _, capacity := range []struct {
		name    string
		workers int
	}{{"ample", 0}, {"scarce", 1}} {
		// catches fault lost-response (shapes-*-exactly-once, shapes-*-errors: lost responses)
		// catches fault crypto-in-gate, ample capacity under SignAndEncrypt (shapes-ample: a stall)
		DescribeTable(fmt.Sprintf("completes pipelines of shapes 1×200, 10×100 and 64×1 with %s server capacity", capacity.name),
			h.Scenario(shapes(capacity.name, capacity.workers)),
			spec.Entries(toxics.CI(), catches, SpecTimeout(90*time.Second)),
			// SignAndEncrypt breaks deep pipelines first: the ample
			// capacity's shapes under it are in the CI profile
			securedShapes(capacity.name, SpecTimeout(90*time.Second)))
	}

	DescribeTable("answers every round of lockstep requests, the server drained between rounds", h.Scenario(lockstep),
		spec.Entries(toxics.CI(), []catalog.Fault{catalog.FaultLostWakeup, catalog.FaultWriterLostWakeup, catalog.FaultLostResponse}, SpecTimeout(time.Minute)),
		spec.Entries(secured, nil, SpecTimeout(time.Minute), spec.Nightly))

	DescribeTable("keeps serving fast requests while other sessions' slow requests run", h.Scenario(headOfLine),
		spec.Entries(toxics.CI(), headOfLineCatches, SpecTimeout(time.Minute)),
		spec.Entries(secured, nil, SpecTimeout(time.Minute), spec.Nightly))
})
