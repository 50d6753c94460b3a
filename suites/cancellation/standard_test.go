package cancellation_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gopcua/opcua/ua"

	"github.com/opcua-chaos/opcua-chaos/fixtures/history"
	"github.com/opcua-chaos/opcua-chaos/fixtures/load"
	"github.com/opcua-chaos/opcua-chaos/fixtures/target"
	"github.com/opcua-chaos/opcua-chaos/fixtures/uaclient"
)

// The race spec on a server with only the standard address space: its
// victims, its backlog closer and its survivors read many standard nodes
// in one Read each, in deep pipelines, instead of Slow.<ms>; every victim
// closed by CloseSession also keeps Publish requests parked at the server
// on a subscription without items (the server holds them until a
// keep-alive is due), so that a server that answers every Read in order
// before a CloseSession still has requests outstanding when it closes the
// session.
const (
	// standardReadNodes is the number of values one standard Read asks
	// for (fewer where the server reports a smaller MaxNodesPerRead): a
	// few hundred µs to a few ms of server time per Read on the servers
	// measured, so that pipelines of them queue at a server with workers.
	standardReadNodes = 1000
	// closerPublishes are the Publish requests each closed victim keeps
	// parked.
	closerPublishes = 3
	// publishInterval × publishKeepAlive is the subscription's keep-alive
	// period: well under victimRequestTimeout, so that a parked Publish
	// is answered (a keep-alive) before the client gives up on it, and
	// well over the victims' life before their close, so that Publishes
	// are parked at the close.
	publishInterval  = 500 * time.Millisecond
	publishKeepAlive = 8
	// closeSlack is the link and scheduling slack of closeGrace: a read
	// running at the close may be answered that long after its service
	// time.
	closeSlack = 200 * time.Millisecond
)

// kindVictimPublish marks the Publish requests closed victims park.
const kindVictimPublish history.Kind = "victim_publish"

// standardCandidates are standard nodes every server has (Part 5's Server
// object): their values are small, so a Read of a thousand stays far
// below message size limits.
var standardCandidates = []*ua.NodeID{
	uaclient.ServerStatusCurrentTime, uaclient.ServerStatusState,
	ua.NewNumericNodeID(0, 2267), // Server_ServiceLevel
	ua.NewNumericNodeID(0, 2994), // Server_Auditing
	ua.NewNumericNodeID(0, 2257), // Server_ServerStatus_StartTime
}

// maxNodesPerRead is Server_ServerCapabilities_OperationLimits_MaxNodesPerRead.
var maxNodesPerRead = ua.NewNumericNodeID(0, 11705)

// raceLoad is what the race spec's sessions read.
type raceLoad struct {
	// standard says the target has no Slow.<ms> nodes: the reads are of
	// many standard nodes.
	standard bool
	// victim is the victims' and the backlog closer's read; survivor the
	// survivors' requests, sent in turn.
	victim   load.Request
	survivor []load.Request
	// what describes the load for the history's labels.
	what string
}

// newRaceLoad returns the race's load on t: Slow.<ms> reads where the
// target has them, else Reads of standard nodes that c (a session of the
// target) reads Good, as many per Read as standardReadNodes and the
// server's MaxNodesPerRead allow.
func newRaceLoad(ctx context.Context, c *uaclient.Client, t target.Profile) (raceLoad, error) {
	if t.ServiceTime {
		return raceLoad{
			victim:   load.SlowRead(victimService),
			survivor: []load.Request{load.SlowRead(50 * time.Millisecond), load.FastRead()},
			what:     fmt.Sprintf("Slow reads (%v victims, 50 ms survivors)", victimService),
		}, nil
	}
	var good []*ua.NodeID
	for _, n := range standardCandidates {
		if _, err := uaclient.ReadValue(ctx, c, n); err == nil {
			good = append(good, n)
		} else if !isStatus(err) {
			return raceLoad{}, fmt.Errorf("read standard node: %w", err)
		}
	}
	if len(good) == 0 {
		return raceLoad{}, fmt.Errorf("none of the standard nodes %v reads Good", standardCandidates)
	}
	n := standardReadNodes
	if v, err := uaclient.ReadValue(ctx, c, maxNodesPerRead); err == nil {
		if m, ok := v.Value().(uint32); ok && m > 0 && int(m) < n {
			n = int(m)
		}
	} else if !isStatus(err) {
		return raceLoad{}, fmt.Errorf("read MaxNodesPerRead: %w", err)
	}
	nodes := make([]*ua.NodeID, n)
	for i := range nodes {
		nodes[i] = good[i%len(good)]
	}
	read := load.ReadMany(nodes...)
	return raceLoad{
		standard: true,
		victim:   read,
		survivor: []load.Request{read, load.FastRead()},
		what:     fmt.Sprintf("Reads of %d values of %d standard nodes (no Slow nodes)", n, len(good)),
	}, nil
}

// isStatus reports whether err carries an OPC UA status code: the server
// answered (e.g. BadNodeIdUnknown), the connection is fine.
func isStatus(err error) bool {
	var s ua.StatusCode
	return errors.As(err, &s)
}

// grace is closeGrace for l in h: the victims' Slow read's service time,
// or for standard reads the longest a victim's read took before the first
// close (a read running at the close takes no longer than that); both
// plus closeSlack.
func (l raceLoad) grace(h history.History) time.Duration {
	if !l.standard {
		return victimService + closeSlack
	}
	first := time.Duration(-1)
	for op := range h.AllOps() {
		if op.Kind == history.KindCloseSession && (first < 0 || op.Invoke < first) {
			first = op.Invoke
		}
	}
	var longest time.Duration
	for op := range h.AllOps() {
		if op.Kind == kindVictim && op.Outcome == history.OK && (first < 0 || op.Complete < first) {
			longest = max(longest, op.Latency())
		}
	}
	return longest + closeSlack
}

// serverTime is a response's server timestamp in Unix seconds, the op's
// Value that closed-session compares (RequireHeld); 0 without one.
func serverTime(hdr *ua.ResponseHeader) float64 {
	if hdr == nil || hdr.Timestamp.IsZero() || hdr.Timestamp.Unix() <= 0 {
		return 0
	}
	return float64(hdr.Timestamp.UnixNano()) / 1e9
}

// subscribe creates a subscription without items on v's session for its
// parked Publish requests and starts n loops that keep one Publish
// outstanding each until the victim closes. It returns without a
// subscription (and no loops) when the server revises the keep-alive
// period to victimRequestTimeout or beyond: a parked Publish would then
// time out at the client before its keep-alive.
func (v *victim) subscribe(ctx context.Context, n int) error {
	resp, err := uaclient.Expect[*ua.CreateSubscriptionResponse](ctx, v.c, &ua.CreateSubscriptionRequest{
		RequestedPublishingInterval: float64(publishInterval / time.Millisecond),
		RequestedLifetimeCount:      3 * publishKeepAlive,
		RequestedMaxKeepAliveCount:  publishKeepAlive,
		PublishingEnabled:           true,
	})
	if err != nil {
		return fmt.Errorf("create subscription of %s: %w", v.name, err)
	}
	keepAlive := time.Duration(resp.RevisedPublishingInterval*float64(resp.RevisedMaxKeepAliveCount)) * time.Millisecond
	v.rec.SetLabel("keepalive."+v.name, keepAlive.String())
	if keepAlive >= victimRequestTimeout {
		return nil
	}
	for range n {
		v.wg.Add(1)
		go func() {
			defer v.wg.Done()
			for !v.closing.Load() && v.publish(ctx) {
			}
		}()
	}
	return nil
}

// publish sends one Publish and records its outcome, stamped with the
// server's response time; false once the connection is gone or the
// server refused it.
func (v *victim) publish(ctx context.Context) bool {
	ref := v.rec.Invoke(v.op(kindVictimPublish, ""))
	c, hdr := load.SendRequest(ctx, ctx, v.c, &ua.PublishRequest{}, victimRequestTimeout)
	c.Value = serverTime(hdr)
	v.rec.Complete(ref, c)
	return c.Outcome == history.OK
}
