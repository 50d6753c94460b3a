package cancellation_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/gopcua/opcua/ua"
	. "github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega/gmeasure"

	"github.com/opcua-chaos/opcua-chaos/fixtures/check"
	"github.com/opcua-chaos/opcua-chaos/fixtures/history"
	"github.com/opcua-chaos/opcua-chaos/fixtures/scenario"
	"github.com/opcua-chaos/opcua-chaos/fixtures/spec"
	"github.com/opcua-chaos/opcua-chaos/server/catalog"
	"github.com/opcua-chaos/opcua-chaos/toxics"
)

const property = "cancellation"

// h runs the suite's scenarios; spec.Bootstrap fills it before the first
// spec.
var h = spec.Bootstrap()

func TestCancellation(t *testing.T) { spec.RunSuite(t, property) }

// Timeline and load of the cancel storm: a phase of slow reads without
// cancels, the storm, the same phase again, then a burst.
const (
	// service is how long each slow read takes on the server (Slow.<ms>).
	service = 100 * time.Millisecond
	// stormOutstanding slow reads per anonymous storm session keep the
	// (few) workers backlogged in every phase.
	stormOutstanding = 4
	// The two workers serve 20 slow reads a second whatever the
	// condition: before, storm and after all measured 20.0 ops/s (ratios
	// 1.000 against the 0.8 floor) in every CI-profile run, so 2 s judged
	// of each phase and of the storm (40 reads; ~50 Cancels aimed at
	// queued and running requests, hundreds to thousands before
	// dispatch) keep the verdicts far from the floor; a leaked slot or a
	// cancelled request still served shows in the first second.
	phaseFor = 3 * time.Second
	stormFor = 3 * time.Second // CI; the soak spec storms a minute
	// settle is left out at the start of every measured phase.
	settle = time.Second
	// burstSessions × burstDepth requests at once after the storm: far
	// below the queue (the reference server is given 400 slots, 200 per
	// owner), so a rejection means capacity leaked.
	burstSessions = 3
	burstDepth    = 50
	burstService  = 20 * time.Millisecond
	// burstFor bounds the burst phase (it ends once its requests are
	// answered).
	burstFor = 20 * time.Second
	// minRatio is the lowest passing throughput ratio (storm/before and
	// after/before).
	minRatio = 0.8
	// stormMinShare is the least share of the requests a storm's Cancels
	// found in flight that must end BadRequestCancelledByClient: below
	// it the storm reads not exercised. The reference server cancelled
	// … of them on Slow reads and … on standard reads; with the fault
	// cancel-wrong-handle none.
	stormMinShare = 0.1
)

// maxNodesPerReadName is the OperationLimits limit preflight reads
// (probe.Report.Reported) that bounds a standard Read.
const maxNodesPerReadName = "MaxNodesPerRead"

// referenceStorm configures the reference server for the storm: two workers
// so that requests queue, and a small queue so that leaked slots show.
var referenceStorm = map[string]string{"OPCUA_WORKERS": "2", "OPCUA_QUEUE_SIZE": "400"}

// stormDiagnostics are the reference server's queue counters (ns=1),
// reported where the target serves them.
var stormDiagnostics = []history.DiagnosticsNode{history.NodeCancelled, history.NodeTooBusy, history.NodeQueueDepth,
	history.NodeQueueSlots, history.NodeQueueCancelled, history.NodeQueueDispatched}

// cancellers are the storm's sessions, one each: which stage of a
// request's life its Cancels aim at, every how many requests it cancels,
// and the target user that gives it an owner of its own (-1: anonymous).
var cancellers = []scenario.Canceller{
	{Aim: scenario.AimBeforeDispatch, Every: 1, User: -1},
	{Aim: scenario.AimBeforeDispatch, Every: 1, User: -1},
	{Aim: scenario.AimQueued, Every: 2, User: -1},
	{Aim: scenario.AimQueued, Every: 2, User: -1},
	{Aim: scenario.AimRunning, Every: 2, User: 0},
	{Aim: scenario.AimCompleting, Every: 2, User: 1},
}

// Close and reset races (scenario.CloseRace): survivors keep a mix of
// reads in flight while victim sessions with slow reads in flight are
// closed, timed out or reset.
const (
	// raceFor is the survivors' run: the last fault (the reset victims'
	// 0.5 s) ends about 4.5 s in, the survivors' recovered second after
	// the backlog closer's close by 3.5 s.
	raceFor = 6 * time.Second
	// raceHold bounds the victims' proxy's condition: the spec's
	// timeout (the step ends with the race's load anyway).
	raceHold = 2 * time.Minute
	// A fresh session's median probe latency after/before the storm must
	// stay ≤ maxProbeRatio (scenario.CloseRace measures up to 100 reads
	// for at most 1.2 s each time).
	maxProbeRatio = 1.5
	// probeFloorMS is the least "before" median the ratio divides by:
	// without latency the probe's reads take 0.1–3 ms, and a clean
	// server's median went from 0.18 to 0.29 ms across the storm (ratio
	// 1.63 under baseline in a CI-profile run: the host's scheduling, not
	// the server). Below 5 ms a ratio says nothing; a read that waits
	// for capacity the storm leaked waits for a 100 ms service time.
	probeFloorMS = 5
	// sessionsSettle bounds the wait for CurrentSessionCount to return.
	sessionsSettle = 15 * time.Second
	// raceWorkers is the reference server's pool, so that the backlog
	// closer's pipeline queues.
	raceWorkers = "8"
	// raceStandardWorkers is the reference server's pool on standard
	// reads (the quirk no-test-nodes): with eight a Read of a thousand
	// values was dispatched as it arrived, and no closed session had a
	// Read queued at its close (closed-session: 0 refused of 37
	// outstanding).
	raceStandardWorkers = "1"
)

// catches are the reference server's faults both specs are aimed at under
// baseline: a cancelled request that keeps its queue slot and one that is
// still dispatched.
var catches = []catalog.Fault{catalog.FaultCancelLeak, catalog.FaultCancelDouble}

// raceCatches adds, for the race of CloseSession, timeouts and resets, a
// CloseSession that leaves the session's queued requests to run
// (race-closed-session). The storm closes no session mid-flight: it
// passed with that fault on (matrix faults-20261207-103445).
var raceCatches = append(slices.Clone(catches), catalog.FaultCloseRunsQueued)

// stormCatches adds, for the cancel storm, a CancelCount that is not the
// number of requests the Cancel removed (the server's running total):
// exactly-once compares each session's CancelCounts with its requests
// answered BadRequestCancelledByClient; a Cancel that never cancels
// (it looks for the wrong handle): storm-exercised reads not exercised;
// and a Cancel whose compaction of the queue strands the oldest queued
// request: exactly-once names it stranded behind a cancel.
var stormCatches = append(slices.Clone(catches), catalog.FaultCancelTotal, catalog.FaultCancelWrongHandle, catalog.FaultCancelStrands)

// ciIndex is cond's index in toxics.CI(): it separates the random draws of
// the specs of each condition, which share the suite seed.
func ciIndex(cond toxics.Condition) int {
	return slices.IndexFunc(toxics.CI(), func(c toxics.Condition) bool { return c.Name == cond.Name })
}

// secured are the conditions of the rows under SignAndEncrypt (nightly
// only): the baseline, with every client on SignAndEncrypt channels.
var secured = toxics.Secured(toxics.SecuritySignEncrypt, toxics.Baseline)

// experiment returns a gmeasure experiment named name, added to the
// current spec's report: the phases' durations and the probes' latencies.
// Spec bodies call it (it adds a Ginkgo report entry), and pass it to the
// scenario, whose parts measure into it (recordInto).
func experiment(name string) *gmeasure.Experiment {
	exp := gmeasure.NewExperiment(name)
	AddReportEntry(exp.Name, exp)
	return exp
}

// recordInto records the durations a part measures into exp.
func recordInto(exp *gmeasure.Experiment) func(name string, d time.Duration) {
	return func(name string, d time.Duration) { exp.RecordDuration(name, d) }
}

// stormExactlyOnce is every read of the cancel storm (of kind) answered
// exactly once, and every Cancel's CancelCount the number of requests it
// removed.
func stormExactlyOnce(kind history.Kind) check.Spec {
	return check.Spec{Name: "storm-exactly-once", Config: check.ExactlyOnceConfig{Kinds: []history.Kind{kind}, RequireCancels: true}}
}

// stormExercised is the storm's exercise: its Cancels took effect on at
// least stormMinShare of the reads (of kind) they found in flight, or the
// storm reads not exercised (check.CancelEffect), its other checks' pass
// trivial.
func stormExercised(kind history.Kind) check.Spec {
	return check.Spec{Name: "storm-exercised", Config: check.CancelEffectConfig{Kinds: []history.Kind{kind}, MinShare: stormMinShare}}
}

// stormChecks are the cancel storm's checks once its phases ran on sl
// (m: the measured windows before, during and after the storm, the burst
// from m.Burst); the storm's goodput unless it ran under a nemesis
// schedule or on standard reads. m.Waited is the highest median latency
// of a session's reads before the storm, m.Service a read's service time:
// below 2 × m.Service no read waited for another's, and the goodput is
// not judged (goodputUnjudged).
func stormChecks(sl scenario.StormLoad, m scenario.StormMeasures, scheduled bool) []check.Spec {
	reads := []history.Kind{sl.Kind}
	var checks []check.Spec
	if !sl.Standard {
		// The cancel offsets are drawn from these latencies: a slow read
		// that does not take its service time aims them nowhere.
		checks = append(checks, check.Assume("storm-slow-reads", check.MedianLatencyConfig{Span: check.Span{From: m.Before.Start, To: m.Before.End}, Kinds: reads, Sessions: m.BeforeSessions, Min: sl.Service}))
	}
	checks = append(checks, []check.Spec{
		check.NoFailedSessions("storm-sessions"),
		stormExactlyOnce(sl.Kind),
		stormExercised(sl.Kind),
		check.Spec{Name: "storm-errors", Config: check.ErrorBudgetConfig{
			Span:  check.Span{To: m.Burst},
			Kinds: []history.Kind{sl.Kind, history.KindCancel, history.KindSession},
			// a rejection in the storm is leaked capacity too
			Allowed: check.Codes{ua.StatusBadRequestCancelledByClient}, Drained: check.Codes{},
		}},
		check.Spec{Name: "storm-recovery", Config: check.RecoveryConfig{Baseline: m.Before, Recovered: m.After, Kinds: reads, MinRatio: minRatio}},
		check.Spec{Name: "storm-burst", Config: check.ErrorBudgetConfig{Span: check.Span{From: m.Burst}, Kinds: reads, Drained: check.Codes{}}},
	}...)
	if !scheduled && !sl.Standard {
		// Cancelled requests must not take the workers' time. Under a
		// nemesis schedule the storm's own throughput says nothing: the
		// schedule starves the server on purpose. On standard reads
		// neither: a Read of a thousand values costs the server (and
		// the client and proxy beside it, on the same cores) its
		// transport and decoding whether it is cancelled or not, and a
		// session whose every Read is cancelled at once sends the next
		// at once, so the storm's goodput falls by construction (the
		// reference server under no-test-nodes: 401 → 121 ops/s, 1 009
		// of 1 423 Reads cancelled while queued, 96.6 % of those
		// targeted).
		goodput := check.Spec{Name: "storm-goodput", Config: check.RecoveryConfig{Baseline: m.Before, Recovered: m.During, Kinds: reads, MinRatio: minRatio}}
		if m.Waited < 2*m.Service {
			goodput = goodputUnjudged(m.Waited, m.Service)
		}
		checks = append(checks, goodput)
	}
	return checks
}

// goodputUnjudged is storm-goodput on a server whose reads did not queue
// before the storm (the highest median latency of a session, waited,
// under two service times s): such a server serves every read at once
// (open62541's asynchronous slow reads each wait on a timer of their
// own), so a cancelled read frees no capacity for the others, and the
// storm's goodput falls by the reads it cancels, by construction (with
// this suite's cancellers, from 180 to about 84 ops/s on such a server:
// storm-goodput measured 82 on open62541 1.5.7). NOT JUDGED, saying so.
func goodputUnjudged(waited, s time.Duration) check.Spec {
	return check.Spec{Name: "storm-goodput", Config: check.ReadingsConfig{
		Reading: "storm.goodput", Required: true,
		What: "the storm's goodput over before",
		Unavailable: fmt.Sprintf("the reads did not queue at the server before the storm (highest median latency of a session %v, under 2 × the %v service time): it serves them all at once, a cancelled read frees no capacity for others, and the goodput falls by the reads cancelled whatever the server does",
			waited.Round(time.Millisecond), s.Round(time.Microsecond)),
	}}
}

// cancelStorm is the cancel storm under cond: slow reads without cancels,
// the storm for stormFor (through a nemesis schedule drawn from the suite
// seed if scheduled), the same reads again, then a burst that fits in the
// queue. Every request is answered exactly once, no capacity leaks (no
// rejection, throughput after ≥ minRatio × before) and, without nemesis,
// the storm's goodput holds too. stream separates the random draws of the
// specs that share the suite seed; exp measures the phases. It needs
// Cancel of the target (a server without it skips naming it), and reads
// Slow.<ms> where the target has it, else many standard nodes in deep
// pipelines (stormLoad); storm sessions get owners of their own where the
// target has users, and share the anonymous owner where not. Its Cancels
// must take effect on a share of the requests they find in flight
// (storm-exercised), else the row reads not exercised.
//
// The schedule runs during the storm only, not beside the whole workload
// (Scenario.Schedule): the phase before it is the baseline the Cancels
// are aimed from and the recovery is judged against.
func cancelStorm(cond toxics.Condition, stream uint64, stormFor time.Duration, scheduled bool, exp *gmeasure.Experiment) scenario.Scenario {
	sl := scenario.NewStormLoad(h.Setup.Target, h.Setup.Probe.Reported(maxNodesPerReadName), service, burstService, stormOutstanding)
	s := scenario.Scenario{
		Property: property, Name: "storm", Condition: cond,
		// The counts, planned before the load: a run that ends before
		// its judgement (its timeout, an interrupt) saves its history
		// judged by them. The others are known once the phases ran
		// (stormChecks).
		Checks: []check.Spec{check.NoFailedSessions("storm-sessions"), stormExactlyOnce(sl.Kind), stormExercised(sl.Kind)},
		// the queue counters, read once the burst is answered
		Observers: []scenario.Observer{scenario.Diagnostics{Nodes: stormDiagnostics, Figures: "storm.diag.", Required: true}},
		Loads: []scenario.Load{scenario.CancelStorm{
			Load: sl, Cancellers: cancellers, Stream: stream,
			PhaseFor: phaseFor, StormFor: stormFor, BurstFor: burstFor, Settle: settle,
			BurstSessions: burstSessions, BurstDepth: burstDepth,
			Measured: recordInto(exp),
			Checks:   func(m scenario.StormMeasures) []check.Spec { return stormChecks(sl, m, scheduled) },
		}},
	}
	if h.Setup.Target.IsReference() {
		s.Server = referenceStorm
	}
	if scheduled {
		// The schedule holds during the storm only (from the end of the
		// phase before it), drawn from the run's seed; its phases at
		// their longest are the planned length of the progress lines
		// and the disk guard.
		sched := scenario.NemesisSchedule{Seed: GinkgoRandomSeed(), At: phaseFor, Total: stormFor - 2*time.Second}
		s.Steps, s.Observers = sched.Steps(), append(s.Observers, sched)
		s.Planned = 2*phaseFor + stormFor + burstFor
	}
	return s
}

// raceCounted are the race spec's counts and stall bound under cond,
// planned before the races: a run that ends before its judgement (its
// timeout, an interrupt) saves its history judged by them. The checks of
// what is measured on the way (session counts, probes, the close's
// windows) are added once it ran (raceChecks).
func raceCounted(cond toxics.Condition) []check.Spec {
	survivors := []history.Kind{history.KindRead, history.KindSlowRead, history.KindSession}
	return []check.Spec{
		{Name: "race-survivors-stall", Config: check.StallConfig{Kinds: survivors, GroupBy: check.BySession, MaxStall: scenario.MaxStall(cond)}},
		{Name: "race-survivors-errors", Config: check.ErrorBudgetConfig{Kinds: survivors, Drained: check.Codes{}}},
		{Name: "race-exactly-once", Config: check.ExactlyOnceConfig{Kinds: []history.Kind{history.KindRead, history.KindSlowRead, scenario.KindVictim}}},
		// a closed session's reads are answered (BadSessionClosed
		// if still queued); dead connections only in the toxics
		{Name: "race-victims-errors", Config: check.ErrorBudgetConfig{
			Kinds:   []history.Kind{scenario.KindVictim, history.KindCloseSession},
			Allowed: check.Codes{ua.StatusBadSessionClosed, ua.StatusBadSessionIDInvalid},
			Excuse:  []string{scenario.RaceFaultTimeout, scenario.RaceFaultReset}, Grace: 2 * time.Second,
		}},
	}
}

// raceChecks are every check of the race spec under cond once it ran
// (m): the survivors started at m.SurvivorsFrom, the backlog closer's
// CloseSession was m.BacklogClose (zero if it has none: a failed
// CloseSession fails race-victims-errors, and race-closed-session has
// none to judge), and m.Dispatched names the reading of each closed
// session's dispatch count where the target counts them; without
// m.NoSessionCount the server's session counts are judged.
//
// The survivors' throughput in the second after the backlog closer's
// CloseSession against the second before it, both under the victims'
// load: a close must not slow the others down (a close that blocks
// dispatch, or hands the closed session's queue to the workers at once).
// The second before and not the whole span since the survivors started:
// their first seconds, before the victims load the workers, run several
// times faster (measured under latency: 110 ops/s then, 14 in the last
// second before the close, 26 after it), and a baseline that mixes both
// failed clean runs.
func raceChecks(cond toxics.Condition, m scenario.RaceMeasures) []check.Spec {
	var checks []check.Spec
	if m.NoSessionCount == "" {
		checks = append(checks, check.Assume("race-sessions-seen", check.ReadingsConfig{
			Reading: scenario.ReadingRaceSessionsDuring, Minus: scenario.ReadingRaceSessionsBaseline, Min: check.Bound(1), Required: true,
			What: "CurrentSessionCount with the victims open over its baseline",
		}))
	}
	for _, r := range []struct {
		name    string
		reading history.ReadingName
		fault   string
	}{{"race-timeout-raced", scenario.ReadingRaceInflightTimeout, scenario.RaceFaultTimeout}, {"race-reset-raced", scenario.ReadingRaceInflightReset, scenario.RaceFaultReset}} {
		checks = append(checks, check.Assume(r.name, check.ReadingsConfig{
			Reading: r.reading, Min: check.Bound(1), Required: true, Count: true,
			What: fmt.Sprintf("victims' reads in flight when %s hit their connections", r.fault),
		}))
	}
	return append(append(checks, []check.Spec{
		{Name: "race-sessions-released", Config: check.ReadingsConfig{
			Reading: scenario.ReadingRaceSessionsAfter, Minus: scenario.ReadingRaceSessionsBaseline, Min: check.Bound(0), Max: check.Bound(0), Required: true,
			// a busy machine releases sessions later, never earlier
			SlowerOnlyFails: true, Unavailable: m.NoSessionCount,
			What: fmt.Sprintf("CurrentSessionCount %v after the storm over its baseline (sessions of closed, timed out or reset connections not released)", sessionsSettle),
		}},
		{Name: "race-probe", Config: check.ReadingsConfig{
			Reading: scenario.ReadingRaceProbeAfter, Stat: check.StatMedian, Ratio: scenario.ReadingRaceProbeBefore, RatioFloor: probeFloorMS, Max: check.Bound(maxProbeRatio), Required: true,
			What: "a fresh session's median probe latency after the storm over before",
		}},
		// catches fault close-runs-queued. Judged only where a close
		// raced a request the server still held (RequireHeld): an
		// in-order server answers the reads sent before a CloseSession
		// before it, and a server that holds nothing at a close shows
		// nothing about it; the closers' parked Publish requests are
		// held by every server with subscriptions.
		{Name: "race-closed-session", Config: check.ClosedSessionConfig{
			Kinds: []history.Kind{scenario.KindVictim, scenario.KindVictimPublish}, Grace: m.Grace, Dispatched: m.Dispatched, RequireHeld: true,
		}},
		{Name: "race-survivors-recovery", Config: check.RecoveryConfig{
			Baseline:  history.Window{Start: max(m.SurvivorsFrom+300*time.Millisecond, m.BacklogClose.Invoke-time.Second), End: m.BacklogClose.Invoke},
			Recovered: history.Window{Start: m.BacklogClose.Complete, End: m.BacklogClose.Complete + time.Second},
			Kinds:     []history.Kind{history.KindRead, history.KindSlowRead}, Bucket: 250 * time.Millisecond, MinRatio: minRatio,
		}},
	}...), raceCounted(cond)...)
}

// races keeps serving other sessions under cond while victims are closed,
// timed out and reset mid-flight: survivors keep a mix of reads in flight
// on their own sessions, victims with reads in flight (Slow.<ms> where the
// target has them, else Reads of many standard nodes, newRaceLoad) are
// closed (the closers, with Publish requests parked too, and the backlog
// closer whose pipeline is far deeper than its share of the workers),
// lose their connection under a timeout toxic or a reset on the victims'
// proxy. It needs no test node and no Cancel. Survivors neither stall
// nor fail nor slow down after the backlog closer's close, every read is
// answered once, no closed session's read runs after its close, the
// server releases every victim's session and a fresh session's latency
// is back after the storm. exp measures the probes.
func races(cond toxics.Condition, exp *gmeasure.Experiment) scenario.Scenario {
	s := scenario.Scenario{
		Property: property, Name: "race", Condition: cond,
		Checks: raceCounted(cond),
		// the victims' proxy is under the same condition, recorded as a
		// fault window of its own
		Steps: scenario.VictimsUnder(cond, raceHold),
		Loads: []scenario.Load{scenario.CloseRace{
			For: raceFor, SessionsSettle: sessionsSettle, Stream: uint64(100 + ciIndex(cond)),
			Measured: recordInto(exp),
			Checks:   func(m scenario.RaceMeasures) []check.Spec { return raceChecks(cond, m) },
		}},
	}
	if h.Setup.Target.IsReference() {
		// a known pool, so the backlog closer's pipeline queues: on
		// standard reads, which take a worker a fraction of a
		// millisecond, a small one
		workers := raceWorkers
		if !h.Setup.Target.ServiceTime {
			workers = raceStandardWorkers
		}
		s.Server = map[string]string{"OPCUA_WORKERS": workers}
	}
	return s
}

var _ = Describe("Cancellation", spec.Property(property), func() {
	It("answers every request of a minute-long cancel storm under a seeded nemesis schedule exactly once and loses no capacity", Label("soak"), spec.Condition(toxics.Scheduled.Name), func(ctx SpecContext) {
		h.Run(ctx, cancelStorm(toxics.Scheduled, 0x50a6, spec.SoakFor(), true, experiment("cancel storm")))
	}, spec.SoakTimeout(3*time.Minute))

	DescribeTable("answers every request of a cancel storm exactly once and loses no capacity", h.Scenario(func(cond toxics.Condition) scenario.Scenario {
		return cancelStorm(cond, uint64(ciIndex(cond)), stormFor, false, experiment("cancel storm"))
	}), spec.Entries(toxics.CI(), stormCatches, SpecTimeout(2*time.Minute)),
		spec.Entries(secured, nil, SpecTimeout(2*time.Minute), spec.Nightly))

	DescribeTable("keeps serving other sessions through CloseSession, timeouts and resets mid-flight", h.Scenario(func(cond toxics.Condition) scenario.Scenario {
		return races(cond, experiment("close and reset races"))
	}), spec.Entries(toxics.CI(), raceCatches, SpecTimeout(2*time.Minute)),
		spec.Entries(secured, nil, SpecTimeout(2*time.Minute), spec.Nightly))
})
