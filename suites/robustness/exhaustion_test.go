package robustness_test

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gopcua/opcua/ua"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/opcua-chaos/opcua-chaos/fixtures/attack"
	"github.com/opcua-chaos/opcua-chaos/fixtures/check"
	"github.com/opcua-chaos/opcua-chaos/fixtures/env"
	"github.com/opcua-chaos/opcua-chaos/fixtures/history"
	"github.com/opcua-chaos/opcua-chaos/fixtures/spec"
	fresh "github.com/opcua-chaos/opcua-chaos/fixtures/victim"
	"github.com/opcua-chaos/opcua-chaos/fixtures/watch"
	"github.com/opcua-chaos/opcua-chaos/server/catalog"
	"github.com/opcua-chaos/opcua-chaos/toxics"
)

// The resource-exhaustion spec: attacks that try to make the server hold
// more memory than it can, lock other clients out, or spend its CPU for
// nothing, while fresh clients try to log in beside them.
const (
	// exhaustHold is how long each attack holds what it made the server
	// hold while the probers try to get in.
	exhaustHold = 8 * time.Second
	// maxLockout is the longest a fresh client may be unable to connect,
	// open a session, log in and read during or after an attack.
	maxLockout = 5 * time.Second
	// maxProbeLatency bounds one successful probe's login (connect to
	// ActivateSession): one slower than the lockout bound was locked out
	// as long. (A login took 3.5 s while the reference server decoded the
	// queue bomb's 1.6 GB on two cores: slow, not locked out.)
	maxProbeLatency = maxLockout
	// exhaustBaseline is the quiet phase before the attacks (memory and
	// probes at rest).
	exhaustBaseline = 3 * time.Second
	// peakFactor and peakSlack size the memory bound from the budget the
	// server reports: baseline + budget × peakFactor + peakSlack (a garbage
	// collected heap may hold up to twice its live bytes).
	peakFactor = 2
	peakSlack  = 96 << 20
	// maxGuessRate is the most failed logins per second one peer may get
	// answered from a server that declares a login throttle.
	maxGuessRate = 5
)

// exhaustLimits configures the reference server so that the attacks go
// past its limits quickly: 300 connections, 200 sessions (100 of them
// unactivated, 100 anonymous). Its memory budget keeps its default.
var exhaustLimits = map[string]string{"OPCUA_MAX_CONNECTIONS": "300", "OPCUA_MAX_SESSIONS": "200"}

// exhaustCatches are the protections the spec is aimed at: each fault
// switch undoes one.
var exhaustCatches = []catalog.Fault{
	catalog.FaultNoByteBudget, catalog.FaultLoginHoldsRequests, catalog.FaultChunksPerChannelOnly,
	catalog.FaultItemQueuesUnbounded, catalog.FaultLongSessionStrings,
	catalog.FaultIdleAfterOpen, catalog.FaultSessionsOutliveChannels, catalog.FaultUnactivatedRefuse,
	catalog.FaultRSABlocksUnbounded, catalog.FaultThrottlePairOnly,
}

// exhaustion runs the exhaustion attacks one after another while fresh
// clients probe, and judges survival, answers, lockouts, memory and the
// guess rate.
func exhaustion(ctx SpecContext, cond toxics.Condition) {
	h.Require(spec.Needs(cond)...)
	limits := attack.ExhaustionLimits{Hold: exhaustHold}
	var opts []env.Option
	if isReference() {
		opts = append(opts, env.WithServerEnv(exhaustLimits))
		limits.MaxConnections, limits.MaxSessions = 300, 200
	}
	if h.Setup.Target.ServiceTime {
		limits.SlowNode = ua.NewStringNodeID(1, "Slow.5000")
	}
	e, err := h.StartUnder(ctx, cond, opts...)
	Expect(err).NotTo(HaveOccurred(), "start environment")
	rec := h.NewRecorder(map[string]string{"condition": cond.Name, "security": cond.SecurityMode()})
	_, err = spec.Apply(ctx, e, rec, cond)
	Expect(err).NotTo(HaveOccurred(), "apply %s", cond.Name)
	w := watch.New(e, rec, watch.Options{Sessions: h.Setup.Probe.StandardDiagnostics.Found, Connections: e.Target.Diagnostics})
	DeferCleanup(w.Close, NodeTimeout(10*time.Second))
	// memory and CPU are read on a Watch of its own, back to back (at
	// most every 250 ms; a Docker stats call takes about a second), beside
	// the state readings
	mw := watch.New(e, rec, watch.Options{})
	DeferCleanup(mw.Close, NodeTimeout(10*time.Second))

	// The probers: a fresh client every second, logging in as the
	// target's first user (anonymous if it has none), over None and, on a
	// secured condition, over the condition's mode too. They come from
	// another peer than the attackers (the server's own endpoint, not the
	// proxy's): a victim is another host, and a server may well cap what
	// one peer address holds.
	var user, password string
	if us := h.Setup.Target.Users; len(us) > 0 {
		user, password = us[0].Name, us[0].Password
	}
	probeCfg := fresh.Config{Endpoint: e.DirectEndpoint, User: user, Password: password, Duration: 10 * time.Minute}
	probers := []*fresh.Prober{fresh.Start(ctx, rec, probeCfg)}
	if e.Security.Secured() {
		probeCfg.Security = e.Security
		probers = append(probers, fresh.Start(ctx, rec, probeCfg))
	}
	stopProbers := func() {
		for _, p := range probers {
			p.Stop()
		}
	}
	DeferCleanup(stopProbers)
	budget := 0.0
	if e.Target.Diagnostics {
		budget, err = fresh.ReadBudget(ctx, rec, e.DirectEndpoint, e.Security)
		Expect(err).NotTo(HaveOccurred(), "read the memory budget the server reports (%s)", fresh.BudgetNode)
	}

	By(fmt.Sprintf("at rest: %v of probes and memory readings", exhaustBaseline))
	stopMem := fresh.Every(ctx, fresh.MemoryEvery, 15*time.Minute, mw.Usage)
	DeferCleanup(func() { stopMem() })
	baseline := history.Window{Start: rec.Now()}
	w.State(ctx)
	sleep(ctx, exhaustBaseline)
	baseline.End = rec.Now()

	runner := &attack.Runner{Endpoint: e.Endpoint, Rec: rec, Seed: GinkgoRandomSeed()}
	// in attack.Exhaustion's order: the session floods last
	attacks := attack.Exhaustion(limits)
	names := make([]string, 0, len(attacks))
	var answers check.AnswersConfig
	for _, a := range attacks {
		names = append(names, a.Name)
		answers.Rules = append(answers.Rules, check.AnswerRule{Attack: a.Name, Allowed: a.Allowed, Deadline: a.Deadline})
	}
	// The CPU a hostile message costs is judged for the attacks whose
	// work is per message; the monitored-item bomb's is sustained
	// sampling (20 000 items at 1 ms), bounded by the sampling interval
	// and item limits a server may revise, not by the messages.
	perMessage := slices.DeleteFunc(slices.Clone(names), func(n string) bool { return n == attack.NameItemQueueBomb })
	checks := []check.Spec{
		{Name: "survival", Config: check.SurvivalConfig{Attacks: names}},
		{Name: "lockout", Config: check.LockoutConfig{Attacks: names, MaxLockout: maxLockout, MaxProbeLatency: maxProbeLatency}},
		{Name: "answers", Config: answers},
		{Name: "amplification", Config: check.AmplificationConfig{Attacks: perMessage}},
	}
	switch tgt := h.Setup.Target; {
	case tgt.MemoryBound > 0:
		// declared (OPCUA_CHAOS_MEMORY_BOUND; the reference server's is
		// built in): a server that lost its budget, reporting 0, is
		// judged by the same bound
		checks = append(checks, check.Spec{Name: "memory-peak", Config: check.MemoryPeakConfig{
			Attacks: names, Bound: float64(tgt.MemoryBound), Baseline: baseline}})
	case budget > 0:
		checks = append(checks, check.Spec{Name: "memory-peak", Config: check.MemoryPeakConfig{
			Attacks: names, BudgetReading: fresh.BudgetReading, Factor: peakFactor, Slack: peakSlack, Baseline: baseline}})
	}
	if h.Setup.Target.LoginThrottle {
		// a target that throttles failed logins (OPCUA_CHAOS_LOGIN_THROTTLE;
		// the reference server does): others may not, and are not judged
		checks = append(checks, check.Spec{Name: "guess-rate", Config: check.GuessRateConfig{Throttled: true, MaxRate: maxGuessRate}})
	}
	spec.Plan(checks...)

	By(fmt.Sprintf("attacking: %d exhaustion attacks one after another, each holding for %v, fresh clients probing", len(attacks), exhaustHold))
	var errs []error
	for _, a := range attacks {
		tally, err := runner.Run(ctx, a)
		errs = append(errs, err)
		if tally.Lost() {
			for range deathPolls {
				if !w.State(ctx) {
					break
				}
				sleep(ctx, deathPoll)
			}
		}
		w.State(ctx)
		if ctx.Err() != nil {
			break
		}
	}
	// the lockout check's grace after the last attack
	sleep(ctx, check.DefaultLockoutGrace)
	w.State(ctx)
	stopMem()
	stopProbers()
	figs := map[string]float64{"attacks.run": float64(len(attacks)), "memory.budget_bytes": budget}
	spec.Judge(ctx, "robustness", cond.Name, rec, figs, checks...)
	Expect(errors.Join(errs...)).NotTo(HaveOccurred(), "send attacks")
}

var _ = Describe("Resource exhaustion", spec.Property("robustness"), Label("exhaustion"), func() {
	DescribeTable("survives memory, connection, session and CPU exhaustion, refuses with a status and never locks a fresh client out",
		exhaustion, spec.Entries([]toxics.Condition{toxics.Baseline}, exhaustCatches, SpecTimeout(5*time.Minute)),
		spec.Entries(toxics.Secured(toxics.SecuritySignEncrypt, toxics.Baseline), nil, SpecTimeout(5*time.Minute), spec.Nightly))
})
