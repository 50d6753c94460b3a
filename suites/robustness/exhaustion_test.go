package robustness_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gopcua/opcua/ua"
	. "github.com/onsi/ginkgo/v2"

	"github.com/opcua-chaos/opcua-chaos/fixtures/attack"
	"github.com/opcua-chaos/opcua-chaos/fixtures/check"
	"github.com/opcua-chaos/opcua-chaos/fixtures/history"
	"github.com/opcua-chaos/opcua-chaos/fixtures/scenario"
	"github.com/opcua-chaos/opcua-chaos/fixtures/spec"
	"github.com/opcua-chaos/opcua-chaos/fixtures/target"
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
	// anonymousProber names the series of fresh anonymous clients (beside
	// the user's, probe-none).
	anonymousProber = "probe-none-anonymous"
	// maxGuessRate is the most failed logins per second one peer may get
	// answered from a server that declares a login throttle.
	maxGuessRate = 5
	// exhaustSettle bounds the wait, after each attack, for the server
	// to come back from it (watch.Watch.Settle).
	exhaustSettle = 10 * time.Second
	// maxCPUPerMessage is the most server CPU one message of the CPU
	// amplifiers of issue 44 may cost (cpuAttacks).
	maxCPUPerMessage = 50 * time.Millisecond
)

// cpuAttacks are the attacks of issue 44 judged by the bound of
// CPU per hostile message (maxCPUPerMessage) beside the catalogue's
// second: a large secured OpenSecureChannel replayed, CreateSession
// signed for anyone, monitored items of 2 MB NodeIds sampled every
// millisecond.
var cpuAttacks = []string{attack.NameOPNBlocks, attack.NameSessionSigning, attack.NameLongNodeIDs}

// exhaustLimits configures the reference server so that the attacks go
// past its limits quickly: 300 connections, 200 sessions (100 of them
// unactivated, 100 anonymous). Its memory budget keeps its default.
var exhaustLimits = map[string]string{"OPCUA_MAX_CONNECTIONS": "300", "OPCUA_MAX_SESSIONS": "200"}

// exhaustSlice is the part of the catalogue the CI profile runs, about a
// minute of the whole's three and a half: one attack of each kind the
// checks judge: idle connections at the connection limit (lockout),
// anonymous sessions on live channels (lockout of the anonymous),
// unread answers (memory), large secured OpenSecureChannels (CPU per
// message), guessing with fresh user names (guess rate) and a claimed
// ApplicationUri (theft). The whole catalogue runs nightly (spec.Long);
// the faults only its other attacks catch are the profile's nightly-only.
var exhaustSlice = []string{
	attack.NameIdleAfterOpen, attack.NameUnreadAnswers, attack.NameOPNBlocks,
	attack.NameGuessManyUsers, attack.NameClaimedURITheft, attack.NameLiveAnonymousFlood,
}

// exhaustCatches returns the fault switches (attack.Attack.Fault) of the
// catalogue's attacks among names (all when names is nil), in the
// catalogue's order: what the specs running them are aimed at.
func exhaustCatches(names []string) []catalog.Fault {
	var out []catalog.Fault
	for _, a := range attack.Exhaustion(attack.ExhaustionLimits{}) {
		if f := a.Fault(); f != "" && (names == nil || slices.Contains(names, a.Name)) {
			out = append(out, f)
		}
	}
	return out
}

// floodSessions is the session table the session floods go past: the
// target's, the larger of the reported and the probed limit (a server may
// keep part of its table from anonymous clients, as the reference server
// does), 0 (attack.DefaultExhaustSessions) when neither is known. On the
// reference server exhaustLimits sets 200, which a smaller table (the
// quirk max-sessions-20) lowers.
func floodSessions() int {
	return max(int(h.Setup.Probe.Reported("MaxSessions")), h.Setup.Target.MaxSessions.N)
}

// exhaustion returns the scenario of the exhaustion attacks named (all
// of the catalogue when nil), run one after another while fresh clients
// probe: survival, answers, lockouts, memory
// and the guess rate are judged. On the reference server the attacks go
// past its limits (exhaustLimits). The checks of the attacks are planned
// up front; those of the memory peak (over the baseline phase, with the
// budget the server reports) and of the guess rate follow once the
// baseline phase ended (exhaust).
func exhaustion(only []string) func(toxics.Condition) scenario.Scenario {
	return func(cond toxics.Condition) scenario.Scenario { return exhaustionOf(only, cond) }
}

func exhaustionOf(only []string, cond toxics.Condition) scenario.Scenario {
	limits := attack.ExhaustionLimits{Hold: exhaustHold, MaxSessions: floodSessions()}
	s := scenario.Scenario{Property: property, Name: "exhaustion", Condition: cond}
	if h.Setup.Target.IsReference() {
		s.Server = exhaustLimits
		limits.MaxConnections = 300
		limits.MaxSessions = min(cmp.Or(limits.MaxSessions, 200), 200)
	}
	if h.Setup.Target.ServiceTime {
		limits.SlowNode = ua.NewStringNodeID(1, "Slow.5000")
	}
	// the anonymous fill's victim: the target's first user (the probers'
	// too); its subscription limits as reported (else the attack's
	// defaults, past the reference server's)
	if us := h.Setup.Target.Users; len(us) > 0 {
		limits.User, limits.Password = us[0].Name, us[0].Password
	}
	limits.NoAnonymous = !h.Setup.Probe.Anonymous.OK
	limits.MaxSubscriptions = int(h.Setup.Probe.Reported("MaxSubscriptions"))
	limits.MaxSubscriptionsPerSession = int(h.Setup.Probe.Reported("MaxSubscriptionsPerSession"))
	// the theft attack's victim: the run's client identity over
	// SignAndEncrypt, where the target offers it and trusts the
	// certificate (else the attack lacks it)
	if victim, err := h.Security(cond.WithSecurity(toxics.SecuritySignEncrypt)); err == nil {
		limits.Victim = victim.Nth(0)
	}
	// in attack.Exhaustion's order: the session floods last; an attack
	// the target lacks what for (the queue bomb without a slow node) is
	// left out, its window and checks with it, and said so (exhaust)
	catalogue := attack.Exhaustion(limits)
	if only != nil {
		catalogue = slices.DeleteFunc(catalogue, func(a attack.Attack) bool { return !slices.Contains(only, a.Name) })
	}
	attacks, lacking := runnable(catalogue)
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
	lockout := check.LockoutConfig{Attacks: names, MaxLockout: maxLockout, MaxProbeLatency: maxProbeLatency,
		SessionLimit: h.Setup.Target.MaxSessions.N}
	if !h.Setup.Target.LoginReserve {
		// a table of activated sessions refusing one more is the
		// configured limit (Part 4 5.6.2): counted, not a lockout; a
		// server that keeps places for logins is judged on them
		lockout.AtLimit = []string{attack.NameActivatedFlood, attack.NameLiveAnonymousFlood}
		// it holds the table when it made the server hold all of it
		// but what the harness may hold beside
		lockout.AtLimitHeld = max(1, h.Setup.Target.MaxSessions.N-target.HarnessSessions)
	}
	s.Checks = []check.Spec{
		{Name: "survival", Config: check.SurvivalConfig{Attacks: names}},
		{Name: "lockout", Config: lockout},
		{Name: "answers", Config: answers},
		{Name: "amplification", Config: check.AmplificationConfig{Attacks: perMessage}},
	}
	if cpu := slices.DeleteFunc(slices.Clone(cpuAttacks), func(n string) bool { return !slices.Contains(names, n) }); len(cpu) > 0 {
		s.Checks = append(s.Checks, check.Spec{Name: "amplification-cpu", Config: check.AmplificationConfig{Attacks: cpu, MaxCPUPerMessage: maxCPUPerMessage}})
	}
	if slices.Contains(names, attack.NameAnonymousFill) {
		s.Checks = append(s.Checks, check.Spec{Name: "subscription-lockout", Config: check.SubscriptionLockoutConfig{Attacks: []string{attack.NameAnonymousFill}}})
	}
	if slices.Contains(names, attack.NameClaimedURITheft) {
		s.Checks = append(s.Checks, check.Spec{Name: "theft", Config: check.TheftConfig{Attacks: []string{attack.NameClaimedURITheft}}})
	}
	s.Workload = func(ctx context.Context, r *scenario.Run) error {
		if len(attacks) == 0 && len(lacking) > 0 {
			// an attack alone that the target lacks what for: skipped,
			// with its reason, rather than a run that attacked nothing
			return &scenario.Lacking{Reason: lacking[0].Name + ": " + lacking[0].Lacks}
		}
		for _, a := range lacking {
			r.Rec.Mark(a.Name, "skipped: "+a.Lacks)
		}
		r.Figures["attacks.skipped"] = float64(len(lacking))
		return exhaust(ctx, r, attacks, names)
	}
	return s
}

// runnable splits attacks into those that can run against the target and
// those that lack what they need (attack.Attack.Lacks).
func runnable(attacks []attack.Attack) (run, lacking []attack.Attack) {
	for _, a := range attacks {
		if a.Lacks != "" {
			lacking = append(lacking, a)
			continue
		}
		run = append(run, a)
	}
	return run, lacking
}

// exhaust is the exhaustion workload: fresh clients probe and the
// server's memory is read through a baseline phase and the attacks, one
// after another, each holding what it made the server hold; names are
// the attacks' names.
func exhaust(ctx context.Context, r *scenario.Run, attacks []attack.Attack, names []string) error {
	e, rec, tgt := r.Env, r.Rec, r.Env.Profile()
	w := watch.New(e, rec, watch.Options{Sessions: h.Setup.Probe.StandardDiagnostics.Found, Connections: e.Target.Diagnostics})
	defer closeWatch(ctx, w)
	// memory and CPU are read on a Watch of its own, back to back (at
	// most every 250 ms; a Docker stats call takes about a second), beside
	// the state readings
	mw := watch.New(e, rec, watch.Options{})
	defer closeWatch(ctx, mw)

	stopProbers := startProbers(ctx, r)
	defer stopProbers()
	budget := 0.0
	if e.Target.Diagnostics {
		var err error
		budget, err = fresh.ReadBudget(ctx, rec, e.DirectEndpoint, e.Security)
		if err != nil {
			return fmt.Errorf("read the memory budget the server reports (%s): %w", fresh.BudgetNode, err)
		}
	}

	rec.Mark("at-rest", fmt.Sprintf("at rest: %v of probes and memory readings", exhaustBaseline))
	stopMem := fresh.Every(ctx, fresh.MemoryEvery, 15*time.Minute, mw.Usage)
	defer stopMem()
	baseline := history.Window{Start: rec.Now()}
	w.State(ctx)
	scenario.Sleep(ctx, exhaustBaseline)
	baseline.End = rec.Now()

	runner := &attack.Runner{Endpoint: e.Endpoint, Direct: e.DirectEndpoint, Rec: rec, Seed: r.Seed}
	runner.Settle = func(ctx context.Context, a attack.Attack, start time.Duration) {
		// each attack's window lasts until the server has come back
		// from it (CPU quiet, memory no longer falling; at most
		// exhaustSettle) and holds a usage reading of its own, so that
		// the next attack starts on a quiet server and each peak is
		// its own attack's
		rec.Mark(a.Name, mw.Settle(ctx, watch.SettleConfig{Within: exhaustSettle, Since: start}).String())
	}
	r.Check(exhaustChecks(tgt, names, budget, baseline)...)

	rec.Mark("attacks", fmt.Sprintf("attacking: %d exhaustion attacks one after another, each holding for %v, fresh clients probing", len(attacks), exhaustHold))
	var errs []error
	for _, a := range attacks {
		tally, err := runner.Run(ctx, a)
		errs = append(errs, err)
		if tally.Lost() {
			for range deathPolls {
				if !w.State(ctx) {
					break
				}
				scenario.Sleep(ctx, deathPoll)
			}
		}
		w.State(ctx)
		if ctx.Err() != nil {
			break
		}
	}
	// the lockout check's grace after the last attack
	scenario.Sleep(ctx, check.DefaultLockoutGrace)
	w.State(ctx)
	stopMem()
	stopProbers()
	r.Figures["attacks.run"] = float64(len(attacks))
	r.Figures["memory.budget_bytes"] = budget
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("send attacks: %w", err)
	}
	return nil
}

// startProbers starts the probers of the exhaustion run r (fresh.Start)
// and returns their stop, which may be called more than once.
func startProbers(ctx context.Context, r *scenario.Run) (stop func()) {
	e, rec := r.Env, r.Rec
	// The probers: a fresh client every second, logging in as the
	// target's first user (anonymous if it has none), over None and, on a
	// secured condition, over the condition's mode too. They come from
	// another peer than the attackers (the server's own endpoint, not the
	// proxy's): a victim is another host, and a server may well cap what
	// one peer address holds.
	var user, password string
	if us := e.Target.Users; len(us) > 0 {
		user, password = us[0].Name, us[0].Password
	}
	probeCfg := fresh.Config{Endpoint: e.DirectEndpoint, User: user, Password: password, Duration: 10 * time.Minute}
	probers := []*fresh.Prober{fresh.Start(ctx, rec, probeCfg)}
	if user != "" && h.Setup.Probe.Anonymous.OK {
		// and a fresh anonymous client, where the target lets one in: an
		// anonymous flood must not lock the next anonymous client out
		anon := probeCfg
		anon.User, anon.Password, anon.Client = "", "", anonymousProber
		probers = append(probers, fresh.Start(ctx, rec, anon))
	}
	if e.Security.Secured() {
		probeCfg.Security = e.Security
		probers = append(probers, fresh.Start(ctx, rec, probeCfg))
	}
	return func() {
		for _, p := range probers {
			p.Stop()
		}
	}
}

// exhaustChecks are the checks of an exhaustion run on tgt whose attacks
// names ran after the baseline phase: the memory peak against the bound
// tgt declares, else against the budget the server reported (0: none),
// and the guessing attacks' rate where tgt throttles failed logins.
func exhaustChecks(tgt target.Profile, names []string, budget float64, baseline history.Window) []check.Spec {
	var checks []check.Spec
	switch {
	case tgt.MemoryBound > 0:
		// declared (OPCUA_CHAOS_MEMORY_BOUND; the reference server's is
		// built in): a server that lost its budget, reporting 0, is
		// judged by the same bound
		checks = append(checks, check.Spec{Name: "memory-peak", Config: check.MemoryPeakConfig{
			Attacks: names, Bound: float64(tgt.MemoryBound), Baseline: baseline}})
	case budget > 0:
		checks = append(checks, check.Spec{Name: "memory-peak", Config: check.MemoryPeakConfig{
			Attacks: names, BudgetReading: history.ReadingMemoryBudget, Factor: peakFactor, Slack: peakSlack, Baseline: baseline}})
	}
	// a target that throttles failed logins (OPCUA_CHAOS_LOGIN_THROTTLE;
	// the reference server does): others may not, and are not judged;
	// each guessing attack that runs is judged
	if tgt.LoginThrottle && slices.Contains(names, attack.NameGuessManyUsers) {
		checks = append(checks, check.Spec{Name: "guess-rate", Config: check.GuessRateConfig{Attack: attack.NameGuessManyUsers, Throttled: true, MaxRate: maxGuessRate}})
	}
	if tgt.LoginThrottle && slices.Contains(names, attack.NameGuessOneUser) {
		// one user's password from every address the harness has, many
		// guesses in flight: a budget per user, not per address
		checks = append(checks, check.Spec{Name: "guess-rate-one-user", Config: check.GuessRateConfig{Attack: attack.NameGuessOneUser, Throttled: true, MaxRate: maxGuessRate}})
	}
	return checks
}

var _ = Describe("Resource exhaustion", spec.Property(property), Label("exhaustion"), func() {
	DescribeTable("survives one attack of each kind (connections, sessions, memory, CPU, guessing, theft), refuses with a status and never locks a fresh client out",
		h.Scenario(exhaustion(exhaustSlice)), spec.Entries([]toxics.Condition{toxics.Baseline}, exhaustCatches(exhaustSlice), SpecTimeout(3*time.Minute)))
	// the whole catalogue, one attack after another on one server: what
	// an attack leaves behind meets the next (its switches are proven
	// by the single attacks below)
	DescribeTable("survives the whole catalogue of memory, connection, session and CPU exhaustion, refuses with a status and never locks a fresh client out",
		h.Scenario(exhaustion(nil)), spec.Entries([]toxics.Condition{toxics.Baseline}, nil, SpecTimeout(7*time.Minute), spec.Long),
		spec.Entries(toxics.Secured(toxics.SecuritySignEncrypt, toxics.Baseline), nil, SpecTimeout(7*time.Minute), spec.Nightly, spec.Long))
	// each attack alone on a fresh server, aimed at the switch that
	// undoes its protection: a failure names its attack in the spec's
	// first line and reproduces in seconds, not the catalogue's minutes
	for _, a := range attack.Exhaustion(attack.ExhaustionLimits{}) {
		DescribeTable("survives "+a.Name+" alone, refuses with a status and never locks a fresh client out",
			h.Scenario(exhaustion([]string{a.Name})), spec.Entries([]toxics.Condition{toxics.Baseline}, exhaustCatches([]string{a.Name}), SpecTimeout(2*time.Minute), spec.Long))
	}
})
