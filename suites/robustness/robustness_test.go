package robustness_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gopcua/opcua/ua"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/opcua-chaos/opcua-chaos/fixtures/attack"
	"github.com/opcua-chaos/opcua-chaos/fixtures/check"
	"github.com/opcua-chaos/opcua-chaos/fixtures/env"
	"github.com/opcua-chaos/opcua-chaos/fixtures/history"
	"github.com/opcua-chaos/opcua-chaos/fixtures/load"
	"github.com/opcua-chaos/opcua-chaos/fixtures/scenario"
	"github.com/opcua-chaos/opcua-chaos/fixtures/spec"
	"github.com/opcua-chaos/opcua-chaos/fixtures/subscribe"
	"github.com/opcua-chaos/opcua-chaos/fixtures/target"
	"github.com/opcua-chaos/opcua-chaos/fixtures/uaclient"
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
	// deathPolls readings deathPoll apart look for the death of a server
	// after an attack whose connections closed or went silent.
	deathPolls = 5
	deathPoll  = 100 * time.Millisecond
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

// maxStall is the longest time the victim may wait with Reads outstanding
// and none answered; maxLatency the longest one Read may take.
func maxStall(cond toxics.Condition) time.Duration {
	if len(cond.Toxics) > 0 || cond.NanoCPUs > 0 {
		return 2 * time.Second
	}
	return time.Second
}

func maxLatency(cond toxics.Condition) time.Duration { return maxStall(cond) }

// isReference reports whether the target is the reference server, which
// takes its limits from the environment.
func isReference() bool {
	t := h.Setup.Target
	return t.Kind == target.Container && t.Name == target.Reference.Name
}

// sleep waits d or until the spec ends.
func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-time.After(d):
	case <-ctx.Done():
	}
}

// closeWatch closes w's session, within 10 s even once the spec ended.
func closeWatch(ctx context.Context, w *watch.Watch) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_ = w.Close(ctx)
}

// victim runs the victim's load (and subscription) in the background.
type victim struct {
	stop context.CancelFunc
	// done is closed once the load and the subscription ended.
	done chan struct{}
	// items are the subscription's monitored items (none: no
	// subscription).
	items []string
	// sub is the subscription's session (nil: no subscription, or
	// closed).
	sub *uaclient.Client

	loadStats load.Stats
	subStats  subscribe.Stats
	err       error
}

// startVictim starts victimRate Reads per second on one session and, where
// the target has a sampling counter, a subscription of subItems items. Both
// run until finish (or the spec's end); close releases them.
func startVictim(ctx context.Context, e *env.Env, rec *history.Recorder) (*victim, error) {
	vctx, stop := context.WithCancel(ctx)
	v := &victim{stop: stop, done: make(chan struct{})}
	var wg sync.WaitGroup
	var loadErr, subErr error
	wg.Go(func() {
		v.loadStats, loadErr = load.Run(vctx, rec, load.Profile{Name: "victim", Endpoint: e.Endpoint, Duration: 5 * time.Minute, RequestTimeout: 5 * time.Second, Security: e.Security,
			Sessions: []load.Session{{Name: "victim", Open: &load.OpenLoop{Rate: victimRate}}}})
	})
	if pattern := e.Target.SampleNode; pattern != "" {
		c, err := uaclient.Open(ctx, e.Endpoint, uaclient.Security(e.Security))
		if err != nil {
			stop()
			wg.Wait()
			return nil, fmt.Errorf("open the victim's subscription session: %w", err)
		}
		v.sub = c
		node := func(i int) *ua.NodeID { return ua.MustParseNodeID(fmt.Sprintf(pattern, i)) }
		for i := range subItems {
			v.items = append(v.items, subscribe.ItemName(node(i)))
		}
		wg.Go(func() {
			v.subStats, subErr = subscribe.Run(vctx, rec, c, subscribe.Config{Client: subLabel, Node: node, Items: subItems,
				Sampling: subSampling, Publishing: subPublishing, Duration: 5 * time.Minute})
		})
	}
	go func() {
		wg.Wait()
		v.err = errors.Join(loadErr, subErr)
		close(v.done)
	}()
	return v, nil
}

// finish stops the victim, adds its figures to r's and returns its
// errors.
func (v *victim) finish(r *scenario.Run) error {
	v.stop()
	<-v.done
	r.AddFigures("victim.", v.loadStats.Figures())
	if len(v.items) > 0 {
		r.AddFigures("victim.", v.subStats.Figures())
	}
	return v.err
}

// close stops the victim, waits for its load and subscription and closes
// the subscription's session (within 10 s, even once the spec ended). It
// may follow finish.
func (v *victim) close(ctx context.Context) {
	v.stop()
	<-v.done
	if v.sub == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_ = v.sub.Close(ctx)
	v.sub = nil
}

// robustness is the scenario of the attacks against the target under cond
// while a victim reads: what the server did is judged. On the reference
// server the session flood goes past its limits (referenceLimits).
//
// The counts judged whatever the timing are planned before the attacks
// run: a spec that ends before its judgement (its timeout while an attack
// hangs the server, an interrupt) saves its history judged by them. The
// workload (attackAll) replaces them with the full set, of the attacks
// that ran. skipped receives the attacks the workload left out for lack
// of the spec's time: the spec fails on them once the run was judged.
func robustness(cond toxics.Condition, skipped *[]string) scenario.Scenario {
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
		Workload: func(ctx context.Context, r *scenario.Run) error { return attackAll(ctx, r, skipped) },
	}
	if isReference() {
		s.Server = referenceLimits
	}
	return s
}

// attackAll is the robustness workload: a victim reads through a baseline
// phase, the attacks run one after another (the idle-connection attacks
// beside them), then sessions, connections and memory are waited for to
// return to their baseline (with a second round of the bursts when the
// memory is out of its band) while the victim still reads. It plans the
// checks of what ran (Run.Check) and puts the attacks it left out for
// lack of the spec's time into skipped.
func attackAll(ctx context.Context, r *scenario.Run, skipped *[]string) error {
	e, rec, cond := r.Env, r.Rec, r.Scenario.Condition
	w := watch.New(e, rec, watch.Options{Sessions: h.Setup.Probe.StandardDiagnostics.Found, Connections: e.Target.Diagnostics})
	defer closeWatch(ctx, w)
	readings := func() {
		w.State(ctx)
		w.Memory(ctx)
		w.Counts(ctx)
	}

	rec.Mark("victim", fmt.Sprintf("serving a victim: %d Reads/s on one session, a subscription where the target samples", victimRate))
	v, err := startVictim(ctx, e, rec)
	if err != nil {
		return err
	}
	defer v.close(ctx)
	sleep(ctx, victimWarmup)
	baseline := history.Window{Start: rec.Now()}
	readings()
	for range int(before / time.Second) {
		sleep(ctx, time.Second)
		readings()
	}
	baseline.End = rec.Now()

	runner := &attack.Runner{Endpoint: e.Endpoint, Rec: rec, Seed: r.Seed}
	if e.Target.ServiceTime {
		runner.SlowNode = ua.NewStringNodeID(1, "Slow.300")
	}
	// The corrupt attack's connection goes through the second proxy, which
	// carries nothing else: its toxic never touches the victim.
	runner.Corrupter = &attack.Corrupter{Endpoint: e.VictimEndpoint, Add: func(ctx context.Context, t toxics.Toxic) (func(context.Context) error, error) {
		return e.Proxy.Apply(ctx, env.VictimProxyName, []toxics.Toxic{t})
	}}
	catalogue, background := attack.Catalogue(), attack.Background()
	rec.Mark("attacks", fmt.Sprintf("attacking: %d attacks one after another, %d idle-connection attacks beside them", len(catalogue), len(background)))
	var errs []error
	var waits []func() error
	for _, a := range background {
		waits = append(waits, runner.Go(ctx, a))
	}
	ran := append([]attack.Attack(nil), background...)
	for _, a := range catalogue {
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < reserve {
			*skipped = append(*skipped, a.Name)
			continue
		}
		tally, err := runner.Run(ctx, a)
		errs = append(errs, err)
		ran = append(ran, a)
		if tally.Lost() {
			// A dying process shows as running for a while (a Go
			// panic prints its stacks first): look again before the
			// next attack, so that the death falls between this
			// attack's readings.
			for range deathPolls {
				if !w.State(ctx) {
					break
				}
				sleep(ctx, deathPoll)
			}
		}
		if isBurst(a) {
			w.Memory(ctx)
		}
		w.State(ctx)
	}
	if len(*skipped) > 0 {
		rec.Mark("attacks-skipped", fmt.Sprint(*skipped))
	}
	for _, wait := range waits {
		errs = append(errs, wait())
	}
	attacked := rec.Now()
	alive := w.State(ctx)

	rec.Mark("settle", "waiting for sessions, connections and memory to return to their baseline, the victim still reading")
	baseSessions := -1.0
	for o := range rec.History().AllOps() {
		if o.Kind == history.KindSessionCount && o.Outcome == history.OK && baseline.Contains(o.Complete) {
			baseSessions = max(baseSessions, o.Value)
		}
	}
	// waitSettled takes readings until sessions (where counted) and memory
	// (where read) are back in their band, at least after and at most
	// settle after from. It reports whether the memory is back.
	waitSettled := func(from time.Duration) bool {
		memBack := true
		for settled := time.Now(); time.Since(settled) < settle && ctx.Err() == nil; {
			n := w.Counts(ctx)
			w.Memory(ctx)
			memBack = check.Settle(rec.History(), memoryCheck(baseline, from, nil)).Verdict != check.Fail
			back := n >= 0 && n <= baseSessions || baseSessions < 0 || !alive
			if back && (memBack || !alive) && time.Since(settled) >= after {
				break
			}
			sleep(ctx, 500*time.Millisecond)
		}
		return memBack
	}
	var rounds []history.Window
	if !waitSettled(attacked) && alive {
		// Out of its band: the same bursts again, to tell retention from
		// a leak.
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < reserve+settle {
			rec.Mark("memory-round-skipped", fmt.Sprintf("less than %v of the spec's time left", reserve+settle))
		} else {
			// memory out of its band: the bursts again, a second round
			// (retention or a leak)
			second := rec.Now()
			rounds = []history.Window{{Start: baseline.End, End: second}}
			rec.Mark("memory-round", "2")
			for _, a := range bursts {
				_, err := runner.Run(ctx, a)
				errs = append(errs, err)
				w.Memory(ctx)
				alive = w.State(ctx)
			}
			attacked = rec.Now()
			waitSettled(attacked)
			rounds = append(rounds, history.Window{Start: second})
		}
	}
	stopped := rec.Now()
	verr := v.finish(r)
	w.State(ctx)
	w.Memory(ctx)
	if len(rounds) > 0 {
		rounds[len(rounds)-1].End = rec.Now()
	}

	r.Figures["attacks.run"] = float64(len(ran))
	r.Figures["attacks.skipped"] = float64(len(*skipped))
	r.Check(robustnessChecks(cond, ran, baseline, attacked, stopped, rounds, v.items)...)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("send attacks: %w", err)
	}
	if verr != nil {
		return fmt.Errorf("run the victim: %w", verr)
	}
	return nil
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
		{Name: "victim-stall", Config: check.StallConfig{Span: check.Span{From: baseline.Start, To: stopped}, Kinds: reads, GroupBy: check.BySession, MaxStall: maxStall(cond), MaxLatency: maxLatency(cond)}},
		{Name: "victim-errors", Config: check.ErrorBudgetConfig{Span: check.Span{To: stopped}, Kinds: reads, Drained: check.Codes{}}},
		{Name: "victim-recovery", Config: check.RecoveryConfig{Baseline: baseline, Recovered: history.Window{Start: attacked, End: stopped}, Kinds: reads, MinRatio: minRatio}},
		{Name: "sessions", Config: check.SettleConfig{Kind: history.KindSessionCount, Baseline: baseline, From: attacked, Within: settle, Unit: "sessions"}},
		{Name: "connections", Config: check.SettleConfig{Kind: history.KindConnectionCount, Baseline: baseline, From: attacked, Within: settle, Unit: "connections"}},
		{Name: "memory", Config: memoryCheck(baseline, attacked, rounds)},
	}
	if len(items) > 0 {
		checks = append(checks, check.Spec{Name: "victim-sampling", Config: check.SamplingConfig{
			Span: check.Span{From: baseline.Start, To: stopped}, Interval: subSampling, Items: items, MinFraction: subMinShare, MaxGap: maxStall(cond),
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
// session count above its baseline).
var catches = []catalog.Fault{catalog.FaultCrashOnDecode, catalog.FaultUnboundedIdle, catalog.FaultSessionsNeverExpire}

// robustnessRow is the body of the robustness table: the scenario of the row's
// condition, judged first (the attacks that ran), then the attacks left
// out for lack of the spec's time fail the spec.
func robustnessRow(ctx SpecContext, cond toxics.Condition) {
	var skipped []string
	h.Run(ctx, robustness(cond, &skipped))
	Expect(skipped).To(BeEmpty(), "attacks not run: less than %v of the spec's time left (every earlier attack waited for an answer)", reserve)
}

var _ = Describe("Robustness", spec.Property(property), func() {
	DescribeTable("survives hostile traffic, answers every bad message, keeps serving a victim and returns to its baseline",
		robustnessRow, spec.Entries(toxics.CI(), catches, SpecTimeout(90*time.Second)),
		// the victim on SignAndEncrypt channels; the attackers' own
		// connections stay on None (hostile traffic needs no keys)
		spec.Entries(toxics.Secured(toxics.SecuritySignEncrypt, toxics.Baseline), nil, SpecTimeout(90*time.Second), spec.Nightly))
})
