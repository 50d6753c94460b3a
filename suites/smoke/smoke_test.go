package smoke_test

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/gopcua/opcua/ua"
	. "github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega/gmeasure"

	"github.com/opcua-chaos/opcua-chaos/fixtures/check"
	"github.com/opcua-chaos/opcua-chaos/fixtures/env"
	"github.com/opcua-chaos/opcua-chaos/fixtures/history"
	"github.com/opcua-chaos/opcua-chaos/fixtures/load"
	"github.com/opcua-chaos/opcua-chaos/fixtures/scenario"
	"github.com/opcua-chaos/opcua-chaos/fixtures/secure"
	"github.com/opcua-chaos/opcua-chaos/fixtures/spec"
	"github.com/opcua-chaos/opcua-chaos/fixtures/target"
	"github.com/opcua-chaos/opcua-chaos/fixtures/uaclient"
	"github.com/opcua-chaos/opcua-chaos/server/catalog"
	"github.com/opcua-chaos/opcua-chaos/toxics"
)

const property = "smoke"

// h runs the suite's scenarios; spec.Bootstrap fills it before the first
// spec.
var h = spec.Bootstrap()

func TestSmoke(t *testing.T) { spec.RunSuite(t, property) }

// Readings the smoke workloads record (history readings) and their checks
// judge: flags are 1 for what held and 0 for what did not, latencies are
// medians in ms.
const (
	// readingProxyRead is 1 when ServerStatus was read through the proxy.
	readingProxyRead history.ReadingName = "smoke.proxy_read_ok"
	// readingServerState is the ServerState read through the proxy (0:
	// Running).
	readingServerState history.ReadingName = "smoke.server_state"
	// readingDirectRead is 1 when the server's current time was read on
	// the direct endpoint.
	readingDirectRead history.ReadingName = "smoke.direct_read_ok"
	// readingEndpointMode and readingExpectedMode are the message
	// security mode (ua.MessageSecurityMode) of the session's endpoint
	// and the one of the condition's channel security.
	readingEndpointMode history.ReadingName = "smoke.endpoint_mode"
	readingExpectedMode history.ReadingName = "smoke.expected_mode"
	// readingBaseline, readingToxic and readingAfter are the median read
	// latencies through the proxy before, under and after a 50 ms
	// downstream latency toxic.
	readingBaseline history.ReadingName = "smoke.baseline_median_ms"
	readingToxic    history.ReadingName = "smoke.toxic_median_ms"
	readingAfter    history.ReadingName = "smoke.after_median_ms"
	// readingResetFailed is 1 when a read on the connection under a
	// reset_peer toxic failed.
	readingResetFailed history.ReadingName = "smoke.reset_read_failed"
	// readingNewSession is 1 when a new session opened after the reset
	// toxic was removed served a read.
	readingNewSession history.ReadingName = "smoke.new_session_served"
	// readingUnlimited and readingLimited are the median times of a burst
	// of CPU-bound reads without and with a 0.25 CPU limit.
	readingUnlimited history.ReadingName = "smoke.unlimited_median_ms"
	readingLimited   history.ReadingName = "smoke.limited_median_ms"
	// readingNanoCPUs is the server container's CPU limit Docker reports
	// under the limit.
	readingNanoCPUs history.ReadingName = "smoke.nano_cpus"
)

// flagCheck is the check name that reading, a flag, is 1.
func flagCheck(name string, reading history.ReadingName, what string) check.Spec {
	return check.Spec{Name: name, Config: check.ReadingsConfig{
		Reading: reading, Min: check.Bound(1), Required: true, Count: true, What: what,
	}}
}

// openSession opens a session on endpoint (with the channel security of
// opts, None by default); uaclient.CloseWithin closes it within
// closeTimeout.
func openSession(ctx context.Context, endpoint string, opts ...uaclient.Option) (*uaclient.Client, error) {
	c, err := uaclient.Open(ctx, endpoint, opts...)
	if err != nil {
		return nil, fmt.Errorf("open session on %s: %w", endpoint, err)
	}
	return c, nil
}

// openRecorded opens a session as client on endpoint with the channel
// security sec (one client identity, see secure.Config.Nth), recorded as
// a history.KindSession op of sec's identity, so that check.Identities
// judges it.
func openRecorded(ctx context.Context, rec *history.Recorder, client, endpoint string, sec secure.Config) (*uaclient.Client, error) {
	ref := rec.Invoke(history.Op{Client: client, Session: client, Identity: sec.Identity(), Kind: history.KindSession, Node: endpoint})
	c, err := openSession(ctx, endpoint, uaclient.Security(sec), uaclient.SessionName("opcua-chaos-"+client))
	if err != nil {
		rec.Fail(ref, 0, err)
		return nil, err
	}
	rec.OK(ref)
	return c, nil
}

// closeTimeout bounds closing a workload's session, also once the spec
// ended.
const closeTimeout = 10 * time.Second

// readServerState is the request of a workload step that reads
// ServerStatus.State, which every server has (scenario.Step).
var readServerState = "Read " + uaclient.ServerStatusState.String() + " (ServerStatus.State)"

// undoCtx is the context of an undo deferred by a workload: 10 s, also
// once ctx has ended.
func undoCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
}

// medianReadLatency reads ServerStatus n times in a row (within a minute)
// and returns the median latency; every read must succeed.
func medianReadLatency(ctx context.Context, exp *gmeasure.Experiment, name string, c *uaclient.Client, n int) (time.Duration, error) {
	deadline := time.Now().Add(time.Minute)
	for i := 0; i < n && time.Now().Before(deadline); i++ {
		begin := time.Now()
		if _, err := uaclient.ReadValue(ctx, c, uaclient.ServerStatusState); err != nil {
			return 0, scenario.Step(fmt.Sprintf("read %d of %s", i+1, name), readServerState, err)
		}
		exp.RecordDuration(name, time.Since(begin))
	}
	return exp.GetStats(name).DurationFor(gmeasure.StatMedian), nil
}

// burst reads node total times from workers goroutines on one session and
// returns how long it took.
func burst(ctx context.Context, c *uaclient.Client, node *ua.NodeID, total, workers int) (time.Duration, error) {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
		next  = make(chan struct{}, total)
	)
	for range total {
		next <- struct{}{}
	}
	close(next)
	begin := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range next {
				if _, err := uaclient.ReadValue(ctx, c, node); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	return time.Since(begin), first
}

// number returns v as a float64 if it is a number (an enum such as
// ServerState decodes as an int32).
func number(v any) (float64, bool) {
	x := reflect.ValueOf(v)
	switch {
	case x.CanInt():
		return float64(x.Int()), true
	case x.CanUint():
		return float64(x.Uint()), true
	case x.CanFloat():
		return x.Float(), true
	}
	return 0, false
}

// readsStatus is the scenario that reads ServerStatus through the proxy
// and directly, every session on cond's channel security: under a
// security mode, the sessions' endpoints must be of that mode, the proxy
// session is the run's first client identity's and the direct one the
// second's (secure.Config.Nth), and then every identity opens a session
// on the fast transport too (load.Run, a Read each): each client path
// with each identity, judged by check.Identities (scenario.Run adds it),
// so that a server that serves one client certificate only, or seals a
// channel for another client's, is named.
func readsStatus(cond toxics.Condition) scenario.Scenario {
	s := scenario.Scenario{
		Property: property, Name: "status", Condition: cond,
		Checks: []check.Spec{
			flagCheck("proxy-read", readingProxyRead, "ServerStatus read through the proxy (1: read)"),
			{Name: "server-state", Config: check.ReadingsConfig{
				Reading: readingServerState, Min: check.Bound(0), Max: check.Bound(0), Required: true, Count: true,
				What: "ServerState read through the proxy (0: Running)",
			}},
			flagCheck("direct-read", readingDirectRead, "the current time read on the direct endpoint (1: read)"),
			{Name: "endpoint-mode", Config: check.ReadingsConfig{
				Reading: readingEndpointMode, Minus: readingExpectedMode, Min: check.Bound(0), Max: check.Bound(0), Required: true, Count: true,
				What: "the session endpoint's message security mode minus the condition's",
			}},
		},
	}
	// closure: the client paths read in sequence (proxy, direct, fast transport per identity), each session's endpoint compared with the condition's security
	s.Workload = func(ctx context.Context, r *scenario.Run) error {
		sec := r.Env.Security
		// the first secured channel of the server: the first identity's
		c, err := openRecorded(ctx, r.Rec, "proxy", r.Env.Endpoint, sec.Nth(0))
		if err != nil {
			return err
		}
		defer uaclient.CloseWithin(ctx, c, closeTimeout)
		v, err := uaclient.ReadValue(ctx, c, uaclient.ServerStatusState)
		r.Rec.Reading(readingProxyRead, history.Flag(err == nil))
		if err != nil {
			r.Rec.Mark("proxy read failed", err.Error())
		} else {
			state, ok := number(v.Value())
			if !ok {
				return fmt.Errorf("ServerState read through the proxy is a %T, not a number", v.Value())
			}
			r.Rec.Reading(readingServerState, state)
		}

		// the second identity's session: a server that cannot serve it
		// fails direct-read (and identities), it does not break the run
		direct, err := openRecorded(ctx, r.Rec, "direct", r.Env.DirectEndpoint, sec.Nth(1))
		if err == nil {
			defer uaclient.CloseWithin(ctx, direct, closeTimeout)
			_, err = uaclient.ReadValue(ctx, direct, uaclient.ServerStatusCurrentTime)
		}
		r.Rec.Reading(readingDirectRead, history.Flag(err == nil))
		if err != nil {
			r.Rec.Mark("direct read failed", err.Error())
		}
		if sec.Secured() {
			// every identity on the fast transport, one Read each
			r.Rec.Mark("every client identity on the fast transport", fmt.Sprintf("%d identities", sec.Identities()))
			if _, err := load.Run(ctx, r.Rec, load.Profile{
				Name: "identities", Endpoint: r.Env.DirectEndpoint, Sessions: make([]load.Session, sec.Identities()),
				Transport: load.TransportFast, Security: sec, MaxRequests: 1, Duration: 10 * time.Second, RequestTimeout: 5 * time.Second,
			}); err != nil {
				r.Rec.Mark("fast transport sessions failed", err.Error())
			}
		}
		ep := c.Session().Endpoint
		got := secure.Config{Mode: ep.SecurityMode, Policy: ep.SecurityPolicyURI}
		r.Rec.Mark("session endpoint", got.String())
		r.Rec.Reading(readingEndpointMode, float64(ep.SecurityMode))
		r.Rec.Reading(readingExpectedMode, float64(sec.MessageMode()))
		return nil
	}
	return s
}

// latencyToxic measures the median read latency through the proxy before,
// under and after a 50 ms downstream latency toxic that the workload
// applies and removes itself (the condition has no toxics: the runner
// applies nothing), sampling into exp.
//
// The band is one-sided in what a busy host can do: timers that fire
// late (the proxy's, the client's) only add latency, so a shared CI
// machine measured 61 ms for the 50 ms toxic; what the smoke test must
// catch is a toxic not applied (< 40 ms) or applied twice (both
// directions: ≥ 100 ms), and one left behind.
func latencyToxic(exp *gmeasure.Experiment) scenario.Scenario {
	s := scenario.Scenario{
		Property: property, Name: "latency", Condition: toxics.Condition{Name: "latency"},
		Checks: []check.Spec{
			{Name: "added-latency", Config: check.ReadingsConfig{
				Reading: readingToxic, Minus: readingBaseline, Min: check.Bound(40), Max: check.Bound(90), Required: true,
				What: "median read latency added by the 50 ms toxic (ms)",
			}},
			{Name: "latency-removed", Config: check.ReadingsConfig{
				Reading: readingAfter, Minus: readingBaseline, Max: check.Bound(10), Required: true,
				What: "median read latency after removing the toxic over the baseline (ms)",
			}},
		},
	}
	// closure: medians of reads on one session before, under and after the harness's own toxic (Proxy.Apply), each phase ending when its reads are done, not at a time
	s.Workload = func(ctx context.Context, r *scenario.Run) error {
		c, err := openSession(ctx, r.Env.Endpoint)
		if err != nil {
			return err
		}
		defer uaclient.CloseWithin(ctx, c, closeTimeout)
		const n = 21

		r.Rec.Mark("measuring the baseline", "")
		base, err := medianReadLatency(ctx, exp, "baseline", c, n)
		if err != nil {
			return err
		}
		r.Rec.Reading(readingBaseline, ms(base))

		r.Rec.Mark("adding a 50 ms downstream latency toxic", "")
		tox := toxics.Latency(toxics.Downstream, 50, 0)
		undo, err := r.Env.Proxy.Apply(ctx, env.ProxyName, []toxics.Toxic{tox})
		if err != nil {
			return fmt.Errorf("add the latency toxic: %w", err)
		}
		removed := r.Rec.Fault("latency-50ms", "50 ms downstream latency toxic")
		defer func() {
			uctx, cancel := undoCtx(ctx)
			defer cancel()
			removed(undo(uctx))
		}()
		slow, err := medianReadLatency(ctx, exp, "latency-50ms", c, n)
		if err != nil {
			return err
		}
		r.Rec.Reading(readingToxic, ms(slow))

		r.Rec.Mark("removing the toxic", "")
		err = undo(ctx)
		removed(err)
		if err != nil {
			return fmt.Errorf("remove the latency toxic: %w", err)
		}
		after, err := medianReadLatency(ctx, exp, "after", c, n)
		if err != nil {
			return err
		}
		r.Rec.Reading(readingAfter, ms(after))
		r.AddFigures("", map[string]float64{"baseline_median_ms": ms(base), "toxic_median_ms": ms(slow), "after_median_ms": ms(after), "added_ms": ms(slow - base)})
		return nil
	}
	return s
}

// resetPeer breaks the connection with a reset_peer toxic that the
// workload applies and removes itself (the condition has no toxics), and
// then opens a new session.
func resetPeer() scenario.Scenario {
	s := scenario.Scenario{
		Property: property, Name: "reset", Condition: toxics.Condition{Name: "reset"},
		Checks: []check.Spec{
			flagCheck("reset-breaks", readingResetFailed, "a read on the connection under reset_peer failed within 15 s (1: failed)"),
			flagCheck("new-session", readingNewSession, "a new session after the toxic was removed served a read (1: served)"),
		},
	}
	// closure: a read on one session, the harness's own toxic (Proxy.Apply) put in and taken out between its reads, then a new session: the smoke of the primitive nemesis uses
	s.Workload = func(ctx context.Context, r *scenario.Run) error {
		c, err := openSession(ctx, r.Env.Endpoint)
		if err != nil {
			return err
		}
		defer uaclient.CloseWithin(ctx, c, closeTimeout)
		if _, err := uaclient.ReadValue(ctx, c, uaclient.ServerStatusState); err != nil {
			return scenario.Step("read before the reset", readServerState, err)
		}

		r.Rec.Mark("adding a reset_peer toxic", "")
		undo, err := r.Env.Proxy.Apply(ctx, env.ProxyName, []toxics.Toxic{toxics.ResetPeer(toxics.Downstream, 0)})
		if err != nil {
			return fmt.Errorf("add the reset_peer toxic: %w", err)
		}
		removed := r.Rec.Fault("reset_peer", "downstream reset_peer toxic")
		defer func() {
			uctx, cancel := undoCtx(ctx)
			defer cancel()
			removed(undo(uctx))
		}()
		failed, err := readFails(ctx, c, 15*time.Second)
		if err != nil {
			return err
		}
		r.Rec.Reading(readingResetFailed, history.Flag(failed != nil))
		if failed != nil {
			r.Rec.Mark("read on the reset connection failed", failed.Error())
		}

		r.Rec.Mark("removing the toxic and opening a new session", "")
		err = undo(ctx)
		removed(err)
		if err != nil {
			return fmt.Errorf("remove the reset_peer toxic: %w", err)
		}
		err = readOnNewSession(ctx, r.Env.Endpoint)
		r.Rec.Reading(readingNewSession, history.Flag(err == nil))
		if err != nil {
			r.Rec.Mark("new session after the reset not served", err.Error())
		}
		return nil
	}
	return s
}

// readFails reads ServerStatus on c every 10 ms, each read within 2 s,
// until one fails or within passes, and returns the failure (nil when
// every read succeeded). Its error is ctx's.
func readFails(ctx context.Context, c *uaclient.Client, within time.Duration) (failed, err error) {
	deadline := time.Now().Add(within)
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, rerr := uaclient.ReadValue(rctx, c, uaclient.ServerStatusState)
		cancel()
		if err := ctx.Err(); err != nil {
			return nil, context.Cause(ctx)
		}
		if rerr != nil {
			return rerr, nil
		}
		if time.Now().After(deadline) {
			return nil, nil
		}
		select {
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// readOnNewSession opens a session on endpoint, reads ServerStatus on it
// and closes it.
func readOnNewSession(ctx context.Context, endpoint string) error {
	fresh, err := openSession(ctx, endpoint)
	if err != nil {
		return err
	}
	defer uaclient.CloseWithin(ctx, fresh, closeTimeout)
	if _, err := uaclient.ReadValue(ctx, fresh, uaclient.ServerStatusState); err != nil {
		return fmt.Errorf("read on a new session after the reset: %w", err)
	}
	return nil
}

// cpuLimit times a fixed burst of CPU-bound reads without and with a 0.25
// CPU limit that the workload puts on the server container and lifts
// itself (the condition has no CPU limit), sampling into exp. 96 reads ×
// 2 ms of server CPU, 8 at a time: ~0.2 CPU-seconds, which take ≥ 0.8 s
// at 0.25 CPU and ~0.1–0.2 s on 2 free cores; 2× leaves room for a busy
// machine.
func cpuLimit(exp *gmeasure.Experiment) scenario.Scenario {
	const nanoCPUs = 250_000_000
	s := scenario.Scenario{
		Property: property, Name: "cpu", Condition: toxics.Condition{Name: "cpu"},
		Requires: []target.Capability{target.CapabilityCPULimit, target.CapabilityServiceTime},
		Checks: []check.Spec{
			{Name: "cpu-limit", Config: check.ReadingsConfig{
				Reading: readingNanoCPUs, Min: check.Bound(nanoCPUs), Max: check.Bound(nanoCPUs), Required: true, Count: true,
				What: "NanoCPUs in docker inspect under the limit",
			}},
			{Name: "slowdown", Config: check.ReadingsConfig{
				Reading: readingLimited, Ratio: readingUnlimited, Min: check.Bound(2), Required: true,
				What: "burst median limited over unlimited",
			}},
		},
	}
	// closure: the harness's own CPU limit (Env.SetNanoCPUs, read back) between timed bursts on one session: the smoke of the primitive nemesis uses, not a fault
	s.Workload = func(ctx context.Context, r *scenario.Run) error {
		c, err := openSession(ctx, r.Env.Endpoint)
		if err != nil {
			return err
		}
		defer uaclient.CloseWithin(ctx, c, closeTimeout)
		busy := ua.NewStringNodeID(1, "Busy.2000")
		const total, workers = 96, 8
		if _, err := burst(ctx, c, busy, 16, workers); err != nil {
			return fmt.Errorf("warm-up burst: %w", err)
		}
		run := func(name string) (time.Duration, error) {
			for range 3 {
				d, err := burst(ctx, c, busy, total, workers)
				if err != nil {
					return 0, fmt.Errorf("burst %s: %w", name, err)
				}
				exp.RecordDuration(name, d)
			}
			return exp.GetStats(name).DurationFor(gmeasure.StatMedian), nil
		}
		r.Rec.Mark("timing the burst without a limit", "")
		unlimited, err := run("unlimited")
		if err != nil {
			return err
		}
		r.Rec.Reading(readingUnlimited, ms(unlimited))

		r.Rec.Mark("limiting the server to 0.25 CPU", "")
		if err := r.Env.SetNanoCPUs(ctx, nanoCPUs); err != nil {
			return fmt.Errorf("limit the server's CPU: %w", err)
		}
		lifted := r.Rec.Fault("cpu-0.25", "server container limited to 0.25 CPU")
		defer func() {
			uctx, cancel := undoCtx(ctx)
			defer cancel()
			lifted(r.Env.SetNanoCPUs(uctx, 0))
		}()
		got, err := r.Env.NanoCPUs(ctx)
		if err != nil {
			return fmt.Errorf("read the server's CPU limit: %w", err)
		}
		r.Rec.Reading(readingNanoCPUs, float64(got))
		limited, err := run("limited-0.25cpu")
		if err != nil {
			return err
		}
		r.Rec.Reading(readingLimited, ms(limited))
		r.AddFigures("", map[string]float64{
			"unlimited_median_ms": ms(unlimited), "limited_median_ms": ms(limited),
			"slowdown_ratio": float64(limited) / float64(unlimited), "nano_cpus": float64(got),
		})
		return nil
	}
	return s
}

var _ = Describe("Smoke", spec.Property(property), func() {
	It("reads ServerStatus through the proxy", spec.Condition(toxics.Baseline.Name), func(ctx SpecContext) {
		h.Run(ctx, readsStatus(toxics.Baseline))
	}, spec.Timeout(2*time.Minute), FlakeAttempts(spec.Attempts))

	// the CI profile's proof that every client path opens SignAndEncrypt
	// channels with every client identity: a second, four sessions long
	secured := toxics.Baseline.WithSecurity(toxics.SecuritySignEncrypt)
	It("reads ServerStatus through the proxy on SignAndEncrypt channels", spec.Condition(secured.Name), spec.Catches(catalog.FaultCertCachedAcrossChannels), func(ctx SpecContext) {
		h.Run(ctx, readsStatus(secured))
	}, spec.Timeout(2*time.Minute), FlakeAttempts(spec.Attempts))

	It("adds 40–90 ms of median read latency under a 50 ms downstream latency toxic, and loses it when removed", spec.Condition("latency"), func(ctx SpecContext) {
		exp := gmeasure.NewExperiment("read latency through the proxy")
		AddReportEntry(exp.Name, exp, ReportEntryVisibilityFailureOrVerbose)
		h.Run(ctx, latencyToxic(exp))
	}, spec.Timeout(3*time.Minute), FlakeAttempts(spec.Attempts))

	It("breaks the connection under reset_peer, and a new session works once it is removed", spec.Condition("reset"), func(ctx SpecContext) {
		h.Run(ctx, resetPeer())
	}, spec.Timeout(2*time.Minute), FlakeAttempts(spec.Attempts))

	It("applies a 0.25 CPU limit to the server container, which slows a fixed burst of CPU-bound reads", spec.Condition("cpu"), func(ctx SpecContext) {
		exp := gmeasure.NewExperiment("burst of 96 Busy.2000 reads")
		AddReportEntry(exp.Name, exp, ReportEntryVisibilityFailureOrVerbose)
		h.Run(ctx, cpuLimit(exp))
	}, spec.Timeout(3*time.Minute), FlakeAttempts(spec.Attempts))
})

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
