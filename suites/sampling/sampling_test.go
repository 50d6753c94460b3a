package sampling_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"

	"github.com/opcua-chaos/opcua-chaos/fixtures/check"
	"github.com/opcua-chaos/opcua-chaos/fixtures/history"
	"github.com/opcua-chaos/opcua-chaos/fixtures/scenario"
	"github.com/opcua-chaos/opcua-chaos/fixtures/spec"
	"github.com/opcua-chaos/opcua-chaos/server/catalog"
	"github.com/opcua-chaos/opcua-chaos/toxics"
)

const property = "sampling"

// h runs the suite's scenarios; spec.Bootstrap fills it before the first
// spec.
var h = spec.Bootstrap()

func TestSampling(t *testing.T) { spec.RunSuite(t, property) }

const (
	// interval is 100 Hz sampling (the o6 criterion).
	interval = 10 * time.Millisecond
	// publishing batches samples; the queue holds four intervals of them.
	publishing = 100 * time.Millisecond
	// warmup leaves out the subscription's start; judged is the measured
	// span after it, by the samples' source timestamps.
	warmup = 1500 * time.Millisecond
	judged = 5 * time.Second
	// readingRevisedSampling is the sampling interval the server revised
	// the requested one to, in milliseconds.
	readingRevisedSampling history.ReadingName = "subscription.revised_sampling_ms"
)

// catches are the reference server's faults both specs are aimed at under
// baseline: a sampler that drifts, a server that drops Publish requests, a
// subscription that skips a
// sequence number (every 50th: the specs see about 70 notification
// messages, one per publishing interval over warmup, judged span and
// tail), a server that queues a sample twice (the sampling check fails
// on duplicates) and one that grants 10 ms but samples at the publishing
// interval (interval not kept).
var catches = []catalog.Fault{catalog.FaultSamplingDrift, catalog.FaultPublishDrop,
	catalog.FaultSkippedSequence, catalog.FaultDuplicateSamples, catalog.FaultSampleAtPublish}

// catchesOf is what the spec of items items is aimed at: catches, and
// with 8 items or more the sampler that never samples the items at
// positions ≡ 7 (mod 64); a lone item is sampled (the 1-item spec passed
// with that fault on, matrix faults-20261207-103445).
func catchesOf(items int) []catalog.Fault {
	if items >= 8 {
		return append(slices.Clone(catches), catalog.FaultSamplerSkips)
	}
	return catches
}

// subscription labels the driver's subscription in the history (its
// Publish ops and listed sequence numbers).
const subscription = "sub"

// nemesisSchedule samples 1024 items at 10 ms through a seeded nemesis
// schedule of runFor less 5 s and recovers its rate after every fault.
// Samples lost during a fault (and its grace) are excused; in the quiet
// parts between faults every item must be back at ≥ 99 %: a sampler that
// drifts or stays behind after starvation fails there.
//
// The driver's heap is profiled by profile (spec.ProfileDriver) after the
// warm-up and 10 s before the subscription ends: what it came to keep
// over a long soak is the difference of the two.
func nemesisSchedule(runFor time.Duration, profile func(ctx context.Context, at ...time.Duration) (stop func())) scenario.Scenario {
	const (
		items  = 1024
		window = time.Second
		// grace after each fault: the publish backlog of a throttled
		// link drains, a starved sampler is back on its grid.
		grace = time.Second
	)
	span := check.Span{From: warmup, To: runFor - window, Window: window}
	itemsCheck := func(mode string) check.Spec {
		return check.Spec{Name: "nemesis-items", Config: check.SamplingConfig{
			Span: span, Interval: interval, Mode: mode, BySourceTime: true, MinFraction: check.DefaultMinFraction,
			Excuse: []string{"*"}, Grace: grace,
		}}
	}
	return scenario.Scenario{
		Property: property, Name: "nemesis", Condition: toxics.Scheduled,
		Schedule: runFor - 5*time.Second,
		Labels:   map[string]string{"items": fmt.Sprint(items)},
		Checks: []check.Spec{
			itemsCheck(check.ByCounter),
			{Name: "nemesis-publish", Config: check.ErrorBudgetConfig{
				Span: check.Span{From: warmup, To: runFor - window}, Kinds: []history.Kind{history.KindPublish},
				Excuse: []string{"*"}, Grace: grace,
			}},
			{Name: "nemesis-sequence", Config: check.SequenceConfig{
				Subscriptions: []string{subscription}, Excuse: []string{"*"}, Grace: grace,
			}},
		},
		Observers: []scenario.Observer{scenario.HeapProfiles{Profile: profile, At: []time.Duration{max(runFor/5, warmup), runFor - 10*time.Second}}},
		Loads: []scenario.Load{scenario.Subscribe{
			Client: subscription, Items: items, Sampling: interval, Publishing: publishing, Outstanding: 4, Duration: runFor,
			Unsecured: true,
			// the items check counts the samples as the target's node needs
			Checks: func(mode string, _ check.Span) []check.Spec { return []check.Spec{itemsCheck(mode)} },
		}},
	}
}

// samplingChecks are the checks of a subscription to items of a stream
// counted by mode (check.ByCounter, check.BySource), judged over span.
func samplingChecks(items int, span check.Span, mode string) []check.Spec {
	return []check.Spec{
		{Name: fmt.Sprintf("items-%d", items), Config: check.SamplingConfig{
			Span:     span,
			Interval: interval, Mode: mode, BySourceTime: true, MinFraction: check.DefaultMinFraction,
		}},
		{Name: fmt.Sprintf("items-%d-publish", items), Config: check.ErrorBudgetConfig{
			// Publish requests still out when the run ends are
			// abandoned by the client, not lost: judge the span.
			Span: span, Kinds: []history.Kind{history.KindPublish}}},
		// every notification message of the whole run
		// arrives: the driver acknowledges each, so a number
		// it never got was skipped by the server (never
		// listed available) or lost on the way; the one in
		// flight when the driver stopped is not judged
		{Name: fmt.Sprintf("items-%d-sequence", items), Config: check.SequenceConfig{Subscriptions: []string{subscription}}},
		// the server samples at the interval asked for
		{Name: fmt.Sprintf("items-%d-interval", items), Config: check.ReadingsConfig{
			Reading: readingRevisedSampling, Max: check.Bound(float64(interval) / float64(time.Millisecond)), Required: true,
			What: "revised sampling interval in ms", Discrete: true,
		}},
		// the host ran every thread over the sampling check's
		// own windows: a hypervisor that steals timeslices
		// makes the server's sampler skip ticks
		scenario.QuietFine(span),
		// the subscriber kept a Publish at the server: with
		// none for longer than its items' queues hold (4
		// publishing intervals, less one to wait for the
		// timer) a conformant server discards samples
		check.Assume(fmt.Sprintf("items-%d-publishing", items), check.PublishCoverageConfig{
			Span: span, Client: "sub", MaxIdle: 3 * publishing,
		}),
	}
}

// delivers returns the scenario, under a condition, that delivers ≥ 99 %
// of the samples of each of items items at 10 ms, of the target's
// sampled counters or else its fast node (scenario.Sampled): the subscription
// runs over warmup and 5 judged windows of a second. Windows the host
// disturbed are left out of the fractions: the subscription goes on until
// 5 were quiet, at most 5 more, and the checks are judged over the
// windows it covered (samplingChecks, revised once the subscription
// ended, whatever ended it).
func delivers(items int) func(toxics.Condition) scenario.Scenario {
	return func(cond toxics.Condition) scenario.Scenario {
		span := check.Span{From: warmup, To: warmup + judged, Count: 5}
		name := fmt.Sprintf("items-%d", items)
		return scenario.Scenario{
			Property: property, Name: name, Condition: cond,
			Labels: map[string]string{"items": fmt.Sprint(items)},
			Checks: samplingChecks(items, span, check.ByCounter),
			Loads: []scenario.Load{scenario.Subscribe{
				Client: subscription, Items: items, Sampling: interval, Publishing: publishing, Outstanding: 4,
				Duration: warmup + judged + 500*time.Millisecond, Revised: readingRevisedSampling,
				Span: span, Quiet: true, StandardNodes: name,
				Checks: func(mode string, span check.Span) []check.Spec { return samplingChecks(items, span, mode) },
			}},
		}
	}
}

var _ = Describe("100 Hz sampling", spec.Property(property), func() {
	It("samples 1024 items at 10 ms through a seeded nemesis schedule and recovers its rate after every fault", Label("soak"), spec.Condition(toxics.Scheduled.Name), func(ctx SpecContext) {
		h.Run(ctx, nemesisSchedule(spec.SoakFor(), spec.ProfileDriver))
	}, spec.SoakTimeout(2*time.Minute))

	// With 1024 items: catches fault sampler-skips (items-1024:
	// subscribed items that deliver no sample; the history names
	// every item created, so check.Sampling judges each).
	for _, items := range []int{1, 1024} {
		DescribeTable(fmt.Sprintf("delivers ≥ 99 %% of the samples of each of %d item(s) at 10 ms", items), h.Scenario(delivers(items)),
			spec.Entries(toxics.CI(), catchesOf(items), SpecTimeout(2*time.Minute)),
			spec.Entries(toxics.Secured(toxics.SecuritySignEncrypt, toxics.Baseline), nil, SpecTimeout(2*time.Minute), spec.Nightly))
	}
})
