package robustness_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/gopcua/opcua/ua"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/opcua-chaos/opcua-chaos/fixtures/attack"
	"github.com/opcua-chaos/opcua-chaos/fixtures/check"
	"github.com/opcua-chaos/opcua-chaos/fixtures/history"
	"github.com/opcua-chaos/opcua-chaos/fixtures/scenario"
	"github.com/opcua-chaos/opcua-chaos/fixtures/spec"
	"github.com/opcua-chaos/opcua-chaos/fixtures/watch"
	"github.com/opcua-chaos/opcua-chaos/server/catalog"
	"github.com/opcua-chaos/opcua-chaos/toxics"
)

const property = "robustness"

// h runs the suite's scenarios; spec.Bootstrap fills it before the first
// spec.
var h = spec.Bootstrap()

func TestRobustness(t *testing.T) { spec.RunSuite(t, property) }

// The victim and the phases around the attacks.
const (
	// victimRate Reads per second on one session (open loop).
	victimRate = 300
	// victimWarmup is left out before the baseline readings, so that the
	// victim's (and the subscription's) sessions are open and counted.
	victimWarmup = time.Second
	// before is the quiet phase after the warm-up: the baseline of the
	// victim's throughput, the session and connection counts and memory
	// (600 of the victim's Reads: its rate is the load's, steady).
	before = 2 * time.Second
	// after is the least the victim runs after the last attack (300
	// Reads against the baseline's throughput; the wait for sessions,
	// connections and memory to return goes on up to settle).
	after = time.Second
	// settle bounds the return of sessions, connections and memory to
	// their baseline after the attacks.
	settle = 15 * time.Second
	// reserve is the spec time kept for the after phase and the verdict:
	// an attack is not started with less left (a target that answers
	// nothing costs a deadline per attack).
	reserve = 35 * time.Second
	// minRatio is the lowest passing victim throughput after/before.
	minRatio = 0.8
	// Subscription of the victim, where the target has a sampling counter.
	subItems      = 4
	subSampling   = 50 * time.Millisecond
	subPublishing = 250 * time.Millisecond
	subMinShare   = 0.9
	// subLabel labels the victim's subscription in the history.
	subLabel = "victim-sub"
	// Memory band: back to within the highest baseline reading × (1 +
	// memRatio) + memSlack after the attacks.
	memRatio = 0.5
	memSlack = 32 << 20
	// victimFor bounds the victim's run in a run of one round (the
	// spec's timeout ends it first); a soak's victim runs its length on
	// top.
	victimFor = 5 * time.Minute
	// maxMemoryRounds bounds the windows a soak's memory is judged
	// round against round in (memoryRounds): its rounds are grouped
	// into that many.
	maxMemoryRounds = 8
	// maxLateRounds bounds the rounds before the last whose sessions are
	// judged on their own (sessions-round<n>), the first that were not
	// back when their wait ended.
	maxLateRounds = 3
)

// bursts are the attacks that make a server hold memory (floods of
// sessions, Publish requests and monitored items). After each of them the
// server's memory is read; when it is not back in its band after the
// attacks, they run again as a second round, so that the memory check can
// tell retention (a C allocator keeps the pages a burst freed: the second
// round does not raise it) from a leak (every round raises it).
var bursts = []attack.Attack{attack.SessionFlood, attack.PublishFlood, attack.MonitoredItemsOneCall, attack.MonitoredItemsInCalls}

// isBurst reports whether a is one of bursts.
func isBurst(a attack.Attack) bool {
	return slices.ContainsFunc(bursts, func(b attack.Attack) bool { return b.Name == a.Name })
}

// memoryCheck is the memory's return to its band after the attacks that
// ended at from; rounds (two or more) let it tell retention from a leak.
func memoryCheck(baseline history.Window, from time.Duration, rounds []history.Window) check.SettleConfig {
	return check.SettleConfig{Kind: history.KindMemory, Baseline: baseline, From: from, Within: settle,
		Ratio: memRatio, Slack: memSlack, Unit: "MiB", Scale: 1 << 20, Rounds: rounds}
}

// referenceLimits configures the reference server so that the session
// flood (300 CreateSession) goes past its limits: 200 sessions, 100 of
// them unactivated.
var referenceLimits = map[string]string{"OPCUA_MAX_SESSIONS": "200"}

// maxLatency is the longest one Read of the victim may take: as long as
// it may wait with Reads outstanding and none answered (scenario.MaxStall).
func maxLatency(cond toxics.Condition) time.Duration { return scenario.MaxStall(cond) }

// theVictim is the victim of the robustness runs: victimRate Reads per
// second on one session and, where the target has a sampling counter, a
// subscription of subItems items, for at most d.
func theVictim(d time.Duration) scenario.Victim {
	return scenario.Victim{Rate: victimRate, RequestTimeout: 5 * time.Second, Label: subLabel, Items: subItems,
		Sampling: subSampling, Publishing: subPublishing, For: d}
}

// robustness is the scenario of the attacks against the target under cond
// while a victim reads: what the server did is judged. On the reference
// server the session flood goes past its limits (referenceLimits).
// soakFor zero runs one round of the attacks (the CI rows); a positive
// soakFor runs rounds of them for that long (attackAll), the scenario
// "rounds".
//
// The counts judged whatever the timing are planned before the attacks
// run: a spec that ends before its judgement (its timeout while an attack
// hangs the server, an interrupt) saves its history judged by them. The
// workload (attackAll) replaces them with the full set, of the attacks
// that ran. skipped receives the attacks the workload left out for lack
// of the spec's time: the spec fails on them once the run was judged.
func robustness(cond toxics.Condition, soakFor time.Duration, skipped *[]string) scenario.Scenario {
	var planned check.AnswersConfig
	var plannedNames []string
	for _, a := range slices.Concat(attack.Background(), attack.Catalogue()) {
		plannedNames = append(plannedNames, a.Name)
		planned.Rules = append(planned.Rules, check.AnswerRule{Attack: a.Name, Allowed: a.Allowed, Deadline: a.Deadline})
	}
	s := scenario.Scenario{
		Property: property, Name: "robustness", Condition: cond,
		Checks: []check.Spec{
			{Name: "survival", Config: check.SurvivalConfig{Attacks: plannedNames}},
			{Name: "answers", Config: planned},
			{Name: "victim-errors", Config: check.ErrorBudgetConfig{Kinds: []history.Kind{history.KindRead}, Drained: check.Codes{}}},
		},
		// closure: attack rounds: each attack is driven, answered and its victim probed before the next, for rounds until the soak ends
		Workload: func(ctx context.Context, r *scenario.Run) error { return attackAll(ctx, r, soakFor, skipped) },
	}
	if soakFor > 0 {
		// no nemesis schedule: the soak's length is the planned length
		// of the progress lines and the disk guard
		s.Name, s.Planned = "rounds", soakFor
	}
	if h.Setup.Target.IsReference() {
		s.Server = referenceLimits
	}
	return s
}

// attackAll is the robustness workload: a victim reads through a baseline
// phase, then rounds of the attacks run while the victim still reads. In
// a round the attacks run one after another (the idle-connection attacks
// beside them), then sessions, connections and memory are waited for to
// return to their baseline (at least after, at most settle).
//
// With soakFor zero it runs one round, with a second round of the bursts
// when the memory is out of its band after it. With a positive soakFor it
// starts round after round while the longest round so far still ends by
// soakFor less reserve from the workload's start (the first round always
// runs), and stops after a round that found the server dead or was cut
// short by the spec's deadline; each round draws the attacks' random
// choices from a seed of its own (the run's seed plus the round's index
// from 0). The memory is then judged round against round (memoryRounds).
//
// It plans the checks of what ran (Run.Check) and puts the attacks it
// left out of the first round for lack of the spec's time into skipped.
func attackAll(ctx context.Context, r *scenario.Run, soakFor time.Duration, skipped *[]string) error {
	e, rec, cond := r.Env, r.Rec, r.Scenario.Condition
	// until: no round is started that would end after it (zero: one
	// round)
	var until time.Time
	runFor := victimFor
	if soakFor > 0 {
		until = time.Now().Add(soakFor - reserve)
		runFor += soakFor
	}
	w := watch.New(e, rec, watch.Options{Sessions: h.Setup.Probe.StandardDiagnostics.Found, Connections: e.Target.Diagnostics})
	defer scenario.CloseWatch(ctx, w)
	mem := &memoryReadings{w: w, rec: rec}

	rec.Mark("victim", fmt.Sprintf("serving a victim: %d Reads/s on one session, a subscription where the target samples", victimRate))
	v, err := theVictim(runFor).Start(ctx, r)
	if err != nil {
		return err
	}
	defer v.Close(ctx)
	baseline := quietPhase(ctx, rec, w, mem)
	a := &attacker{w: w, mem: mem, rec: rec, runner: newRunner(r), baseline: baseline,
		baseSessions: highestSessions(rec.History(), baseline), skipped: skipped, alive: true}
	ran := a.rounds(ctx, r.Seed, soakFor > 0, until)
	windows := ran.windows
	var rounds []history.Window
	if len(windows) == 1 && !ran.memBack && a.alive {
		rounds = a.memoryRound(ctx)
	}
	stopped := rec.Now()
	verr := v.Finish(r)
	w.State(ctx)
	mem.read(ctx)
	windows[len(windows)-1].End = rec.Now()
	if len(rounds) > 0 {
		rounds[len(rounds)-1].End = rec.Now()
	}
	if len(windows) > 1 {
		rounds = memoryRounds(windows)
		rec.Mark("memory-rounds", fmt.Sprintf("%d rounds of the attacks judged in %d windows of consecutive rounds", len(windows), len(rounds)))
	}

	r.Figures["attacks.run"] = float64(a.runs)
	r.Figures["attacks.skipped"] = float64(len(*skipped))
	checks := robustnessChecks(cond, a.ran, baseline, a.attacked, stopped, rounds, v.Items())
	if soakFor > 0 {
		r.Figures["rounds"] = float64(len(windows))
		// the sessions of the first rounds before the last that were not
		// back when their wait ended, each judged on its own (the last
		// round's are judged by "sessions")
		for i, n := range ran.lateRounds {
			if n < len(windows) {
				checks = append(checks, check.Spec{Name: fmt.Sprintf("sessions-round%d", n), Config: sessionsCheck(baseline, ran.lateFrom[i])})
			}
		}
	}
	r.Check(checks...)
	if err := errors.Join(a.errs...); err != nil {
		return fmt.Errorf("send attacks: %w", err)
	}
	if verr != nil {
		return fmt.Errorf("run the victim: %w", verr)
	}
	return nil
}

// quietPhase lets the victim warm up, then takes the baseline readings
// (the server's state, memory and counts) every second for before, and
// returns the baseline phase.
func quietPhase(ctx context.Context, rec *history.Recorder, w *watch.Watch, mem *memoryReadings) history.Window {
	readings := func() {
		w.State(ctx)
		mem.read(ctx)
		w.Counts(ctx)
	}
	scenario.Sleep(ctx, victimWarmup)
	baseline := history.Window{Start: rec.Now()}
	readings()
	for range int(before / time.Second) {
		scenario.Sleep(ctx, time.Second)
		readings()
	}
	baseline.End = rec.Now()
	return baseline
}

// newRunner is the attack runner of the robustness run r
// (scenario.AttackRunner): a slow node where the target has one.
func newRunner(r *scenario.Run) *attack.Runner {
	runner := scenario.AttackRunner(r)
	if r.Env.Target.ServiceTime {
		runner.SlowNode = ua.NewStringNodeID(1, "Slow.300")
	}
	return runner
}

// highestSessions is the highest session count read in baseline, -1 if
// none was.
func highestSessions(h history.History, baseline history.Window) float64 {
	n := -1.0
	for o := range h.AllOps() {
		if o.Kind == history.KindSessionCount && o.Outcome == history.OK && baseline.Contains(o.Complete) {
			n = max(n, o.Value)
		}
	}
	return n
}

// roundsRan is what the rounds of a robustness run left to judge.
type roundsRan struct {
	// windows are the rounds', each from its start to the next's (the
	// last one's End is set once the final readings are taken).
	windows []history.Window
	// memBack says whether the memory was back in its band after the
	// last round.
	memBack bool
	// lateRounds are the first rounds (at most maxLateRounds) whose
	// sessions were not back when their wait ended, lateFrom when each
	// one's attacks ended.
	lateRounds []int
	lateFrom   []time.Duration
}

// rounds runs the rounds of the attacks, each followed by the wait for
// sessions, connections and memory to return: one round, or with soak
// round after round until endRounds says to stop (until: the soak's end
// less reserve), a round cut short by the spec's deadline, or the spec's
// end. Round n > 1 draws from seed + n - 1.
func (a *attacker) rounds(ctx context.Context, seed int64, soak bool, until time.Time) roundsRan {
	rec := a.rec
	ran := roundsRan{windows: []history.Window{{Start: a.baseline.End}}}
	var longest time.Duration
	for round := 1; ; round++ {
		began := time.Now()
		if round > 1 {
			a.runner.Seed = seed + int64(round-1)
			ran.windows = append(ran.windows, history.Window{Start: rec.Now()})
			ran.windows[len(ran.windows)-2].End = ran.windows[len(ran.windows)-1].Start
		}
		cut := a.round(ctx, round)
		rec.Mark("settle", "waiting for sessions, connections and memory to return to their baseline, the victim still reading")
		var sessionsBack bool
		ran.memBack, sessionsBack = a.waitSettled(ctx, a.attacked)
		if !sessionsBack && len(ran.lateRounds) < maxLateRounds {
			ran.lateRounds, ran.lateFrom = append(ran.lateRounds, round), append(ran.lateFrom, a.attacked)
		}
		longest = max(longest, time.Since(began))
		if !soak || cut || ctx.Err() != nil {
			break
		}
		if why := endRounds(ctx, a.alive, until, longest); why != "" {
			rec.Mark("rounds-ended", fmt.Sprintf("after round %d: %s", round, why))
			break
		}
	}
	return ran
}

// memoryRound runs the bursts again after a single round that left the
// memory out of its band, to tell retention from a leak, and returns the
// two rounds' windows (the second's End is set once the final readings
// are taken); none where less than reserve + settle of the spec's time
// is left.
func (a *attacker) memoryRound(ctx context.Context) []history.Window {
	rec := a.rec
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < reserve+settle {
		rec.Mark("memory-round-skipped", fmt.Sprintf("less than %v of the spec's time left", reserve+settle))
		return nil
	}
	// memory out of its band: the bursts again, a second round
	// (retention or a leak)
	second := rec.Now()
	rounds := []history.Window{{Start: a.baseline.End, End: second}}
	rec.Mark("memory-round", "2")
	for _, b := range bursts {
		_, err := a.runner.Run(ctx, b)
		a.errs = append(a.errs, err)
		a.mem.read(ctx)
		a.alive = a.w.State(ctx)
	}
	a.attacked = rec.Now()
	a.waitSettled(ctx, a.attacked)
	return append(rounds, history.Window{Start: second})
}

// endRounds says why a soak starts no further round, "" if it starts one:
// the server was not running after the last round, or a round as long as
// the longest so far would end after until or leave less than reserve of
// the spec's time (ctx's deadline).
func endRounds(ctx context.Context, alive bool, until time.Time, longest time.Duration) string {
	now := time.Now()
	if !alive {
		return "the server is not running"
	}
	if now.Add(longest).After(until) {
		return fmt.Sprintf("another round (%v, the longest so far) would end after the soak's length less the reserve (%v)", longest.Round(time.Second), reserve)
	}
	if dl, ok := ctx.Deadline(); ok && dl.Sub(now) < reserve+longest {
		return fmt.Sprintf("less than %v of the spec's time left for another round", (reserve + longest).Round(time.Second))
	}
	return ""
}

// attacker runs the rounds of a robustness run against one server.
type attacker struct {
	w      *watch.Watch
	mem    *memoryReadings
	rec    *history.Recorder
	runner *attack.Runner
	// baseline is the quiet phase before the attacks, baseSessions the
	// highest session count read in it (-1: none).
	baseline     history.Window
	baseSessions float64
	// skipped receives the attacks the first round left out.
	skipped *[]string

	// ran are the attacks of the first round (the later rounds run the
	// same or fewer), runs counts every attack run of every round (not
	// the bursts a single round's memory is checked with again).
	ran  []attack.Attack
	runs int
	// attacked is when the last round's attacks ended, alive whether the
	// server was running then.
	attacked time.Duration
	alive    bool
	errs     []error
}

// round runs round n of the attacks: the idle-connection attacks beside
// the catalogue's, one after another, a memory reading after each burst
// and a reading of the server's state after each attack (several after
// one whose connection closed or went silent). An attack is not started
// with less than reserve of the spec's time left: in the first round it
// is skipped, a later round ends there (cut, reported).
func (a *attacker) round(ctx context.Context, n int) (cut bool) {
	w, rec, runner := a.w, a.rec, a.runner
	catalogue, background := attack.Catalogue(), attack.Background()
	detail := fmt.Sprintf("attacking: %d attacks one after another, %d idle-connection attacks beside them", len(catalogue), len(background))
	if n > 1 {
		detail = fmt.Sprintf("round %d: %s", n, detail)
	}
	rec.Mark("attacks", detail)
	var waits []func() error
	for _, b := range background {
		waits = append(waits, runner.Go(ctx, b))
	}
	a.runs += len(background)
	if n == 1 {
		a.ran = append(a.ran, background...)
	}
	for _, b := range catalogue {
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < reserve {
			if n > 1 {
				cut = true
				rec.Mark("round-cut", fmt.Sprintf("round %d: less than %v of the spec's time left before %s", n, reserve, b.Name))
				break
			}
			*a.skipped = append(*a.skipped, b.Name)
			continue
		}
		tally, err := runner.Run(ctx, b)
		a.errs = append(a.errs, err)
		a.runs++
		if n == 1 {
			a.ran = append(a.ran, b)
		}
		if tally.Lost() {
			// look again before the next attack, so that the death
			// falls between this attack's readings
			scenario.LookForDeath(ctx, w)
		}
		if isBurst(b) {
			a.mem.read(ctx)
		}
		w.State(ctx)
	}
	if n == 1 && len(*a.skipped) > 0 {
		rec.Mark("attacks-skipped", fmt.Sprint(*a.skipped))
	}
	for _, wait := range waits {
		a.errs = append(a.errs, wait())
	}
	a.attacked = rec.Now()
	a.alive = w.State(ctx)
	return cut
}

// waitSettled takes readings until sessions (where counted) and memory
// (where read) are back in their band, at least after and at most settle
// after from, while the victim still reads. It reports whether the memory
// and the sessions were back.
func (a *attacker) waitSettled(ctx context.Context, from time.Duration) (memBack, sessionsBack bool) {
	w := a.w
	memBack, sessionsBack = true, true
	for settled := time.Now(); time.Since(settled) < settle && ctx.Err() == nil; {
		n := w.Counts(ctx)
		a.mem.read(ctx)
		// the memory readings alone: the whole history is a pass over
		// hours of ops in a long soak, every half second
		memBack = check.Settle(a.mem.history(), memoryCheck(a.baseline, from, nil)).Verdict != check.Fail
		sessionsBack = n >= 0 && n <= a.baseSessions || a.baseSessions < 0 || !a.alive
		if sessionsBack && (memBack || !a.alive) && time.Since(settled) >= after {
			break
		}
		scenario.Sleep(ctx, 500*time.Millisecond)
	}
	return memBack, sessionsBack
}

// memoryReadings reads the server's memory through a watch (which
// records each reading) and keeps the readings: whether the memory
// settled after a round is judged on them alone.
type memoryReadings struct {
	w   *watch.Watch
	rec *history.Recorder
	ops []history.Op
}

// read takes one reading.
func (m *memoryReadings) read(ctx context.Context) {
	at := m.rec.Now()
	if v, ok := m.w.Memory(ctx); ok {
		m.ops = append(m.ops, history.Op{ID: uint64(len(m.ops) + 1), Kind: history.KindMemory, Invoke: at, Complete: m.rec.Now(), Outcome: history.OK, Value: v})
	}
}

// history returns the readings as a history.
func (m *memoryReadings) history() history.History { return history.History{Ops: m.ops} }

// memoryRounds groups the windows of a soak's rounds into at most
// maxMemoryRounds windows of consecutive rounds, as even as they divide:
// the memory is judged window against window (SettleConfig.Rounds), so
// that a leak too slow to show between two rounds shows between two
// groups of them, and the check's figures stay few however many rounds
// ran.
func memoryRounds(rounds []history.Window) []history.Window {
	m := min(len(rounds), maxMemoryRounds)
	out := make([]history.Window, m)
	for j := range m {
		lo, hi := j*len(rounds)/m, (j+1)*len(rounds)/m
		out[j] = history.Window{Start: rounds[lo].Start, End: rounds[hi-1].End}
	}
	return out
}

// sessionsCheck is the session count's return to its baseline after the
// attacks that ended at from.
func sessionsCheck(baseline history.Window, from time.Duration) check.SettleConfig {
	return check.SettleConfig{Kind: history.KindSessionCount, Baseline: baseline, From: from, Within: settle, Unit: "sessions"}
}

// robustnessChecks are the checks of a robustness run under cond whose
// attacks ran, whose baseline phase was baseline, whose attacks ended at
// attacked and whose victim stopped at stopped; rounds are the memory
// rounds (none: one), items the victim's monitored items (none: no
// subscription).
func robustnessChecks(cond toxics.Condition, ran []attack.Attack, baseline history.Window, attacked, stopped time.Duration, rounds []history.Window, items []string) []check.Spec {
	names := make([]string, len(ran))
	var answers check.AnswersConfig
	for i, a := range ran {
		names[i] = a.Name
		answers.Rules = append(answers.Rules, check.AnswerRule{Attack: a.Name, Allowed: a.Allowed, Deadline: a.Deadline})
	}
	reads := []history.Kind{history.KindRead}
	checks := []check.Spec{
		{Name: "survival", Config: check.SurvivalConfig{Attacks: names}},
		{Name: "answers", Config: answers},
		{Name: "victim-stall", Config: check.StallConfig{Span: check.Span{From: baseline.Start, To: stopped}, Kinds: reads, GroupBy: check.BySession, MaxStall: scenario.MaxStall(cond), MaxLatency: maxLatency(cond)}},
		{Name: "victim-errors", Config: check.ErrorBudgetConfig{Span: check.Span{To: stopped}, Kinds: reads, Drained: check.Codes{}}},
		{Name: "victim-recovery", Config: check.RecoveryConfig{Baseline: baseline, Recovered: history.Window{Start: attacked, End: stopped}, Kinds: reads, MinRatio: minRatio}},
		{Name: "sessions", Config: sessionsCheck(baseline, attacked)},
		{Name: "connections", Config: check.SettleConfig{Kind: history.KindConnectionCount, Baseline: baseline, From: attacked, Within: settle, Unit: "connections"}},
		{Name: "memory", Config: memoryCheck(baseline, attacked, rounds)},
	}
	if len(items) > 0 {
		checks = append(checks, check.Spec{Name: "victim-sampling", Config: check.SamplingConfig{
			Span: check.Span{From: baseline.Start, To: stopped}, Interval: subSampling, Items: items, MinFraction: subMinShare, MaxGap: scenario.MaxStall(cond),
		}}, check.Spec{Name: "victim-sequence", Config: check.SequenceConfig{
			// hostile traffic on other connections is no reason to skip
			// or lose a notification message of the victim's
			Subscriptions: []string{subLabel},
		}})
	}
	return checks
}

// catches are the bugs the spec is aimed at under baseline: a malformed
// request that kills the process, idle connections never closed, and
// sessions that never expire (the attackers' abandoned sessions keep the
// session count above its baseline), and parked Publishes that count
// against the reader's high mark (the Publish flood's channel stops
// behind them: answers names it).
var catches = []catalog.Fault{catalog.FaultCrashOnDecode, catalog.FaultUnboundedIdle, catalog.FaultSessionsNeverExpire, catalog.FaultPublishBlocksReader}

// robustnessRow is the body of the robustness table: the scenario of the row's
// condition, judged first (the attacks that ran), then the attacks left
// out for lack of the spec's time fail the spec.
func robustnessRow(ctx SpecContext, cond toxics.Condition) { runRobustness(ctx, cond, 0) }

// runRobustness runs the robustness scenario under cond (rounds for
// soakFor when positive, else one) and judges it, then fails the spec on
// the attacks left out for lack of its time.
func runRobustness(ctx SpecContext, cond toxics.Condition, soakFor time.Duration) {
	var skipped []string
	h.Run(ctx, robustness(cond, soakFor, &skipped))
	Expect(skipped).To(BeEmpty(), "attacks not run: less than %v of the spec's time left (every earlier attack waited for an answer)", reserve)
}

var _ = Describe("Robustness", spec.Property(property), func() {
	DescribeTable("survives hostile traffic, answers every bad message, keeps serving a victim and returns to its baseline",
		robustnessRow, spec.Entries(toxics.CI(), catches, SpecTimeout(90*time.Second)),
		// the victim on SignAndEncrypt channels; the attackers' own
		// connections stay on None (hostile traffic needs no keys)
		spec.Entries(toxics.Secured(toxics.SecuritySignEncrypt, toxics.Baseline), nil, SpecTimeout(90*time.Second), spec.Nightly))

	// Robustness in rounds: against one server for the whole soak, the
	// attacks of the CI rows run round after round (attackAll: the
	// catalogue one after another, the idle-connection attacks beside
	// it, then the wait for sessions, connections and memory to return),
	// each round with random choices of its own, while one victim reads
	// and samples throughout. A round starts only while the longest round
	// so far still ends SOAK less reserve after the workload started, so
	// that the last round's settling and the verdict fit the spec's time;
	// SOAK=1m runs one round, or two on a fast target.
	//
	// The same checks judge all rounds at once (robustnessChecks):
	// survival after every round (a death in any round, named by the
	// attack it fell in: crash-on-decode, whatever decode path the
	// round's fuzzing drew), every bad message of every round answered
	// within its deadline, the victim never stalled, and sessions,
	// connections and memory back to their baseline after the last round
	// (idle connections never closed: unbounded-idle; abandoned sessions
	// never expiring pile up round after round: sessions-never-expire),
	// with sessions-round<n> for the first rounds before it whose sessions
	// were not back when their wait ended. The memory is judged round
	// against round (memoryRounds: the rounds in at most 8 groups), so
	// that a slow leak, a few MiB a round that one round leaves inside
	// the band, fails once the rounds have carried it out of it, while
	// memory a round retains without growing passes. It is not labelled
	// for the fault matrix, which the CI rows cover in a minute.
	It("survives rounds of hostile traffic for the soak's length, answering every bad message, serving a victim throughout and returning to its baseline after every round", Label("soak"), spec.Condition(toxics.Baseline.Name), func(ctx SpecContext) {
		runRobustness(ctx, toxics.Baseline, spec.SoakFor())
	}, spec.SoakTimeout(2*time.Minute))
})
