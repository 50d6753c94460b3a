package wakeups_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/opcua-chaos/opcua-chaos/fixtures/check"
	"github.com/opcua-chaos/opcua-chaos/fixtures/env"
	"github.com/opcua-chaos/opcua-chaos/fixtures/history"
	"github.com/opcua-chaos/opcua-chaos/fixtures/load"
	"github.com/opcua-chaos/opcua-chaos/fixtures/spec"
	"github.com/opcua-chaos/opcua-chaos/server/catalog"
	"github.com/opcua-chaos/opcua-chaos/toxics"
)

const property = "wakeups"

// maxStall is the longest time requests may be outstanding with nothing
// completing (issue: no stall window ≥ 500 ms). The idle gaps of the bursty
// profile are longer, so a request stranded until the next burst shows.
const maxStall = 500 * time.Millisecond

// catches are the reference server's faults every spec is aimed at under
// baseline: a parked worker that misses its wakeup, a server that serves
// one request at a time, responses lost on a live connection.
var catches = []catalog.Fault{catalog.FaultLostWakeup, catalog.FaultSerialDispatch, catalog.FaultLostResponse}

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

// start requires caps and what cond needs of the target (a spec the target
// cannot run is skipped before anything starts), starts the environment
// with the reference server's worker pool set to workers (ignored by other
// targets) and applies cond.
func start(ctx context.Context, cond toxics.Condition, workers int, caps ...string) (*env.Env, *history.Recorder) {
	GinkgoHelper()
	h.Require(spec.Needs(cond, caps...)...)
	var opts []env.Option
	if workers > 0 {
		opts = append(opts, env.WithServerEnv(map[string]string{"OPCUA_WORKERS": fmt.Sprint(workers)}))
	}
	e, err := h.StartUnder(ctx, cond, opts...)
	Expect(err).NotTo(HaveOccurred(), "start environment")
	rec := h.NewRecorder(map[string]string{"condition": cond.Name, "security": cond.SecurityMode(), "workers": fmt.Sprint(workers)})
	_, err = spec.Apply(ctx, e, rec, cond)
	Expect(err).NotTo(HaveOccurred(), "apply %s", cond.Name)
	return e, rec
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

// readingSessionsFailed is the reading of how many sessions of a load
// could not be opened.
const readingSessionsFailed = "client.sessions_failed"

// run runs the load p on e, its sessions on e's channel security, and
// records how many of them could not be opened (sessionsOpened judges
// it).
func run(ctx context.Context, e *env.Env, rec *history.Recorder, p load.Profile) map[string]float64 {
	GinkgoHelper()
	p.Security = e.Security
	st, err := load.Run(ctx, rec, p)
	Expect(err).NotTo(HaveOccurred(), "run load %s", p.Name)
	rec.Reading(readingSessionsFailed, float64(st.SessionsFailed))
	return st.Figures()
}

// sessionsOpened is the check that every session of every load opened.
func sessionsOpened(name string) check.Spec {
	return check.Spec{Name: name, Config: check.ReadingsConfig{
		Reading: readingSessionsFailed, Stat: check.StatMax, Max: check.Bound(0), Required: true, Count: true,
		What: "sessions that could not be opened",
	}}
}

var _ = Describe("No lost wakeups", spec.Property(property), func() {
	It("keeps every request moving through a seeded nemesis schedule", Label("soak"), spec.Condition(toxics.Scheduled.Name), func(ctx SpecContext) {
		runFor := spec.SoakFor()
		e, rec := start(ctx, toxics.Scheduled, 0)
		// Nothing in the schedule closes a connection: every request
		// completes exactly once, none fails, and no session waits 2 s
		// with requests outstanding and nothing completing.
		checks := []check.Spec{
			{Name: "nemesis-stall", Config: check.StallConfig{GroupBy: check.BySession, MaxStall: 2 * time.Second, Kinds: []history.Kind{history.KindRead}}},
			{Name: "nemesis-errors", Config: check.ErrorBudgetConfig{}},
			{Name: "nemesis-exactly-once", Config: check.ExactlyOnceConfig{Kinds: []history.Kind{history.KindRead}}},
			sessionsOpened("nemesis-sessions"),
		}
		spec.Plan(checks...)
		steps, wait := spec.Nemesis(ctx, e, rec, runFor-5*time.Second)
		p := load.Pipelined(e.Endpoint, 10, 50)
		p.Name, p.Duration, p.RequestTimeout = "nemesis", runFor, 30*time.Second
		figs := run(ctx, e, rec, p)
		Expect(wait()).To(Succeed(), "nemesis schedule")
		figs["nemesis.steps"] = float64(steps)
		spec.Judge(ctx, property, toxics.Scheduled.Name, rec, figs, checks...)
	}, spec.SoakTimeout(2*time.Minute))

	DescribeTable("completes bursts separated by idle gaps, with few workers that park often", func(ctx SpecContext, cond toxics.Condition) {
		e, rec := start(ctx, cond, 2)
		checks := []check.Spec{stallCheck("bursty", check.BySession, history.KindRead),
			{Name: "bursty-errors", Config: check.ErrorBudgetConfig{}}, exactlyOnce("bursty-exactly-once"), sessionsOpened("bursty-sessions")}
		spec.Plan(checks...)
		// Seeded from the suite seed: replay with --seed.
		rng := rand.New(rand.NewPCG(uint64(GinkgoRandomSeed()), 0x5eed))
		// 4 s: every session wakes the server 3–6 times (idle gaps
		// of 0.6–1.2 s), 18–36 wakeups of parked workers per spec; a
		// lost one stalls its session for the rest of the run.
		p := load.Profile{Name: "bursty", Endpoint: e.Endpoint, Duration: 4 * time.Second}
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
		rec.SetLabel("profile", fmt.Sprint(gaps))
		figs := run(ctx, e, rec, p)
		spec.Judge(ctx, property, cond.Name, rec, figs, checks...)
	}, spec.Entries(toxics.CI(), catches, SpecTimeout(time.Minute)),
		spec.Entries(secured, nil, SpecTimeout(time.Minute), spec.Nightly))

	for _, capacity := range []struct {
		name    string
		workers int
	}{{"ample", 0}, {"scarce", 1}} {
		// catches fault lost-response (shapes-*-exactly-once, shapes-*-errors: lost responses)
		// catches fault crypto-in-gate, ample capacity under SignAndEncrypt (shapes-ample: a stall)
		DescribeTable(fmt.Sprintf("completes pipelines of shapes 1×200, 10×100 and 64×1 with %s server capacity", capacity.name), func(ctx SpecContext, cond toxics.Condition) {
			e, rec := start(ctx, cond, capacity.workers)
			prefix := "shapes-" + capacity.name
			checks := []check.Spec{stallCheck(prefix, check.ByRun, history.KindRead),
				{Name: prefix + "-errors", Config: check.ErrorBudgetConfig{}}, exactlyOnce(prefix + "-exactly-once"), sessionsOpened(prefix + "-sessions")}
			spec.Plan(checks...)
			figs := map[string]float64{}
			for _, shape := range []struct{ sessions, outstanding int }{{1, 200}, {10, 100}, {64, 1}} {
				name := fmt.Sprintf("%dx%d", shape.sessions, shape.outstanding)
				By("driving " + name)
				rec.Mark("shape "+name, "")
				p := load.Pipelined(e.Endpoint, shape.sessions, shape.outstanding)
				// 1.5 s a shape: every worker parks and wakes
				// thousands of times in it (a few ms a request);
				// the lost-wakeup fault stalled the pipeline
				// within the first shape at 2 s a shape
				p.Name, p.Duration = name, 1500*time.Millisecond
				for i := range p.Sessions {
					p.Sessions[i].Name = fmt.Sprintf("%s-%02d", name, i)
				}
				for k, v := range run(ctx, e, rec, p) {
					figs[name+"."+k] = v
				}
			}
			// Progress is judged over the whole server: with one
			// worker, 1 000 requests queue in one owner's FIFO in
			// blocks of a session's pipeline, so a session waits
			// for the other sessions' blocks (≈ 900 requests,
			// 200–500 ms under 0.5 CPU) without any wakeup being
			// lost. The seed's stall (an emptied owner left with
			// no turn) stops the whole pipeline; a session starved
			// for good fails MaxLatency.
			spec.Judge(ctx, property, cond.Name, rec, figs, checks...)
		}, spec.Entries(toxics.CI(), catches, SpecTimeout(90*time.Second)),
			// SignAndEncrypt breaks deep pipelines first: the ample
			// capacity's shapes under it are in the CI profile
			securedShapes(capacity.name, SpecTimeout(90*time.Second)))

	}

	DescribeTable("answers every round of lockstep requests, the server drained between rounds", func(ctx SpecContext, cond toxics.Condition) {
		e, rec := start(ctx, cond, 0)
		checks := []check.Spec{stallCheck("lockstep", check.ByRun, history.KindRead),
			{Name: "lockstep-errors", Config: check.ErrorBudgetConfig{}}, exactlyOnce("lockstep-exactly-once"), sessionsOpened("lockstep-sessions")}
		spec.Plan(checks...)
		// 4 sessions send 2 requests each at once, and the next round
		// only when all 8 are answered: every round ends with the
		// server's queue empty and its workers parked, so a request a
		// parked worker was never woken for has no later arrival to
		// rescue it. In the other specs arrivals never stop, and the
		// same fault stalls only when the race falls on the last
		// request before a pause. Hundreds of rounds a second at
		// baseline, ~20 under latency; the in-process reference server
		// with the lost-wakeup fault stranded a request in 12 of 12
		// runs of 1.5 s (2 and 8 workers, 1–4 requests a session).
		//
		// A round still waiting after a second gets a nudge: one more
		// request, which wakes a parked worker. A stranded request is
		// then answered, 1 s late, and the stall check names the wait
		// a stall a nudge ended (a lost wakeup); a response the server
		// dropped is not brought by it and stays a lost response at the
		// request timeout. A clean round takes milliseconds (~100 ms
		// under latency+cpu), so a clean server is never nudged; a wait
		// of 1 s is twice maxStall and fails the stall check anyway.
		p := load.Profile{Name: "lockstep", Endpoint: e.Endpoint, Duration: time.Second, Lockstep: true,
			Nudge: time.Second,
			// well past the nudge: a dropped response costs 3 s,
			// not the default 10 s
			RequestTimeout: 3 * time.Second,
			Sessions:       load.Sessions(4, "step", load.Session{Outstanding: 2})}
		figs := run(ctx, e, rec, p)
		spec.Judge(ctx, property, cond.Name, rec, figs, checks...)
	}, spec.Entries(toxics.CI(), []catalog.Fault{catalog.FaultLostWakeup, catalog.FaultLostResponse}, SpecTimeout(time.Minute)),
		spec.Entries(secured, nil, SpecTimeout(time.Minute), spec.Nightly))

	DescribeTable("keeps serving fast requests while other sessions' slow requests run", func(ctx SpecContext, cond toxics.Condition) {
		e, rec := start(ctx, cond, 0, "service-time")
		checks := []check.Spec{stallCheck("head-of-line", check.BySession, history.KindRead),
			{Name: "head-of-line-errors", Config: check.ErrorBudgetConfig{}}, exactlyOnce("head-of-line-exactly-once"), sessionsOpened("head-of-line-sessions")}
		spec.Plan(checks...)
		// 4 sessions keep one 1 s request each in flight; a
		// server that serves requests one at a time (head-of-line
		// blocking) leaves the fast session waiting a second.
		// 3 s: three rounds of the slow requests; serial dispatch
		// stalls the fast session a whole second in each
		p := load.Profile{Name: "head-of-line", Endpoint: e.Endpoint, Duration: 3 * time.Second}
		p.Sessions = append(load.Sessions(4, "slow", load.Session{Outstanding: 1, Requests: []load.Request{load.SlowRead(time.Second)}}),
			load.Session{Name: "fast", Outstanding: 4})
		figs := run(ctx, e, rec, p)
		spec.Judge(ctx, property, cond.Name, rec, figs, checks...)
	}, spec.Entries(toxics.CI(), catches, SpecTimeout(time.Minute)),
		spec.Entries(secured, nil, SpecTimeout(time.Minute), spec.Nightly))
})
