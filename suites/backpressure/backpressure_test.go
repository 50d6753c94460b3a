package backpressure_test

import (
	"context"
	"fmt"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/gopcua/opcua/ua"
	. "github.com/onsi/ginkgo/v2"

	"github.com/opcua-chaos/opcua-chaos/fixtures/check"
	"github.com/opcua-chaos/opcua-chaos/fixtures/history"
	"github.com/opcua-chaos/opcua-chaos/fixtures/load"
	"github.com/opcua-chaos/opcua-chaos/fixtures/scenario"
	"github.com/opcua-chaos/opcua-chaos/fixtures/spec"
	"github.com/opcua-chaos/opcua-chaos/server/catalog"
	"github.com/opcua-chaos/opcua-chaos/toxics"
)

const property = "backpressure"

// h runs the suite's scenarios; spec.Bootstrap fills it before the first
// spec.
var h = spec.Bootstrap()

func TestBackpressure(t *testing.T) { spec.RunSuite(t, property) }

// Load shapes and bounds of the backpressure specs.
const (
	// deepSessions × deepOutstanding fast Reads for deepFor: the load that
	// faulted the .NET stack's channels with BadTcpNotEnoughResources
	// (the pipelines are full within the first second; 6 s put ~80 000
	// requests through the server under the CPU limit: 111 000–121 000 in
	// 8 s in a CI run, ~200 000 without the limit). 4 s keep ~50 000
	// under the limit: the faults aimed here showed within the first
	// seconds at 6 s (no-backpressure: 1.6 % errors; retain-memory: 758
	// MiB retained against the 256 MiB bound; late-resume: 631 pauses
	// resumed at 0).
	deepSessions    = 10
	deepOutstanding = 1000
	deepFor         = 4 * time.Second

	// slowKBps throttles the responses of the slow reader, which pipelines
	// slowDepth requests at once; the throttle holds for throttleFor: the
	// server stops reading within its first second (all 30 000 are sent
	// at once), so 4 s give ~30 readings of its pending responses at the
	// marks, and a server without backpressure or with a leak has taken
	// the whole pipeline (its growth) by then.
	slowKBps    = 32
	slowDepth   = 30_000
	throttleFor = 4 * time.Second

	// requestTimeout is long enough that no client gives up on a request
	// while its responses are throttled.
	requestTimeout = 60 * time.Second
	// deepRequestTimeout is the deadline after which a request of the deep
	// pipelines counts as lost (no response on a live connection): far
	// above their latency (≤ 3 s even under 0.5 CPU), short enough that a
	// lost response is named within the spec.
	deepRequestTimeout = 20 * time.Second

	// The server's memory growth during the load (peak minus the first
	// reading) is bounded. A server that stops reading holds a window of
	// requests per channel: the reference server grows by 5–9 MiB in the
	// slow reader spec, one that reads all it is sent (no-backpressure) by
	// ~70 MiB, so slowGrowthMiB = 32 leaves a wide margin both ways. Under
	// 10 × 1000 pipelines at ~10k req/s its garbage alone grows it by
	// 5–45 MiB (the no-backpressure server ~120 MiB): deepGrowthMiB = 128
	// is a sanity bound there, the slow reader is the sharp test.
	slowGrowthMiB = 32
	deepGrowthMiB = 128
	// What the server still holds drainSettle after the load drained is
	// bounded too: a server without backpressure holds its piled-up
	// responses only while the load lasts, a leak keeps what it took. A
	// garbage-collected server may keep its garbage until its next cycle
	// (up to the growth during the load), so the bounds sit above the
	// growth bounds: a leak of the retain-memory kind (16 KiB per request:
	// ~470 MiB over the slow reader's 30 000, GiBs in the deep pipelines)
	// is far beyond them.
	slowRetainedMiB = 128
	deepRetainedMiB = 256
	// drainSettle is how long the monitor watches the server after the
	// load drained; its readings from drainRelease on (four, 250 ms
	// apart) show what it retains. What a collector has not given back
	// by then is within the retention bounds above the growth bounds.
	drainSettle  = 2500 * time.Millisecond
	drainRelease = 1500 * time.Millisecond

	// The reference server's marks (seeds 001/002): it stops reading at
	// 100 pending responses and resumes at 50. While the throttled reader
	// keeps it backlogged, its pending count never drops far below 50
	// (lowSlack covers a reading taken between a release and the next
	// read).
	highMark = 100
	lowMark  = 50
	lowSlack = 10

	// The refill pipeline: one session keeps refillOutstanding Reads
	// outstanding for refillFor, cycling through one of refillLong and
	// refillShorts short ones (Slow.6 to Slow.10). A server that resumes
	// reading by its low mark keeps short requests queued beside the long
	// ones and answers on; one that resumes only once its pipeline drained
	// holds each read batch until its long request ends, answering nothing
	// meanwhile. In process (7 runs of 3 s each way, 5 of them with
	// GOMAXPROCS=1 for a starved host, k = 10) the reference server's
	// channel was idle 0–7 % of its backlogged time, the late-resume
	// faults' 59–62 % (1.9–2.2 idle gaps per 100 answers, 60 % of the
	// throughput): refillMaxIdleShare = 0.3 leaves a wide margin both
	// ways. refillIdleGap = 10 mean inter-completion times (~15 ms) is far
	// above a correct server's gaps (its workers finishing short requests
	// in step) and far below the late resumer's ~200 ms gaps. Shorter
	// short requests (3–7 ms) double the request rate, and a starved host
	// then idled the correct server up to 14 %.
	refillOutstanding  = 300
	refillFor          = 3 * time.Second
	refillLong         = 300 * time.Millisecond
	refillShorts       = 49
	refillIdleGap      = 10
	refillMaxIdleShare = 0.3
	refillSettle       = 500 * time.Millisecond
)

// refillRequests is the refill pipeline's cycle: one long Read, then
// refillShorts short ones of 6 to 10 ms, whose spread keeps a correct
// server's workers from finishing in step.
func refillRequests() []load.Request {
	out := []load.Request{load.SlowRead(refillLong)}
	for i := range refillShorts {
		out = append(out, load.SlowRead(time.Duration(6+(3*i)%5)*time.Millisecond))
	}
	return out
}

// refillChecks are the refill spec's checks: no errors, every Read answered
// exactly once, and the backpressure check with the client-side idle
// measure judged (check.BackpressureConfig.Idle, on channels answered out
// of order only: a server answering in request order waits on its long
// Reads by design) besides the server's own counters where it has them.
func refillChecks() []check.Spec {
	slow := []history.Kind{history.KindSlowRead}
	return []check.Spec{
		{Name: "refill-errors", Config: check.ErrorBudgetConfig{Kinds: append(slices.Clone(slow), history.KindSession), Drained: check.Codes{}}},
		{Name: "refill-exactly-once", Config: check.ExactlyOnceConfig{Kinds: slow}},
		{Name: "refill-backpressure", Config: check.BackpressureConfig{
			Kinds:      slow,
			MaxPending: history.ReadingMaxPending, HighMark: highMark,
			Resumed: history.ReadingLowestResume, LowMark: lowMark, LowSlack: lowSlack,
			BacklogSettle: refillSettle,
			Idle:          true, IdleGap: refillIdleGap, MaxIdleShare: refillMaxIdleShare, IdleOutOfOrder: true,
		}},
		survival("refill-survival"),
		check.SessionsOpened("refill-sessions", 1),
	}
}

// statusRead reads Server_ServerStatus (i=2256): every server has it, and
// its response (~200 bytes) is larger than a scalar's, so pending responses
// weigh on the server's memory.
var statusRead = load.Request{Kind: history.KindRead, Node: ua.NewNumericNodeID(0, 2256)}

// secured are the conditions of the rows under SignAndEncrypt: the
// baseline, with every client on SignAndEncrypt channels.
var secured = toxics.Secured(toxics.SecuritySignEncrypt, toxics.Baseline)

// securedDeepCatches are the faults the deep pipelines under
// SignAndEncrypt are aimed at (their None row is aimed at deepCatches):
// response crypto under the channel's send gate, which stalls deep
// pipelines on secured channels only.
var securedDeepCatches = []catalog.Fault{catalog.FaultCryptoInGate}

// judged are the op kinds the backpressure checks read.
var judged = []history.Kind{history.KindRead, history.KindSession}

// diagnosticNodes are the reference server's backpressure counters (ns=1),
// reported where the target serves them.
var diagnosticNodes = []history.DiagnosticsNode{
	history.NodePauses, history.NodeMaxPending, history.NodePending,
	history.NodeLowestResume, history.NodeQueueDepth, history.NodeTooBusy,
}

// Client-side counts the checks read, recorded as readings.
const (
	readingAnsweredThrottled history.ReadingName = "client.answered_throttled"
	readingRequestsSent      history.ReadingName = "client.requests_sent"
)

// diagnostics reads the reference server's backpressure counters at the
// end of a run (where it still runs) into the figures under "diag." and
// records the pending-response counters for the backpressure check
// (targets without the diagnostics report nothing). A server too
// stalled to answer them is marked unread instead of ending the spec
// before its judgement: the checks that needed them say so.
func diagnostics() scenario.Diagnostics {
	return scenario.Diagnostics{
		Nodes: diagnosticNodes, Figures: "diag.",
		Record: []history.DiagnosticsNode{history.NodeMaxPending, history.NodePauses, history.NodeLowestResume},
	}
}

// survival is the check that the server process lived through the spec
// (readings of its container at the start and before the diagnostics):
// a server killed for its memory limit fails here, by name, instead of
// breaking the spec at the next read.
func survival(name string) check.Spec {
	return check.Spec{Name: name, Config: check.SurvivalConfig{}}
}

// backpressureCheck is the backpressure check: pending responses within
// the marks where the target reports them (at most the high mark, paused
// readers resumed by the low mark), memory growth during the load within
// growth MiB and memory retained drainSettle after it within retained
// MiB, each failure named (no backpressure, resumes late, a leak).
// backlogged names the fault window in which a throttled reader keeps the
// server backlogged (its pending count there is reported against the low
// mark), empty for none.
func backpressureCheck(name string, growth, retained float64, backlogged string) check.Spec {
	cfg := check.BackpressureConfig{
		Kinds:        judged,
		MaxGrowthMiB: growth, MaxRetainedMiB: retained,
		MaxPending: history.ReadingMaxPending, HighMark: highMark,
		Resumed: history.ReadingLowestResume, LowMark: lowMark, LowSlack: lowSlack,
		Settle: drainRelease,
	}
	if backlogged != "" {
		cfg.Pending, cfg.Backlogged = history.ReadingPending, backlogged
	}
	return check.Spec{Name: name, Config: cfg}
}

// reportIdle has the backpressure check s report its client-side idle
// measure (check.BackpressureConfig.Idle: idle gaps per channel while the
// client kept the high mark outstanding), the one view of a late resume
// on a server that publishes no counters. It is reported, not judged: in
// these load shapes a correct server's channels are as idle as a late
// resumer's (see the field's doc).
func reportIdle(s check.Spec) check.Spec {
	cfg := s.Config.(check.BackpressureConfig)
	cfg.Idle = true
	s.Config = cfg
	return s
}

// slowChecks are the slow reader spec's checks but the drain stall (its
// span starts when the throttle is removed): the assumption that the
// throttle held most of the pipeline back (or the spec proved nothing
// about a slow reader), then the property, the whole pipeline sent
// included.
func slowChecks(throttle string) []check.Spec {
	return []check.Spec{
		check.Assume("slow-throttled", check.ReadingsConfig{
			Reading: readingAnsweredThrottled, Max: check.Bound(slowDepth/2 - 1), Required: true,
			What: fmt.Sprintf("requests of %d answered while throttled to %d KB/s", slowDepth, slowKBps),
		}),
		// A property, not an assumption: a server that faults the
		// channel when it falls behind stops the pipeline being sent
		// (fault-on-overflow), which must read as its failure.
		{Name: "slow-sent", Config: check.ReadingsConfig{
			Reading: readingRequestsSent, Min: check.Bound(slowDepth), Max: check.Bound(slowDepth), Required: true, Count: true,
			What: "requests sent (a faulted channel stops the pipeline)",
		}},
		{Name: "slow-errors", Config: check.ErrorBudgetConfig{Kinds: judged, Drained: check.Codes{}}},
		{Name: "slow-exactly-once", Config: check.ExactlyOnceConfig{Kinds: judged}},
		// the throttle keeps the server backlogged: its pending
		// responses stay between the marks
		reportIdle(backpressureCheck("slow-backpressure", slowGrowthMiB, slowRetainedMiB, throttle)),
		survival("slow-survival"),
	}
}

// catches are the reference server's faults both specs are aimed at under
// baseline: a server that never stops reading, one that faults the
// channel when it falls behind, one that loses responses and one that
// retains memory per request.
var catches = []catalog.Fault{catalog.FaultNoBackpressure, catalog.FaultFaultOnOverflow, catalog.FaultLostResponse, catalog.FaultRetainMemory}

// deepCatches are catches and the fault the deep pipelines are aimed at
// too: a server that resumes reading late (10 × 1000 outstanding Reads
// pause and resume its readers over and over), seen in its counters. The
// same fault without counters (late-resume-silent) is the refill spec's:
// the deep pipelines' idle measure is reported, not judged.
var deepCatches = append(slices.Clone(catches), catalog.FaultLateResume)

// refillCatches are the faults the refill pipeline is aimed at: a server
// that resumes reading late, with its counters and without them.
var refillCatches = []catalog.Fault{catalog.FaultLateResume, catalog.FaultLateResumeSilent}

// profiler writes heap profiles of the load driver at offsets from now
// (spec.ProfileDriver); its stop cancels those not written yet.
type profiler = func(ctx context.Context, at ...time.Duration) (stop func())

// nemesisSoak serves 10 sessions × 1000 outstanding Reads for runFor
// through a seeded nemesis schedule (the runner's, over runFor less 5 s).
// Nothing in the schedule closes a connection: no errors, no channel
// faults, every request answered exactly once; a throttled or starved
// server slows down but never stops for 5 s, and holds its memory within
// the deep bounds. Over the soak the server's memory does not keep
// growing, its throughput does not drift down and its sessions and
// connections do not keep growing. The driver's heap is profiled by
// profile (after warm-up, the trend checker's fifth of the run, and 10 s
// before the load ends) and the history's spill is told on log.
func nemesisSoak(runFor time.Duration, profile profiler, log io.Writer) scenario.Scenario {
	return scenario.Scenario{
		Property: property, Name: "nemesis", Condition: toxics.Scheduled, Schedule: runFor - 5*time.Second,
		Checks: []check.Spec{
			{Name: "nemesis-errors", Config: check.ErrorBudgetConfig{Kinds: judged, Drained: check.Codes{}}},
			{Name: "nemesis-stall", Config: check.StallConfig{Kinds: judged, GroupBy: check.BySession, MaxStall: 5 * time.Second}},
			{Name: "nemesis-exactly-once", Config: check.ExactlyOnceConfig{Kinds: judged}},
			backpressureCheck("nemesis-backpressure", deepGrowthMiB, deepRetainedMiB, ""),
			survival("nemesis-survival"),
			check.SessionsOpened("nemesis-sessions", deepSessions),
			// over the soak: the server's memory does not keep growing
			// and its throughput does not drift down
			// and its sessions and connections do not keep growing
			{Name: "nemesis-trend", Config: check.TrendConfig{Kinds: judged,
				Counts: []history.Kind{history.KindSessionCount, history.KindConnectionCount}}},
			scenario.Headroom(0), // the schedule changes the server's limit
		},
		Prefix: "nemesis.",
		// stopped in reverse: the heap profiles, the server's drain, the
		// samplers, the monitor, then the spill and the counters
		Observers: []scenario.Observer{
			diagnostics(), scenario.Spill{Log: log}, scenario.Server{},
			scenario.DriverRSS{Every: 5 * time.Second},
			scenario.Counts{Every: 5 * time.Second, Sessions: h.Setup.Probe.StandardDiagnostics.Found},
			scenario.Linger{For: drainSettle},
			// what the driver keeps: heap profiles after warm-up (the
			// trend checker's, a fifth of the run) and 10 s before the
			// load ends
			scenario.HeapProfiles{Profile: profile, At: []time.Duration{max(runFor/5, 10*time.Second), runFor - 10*time.Second}},
		},
		Loads: []scenario.Load{scenario.Pipeline{Name: "nemesis", Sessions: deepSessions, Outstanding: deepOutstanding, Duration: runFor, RequestTimeout: requestTimeout}},
	}
}

// deep pipelines deepSessions × deepOutstanding fast Reads for deepFor
// under cond: no errors, channel faults or stalls, in bounded memory. The
// sessions are anonymous, or, where only logins as a user leave room for
// all of them (the reference server with max-sessions-20 keeps 10 of its
// 20 places from anonymous clients), every session logged in as the
// target's first user (scenario.NeedAll): what the deep specs judge does
// not depend on who the sessions are.
func deep(cond toxics.Condition) scenario.Scenario {
	return scenario.Scenario{
		Property: property, Name: "deep", Condition: cond,
		// The backpressure check is named first when it fails: a server
		// that reads requests it cannot answer yet is refused by its own
		// memory budget next, and those errors follow from it (channel
		// faults still lead, check.BlameOrder).
		Checks: []check.Spec{
			reportIdle(backpressureCheck("deep-backpressure", deepGrowthMiB, deepRetainedMiB, "")),
			// Drained rejections count as errors: a server that
			// pushes back never needs to refuse a pipeline.
			{Name: "deep-errors", Config: check.ErrorBudgetConfig{Kinds: judged, Drained: check.Codes{}}},
			{Name: "deep-stall", Config: check.StallConfig{Kinds: judged, GroupBy: check.BySession, MaxStall: scenario.MaxStall(cond)}},
			{Name: "deep-exactly-once", Config: check.ExactlyOnceConfig{Kinds: judged}},
			survival("deep-survival"),
			check.SessionsOpened("deep-sessions", deepSessions),
			scenario.Headroom(float64(cond.NanoCPUs) / 1e9),
		},
		Prefix:    "deep.",
		Observers: []scenario.Observer{diagnostics(), scenario.Server{}, scenario.Linger{For: drainSettle}},
		Loads: []scenario.Load{scenario.Pipeline{
			Sessions: deepSessions, Outstanding: deepOutstanding, Duration: deepFor, RequestTimeout: deepRequestTimeout,
			Mark: fmt.Sprintf("pipelining %d × %d Reads for %s", deepSessions, deepOutstanding, deepFor),
		}},
	}
}

// refill keeps refillOutstanding Reads of refillRequests outstanding on
// one session for refillFor under cond (refillChecks).
func refill(cond toxics.Condition) scenario.Scenario {
	return scenario.Scenario{
		// Slow.<ms> Reads: a target without them is skipped
		Property: property, Name: "refill", Condition: cond,
		Checks:    refillChecks(),
		Prefix:    "refill.",
		Observers: []scenario.Observer{diagnostics(), scenario.Server{}},
		Loads: []scenario.Load{scenario.Profile{
			Mark: fmt.Sprintf("pipelining %d Reads (1 of %v per %d of 6–10 ms) on one session for %s", refillOutstanding, refillLong, refillShorts+1, refillFor),
			Profile: load.Profile{
				Name: "refill", Duration: refillFor, RequestTimeout: deepRequestTimeout,
				Sessions: []load.Session{{Name: "refill", Outstanding: refillOutstanding, Requests: refillRequests()}},
			},
		}},
	}
}

// slowReader pipelines slowDepth Reads on one session whose responses are
// throttled to slowKBps for throttleFor, then removes the throttle and
// drains the pipeline (its drain the figure slow.drain_s): the server
// stops reading from the throttled reader (slowChecks) and, once the
// reader catches up, the channel flows again (slow-drain-stall, planned
// when the throttle is removed: its span starts there). The reader is
// throttled on purpose: no client-bound verdict.
func slowReader(cond toxics.Condition) scenario.Scenario {
	throttle := toxics.Bandwidth(toxics.Downstream, slowKBps)
	throttle.Name = "slow-reader"
	return scenario.Scenario{
		Property: property, Name: "slow-reader", Condition: cond,
		Checks:    slowChecks("slow-reader"),
		Prefix:    "slow.",
		Observers: []scenario.Observer{diagnostics(), scenario.Server{}, scenario.Linger{For: drainSettle}},
		Steps: []scenario.FaultStep{{
			For: throttleFor, Drain: "drain_s",
			Mark: fmt.Sprintf("throttling responses to %d KB/s", slowKBps),
			// on the clients' proxy, as a condition's toxics are
			Condition: toxics.Condition{Name: throttle.Name, Toxics: []toxics.Toxic{throttle}},
			// stopped in reverse before the throttle is removed: the
			// server's pending responses while the reader was throttled
			// (between the marks, where it reports them), its counters
			// then, the answers the throttle let through (requests
			// failed by a faulted channel were not answered, and must
			// not read as a throttle that held nothing back), and the
			// drain's stall check from then on
			Observers: []scenario.Observer{
				scenario.StallFrom{Name: "slow-drain-stall", Config: check.StallConfig{Kinds: judged, MaxStall: scenario.MaxStall(cond)}},
				scenario.Answered{Kind: history.KindRead, Reading: readingAnsweredThrottled, Figure: "answered_throttled"},
				scenario.Diagnostics{Nodes: diagnosticNodes, Figures: "diag.throttled.", Required: true},
				scenario.DiagnosticsSampler{Nodes: []history.DiagnosticsNode{history.NodePending}, Every: 100 * time.Millisecond},
			},
		}},
		Loads: []scenario.Load{scenario.Profile{
			Mark: fmt.Sprintf("pipelining %d Reads on one session for %s", slowDepth, throttleFor), Sent: readingRequestsSent,
			Profile: load.Profile{
				Name: "slow-reader", Duration: time.Minute, RequestTimeout: requestTimeout,
				Sessions: []load.Session{{Name: "reader", Outstanding: slowDepth, MaxRequests: slowDepth, Requests: []load.Request{statusRead}}},
			},
		}},
	}
}

var _ = Describe("Backpressure", spec.Property(property), func() {
	// catches fault slow-leak (nemesis-trend: a leak)
	// catches fault trickle-leak in a soak of an hour or more (nemesis-trend: a leak per hour; catalog.MinSoak)
	It("serves 10 sessions × 1000 outstanding Reads through a seeded nemesis schedule, exactly once, in bounded memory", Label("soak"), spec.Condition(toxics.Scheduled.Name), spec.Catches(catalog.FaultSlowLeak, catalog.FaultTrickleLeak), func(ctx SpecContext) {
		h.Run(ctx, nemesisSoak(spec.SoakFor(), spec.ProfileDriver, GinkgoWriter))
	}, spec.SoakTimeout(2*time.Minute))

	// catches fault lost-response (deep-exactly-once: lost responses)
	// catches fault retain-memory (deep-backpressure: retained, a leak or retention from one load)
	// catches fault late-resume (deep-backpressure: resumes late)
	// catches fault crypto-in-gate, under SignAndEncrypt (deep-stall: stalled channels)
	DescribeTable("serves 10 sessions × 1000 outstanding Reads without errors, channel faults or stalls, in bounded memory", h.Scenario(deep),
		spec.Entries(toxics.CI(), deepCatches, SpecTimeout(3*time.Minute)),
		// SignAndEncrypt breaks deep pipelines first (each response is
		// signed and encrypted before it leaves): in the CI profile
		spec.Entries(secured, securedDeepCatches, SpecTimeout(3*time.Minute)))

	// catches fault late-resume (refill-backpressure: resumes late, in its
	// counters and idle measure)
	// catches fault late-resume-silent (refill-backpressure: resumed reading
	// late, in the idle measure)
	DescribeTable("keeps answering one session's pipeline of long and short Reads while a long one runs (resumes reading by its low mark)", h.Scenario(refill),
		spec.Entries([]toxics.Condition{toxics.Baseline}, refillCatches, SpecTimeout(time.Minute)))

	// catches fault retain-memory (slow-backpressure: retained, a leak or retention from one load)
	DescribeTable("stops reading from a throttled reader and answers its pipeline exactly once when it catches up", h.Scenario(slowReader),
		spec.Entries(toxics.CI(), catches, SpecTimeout(3*time.Minute)),
		spec.Entries(secured, nil, SpecTimeout(3*time.Minute), spec.Nightly))
})
