package cancellation_test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
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
	"github.com/opcua-chaos/opcua-chaos/fixtures/target"
	"github.com/opcua-chaos/opcua-chaos/fixtures/uaclient"
	"github.com/opcua-chaos/opcua-chaos/toxics"
)

// Timeline and load of the cancel storm: a phase of slow reads without
// cancels, the storm, the same phase again, then a burst.
const (
	// service is how long each slow read takes on the server (Slow.<ms>).
	service = 100 * time.Millisecond
	// stormSessions × stormOutstanding slow reads keep the (few) workers
	// backlogged in every phase.
	stormSessions    = 6
	stormOutstanding = 4
	phaseFor         = 4 * time.Second
	stormFor         = 6 * time.Second
	// settle is left out at the start of every measured phase.
	settle = time.Second
	// burstSessions × burstDepth requests at once after the storm: far
	// below the queue (the reference server is given 400 slots, 200 per
	// owner), so a rejection means capacity leaked.
	burstSessions = 3
	burstDepth    = 50
	burstService  = 20 * time.Millisecond
	// minRatio is the lowest passing throughput ratio (storm/before and
	// after/before).
	minRatio = 0.8
)

// referenceStorm configures the reference server for the storm: two workers
// so that requests queue, and a small queue so that leaked slots show.
var referenceStorm = map[string]string{"OPCUA_WORKERS": "2", "OPCUA_QUEUE_SIZE": "400"}

// stormDiagnostics are the reference server's queue counters (ns=1),
// reported where the target serves them.
var stormDiagnostics = []string{"Counter.Cancelled", "Counter.TooBusy", "Queue.Depth", "Queue.Slots", "Queue.Cancelled", "Queue.Dispatched"}

// canceller is how one storm session cancels: every nth request, after a
// delay drawn from [lo, hi) times the median latency L of a slow read
// before the storm (plus abs), aimed at one stage of the request's life.
type canceller struct {
	aim    string
	every  int
	lo, hi float64
	abs    time.Duration
}

// cancellers are the storm's sessions, one each. Requests cancelled within
// 20 ms are still queued (before dispatch); 0.2–0.7 L queued behind others;
// L minus most of the service time is while running; L ± 10 % of the
// service races the response (after completion no Cancel is sent).
var cancellers = [stormSessions]canceller{
	{aim: "before-dispatch", every: 1, abs: 20 * time.Millisecond},
	{aim: "before-dispatch", every: 1, abs: 20 * time.Millisecond},
	{aim: "queued", every: 2, lo: 0.2, hi: 0.7},
	{aim: "queued", every: 2, lo: 0.2, hi: 0.7},
	{aim: "running", every: 2, lo: 1, hi: 1},
	{aim: "completing", every: 2, lo: 1, hi: 1},
}

// delay draws the session's CancelAfter.
func (c canceller) delay(rng *rand.Rand, l time.Duration) time.Duration {
	switch c.aim {
	case "before-dispatch":
		return time.Duration(rng.Int64N(int64(c.abs)))
	case "running":
		// dispatched about L - service after sending; cancel in the middle
		return l - service + time.Duration(float64(service)*(0.2+0.6*rng.Float64()))
	case "completing":
		return l - service/10 + time.Duration(rng.Int64N(int64(service/5)))
	}
	return time.Duration(float64(l) * (c.lo + (c.hi-c.lo)*rng.Float64()))
}

// slowSessions returns n sessions named prefix.. keeping stormOutstanding
// slow reads each in flight.
func slowSessions(prefix string) []load.Session {
	return load.Sessions(stormSessions, prefix, load.Session{Outstanding: stormOutstanding, Requests: []load.Request{load.SlowRead(service)}})
}

// medianLatency returns the median latency of the ok ops of kind that
// completed in w.
func medianLatency(h history.History, kind history.Kind, w history.Window) time.Duration {
	var ls []time.Duration
	for _, op := range h.Ops {
		if op.Kind == kind && op.Outcome == history.OK && w.Contains(op.Complete) {
			ls = append(ls, op.Latency())
		}
	}
	if len(ls) == 0 {
		return 0
	}
	slices.Sort(ls)
	return ls[len(ls)/2]
}

// diagnostics reads the target's ns=1 counters into figs (prefix+name) over
// a session of its own on the direct endpoint; targets without them report
// nothing.
func diagnostics(ctx context.Context, e *env.Env, prefix string, names []string, figs map[string]float64) {
	GinkgoHelper()
	if !e.Target.Diagnostics {
		return
	}
	c, err := uaclient.Open(ctx, e.DirectEndpoint)
	Expect(err).NotTo(HaveOccurred(), "open diagnostics session")
	defer func() { _ = c.Close(context.WithoutCancel(ctx)) }()
	for _, n := range names {
		v, err := uaclient.ReadValue(ctx, c, ua.NewStringNodeID(1, n))
		Expect(err).NotTo(HaveOccurred(), "read diagnostics node ns=1;s=%s", n)
		if x, ok := v.Value().(int64); ok {
			figs[prefix+n] = float64(x)
		}
	}
}

// prefixed returns figs with every key prefixed: both specs of a condition
// share one summary row.
func prefixed(prefix string, figs map[string]float64) map[string]float64 {
	out := make(map[string]float64, len(figs))
	for k, v := range figs {
		out[prefix+k] = v
	}
	return out
}

// isReference reports whether the target is the reference server, which
// takes its worker and queue sizes from the environment.
func isReference() bool {
	t := h.Setup.Target
	return t.Kind == target.Container && t.Name == target.Reference.Name
}

var _ = Describe("Cancellation", spec.Property("cancellation"), func() {
	for ci, cond := range toxics.CI() {
		Context("under "+cond.Name, spec.Condition(cond.Name), func() {
			It("answers every request of a cancel storm exactly once and loses no capacity", func(ctx SpecContext) {
				var opts []env.Option
				if isReference() {
					opts = append(opts, env.WithServerEnv(referenceStorm))
				}
				e, err := h.Start(ctx, opts...)
				Expect(err).NotTo(HaveOccurred(), "start environment")
				rec := h.NewRecorder(map[string]string{"condition": cond.Name})
				_, err = spec.Apply(ctx, e, rec, cond)
				Expect(err).NotTo(HaveOccurred(), "apply %s", cond.Name)
				rng := rand.New(rand.NewPCG(uint64(GinkgoRandomSeed()), uint64(ci)))
				exp := gmeasure.NewExperiment("cancel storm")
				AddReportEntry(exp.Name, exp)
				figs := map[string]float64{}

				phase := func(name string, d time.Duration, sessions []load.Session) time.Duration {
					GinkgoHelper()
					start := rec.Now()
					var st load.Stats
					var err error
					exp.MeasureDuration(name, func() {
						st, err = load.Run(ctx, rec, load.Profile{Name: name, Endpoint: e.Endpoint, Duration: d, RequestTimeout: 30 * time.Second, Sessions: sessions})
					})
					Expect(err).NotTo(HaveOccurred(), "run %s phase", name)
					Expect(st.SessionsFailed).To(BeZero(), "%s: sessions failed to open", name)
					maps.Copy(figs, prefixed("storm."+name+".", map[string]float64{"requests": float64(st.Requests), "ok": float64(st.OK), "cancels": float64(st.Cancels), "req_s": st.Throughput()}))
					return start
				}

				By(fmt.Sprintf("reading %d × %d slow reads (%s) without cancels", stormSessions, stormOutstanding, service))
				tBefore := phase("before", phaseFor, slowSessions("before-"))
				before := history.Window{Start: tBefore + settle, End: tBefore + phaseFor}
				l := medianLatency(rec.History(), history.KindSlowRead, before)
				Expect(l).To(BeNumerically(">=", service), "median slow read latency before the storm")
				figs["storm.before.median_latency_ms"] = float64(l) / float64(time.Millisecond)

				By("cancelling before dispatch, while queued, while running and at completion")
				storm := slowSessions("storm-")
				for i, c := range cancellers {
					storm[i].CancelEvery, storm[i].CancelAfter = c.every, c.delay(rng, l)
					rec.SetLabel("cancel."+storm[i].Name, fmt.Sprintf("%s every %d after %s", c.aim, c.every, storm[i].CancelAfter))
				}
				removed := rec.Fault("cancel-storm", fmt.Sprintf("%d sessions, median latency before %s", stormSessions, l))
				tStorm := phase("storm", stormFor, storm)
				removed(nil)
				during := history.Window{Start: tStorm + settle, End: tStorm + stormFor}

				By("reading the same slow reads again")
				tAfter := phase("after", phaseFor, slowSessions("after-"))
				after := history.Window{Start: tAfter + settle, End: tAfter + phaseFor}

				By(fmt.Sprintf("bursting %d × %d requests that fit in the queue", burstSessions, burstDepth))
				tBurst := phase("burst", 20*time.Second, load.Sessions(burstSessions, "burst-", load.Session{
					Outstanding: burstDepth, MaxRequests: burstDepth, Requests: []load.Request{load.SlowRead(burstService)},
				}))
				diagnostics(ctx, e, "storm.diag.", stormDiagnostics, figs)

				slow := []history.Kind{history.KindSlowRead}
				v := spec.Judge("cancellation", cond.Name, rec, figs,
					check.Spec{Name: "storm-exactly-once", Config: check.ExactlyOnceConfig{Kinds: slow, RequireCancels: true}},
					check.Spec{Name: "storm-errors", Config: check.ErrorBudgetConfig{
						Span:  check.Span{To: tBurst},
						Kinds: []history.Kind{history.KindSlowRead, history.KindCancel, history.KindSession},
						// a rejection in the storm is leaked capacity too
						Allowed: check.Codes{ua.StatusBadRequestCancelledByClient}, Drained: check.Codes{},
					}},
					// cancelled requests must not take the workers' time
					check.Spec{Name: "storm-goodput", Config: check.RecoveryConfig{Baseline: before, Recovered: during, Kinds: slow, MinRatio: minRatio}},
					check.Spec{Name: "storm-recovery", Config: check.RecoveryConfig{Baseline: before, Recovered: after, Kinds: slow, MinRatio: minRatio}},
					check.Spec{Name: "storm-burst", Config: check.ErrorBudgetConfig{Span: check.Span{From: tBurst}, Kinds: slow, Drained: check.Codes{}}},
				)
				Expect(v.Failed).To(BeFalse(), v.Explanation)
			}, SpecTimeout(2*time.Minute))
		})
	}
})
