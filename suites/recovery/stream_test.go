package recovery_test

import (
	"context"
	"fmt"
	"time"

	"github.com/gopcua/opcua/ua"

	"github.com/opcua-chaos/opcua-chaos/fixtures/check"
	"github.com/opcua-chaos/opcua-chaos/fixtures/reconnect"
	"github.com/opcua-chaos/opcua-chaos/fixtures/scenario"
	"github.com/opcua-chaos/opcua-chaos/fixtures/target"
	"github.com/opcua-chaos/opcua-chaos/fixtures/uaclient"
)

// The stream on a server without a sampled counter. Its one item is
// Server_ServerStatus_CurrentTime (i=2258): Part 5 makes it the server's
// clock, so it is the one variable of the standard address space every
// server keeps changing. The reference server and open62541 give it a new
// value at every sample (20 and 50 ms), S2OPC once a second. Other
// standard variables change on the same clock (ServerStatus) or only when
// sessions come and go (the diagnostics counts): they would add
// notifications to the same messages, not messages, and an item that does
// not change would read as a stream that lost its samples. The stream is
// counted by source timestamp (check.BySource) at the period measured
// before the faults (reconnect.Pace), not at the sampling interval asked
// for.
const (
	// paceChanges is how many changes of every item the warm-up waits
	// for to measure the stream's period (10 s at S2OPC's 1 Hz), at most
	// paceWait; with fewer the transferred stream is not judged.
	paceChanges = 10
	paceWait    = 15 * time.Second
	// streamPeriods is the fewest periods of the stream the judged span
	// after the transfer holds: at S2OPC's 1 Hz 30 s instead of streamed,
	// so that one sample more or less at the span's edges (±3 %) stays
	// within minFraction, and the transfer-drops fault (the items gone
	// after the transfer: about 5 % of the span's samples) far below it.
	streamPeriods = 30
	// minFraction is the share of the stream's samples the judged span
	// must hold.
	minFraction = 0.95
)

// stream is what the spec subscribes to and how its samples are counted.
type stream struct {
	// nodes are the items' nodes.
	nodes []*ua.NodeID
	// mode counts the samples: check.ByCounter for counters that change
	// at every sample, check.BySource for a standard node.
	mode string
	// on says what the items are, for the history's labels.
	on string
}

// streamFor returns the stream for target p: items counters of its
// sampled counter (target.Profile.SampleNode, which preflight found or the
// user declared; a server that revised 10 ms keeps it, the spec judges at
// the interval it granted), else the standard node CurrentTime. A counter
// pattern that does not make a node id is an error.
func streamFor(p target.Profile) (stream, error) {
	if p.SampleNode == "" {
		n := uaclient.ServerStatusCurrentTime
		return stream{nodes: []*ua.NodeID{n}, mode: check.BySource,
			on: fmt.Sprintf("standard node %s (Server_ServerStatus_CurrentTime): target %s has no sampled counter", n, p.Name)}, nil
	}
	nodes := make([]*ua.NodeID, items)
	for i := range nodes {
		n, err := ua.ParseNodeID(fmt.Sprintf(p.SampleNode, i))
		if err != nil {
			return stream{}, fmt.Errorf("sampled counter %q of target %s: %w", p.SampleNode, p.Name, err)
		}
		nodes[i] = n
	}
	return stream{nodes: nodes, mode: check.ByCounter, on: fmt.Sprintf("%d sampled counters %s", items, p.SampleNode)}, nil
}

// paced is the stream as the warm-up measured it, and what it sizes.
type paced struct {
	reconnect.Pace
	// interval is the period the stream is judged at: the sampling
	// interval the server granted for counters (every sample one
	// increment), the measured period (at least that interval) for a
	// standard node.
	interval time.Duration
	// streamed is how long the stream runs in its new session after the
	// transfer: streamed, or streamPeriods of interval where that is
	// longer.
	streamed time.Duration
	// skip says why the transferred stream cannot be judged, or "".
	skip string
}

// warmUp lets sub run for warm and, where the stream is counted by
// source timestamp, until every item changed paceChanges times or
// paceWait passed, and returns its pace.
func warmUp(ctx context.Context, st stream, sub *reconnect.Subscription) paced {
	scenario.Sleep(ctx, warm)
	if st.mode == check.BySource {
		for end := time.Now().Add(paceWait - warm); sub.Pace().Changes < paceChanges && time.Now().Before(end) && ctx.Err() == nil; {
			scenario.Sleep(ctx, 100*time.Millisecond)
		}
	}
	return measure(st.mode, sub.Sampling, sub.Pace())
}

// measure sizes the judgement of a stream counted by mode, whose items
// the server samples every sampling, from its pace so far.
func measure(mode string, sampling time.Duration, p reconnect.Pace) paced {
	out := paced{Pace: p, interval: sampling}
	if mode == check.BySource {
		var why string
		if out.interval, why = p.Judged(sampling, paceChanges); why != "" {
			out.skip = fmt.Sprintf("after %v of warm-up: %s", paceWait, why)
		}
	}
	out.streamed = max(streamed, streamPeriods*out.interval)
	return out
}

// transferStream is the transfer check of sub's stream counted by mode,
// judged in span (from before the transfer to the end of its run after
// it); skip (the identity's, else the pace's) says why it is not judged.
func transferStream(sub *reconnect.Subscription, mode string, p paced, span check.Span, skip string) check.Spec {
	if skip == "" && p.skip != "" {
		skip = "the stream across the transfer: " + p.skip
	}
	return check.Spec{Name: "transfer-stream", Config: check.TransferConfig{Subscriptions: []string{sub.Label}, Stream: check.SamplingConfig{
		Span:     span,
		Interval: p.interval, Mode: mode, BySourceTime: true, MinFraction: minFraction, MaxGap: max(maxGap, 2*p.interval),
		// a transferred subscription may send every item's current
		// value again (Part 4 TransferSubscriptions,
		// sendInitialValues), and a republished message repeats
		// what the client may have half received
		AllowDuplicates: true,
	}, Skip: skip}}
}
