package fairness_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"

	"github.com/opcua-chaos/opcua-chaos/fixtures/check"
	"github.com/opcua-chaos/opcua-chaos/fixtures/history"
	"github.com/opcua-chaos/opcua-chaos/fixtures/load"
	"github.com/opcua-chaos/opcua-chaos/fixtures/machine"
	"github.com/opcua-chaos/opcua-chaos/fixtures/report"
	"github.com/opcua-chaos/opcua-chaos/fixtures/scenario"
	"github.com/opcua-chaos/opcua-chaos/fixtures/spec"
	"github.com/opcua-chaos/opcua-chaos/fixtures/target"
	"github.com/opcua-chaos/opcua-chaos/fixtures/watch"
	"github.com/opcua-chaos/opcua-chaos/server/catalog"
	"github.com/opcua-chaos/opcua-chaos/toxics"
)

const property = "fairness"

// h starts environments; spec.Bootstrap fills it before the first spec.
var h = spec.Bootstrap()

func TestFairness(t *testing.T) { spec.RunSuite(t, property) }

// timeline is the course of a fairness run: a warm-up, then the judged
// windows.
type timeline struct {
	warmup, window time.Duration
	windows        int
	// nemesis: inject a nemesis schedule drawn from the suite seed
	// (toxics.Schedule) while the load runs.
	nemesis bool
}

// ciRun is the CI profile's timeline: 4 windows of 1 s (median of ≥ 3
// valid ones, one to spare) after a 0.75 s warm-up (the owners' shares settle
// within the first 0.5 s under every condition: 2.7–2.9 heavy/light in it,
// 2.9–3.1 in every later 0.5 s, measured in a CI-profile run). A window
// holds ~700 of the light owner's requests under every condition (the
// worker-bound shape, the slowest: ~740 a second). The window's median is
// what is judged: medians of 2 s windows spread 2.994–3.004 over a whole
// CI run and of 1.5 s windows 3.001–3.008 (band 2.5–3.5), so a window of
// 1 s (√1.5 more noise) still keeps a clean server 0.49 from the band,
// while the faults sit outside it (unweighted 1.00, turn-stall 2.19–2.25:
// a systematic shift, not noise), and saves 2 s a spec. soakRun judges
// 28 windows through a nemesis schedule.
var (
	ciRun   = timeline{warmup: 750 * time.Millisecond, window: time.Second, windows: 4}
	soakRun = timeline{warmup: 2 * time.Second, window: 2 * time.Second, windows: int((spec.SoakLength() - 2500*time.Millisecond) / (2 * time.Second)), nemesis: true}
)

// runFor is how long the load runs: warm-up, windows and a margin.
func (t timeline) runFor() time.Duration {
	return t.warmup + time.Duration(t.windows)*t.window + 500*time.Millisecond
}

// span is the judged part of a run: whole windows after the warm-up.
func (t timeline) span() check.Span {
	return check.Span{From: t.warmup, To: t.warmup + time.Duration(t.windows)*t.window, Window: t.window}
}

// quiet is the assumption that the host left the run alone, over the
// span's own windows: a window it disturbed is left out of the shares.
func (t timeline) quiet() check.Spec {
	q := scenario.Quiet(t.span())
	q.Stage = check.Assumption
	return q
}

// judged is the part of the run whose server-side readings show the
// owners were backlogged: the judged windows.
func (t timeline) judged() check.Span {
	return check.Span{From: t.warmup, To: t.span().To}
}

// Bounds of the fairness runs.
const (
	// minServerBacklog is the median number of an owner's requests that
	// must wait in the server's queue (where the target reports it) for
	// the owner to count as backlogged at the server.
	minServerBacklog = 10
	// maxDryRate bounds how often an owner's server queue may run dry
	// during the judged windows, per request of that owner dispatched
	// (Owner.<name>.Emptied and .Dispatched, where the target reports
	// them). Running dry costs an owner at most the rest of its round, so
	// 1 % costs a weight-3 owner at most 2 % of its share.
	maxDryRate = 0.01
	// sampleEvery is the period of the server-side diagnostics readings.
	sampleEvery = 500 * time.Millisecond
	// deep is the per-session pipeline depth: a client-side backlog only
	// proves a server-side one when it is deep (FIELD-NOTES).
	deep = 100
)

// shape is how a request occupies the server. Fairness is judged with both:
// a scheduler bug shows in one and hides in the other.
type shape struct {
	// name goes into spec texts and check names.
	name string
	// catches are the faults of the reference server that the weighted
	// spec of this shape must catch under baseline (the fault matrix).
	catches []catalog.Fault
	// request is what every session sends.
	request load.Request
	// cpuBound: the request burns server CPU, so under a CPU limit the
	// server must use that limit (saturation precondition).
	cpuBound bool
	// requires are the capabilities the request needs of the target
	// ("service-time" for the test nodes).
	requires []target.Capability
	// standard is the shape to run instead on a target without the
	// test nodes (nil: none, the spec skips naming the nodes).
	standard *shape
}

// on returns the shape that runs on p: sh, or its standard-node shape
// where p lacks the test nodes sh needs (Busy; a worker-bound shape has
// none and skips).
func (sh shape) on(p target.Profile) shape {
	if sh.standard != nil && p.Requires(sh.requires...) != "" {
		return *sh.standard
	}
	return sh
}

// nodes is "standard" for a shape that reads only the standard address
// space, else "test": the history's label "nodes" and the row's figure
// <spec>.nodes_standard (report.StandardNodes) say which ran.
func (sh shape) nodes() string {
	if len(sh.requires) == 0 {
		return "standard"
	}
	return "test"
}

// secured are the conditions of the rows under SignAndEncrypt (nightly
// only): the baseline, with every client on SignAndEncrypt channels.
var secured = toxics.Secured(toxics.SecuritySignEncrypt, toxics.Baseline)

var (
	// cpuBound requests burn 1 ms of server CPU (Busy.1000): the server's
	// CPU is the bottleneck, long enough per request that the load driver
	// and the proxy are not (at 200 µs they are, on 2 cores).
	// Ignored weights (unweighted) show in either shape.
	cpuBound = shape{name: "cpu-bound", request: load.BusyRead(time.Millisecond), cpuBound: true,
		requires: []target.Capability{target.CapabilityServiceTime}, standard: &standardCPU,
		catches: []catalog.Fault{catalog.FaultUnweighted}}
	// standardCPU is cpuBound on a target without Busy: Reads of
	// standardItems scalar values of the Server object's ServerStatus
	// (load.StandardRead), which every server has. Each costs the server
	// standardItems lookups and encodings and the driver one decode (the
	// row's figures load.server_cpu_us_per_request and
	// load.client_cpu_us_per_request measure both). A server faster than
	// the driver at this (open62541 45 µs a request against the driver's
	// 29 µs) does not fill its 1-core limit on a 2-core machine: the
	// calibration lowers the limit until it does (runShare).
	standardCPU = shape{name: "cpu-bound", request: load.StandardRead(standardItems), cpuBound: true,
		catches: []catalog.Fault{catalog.FaultUnweighted}}
	// workerBound requests hold a worker for 2 ms without CPU (Slow.2):
	// the worker pool is the bottleneck and dispatches thousands of
	// requests per second, so a scheduler that loses turns for a
	// millisecond (fault turn-stall) shows; CPU-bound service at the same
	// rate would saturate the machine's two cores before the server
	// (turn-stall skews heavy/light to 2.05–2.22; the CPU-bound spec does
	// not see it, its 1 ms requests dwarf the 1 ms stall).
	workerBound = shape{name: "worker-bound", request: load.SlowRead(2 * time.Millisecond), requires: []target.Capability{target.CapabilityServiceTime},
		catches: []catalog.Fault{catalog.FaultUnweighted, catalog.FaultTurnStall}}
)

// standardItems is the number of values a standard CPU-bound Read asks
// for: far below any server's MaxNodesPerRead (S2OPC 5000, the reference
// server 10 000, open62541 none).
const standardItems = 100

// isolationCatches are the faults the isolation spec's baseline row must
// catch. Its owners are of equal weight with unequal session counts (the
// flood 8 sessions, the victim 2): a server that keys its queue by session
// instead of user (per-session-owners) serves them 8:2, a median ratio
// of 0.25 against 0.8, and the shares' failure names the shape ("shares
// follow sessions"). The weighted specs are not aimed at it: their owners
// have 4 sessions each, so per-session service (no session is an owner
// the weights name) serves them 1:1: the same history as ignored weights
// (unweighted), which no first line can tell apart from it.
var isolationCatches = []catalog.Fault{catalog.FaultPerSessionOwners}

// owners describes the sessions of each owner in a run.
type owner struct {
	user     string
	password string
	sessions int
}

// runShare is the workload of a share run: it drives every owner's
// sessions with deep pipelines of sh's requests (the runner has put the
// target under the run's condition, and its observers record the
// server's CPU and its owners' queue counters into the history: the
// assumptions' readings), and reports the extra figures.
//
// The load goes on past the planned windows while fewer than the planned
// number of them were quiet (scenario.MeasureQuiet, judged with the bounds of
// tl's quiet assumption), at most as long again: windows the host
// disturbed are left out of the shares, and the spec is judged on quiet
// ones. A CPU-bound shape under a CPU limit calibrates it first
// (watch.SaturateCPU, in the warm-up): a server that did not use 0.9 of
// its limit (the driver or the proxy on a machine they share, or its own
// waits, setting the pace) gets 0.75 of what it used, and the judged
// windows start capSettle after that (the load runs as much longer); the
// limits and the use measured are readings, and the row's figures
// <name>.cpu_cap, .cpu_cap_from and .cpu_cap_used. The run's checks
// (checks of tl, planned before the load) are then replaced (Run.Check,
// by name) by checks of the timeline with the windows the load covered.
func runShare(name string, sh shape, tl timeline, owners []owner, checks func(timeline) []check.Spec) scenario.Workload {
	// closure: the CPU calibration (watch.SaturateCPU) steers the load while it runs: it extends it and moves the judged windows, and the checks are rebuilt from what it measured
	return func(ctx context.Context, r *scenario.Run) error {
		e, rec, cond := r.Env, r.Rec, r.Scenario.Condition
		r.StandardNodes(name, sh.nodes() == "standard")
		mq := scenario.NewMeasureQuiet(rec, tl.quiet(), tl.windows)
		if tl.nemesis {
			// a soak needs a few quiet windows of its many, not all
			mq.Want, mq.Extra = max(3, tl.windows/2), time.Duration(tl.windows/4)*tl.window
		}
		if n := measureCap(cond, sh); n > 0 && e.Server != nil {
			// Not a fault: the measurement's setup, marked in the history.
			if _, err := e.LimitCPU(ctx, n); err != nil {
				return fmt.Errorf("limit the server to %.2f cores: %w", float64(n)/1e9, err)
			}
			rec.Mark("measure-cpu-cap", fmt.Sprintf("server limited to %.2f of %d cores so that the load driver and the proxy keep one", float64(n)/1e9, runtime.NumCPU()))
		}
		ext := mq.Extension()
		var sat *watch.Saturator
		if limit := cpuLimit(cond, sh); limit > 0 && e.Server != nil {
			// The server must saturate its limit for the shares to judge
			// its scheduler: a server faster than the driver on this
			// machine gets a lower one (calibrate), and the judged
			// windows start once the owners' shares have settled under
			// it (mq.Shift), the load running that much longer.
			sat = watch.SaturateCPU(ctx, e, rec, watch.SaturateConfig{Limit: limit})
			ext = calibrated(ext, sat, mq, tl)
			defer func() { _, _ = sat.Stop() }() // an early return's; its error is the return's below
		}
		p := load.Profile{Name: "share", Duration: tl.runFor(), RequestTimeout: 30 * time.Second, Extend: ext}
		if sat != nil {
			p.Started = sat.Started
		}
		// the shares are between the owners' sessions as given: all of
		// them, or the spec skips naming the target's session limit
		var sizes []string
		total := 0
		for _, o := range owners {
			sizes = append(sizes, fmt.Sprint(o.sessions))
			total += o.sessions
		}
		// every owner is a user: the shape is sized against the limit
		// of user logins
		if _, err := r.NeedSessions(strings.Join(sizes, "+"), target.UserSessions, total); err != nil {
			return err
		}
		for i, o := range owners {
			// each owner a client application of its own: on a secured
			// condition its sessions take the run's i-th client identity
			// (in turn, where there are more owners than identities)
			p.Sessions = append(p.Sessions, load.Sessions(o.sessions, o.user+"-", load.Session{
				User: o.user, Password: o.password, Outstanding: deep,
				Requests: []load.Request{sh.request}, Identity: i + 1,
			})...)
		}
		if err := (scenario.Profile{Profile: p}).Drive(ctx, r); err != nil {
			return err
		}
		r.AddFigures("", mq.Figures())
		if sat != nil {
			res, err := sat.Stop()
			if err != nil {
				return err
			}
			r.Figures[name+"."+report.CPUCap] = watch.Cores(res.Cap)
			r.Figures[name+"."+report.CPUCapFrom] = watch.Cores(res.From)
			r.Figures[name+"."+report.CPUCapUsed] = res.Used
			tl.warmup += capShift(res, tl)
		}
		tl.windows = mq.Windows()
		r.Check(checks(tl)...) // same names: replaced in place
		return nil
	}
}

// ownerNodes are the reference server's queue counters of owners (queued,
// emptied, dispatched), which the backlog assumptions read.
func ownerNodes(owners []owner) []history.DiagnosticsNode {
	var nodes []history.DiagnosticsNode
	for _, o := range owners {
		nodes = append(nodes, history.OwnerNode(o.user, history.OwnerQueued), history.OwnerNode(o.user, history.OwnerEmptied), history.OwnerNode(o.user, history.OwnerDispatched))
	}
	return nodes
}

// capSettle is how long the owners' shares are given to settle under a
// CPU limit a calibration lowered before the judged windows start: the
// same as under the first limit (they settle within 0.5 s, see ciRun).
const capSettle = 500 * time.Millisecond

// capShiftMax bounds how much later than planned the judged windows may
// start after a calibration (its measurement, the engine's update and
// capSettle, ~1.3 s after the load started): the load's extension grows
// by it.
const capShiftMax = 3 * time.Second

// capShift is how much later than planned the judged windows start when
// a calibration lowered the limit: capSettle after the new limit took
// effect (0 when it stood).
func capShift(res watch.Saturation, tl timeline) time.Duration {
	if !res.Changed() {
		return 0
	}
	return min(max(res.At+capSettle-tl.warmup, 0), capShiftMax)
}

// calibrated returns the load's extension x with a calibration sat: the
// load goes on while it is pending, and once it has lowered the limit,
// until the planned windows, moved after it (mq.Shift), have ended.
func calibrated(x machine.Extension, sat *watch.Saturator, mq *scenario.MeasureQuiet, tl timeline) machine.Extension {
	more := x.More
	var once sync.Once
	x.More = func() bool {
		res, done := sat.Result()
		if !done {
			return true
		}
		once.Do(func() { mq.Shift(capShift(res, tl)) })
		return more()
	}
	x.Max += capShiftMax
	return x
}

// share is the scenario of a share run named name under cond: the checks
// of tl planned, the server and its owners' queue counters observed, the
// workload runShare (with tl's nemesis schedule, if any), on a target
// with caps.
func share(name string, cond toxics.Condition, sh shape, tl timeline, owners []owner, checks func(timeline) []check.Spec, caps ...target.Capability) scenario.Scenario {
	s := scenario.Scenario{
		Property: property, Name: name, Condition: cond, Requires: append(caps, sh.requires...),
		Labels: map[string]string{"nodes": sh.nodes()},
		Checks: checks(tl),
		Observers: []scenario.Observer{
			scenario.Server{},
			scenario.DiagnosticsSampler{Nodes: ownerNodes(owners), Every: sampleEvery},
		},
		Workload: runShare(name, sh, tl, owners, checks),
	}
	if tl.nemesis {
		s.Schedule = tl.runFor() - 5*time.Second
		// the load's whole run, not the schedule's shorter one, is the
		// planned length of the progress lines and the disk guard
		s.Planned = tl.runFor()
	}
	return s
}

// measureCap is the CPU limit, in nano-CPUs, a share run of sh puts on a
// server container that cond leaves unlimited: one core less than the
// host, so that the load driver and the proxy keep a core. CPU-bound
// requests on an unlimited server take every core of a 2-core machine
// (1.5–1.96 cores measured), the client's timers then run a median
// 46–258 ms late and the owners' shares measure the starved client (flood
// isolation fell to 0.66–0.76 on a clean server; Quiet names it "client
// starved"). A server limited to one of two cores keeps the scheduler the
// bottleneck, which is what the shares judge. 0 when cond limits the CPU
// itself, for worker-bound requests (they hold workers, not CPU), or on a
// 1-CPU host (nothing to leave; Quiet judges what happens).
func measureCap(cond toxics.Condition, sh shape) int64 {
	if cond.NanoCPUs > 0 || !sh.cpuBound || runtime.NumCPU() < 2 {
		return 0
	}
	return int64(runtime.NumCPU()-1) * 1e9
}

// cpuLimit is the CPU limit, in nano-CPUs, in force on the server when a
// share run of sh under cond starts: the condition's, or measureCap's (0:
// none). Only a CPU-bound shape is judged against it.
func cpuLimit(cond toxics.Condition, sh shape) int64 {
	if !sh.cpuBound {
		return 0
	}
	if cond.NanoCPUs > 0 {
		return cond.NanoCPUs
	}
	return measureCap(cond, sh)
}

// assumptions are the checks a share run rests on, judged before the
// shares (check.Assume), where the target reports their readings. Every
// owner was backlogged at the server, not only at the client (a
// client-side backlog does not prove a server-side one, FIELD-NOTES):
// requests waited in its queue (median ≥ minServerBacklog), and the queue
// did not run dry during the judged windows (maxDryRate). Both are needed:
// at 200 µs of CPU per request the proxy and the load driver share the two
// cores with the server, the heavy owner's median queue stays above 10 and
// yet it runs dry over and over, and its share falls to the light owner's.
// A CPU-limited server serving CPU-bound requests must be saturated (≥ 80
// % of its limit), or the shares say nothing about its scheduler. And the
// load driver had CPU to spare (scenario.Headroom). The two backlog
// assumptions read the server's own counters (check.AssumeServer): a
// server whose bug empties them (owners keyed by session, not user)
// fails on its shares, named first, instead of reading not judged.
func assumptions(name string, cond toxics.Condition, sh shape, tl timeline, owners ...string) []check.Spec {
	var out []check.Spec
	for _, o := range owners {
		out = append(out,
			check.AssumeServer(name+"-backlog-"+o, check.ReadingsConfig{
				Span: tl.judged(), Reading: history.OwnerNode(o, history.OwnerQueued).Reading(), Stat: check.StatMedian, Min: check.Bound(minServerBacklog),
				What: "median requests of owner " + o + " queued at the server",
			}),
			check.AssumeServer(name+"-dry-"+o, check.ReadingsConfig{
				Span: tl.judged(), Reading: history.OwnerNode(o, history.OwnerEmptied).Reading(), Stat: check.StatDelta, Ratio: history.OwnerNode(o, history.OwnerDispatched).Reading(), Max: check.Bound(maxDryRate),
				What: "times owner " + o + "'s queue ran dry at the server per request dispatched",
			}))
	}
	limit := float64(cond.NanoCPUs) / 1e9
	if c := measureCap(cond, sh); c > 0 && h.Setup.Target.Kind == target.Container {
		limit = float64(c) / 1e9
	}
	// The driver had CPU to spare over the judged windows (a client-bound
	// run measured it), against the server's limit then in force: the
	// one the run recorded (a calibration's), else limit.
	headroom := scenario.Headroom(limit)
	hc := headroom.Config.(check.HeadroomConfig)
	hc.Span, hc.ServerLimit = tl.judged(), history.ReadingCPULimit
	headroom.Config = hc
	out = append(out, headroom, tl.quiet())
	if sh.cpuBound && limit > 0 {
		// the share of the limit in force over the judged windows, as the
		// run recorded it (at the start, and when a calibration lowered it)
		out = append(out, check.Assume(name+"-saturated", check.ReadingsConfig{
			Span:    tl.judged(),
			Reading: history.ReadingCPU, Stat: check.StatRate, Per: history.ReadingCPULimit, Min: check.Bound(minSaturation),
			What: "share of its CPU limit the server used over the judged windows",
		}))
	}
	return out
}

// minSaturation is the share of its CPU limit a server serving CPU-bound
// requests must use over the judged windows for its shares to say
// anything about its scheduler.
const minSaturation = 0.8

// weighted is the weighted scenario: the heaviest and the lightest of
// the target's weighted owners (the reference server's heavy:3,light:1,
// or OPCUA_CHAOS_WEIGHTS) with the same sessions and pipelines; the
// median heavy/light ratio of the valid windows must be within 1/6 of the
// weight ratio (2.5–3.5 for 1:3).
// It needs configured weights and users; the worker-bound shape needs
// Slow.<ms> nodes, the CPU-bound one runs on Busy.<µs> or, without it, on
// standard nodes.
func weighted(cond toxics.Condition, sh shape, tl timeline) scenario.Scenario {
	sh = sh.on(h.Setup.Target)
	heavy, light, want, _ := h.Setup.Target.Weighted()
	name := "weighted-" + sh.name
	checks := func(tl timeline) []check.Spec {
		return append(assumptions(name, cond, sh, tl, heavy.Name, light.Name),
			check.Spec{Name: name, Config: check.ShareConfig{
				Span: tl.span(), Owners: []string{heavy.Name, light.Name},
				Weights: map[string]float64{heavy.Name: want, light.Name: 1},
				Kinds:   []history.Kind{sh.request.Kind}, MinRatio: 5.0 / 6, MinOutstanding: deep / 2, MinServed: 20,
				Band: &check.ShareBand{Of: heavy.Name, Over: light.Name, Min: want * 5 / 6, Max: want * 7 / 6},
			}},
			check.Spec{Name: name + "-errors", Config: check.ErrorBudgetConfig{Kinds: []history.Kind{sh.request.Kind}}},
		)
	}
	return share(name, cond, sh, tl, []owner{
		{heavy.Name, heavy.Password, 4},
		{light.Name, light.Password, 4},
	}, checks, target.CapabilityWeights, target.CapabilityUsers)
}

// weightedCI is the weighted scenario of sh under a condition, over the
// CI profile's timeline.
func weightedCI(sh shape) func(toxics.Condition) scenario.Scenario {
	return func(cond toxics.Condition) scenario.Scenario { return weighted(cond, sh, ciRun) }
}

// isolation keeps a flooding owner from starving another of equal weight
// (the target's first two users of equal weight, flood and victim): the
// flood has 8 sessions, the victim 2, CPU-bound (Busy.<µs> or, without it,
// standard nodes). It needs users.
func isolation(cond toxics.Condition, flood, victim target.User) scenario.Scenario {
	cpuBound := cpuBound.on(h.Setup.Target)
	// min/max of two equal owners ≥ 0.8 is the 0.8–1.25
	// band; the victim is served in every window.
	checks := func(tl timeline) []check.Spec {
		return append(assumptions("isolation", cond, cpuBound, tl, flood.Name, victim.Name),
			check.Spec{Name: "isolation", Config: check.ShareConfig{
				Span: tl.span(), Owners: []string{flood.Name, victim.Name},
				Kinds: []history.Kind{cpuBound.request.Kind}, MinRatio: 0.8, MinOutstanding: deep / 2, MinServed: 20,
				Unstarved: []string{victim.Name},
			}},
			check.Spec{Name: "isolation-errors", Config: check.ErrorBudgetConfig{Kinds: []history.Kind{cpuBound.request.Kind}}},
		)
	}
	return share("isolation", cond, cpuBound, ciRun, []owner{
		{flood.Name, flood.Password, 8},
		{victim.Name, victim.Password, 2},
	}, checks, target.CapabilityUsers)
}

var _ = Describe("Fairness", spec.Property(property), func() {
	It(fmt.Sprintf("serves owners weighted 1:3 through a seeded nemesis schedule, worker-bound (median of %d windows)", soakRun.windows), Label("soak"), spec.Condition(toxics.Scheduled.Name), func(ctx SpecContext) {
		spec.SoakFor() // fails the spec on a bad SOAK value; soakRun has its length
		h.Run(ctx, weighted(toxics.Scheduled, workerBound, soakRun))
	}, spec.SoakTimeout(2*time.Minute))

	// Each spec starts its own environment once it knows the target can
	// run it: the spec timeout includes the start. A target without two
	// users of equal weight skips the isolation spec, unless it lacks a
	// capability the spec needs (the runner's skip, named first).
	DescribeTable("keeps a flooding owner from starving another of equal weight", func(ctx SpecContext, cond toxics.Condition) {
		flood, victim, ok := h.Setup.Target.EqualPair()
		s := isolation(cond, flood, victim)
		if !ok && h.Setup.Target.Requires(s.Needs()...) == "" {
			spec.SkipAs(report.SkipCapability, fmt.Sprintf("target %s has no two users of equal weight (weights %s)", h.Setup.Target.Name, target.WeightsEnv(h.Setup.Target.Weights)))
		}
		h.Run(ctx, s)
	}, spec.Entries(toxics.CI(), isolationCatches, SpecTimeout(2*time.Minute)),
		spec.Entries(secured, nil, SpecTimeout(2*time.Minute), spec.Nightly))

	for _, sh := range []shape{cpuBound, workerBound} {
		DescribeTable("serves owners weighted 1:3 in proportion, "+sh.name+" (median of windows 2.5–3.5)", h.Scenario(weightedCI(sh)),
			spec.Entries(toxics.CI(), sh.catches, Label("service:"+sh.name), SpecTimeout(2*time.Minute)),
			spec.Entries(secured, nil, Label("service:"+sh.name), SpecTimeout(2*time.Minute), spec.Nightly))
	}
})
