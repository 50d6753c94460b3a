package backpressure_test

import (
	"context"
	"fmt"
	"maps"
	"time"

	"github.com/gopcua/opcua/ua"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/gmeasure"

	"github.com/opcua-chaos/opcua-chaos/fixtures/check"
	"github.com/opcua-chaos/opcua-chaos/fixtures/env"
	"github.com/opcua-chaos/opcua-chaos/fixtures/history"
	"github.com/opcua-chaos/opcua-chaos/fixtures/load"
	"github.com/opcua-chaos/opcua-chaos/fixtures/spec"
	"github.com/opcua-chaos/opcua-chaos/server"
	"github.com/opcua-chaos/opcua-chaos/toxics"
)

// Load shapes and bounds of the backpressure specs.
const (
	// deepSessions × deepOutstanding fast Reads for deepFor: the load that
	// faulted the .NET stack's channels with BadTcpNotEnoughResources.
	deepSessions    = 10
	deepOutstanding = 1000
	deepFor         = 8 * time.Second

	// slowKBps throttles the responses of the slow reader, which pipelines
	// slowDepth requests at once; the throttle holds for throttleFor.
	slowKBps    = 32
	slowDepth   = 30_000
	throttleFor = 8 * time.Second

	// requestTimeout is long enough that no client gives up on a request
	// while its responses are throttled.
	requestTimeout = 60 * time.Second

	// The server's memory growth (peak minus the first reading) is bounded.
	// A server that stops reading holds a window of requests per channel:
	// the reference server grows by 5–9 MiB in the slow reader spec, one
	// that reads all it is sent (no-backpressure) by ~70 MiB, so
	// slowGrowthMiB = 32 leaves a wide margin both ways. Under 10 × 1000
	// pipelines at ~10k req/s its garbage alone grows it by 5–45 MiB (the
	// no-backpressure server ~120 MiB): deepGrowthMiB = 128 is a sanity
	// bound there, the slow reader is the sharp test.
	slowGrowthMiB = 32
	deepGrowthMiB = 128
)

// statusRead reads Server_ServerStatus (i=2256): every server has it, and
// its response (~200 bytes) is larger than a scalar's, so pending responses
// weigh on the server's memory.
var statusRead = load.Request{Kind: history.KindRead, Node: ua.NewNumericNodeID(0, 2256)}

// judged are the op kinds the backpressure checks read.
var judged = []history.Kind{history.KindRead, history.KindSession}

// maxStall is the longest window without completions allowed under cond.
func maxStall(cond toxics.Condition) time.Duration {
	if len(cond.Toxics) > 0 || cond.NanoCPUs > 0 {
		return 2 * time.Second
	}
	return time.Second
}

// diagnosticNodes are the reference server's backpressure counters (ns=1),
// reported where the target serves them.
var diagnosticNodes = []string{
	"Channel.BackpressurePauses", "Channel.MaxPendingResponses", "Channel.PendingResponses",
	"Queue.Depth", "Counter.TooBusy",
}

// monitor samples the server container's usage, if the target has one.
func monitor(ctx context.Context, e *env.Env) *env.Monitor {
	if e.Server == nil {
		return nil
	}
	return e.MonitorServer(ctx, 250*time.Millisecond)
}

// stopMonitor returns the server's usage (nil for a target without
// container) and its memory growth in MiB (-1 without container).
func stopMonitor(mon *env.Monitor) (*env.UsageSummary, float64) {
	GinkgoHelper()
	if mon == nil {
		return nil, -1
	}
	us, err := mon.Stop()
	Expect(err).NotTo(HaveOccurred(), "sample server usage")
	return &us, (float64(us.PeakMemory) - float64(us.BaseMemory)) / (1 << 20)
}

// loadFigures returns the load, server usage and bottleneck figures under
// prefix, with the memory growth; a client-bound run is skipped with the
// reason (spec.LoadFigures).
func loadFigures(prefix string, cond toxics.Condition, st load.Stats, us *env.UsageSummary, growth float64) map[string]float64 {
	figs := spec.LoadFigures("backpressure", prefix, cond, st, us)
	if us != nil {
		figs[prefix+"server.mem_growth_mib"] = growth
	}
	return figs
}

// expectBoundedMemory fails the spec when the server's memory grew by more
// than bound MiB.
func expectBoundedMemory(growth float64, bound int, figs map[string]float64, prefix string, v spec.Verdict) {
	GinkgoHelper()
	if growth < 0 {
		return // external target: not measurable
	}
	Expect(growth).To(BeNumerically("<=", bound),
		"server memory grew by %.1f MiB (peak %.1f MiB), bound %d MiB: the server keeps reading requests it cannot answer yet instead of pushing back (diagnostics: max pending responses %v, backpressure pauses %v)\n%s",
		growth, figs[prefix+"server.mem_peak_mib"], bound, figs[prefix+"diag.Channel.MaxPendingResponses"], figs[prefix+"diag.Channel.BackpressurePauses"], v.Explanation)
}

var _ = Describe("Backpressure", spec.Property("backpressure"), func() {
	It("serves 10 sessions × 1000 outstanding Reads through a seeded nemesis schedule, exactly once, in bounded memory", Label("soak"), spec.Condition(toxics.Scheduled.Name), func(ctx SpecContext) {
		const runFor = time.Minute
		e, err := h.Start(ctx)
		Expect(err).NotTo(HaveOccurred(), "start environment")
		rec := h.NewRecorder(map[string]string{"condition": toxics.Scheduled.Name})
		mon := monitor(ctx, e)
		steps, wait := spec.Nemesis(ctx, e, rec, runFor-5*time.Second)
		p := load.Pipelined(e.Endpoint, deepSessions, deepOutstanding)
		p.Name, p.Duration, p.RequestTimeout = "nemesis", runFor, requestTimeout
		st, err := load.Run(ctx, rec, p)
		Expect(err).NotTo(HaveOccurred(), "run load")
		Expect(wait()).To(Succeed(), "nemesis schedule")
		us, growth := stopMonitor(mon)
		figs := loadFigures("nemesis.", toxics.Scheduled, st, us, growth)
		figs["nemesis.steps"] = float64(steps)
		spec.Diagnostics(ctx, e, "nemesis.diag.", diagnosticNodes, figs)
		// Nothing in the schedule closes a connection: no errors, no
		// channel faults, every request answered exactly once; a throttled
		// or starved server slows down but never stops for 5 s.
		v := spec.Judge("backpressure", toxics.Scheduled.Name, rec, figs,
			check.Spec{Name: "nemesis-errors", Config: check.ErrorBudgetConfig{Kinds: judged, Drained: check.Codes{}}},
			check.Spec{Name: "nemesis-stall", Config: check.StallConfig{Kinds: judged, GroupBy: check.BySession, MaxStall: 5 * time.Second}},
			check.Spec{Name: "nemesis-exactly-once", Config: check.ExactlyOnceConfig{Kinds: judged}},
		)
		Expect(v.Failed).To(BeFalse(), v.Why())
		Expect(st.Sessions).To(Equal(deepSessions), "sessions opened")
		expectBoundedMemory(growth, deepGrowthMiB, figs, "nemesis.", v)
	}, SpecTimeout(3*time.Minute))

	for _, cond := range toxics.CI() {
		// Under baseline both specs are aimed at a server that never stops
		// reading and at one that faults the channel when it falls behind.
		Context("under "+cond.Name, spec.Condition(cond.Name), spec.CatchesUnder(cond, server.FaultNoBackpressure, server.FaultFaultOnOverflow), func() {
			var e *env.Env
			BeforeEach(func(ctx SpecContext) {
				// Both specs read ServerStatus only: the condition is all
				// they need of the target.
				h.Require(spec.Needs(cond)...)
				var err error
				e, err = h.Start(ctx)
				Expect(err).NotTo(HaveOccurred(), "start environment")
			}, NodeTimeout(2*time.Minute))

			It("serves 10 sessions × 1000 outstanding Reads without errors, channel faults or stalls, in bounded memory", func(ctx SpecContext) {
				rec := h.NewRecorder(map[string]string{"condition": cond.Name})
				_, err := spec.Apply(ctx, e, rec, cond)
				Expect(err).NotTo(HaveOccurred(), "apply %s", cond.Name)
				mon := monitor(ctx, e)

				By(fmt.Sprintf("pipelining %d × %d Reads for %s", deepSessions, deepOutstanding, deepFor))
				p := load.Pipelined(e.Endpoint, deepSessions, deepOutstanding)
				p.Duration, p.RequestTimeout = deepFor, requestTimeout
				exp := gmeasure.NewExperiment("deep pipelines")
				AddReportEntry(exp.Name, exp)
				var st load.Stats
				exp.MeasureDuration("run", func() {
					st, err = load.Run(ctx, rec, p)
				})
				Expect(err).NotTo(HaveOccurred(), "run load")

				us, growth := stopMonitor(mon)
				figs := loadFigures("deep.", cond, st, us, growth)
				spec.Diagnostics(ctx, e, "deep.diag.", diagnosticNodes, figs)
				v := spec.Judge("backpressure", cond.Name, rec, figs,
					// Drained rejections count as errors: a server that
					// pushes back never needs to refuse a pipeline.
					check.Spec{Name: "deep-errors", Config: check.ErrorBudgetConfig{Kinds: judged, Drained: check.Codes{}}},
					check.Spec{Name: "deep-stall", Config: check.StallConfig{Kinds: judged, GroupBy: check.BySession, MaxStall: maxStall(cond)}},
					check.Spec{Name: "deep-exactly-once", Config: check.ExactlyOnceConfig{Kinds: judged}},
				)
				Expect(v.Failed).To(BeFalse(), v.Why())
				Expect(st.Sessions).To(Equal(deepSessions), "sessions opened")
				expectBoundedMemory(growth, deepGrowthMiB, figs, "deep.", v)
			}, SpecTimeout(90*time.Second))

			It("stops reading from a throttled reader and answers its pipeline exactly once when it catches up", func(ctx SpecContext) {
				rec := h.NewRecorder(map[string]string{"condition": cond.Name})
				_, err := spec.Apply(ctx, e, rec, cond)
				Expect(err).NotTo(HaveOccurred(), "apply %s", cond.Name)
				mon := monitor(ctx, e)

				By(fmt.Sprintf("throttling responses to %d KB/s", slowKBps))
				throttle := toxics.Bandwidth(toxics.Downstream, slowKBps)
				throttle.Name = "slow-reader"
				undo, err := e.Proxy.Apply(ctx, env.ProxyName, []toxics.Toxic{throttle})
				Expect(err).NotTo(HaveOccurred(), "add %s toxic", throttle.Type)
				removed := rec.Fault(throttle.Name, fmt.Sprintf("bandwidth downstream %d KB/s", slowKBps))
				unthrottle := func(ctx context.Context) error {
					err := undo(ctx)
					removed(err)
					return err
				}
				DeferCleanup(unthrottle, NodeTimeout(30*time.Second))

				By(fmt.Sprintf("pipelining %d Reads on one session for %s", slowDepth, throttleFor))
				p := load.Profile{
					Name: "slow-reader", Endpoint: e.Endpoint, Duration: time.Minute, RequestTimeout: requestTimeout,
					Sessions: []load.Session{{Name: "reader", Outstanding: slowDepth, MaxRequests: slowDepth, Requests: []load.Request{statusRead}}},
				}
				type result struct {
					st  load.Stats
					err error
				}
				done := make(chan result, 1)
				go func() {
					defer GinkgoRecover()
					st, err := load.Run(ctx, rec, p)
					done <- result{st, err}
				}()
				select {
				case <-time.After(throttleFor):
				case <-ctx.Done():
					Fail("spec timed out while throttled")
				}
				figs := map[string]float64{}
				spec.Diagnostics(ctx, e, "slow.diag.throttled.", diagnosticNodes, figs)
				answered := 0
				for _, op := range rec.History().Ops {
					if op.Kind == history.KindRead && op.Done() {
						answered++
					}
				}
				figs["slow.answered_throttled"] = float64(answered)

				By("removing the throttle and draining the pipeline")
				drainFrom := rec.Now()
				Expect(unthrottle(ctx)).To(Succeed(), "remove %s toxic", throttle.Type)
				exp := gmeasure.NewExperiment("slow reader")
				AddReportEntry(exp.Name, exp)
				var res result
				exp.MeasureDuration("drain", func() { res = <-done })
				Expect(res.err).NotTo(HaveOccurred(), "run load")
				figs["slow.drain_s"] = exp.GetStats("drain").DurationFor(gmeasure.StatMax).Seconds()
				maps.Copy(figs, spec.Prefixed("slow.", res.st.Figures()))
				// The reader is throttled on purpose: no client-bound verdict.
				us, growth := stopMonitor(mon)
				if us != nil {
					maps.Copy(figs, spec.Prefixed("slow.", us.Figures()))
					figs["slow.server.mem_growth_mib"] = growth
				}
				spec.Diagnostics(ctx, e, "slow.diag.", diagnosticNodes, figs)

				v := spec.Judge("backpressure", cond.Name, rec, figs,
					check.Spec{Name: "slow-errors", Config: check.ErrorBudgetConfig{Kinds: judged, Drained: check.Codes{}}},
					check.Spec{Name: "slow-exactly-once", Config: check.ExactlyOnceConfig{Kinds: judged}},
					// once the reader catches up, the channel flows again
					check.Spec{Name: "slow-drain-stall", Config: check.StallConfig{Span: check.Span{From: drainFrom}, Kinds: judged, MaxStall: maxStall(cond)}},
				)
				Expect(v.Failed).To(BeFalse(), v.Why())
				// Precondition: the throttle held most of the pipeline back,
				// or the spec proved nothing about a slow reader.
				Expect(answered).To(BeNumerically("<", slowDepth/2),
					"precondition: %d of %d requests were answered while throttled to %d KB/s", answered, slowDepth, slowKBps)
				Expect(res.st.Requests).To(Equal(slowDepth), "requests sent")
				expectBoundedMemory(growth, slowGrowthMiB, figs, "slow.", v)
			}, SpecTimeout(2*time.Minute))
		})
	}
})
