package server

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/gopcua/opcua/id"
	"github.com/gopcua/opcua/ua"

	"github.com/opcua-chaos/opcua-chaos/server/catalog"
	"github.com/opcua-chaos/opcua-chaos/server/internal/budget"
)

// NamespaceURI is the URI of namespace 1, the server's own nodes.
const NamespaceURI = "urn:opcua-chaos:refserver:nodes"

// Limits of the service-time nodes and of one Read.
const (
	MaxSlowMillis   = 600_000    // Slow.<ms>: up to 10 min
	MaxBusyMicros   = 60_000_000 // Busy.<µs>: up to 60 s
	MaxNodesPerRead = 10_000
)

// The namespace 1 counter nodes (all Int64, string ids).
const (
	NodeReads             = "Counter.Reads"               // Read operations (ReadValueIds) answered
	NodeReadRequests      = "Counter.ReadRequests"        // Read requests answered
	NodeRequests          = "Counter.Requests"            // service requests received
	NodeRejected          = "Counter.Rejected"            // requests answered with a Bad service result
	NodeTimeouts          = "Counter.Timeouts"            // requests answered BadTimeout (TimeoutHint)
	NodeSessions          = "Counter.Sessions"            // current sessions
	NodeSessionsCumulated = "Counter.SessionsCumulated"   // sessions created since start
	NodeChannels          = "Counter.Channels"            // current secure channels
	NodeChannelsCumulated = "Counter.ChannelsCumulated"   // secure channels opened since start
	NodeTooBusy           = "Counter.TooBusy"             // requests refused BadServerTooBusy
	NodeCancelled         = "Counter.Cancelled"           // queued requests cancelled by the Cancel service
	NodeConnections       = "Counter.Connections"         // TCP connections served now
	NodeRefused           = "Counter.ConnectionsRefused"  // connections refused (MaxConnections)
	NodeEvicted           = "Counter.ConnectionsEvicted"  // connections without an activated session closed at MaxConnections to admit a new one
	NodePanics            = "Counter.Panics"              // panics recovered (the process lived on)
	NodeDecodingErrors    = "Counter.DecodingErrors"      // requests answered BadDecodingError
	NodeLoginsDelayed     = "Counter.LoginsDelayed"       // ActivateSession calls held back after failed logins
	NodeRSARefused        = "Counter.RSARefused"          // OpenSecureChannel and CreateSession refused over their peer's budget of RSA work
	NodeSecretsRefused    = "Counter.SecretsRefused"      // ActivateSession refused undecrypted over the server-wide budget of secret decryption
	NodeUnactivated       = "Counter.SessionsUnactivated" // sessions created, not yet activated

	NodeMemoryBudget  = "Memory.Budget"  // the memory budget's byte limit (0: none, the no-byte-budget fault)
	NodeMemoryCharged = "Memory.Charged" // bytes charged to it now, all classes
	// Memory.Charged.<class> and Memory.Refused.<class> (class: chunks,
	// queue, logins, items, sessions) are one class's bytes now and its
	// refused charges.

	NodeQueueDepth          = "Queue.Depth"          // requests queued now
	NodeQueueSlots          = "Queue.Slots"          // queue slots held now (Depth plus leaked slots)
	NodeQueueLimit          = "Queue.Limit"          // total queue bound
	NodeQueueOwnerLimit     = "Queue.OwnerLimit"     // per-owner ceiling
	NodeQueueEnqueued       = "Queue.Enqueued"       // requests admitted to the queue
	NodeQueueDispatched     = "Queue.Dispatched"     // requests taken by workers
	NodeQueueRejected       = "Queue.Rejected"       // requests refused (queue or owner share full)
	NodeQueueCancelled      = "Queue.Cancelled"      // queued requests cancelled (Cancel, CloseSession, lost channel, stop)
	NodeQueueWorkers        = "Queue.Workers"        // worker pool size
	NodeQueueWorkersBusy    = "Queue.WorkersBusy"    // workers running a request now
	NodeQueueWorkersWaiting = "Queue.WorkersWaiting" // workers parked for work now

	NodeBackpressurePauses = "Channel.BackpressurePauses"  // times a channel stopped reading
	NodeMaxPending         = "Channel.MaxPendingResponses" // most responses pending on one channel
	NodeLowestResume       = "Channel.LowestResume"        // fewest responses pending when a paused reader resumed (-1: none)
	NodePending            = "Channel.PendingResponses"    // responses pending now, all channels
	NodeParked             = "Channel.ParkedRequests"      // requests parked now (queued Publish), all channels
)

// OwnerNode returns the id string of a per-owner counter node:
// Owner.<owner>.<counter> with counter one of Queued, Slots, Enqueued,
// Dispatched, Rejected, Cancelled, Weight, Emptied (e.g. ns=1;s=Owner.heavy.Dispatched).
// Owners are user names, or peer IPs for anonymous sessions.
func OwnerNode(owner, counter string) string { return "Owner." + owner + "." + counter }

// read serves a Read request.
func (s *Server) read(ctx context.Context, r *ua.ReadRequest) ua.Response {
	switch {
	case len(r.NodesToRead) == 0:
		return s.fault(r, ua.StatusBadNothingToDo)
	case len(r.NodesToRead) > MaxNodesPerRead:
		// admit refuses such a Read on arrival; only a caller other than
		// the queue gets here.
		return s.fault(r, ua.StatusBadTooManyOperations)
	case r.TimestampsToReturn > ua.TimestampsToReturnNeither:
		return s.fault(r, ua.StatusBadTimestampsToReturnInvalid)
	}
	results := make([]*ua.DataValue, len(r.NodesToRead))
	for i, rv := range r.NodesToRead {
		dv, err := s.readValue(ctx, rv, r.TimestampsToReturn)
		if err != nil {
			code := ctxStatus(err)
			if code == ua.StatusBadTimeout {
				s.stats.timeouts.Add(1)
			}
			return s.fault(r, code)
		}
		results[i] = dv
	}
	s.stats.readRequests.Add(1)
	s.stats.reads.Add(int64(len(results)))
	return &ua.ReadResponse{ResponseHeader: respHeader(r, ua.StatusOK), Results: results}
}

// readValue reads one attribute. It fails only when ctx ends during a Slow or
// Busy node; other problems are per-value status codes.
func (s *Server) readValue(ctx context.Context, rv *ua.ReadValueID, ts ua.TimestampsToReturn) (*ua.DataValue, error) {
	if rv == nil || rv.NodeID == nil {
		return &ua.DataValue{EncodingMask: ua.DataValueStatusCode, Status: ua.StatusBadNodeIDUnknown}, nil
	}
	if s.nodeIDTooLong(rv.NodeID) {
		return &ua.DataValue{EncodingMask: ua.DataValueStatusCode, Status: ua.StatusBadNodeIDInvalid}, nil
	}
	v, ok, err := s.value(ctx, rv.NodeID)
	if err != nil {
		return nil, err
	}
	switch {
	case !ok:
		return &ua.DataValue{EncodingMask: ua.DataValueStatusCode, Status: ua.StatusBadNodeIDUnknown}, nil
	case rv.AttributeID != ua.AttributeIDValue:
		return &ua.DataValue{EncodingMask: ua.DataValueStatusCode, Status: ua.StatusBadAttributeIDInvalid}, nil
	}
	variant, err := ua.NewVariant(v)
	if err != nil {
		s.log.Error("cannot encode node value", "node", rv.NodeID.String(), "err", err)
		return &ua.DataValue{EncodingMask: ua.DataValueStatusCode, Status: ua.StatusBadInternalError}, nil
	}
	dv := &ua.DataValue{EncodingMask: ua.DataValueValue, Value: variant}
	now := time.Now()
	if ts == ua.TimestampsToReturnSource || ts == ua.TimestampsToReturnBoth {
		dv.EncodingMask |= ua.DataValueSourceTimestamp
		dv.SourceTimestamp = now
	}
	if ts == ua.TimestampsToReturnServer || ts == ua.TimestampsToReturnBoth {
		dv.EncodingMask |= ua.DataValueServerTimestamp
		dv.ServerTimestamp = now
	}
	return dv, nil
}

// value returns the value of a node; ok is false for unknown nodes.
func (s *Server) value(ctx context.Context, n *ua.NodeID) (v any, ok bool, err error) {
	switch n.Namespace() {
	case 0:
		if n.Type() != ua.NodeIDTypeTwoByte && n.Type() != ua.NodeIDTypeFourByte && n.Type() != ua.NodeIDTypeNumeric {
			return nil, false, nil
		}
		v, ok = s.standardValue(n.IntID())
		return v, ok, nil
	case 1:
		if n.Type() != ua.NodeIDTypeString {
			return nil, false, nil
		}
		return s.ownValue(ctx, n.StringID())
	}
	return nil, false, nil
}

func (s *Server) buildInfo() *ua.BuildInfo {
	return &ua.BuildInfo{
		ProductURI:       ProductURI,
		ManufacturerName: "opcua-chaos",
		ProductName:      ProductName,
		SoftwareVersion:  "0.2.0",
		BuildDate:        s.start,
	}
}

func (s *Server) standardValue(i uint32) (any, bool) {
	now := time.Now()
	c := s.sessions.Counts()
	rejected := uint32(s.stats.rejectedRequests.Load())
	switch i {
	case id.Server_NamespaceArray:
		return []string{"http://opcfoundation.org/UA/", NamespaceURI}, true
	case id.Server_ServerArray:
		return []string{ApplicationURI}, true
	case id.Server_ServerStatus:
		return ua.NewExtensionObject(&ua.ServerStatusDataType{
			StartTime:      s.start,
			CurrentTime:    now,
			State:          ua.ServerStateRunning,
			BuildInfo:      s.buildInfo(),
			ShutdownReason: &ua.LocalizedText{},
		}), true
	case id.Server_ServerStatus_StartTime:
		return s.start, true
	case id.Server_ServerStatus_CurrentTime:
		return now, true
	case id.Server_ServerStatus_State:
		return int32(ua.ServerStateRunning), true
	case id.Server_ServerStatus_BuildInfo:
		return ua.NewExtensionObject(s.buildInfo()), true
	case id.Server_ServerStatus_SecondsTillShutdown:
		return uint32(0), true
	case id.Server_ServerStatus_ShutdownReason:
		return &ua.LocalizedText{}, true
	case id.Server_ServerCapabilities_MaxSessions:
		return uint32(s.cfg.MaxSessions), true
	case id.Server_ServerCapabilities_OperationLimits_MaxNodesPerRead:
		return uint32(MaxNodesPerRead), true
	case id.Server_ServerCapabilities_OperationLimits_MaxMonitoredItemsPerCall:
		return uint32(s.subs.Options().MaxItemsPerCall), true
	case id.Server_ServerCapabilities_MaxMonitoredItemsPerSubscription:
		return uint32(s.subs.Options().MaxItems), true
	case id.Server_ServerCapabilities_MaxMonitoredItems:
		return uint32(s.subs.Options().MaxItemsTotal), true
	case id.Server_ServerDiagnostics_EnabledFlag:
		return true, true
	case id.Server_ServerDiagnostics_ServerDiagnosticsSummary:
		return ua.NewExtensionObject(&ua.ServerDiagnosticsSummaryDataType{
			CurrentSessionCount:          uint32(c.Current),
			CumulatedSessionCount:        uint32(c.Cumulated),
			SecurityRejectedSessionCount: uint32(s.stats.securityRejected.Load()),
			RejectedSessionCount:         uint32(c.Rejected),
			SessionTimeoutCount:          uint32(c.Timeouts),
			RejectedRequestsCount:        rejected,
		}), true
	case id.Server_ServerDiagnostics_ServerDiagnosticsSummary_ServerViewCount,
		id.Server_ServerDiagnostics_ServerDiagnosticsSummary_SessionAbortCount,
		id.Server_ServerDiagnostics_ServerDiagnosticsSummary_PublishingIntervalCount,
		id.Server_ServerDiagnostics_ServerDiagnosticsSummary_CurrentSubscriptionCount,
		id.Server_ServerDiagnostics_ServerDiagnosticsSummary_CumulatedSubscriptionCount,
		id.Server_ServerDiagnostics_ServerDiagnosticsSummary_SecurityRejectedRequestsCount:
		return uint32(0), true
	case id.Server_ServerDiagnostics_ServerDiagnosticsSummary_CurrentSessionCount:
		return uint32(c.Current), true
	case id.Server_ServerDiagnostics_ServerDiagnosticsSummary_CumulatedSessionCount:
		return uint32(c.Cumulated), true
	case id.Server_ServerDiagnostics_ServerDiagnosticsSummary_SecurityRejectedSessionCount:
		return uint32(s.stats.securityRejected.Load()), true
	case id.Server_ServerDiagnostics_ServerDiagnosticsSummary_RejectedSessionCount:
		return uint32(c.Rejected), true
	case id.Server_ServerDiagnostics_ServerDiagnosticsSummary_SessionTimeoutCount:
		return uint32(c.Timeouts), true
	case id.Server_ServerDiagnostics_ServerDiagnosticsSummary_RejectedRequestsCount:
		return rejected, true
	}
	return nil, false
}

// ownValue serves namespace 1.
func (s *Server) ownValue(ctx context.Context, name string) (any, bool, error) {
	if v, ok := s.subscriptionValue(name); ok {
		return v, true, nil
	}
	if v, ok := s.memoryValue(name); ok {
		return v, true, nil
	}
	if rest, ok := strings.CutPrefix(name, "Slow."); ok && s.serviceTimeNodes() {
		return serviceTime(ctx, rest, MaxSlowMillis, time.Millisecond, sleep)
	}
	if rest, ok := strings.CutPrefix(name, "Busy."); ok && s.serviceTimeNodes() {
		return serviceTime(ctx, rest, MaxBusyMicros, time.Microsecond, spin)
	}
	if rest, ok := strings.CutPrefix(name, "Owner."); ok {
		i := strings.LastIndexByte(rest, '.')
		if i <= 0 {
			return nil, false, nil
		}
		o, _ := s.queue.Owner(rest[:i])
		switch rest[i+1:] {
		case "Queued":
			return int64(o.Queued), true, nil
		case "Slots":
			return int64(o.Charged), true, nil
		case "Enqueued":
			return o.Enqueued, true, nil
		case "Dispatched":
			return o.Dispatched, true, nil
		case "Rejected":
			return o.Rejected, true, nil
		case "Cancelled":
			return o.Cancelled, true, nil
		case "Weight":
			return int64(o.Weight), true, nil
		case "Emptied":
			return o.Emptied, true, nil
		}
		return nil, false, nil
	}
	if strings.HasPrefix(name, "Queue.") {
		q := s.queue.Stats()
		switch name {
		case NodeQueueDepth:
			return int64(q.Queued), true, nil
		case NodeQueueSlots:
			return int64(q.Charged), true, nil
		case NodeQueueLimit:
			return int64(q.Limit), true, nil
		case NodeQueueOwnerLimit:
			return int64(q.OwnerLimit), true, nil
		case NodeQueueEnqueued:
			return q.Enqueued, true, nil
		case NodeQueueDispatched:
			return q.Dispatched, true, nil
		case NodeQueueRejected:
			return q.Rejected, true, nil
		case NodeQueueCancelled:
			return q.Cancelled, true, nil
		case NodeQueueWorkers:
			return int64(s.workers()), true, nil
		case NodeQueueWorkersBusy:
			return s.busyWorkers.Load(), true, nil
		case NodeQueueWorkersWaiting:
			return int64(q.Waiting), true, nil
		}
		return nil, false, nil
	}
	if strings.HasPrefix(name, "Channel.") {
		if s.cfg.Faults.Has(catalog.FaultLateResumeSilent) {
			// Fault late-resume-silent: a server without channel
			// counters; its late resume shows on the wire only.
			return nil, false, nil
		}
		pauses, maxPending, pending, parked := s.chans.totals()
		switch name {
		case NodeBackpressurePauses:
			return pauses, true, nil
		case NodeMaxPending:
			return int64(maxPending), true, nil
		case NodeLowestResume:
			return int64(s.chans.lowestResume()), true, nil
		case NodePending:
			return int64(pending), true, nil
		case NodeParked:
			return int64(parked), true, nil
		}
		return nil, false, nil
	}
	c := s.sessions.Counts()
	switch name {
	case NodeTooBusy:
		return s.stats.tooBusy.Load(), true, nil
	case NodeCancelled:
		return s.stats.cancelled.Load(), true, nil
	case NodeReads:
		return s.stats.reads.Load(), true, nil
	case NodeReadRequests:
		return s.stats.readRequests.Load(), true, nil
	case NodeRequests:
		return s.stats.requests.Load(), true, nil
	case NodeRejected:
		return s.stats.rejectedRequests.Load(), true, nil
	case NodeTimeouts:
		return s.stats.timeouts.Load(), true, nil
	case NodeSessions:
		return int64(c.Current), true, nil
	case NodeSessionsCumulated:
		return c.Cumulated, true, nil
	case NodeChannels:
		return s.stats.channels.Load(), true, nil
	case NodeChannelsCumulated:
		return s.stats.channelsCumulated.Load(), true, nil
	case NodeConnections:
		return s.openConns.Load(), true, nil
	case NodeRefused:
		return s.stats.refusedConns.Load(), true, nil
	case NodeEvicted:
		return s.stats.evictedConns.Load(), true, nil
	case NodePanics:
		return s.stats.panics.Load(), true, nil
	case NodeDecodingErrors:
		return s.stats.decodingErrors.Load(), true, nil
	case NodeLoginsDelayed:
		return s.stats.loginsDelayed.Load(), true, nil
	case NodeRSARefused:
		return s.stats.rsaRefused.Load(), true, nil
	case NodeSecretsRefused:
		return s.stats.secretsRefused.Load(), true, nil
	case NodeUnactivated:
		return int64(c.Unactivated), true, nil
	}
	return nil, false, nil
}

// memoryValue serves the Memory.* nodes of the memory budget.
func (s *Server) memoryValue(name string) (int64, bool) {
	switch name {
	case NodeMemoryBudget:
		return s.budget.Limit(), true
	case NodeMemoryCharged:
		return s.budget.Used(), true
	}
	for _, c := range budget.Classes() {
		switch name {
		case NodeMemoryCharged + "." + c.String():
			return s.budget.UsedBy(c), true
		case "Memory.Refused." + c.String():
			return s.budget.Refused(c), true
		}
	}
	return 0, false
}

// serviceTime serves a service-time node whose name ends in n (rest), a
// count of unit from 0 to limit: the read waits n units with wait and its
// value is n. Any other n names no node.
func serviceTime(ctx context.Context, rest string, limit int, unit time.Duration, wait func(context.Context, time.Duration) error) (any, bool, error) {
	n, err := strconv.Atoi(rest)
	if err != nil || n < 0 || n > limit {
		return nil, false, nil
	}
	if err := wait(ctx, time.Duration(n)*unit); err != nil {
		return nil, false, err
	}
	return int64(n), true, nil
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// spin burns CPU for d of wall time, spinning on the monotonic clock, and
// stops early when ctx ends.
func spin(ctx context.Context, d time.Duration) error {
	deadline := time.Now().Add(d)
	for i := 0; time.Now().Before(deadline); i++ {
		if i&1023 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return ctx.Err()
}
