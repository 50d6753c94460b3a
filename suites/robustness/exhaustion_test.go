package robustness_test

import (
	"cmp"
	"slices"
	"time"

	"github.com/gopcua/opcua/ua"
	. "github.com/onsi/ginkgo/v2"

	"github.com/opcua-chaos/opcua-chaos/fixtures/attack"
	"github.com/opcua-chaos/opcua-chaos/fixtures/check"
	"github.com/opcua-chaos/opcua-chaos/fixtures/scenario"
	"github.com/opcua-chaos/opcua-chaos/fixtures/spec"
	"github.com/opcua-chaos/opcua-chaos/fixtures/target"
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
// baseline phase ended (scenario.Exhaust).
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
	// left out, its window and checks with it, and said so (scenario.Exhaust)
	catalogue := attack.Exhaustion(limits)
	if only != nil {
		catalogue = slices.DeleteFunc(catalogue, func(a attack.Attack) bool { return !slices.Contains(only, a.Name) })
	}
	attacks, _ := attack.Runnable(catalogue)
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
	// fresh clients probe from before the baseline phase until after the
	// attacks (Probers); the attacks run one after another, each holding
	// what it made the server hold, and the memory peak and guess rate
	// are planned once the baseline phase ended (Exhaust)
	var probers scenario.Probers
	if h.Setup.Probe.Anonymous.OK {
		probers.Anonymous = anonymousProber
	}
	s.Observers = []scenario.Observer{probers}
	s.Loads = []scenario.Load{scenario.Exhaust{
		Attacks: catalogue, Hold: exhaustHold, Baseline: exhaustBaseline, Settle: exhaustSettle, Grace: check.DefaultLockoutGrace,
		Sessions: h.Setup.Probe.StandardDiagnostics.Found,
		Peak:     &scenario.MemoryPeak{Name: "memory-peak", Factor: peakFactor, Slack: peakSlack},
		After:    afterBaseline(h.Setup.Target, names),
	}}
	return s
}

// afterBaseline are the checks an exhaustion run on tgt plans once its
// baseline phase ended, after the memory peak's (scenario.Exhaust.After):
// the guessing attacks' rate where tgt throttles failed logins
// (OPCUA_CHAOS_LOGIN_THROTTLE; the reference server does): others may
// not, and are not judged; each guessing attack among names is judged.
func afterBaseline(tgt target.Profile, names []string) []check.Spec {
	var checks []check.Spec
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
		h.Scenario(exhaustion(exhaustSlice)), spec.Entries([]toxics.Condition{toxics.Baseline}, attack.ExhaustionFaults(exhaustSlice), SpecTimeout(3*time.Minute)))
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
			h.Scenario(exhaustion([]string{a.Name})), spec.Entries([]toxics.Condition{toxics.Baseline}, attack.ExhaustionFaults([]string{a.Name}), SpecTimeout(2*time.Minute), spec.Long))
	}
})
