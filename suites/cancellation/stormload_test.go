package cancellation_test

import (
	"fmt"
	"slices"
	"time"

	"github.com/opcua-chaos/opcua-chaos/fixtures/history"
	"github.com/opcua-chaos/opcua-chaos/fixtures/load"
	"github.com/opcua-chaos/opcua-chaos/fixtures/target"
)

// The cancel storm on a server without Slow.<ms>: its sessions read many
// standard nodes per Read in deep pipelines, so that a server with a
// bounded pool of workers, or one that serves a channel's requests in
// turn, holds most of them queued when their Cancels arrive.
const (
	// standardOutstanding standard Reads per storm session (each of the
	// six): 96 in flight at once. The reference server under the quirk
	// no-test-nodes, given two workers, held a median of … queued
	// (storm.diag.Queue.Depth) and its median read waited … ms.
	standardOutstanding = 16
	// stormMinShare is the least share of the requests a storm's Cancels
	// found in flight that must end BadRequestCancelledByClient: below
	// it the storm reads not exercised. The reference server cancelled
	// … of them on Slow reads and … on standard reads; with the fault
	// cancel-wrong-handle none.
	stormMinShare = 0.1
	// maxDispatchWindow bounds the before-dispatch Cancels' delay: within
	// it of sending a Slow read is still queued.
	maxDispatchWindow = 20 * time.Millisecond
)

// maxNodesPerReadName is the OperationLimits limit preflight reads
// (probe.Report.Reported) that bounds a standard Read.
const maxNodesPerReadName = "MaxNodesPerRead"

// stormLoad is what the cancel storm's sessions read.
type stormLoad struct {
	// standard says the target has no Slow.<ms> nodes: the reads are of
	// many standard nodes.
	standard bool
	// kind is the history kind of the storm's reads.
	kind history.Kind
	// read is every phase's request, burst the burst's.
	read, burst load.Request
	// outstanding is the reads in flight of an anonymous storm session,
	// own those of a session with an owner of its own.
	outstanding, own int
	// what describes the load for the history's labels and marks.
	what string
}

// newStormLoad returns the storm's load on t: Slow.<ms> reads where the
// target has them (a known service time at a worker-bound server), else
// Reads of standardReadNodes ServerStatus scalars (load.StandardRead,
// fewer where the server reports a smaller MaxNodesPerRead, maxNodes) in
// pipelines standardOutstanding deep.
func newStormLoad(t target.Profile, maxNodes uint32) stormLoad {
	if t.ServiceTime {
		return stormLoad{kind: history.KindSlowRead, read: load.SlowRead(service), burst: load.SlowRead(burstService),
			outstanding: stormOutstanding, own: 1, what: fmt.Sprintf("reading slow reads (%s)", service)}
	}
	n := standardReadNodes
	if maxNodes > 0 && int(maxNodes) < n {
		n = int(maxNodes)
	}
	read := load.StandardRead(n)
	return stormLoad{standard: true, kind: history.KindStandardRead, read: read, burst: read,
		outstanding: standardOutstanding, own: standardOutstanding,
		what: fmt.Sprintf("reading %d ServerStatus values per Read, %d Reads in flight per session (no Slow nodes)", n, standardOutstanding)}
}

// dispatchWindow is how soon after sending a before-dispatch Cancel goes
// out, for a median latency l: within maxDispatchWindow, and for standard
// reads within a tenth of l (their service time is far shorter).
func (sl stormLoad) dispatchWindow(l time.Duration) time.Duration {
	if !sl.standard {
		return maxDispatchWindow
	}
	return max(min(maxDispatchWindow, l/10), time.Microsecond)
}

// serviceTime is a read's service time: Slow's, or for standard reads the
// least latency of one answered in w (a read that did not wait: the
// server's work and the link's round trip).
func (sl stormLoad) serviceTime(h history.History, w history.Window) time.Duration {
	if !sl.standard {
		return service
	}
	var ls []time.Duration
	for op := range h.AllOps() {
		if op.Kind == sl.kind && op.Outcome == history.OK && w.Contains(op.Complete) {
			ls = append(ls, op.Latency())
		}
	}
	if len(ls) == 0 {
		return time.Microsecond
	}
	return max(slices.Min(ls), time.Microsecond)
}
