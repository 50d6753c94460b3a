package server

import (
	"context"
	"math"
	"strings"
	"time"

	"github.com/gopcua/opcua/ua"

	"github.com/opcua-chaos/opcua-chaos/server/catalog"
	"github.com/opcua-chaos/opcua-chaos/server/internal/channel"
	"github.com/opcua-chaos/opcua-chaos/server/internal/session"
	"github.com/opcua-chaos/opcua-chaos/server/internal/subscription"
)

// The namespace 1 nodes of the subscription layer (Int64).
const (
	NodeSubscriptions        = "Subscription.Count"         // live subscriptions
	NodeMonitoredItems       = "Subscription.Items"         // live monitored items
	NodeNotifications        = "Subscription.Notifications" // data change notifications sent
	NodeNotificationMessages = "Subscription.Messages"      // notification messages sent
	NodeKeepAlives           = "Subscription.KeepAlives"    // keep-alive messages sent
	NodePublishDropped       = "Subscription.PublishDropped"
	NodeSamplingCycles       = "Sampling.Cycles"        // sampling cycles run, all groups
	NodeSamplingSamples      = "Sampling.Samples"       // samples taken
	NodeSamplingLate         = "Sampling.Late"          // cycles started ≥ 1 interval late
	NodeSamplingMissed       = "Sampling.Missed"        // grid points skipped
	NodeSamplingMaxLateness  = "Sampling.MaxLatenessUs" // worst cycle start delay, µs
)

// newSubscriptions builds the server's counter nodes and subscription
// manager from its config. Monitored-item queues are charged to the
// server's memory budget (s.budget, set before).
func (s *Server) newSubscriptions() {
	clock := subscription.NewRealClock()
	s.counters = subscription.NewCounters(1, s.cfg.Counters, clock)
	opts := subscription.Options{
		Clock:         clock,
		Source:        boundedSource{s, subscription.Sources{s.counterSource(), nodeSource{s}}},
		Logger:        s.log,
		SamplingDrift: s.cfg.Faults.Has(catalog.FaultSamplingDrift),
		SamplerSkips:  s.cfg.Faults.Has(catalog.FaultSamplerSkips),
		PublishDrop:   s.cfg.Faults.Has(catalog.FaultPublishDrop),

		RepublishForgets:     s.cfg.Faults.Has(catalog.FaultRepublishForgets),
		SkippedSequence:      s.cfg.Faults.Has(catalog.FaultSkippedSequence),
		SkipSequenceEvery:    SkipSequenceEvery,
		DuplicateSamples:     s.cfg.Faults.Has(catalog.FaultDuplicateSamples),
		DuplicateSampleEvery: DuplicateSampleEvery,
		SampleAtPublish:      s.cfg.Faults.Has(catalog.FaultSampleAtPublish),

		RepublishNext:          s.cfg.Faults.Has(catalog.FaultRepublishNext),
		KeepAliveConsumesSeq:   s.cfg.Faults.Has(catalog.FaultKeepAliveConsumesSeq),
		TransferNoStatusChange: s.cfg.Faults.Has(catalog.FaultTransferNoStatusChange),

		MinSamplingInterval: s.minSamplingInterval(),

		MaxItemsPerCall:    s.cfg.MaxMonitoredItemsPerCall,
		MaxItemsPerSession: s.cfg.MaxMonitoredItemsPerSession,
		MaxItemsTotal:      s.cfg.MaxMonitoredItems,

		ItemCost:              s.itemCost(),
		MaxSubscriptionsTotal: s.cfg.MaxSubscriptions,
		MaxPublishRate:        s.cfg.MaxPublishRate,
		MinPublishingInterval: s.cfg.MinPublishingInterval,
		Anonymous:             anonymousSession,
		AnonymousShare:        s.cfg.AnonymousSubscriptionShare,
	}
	if s.cfg.Faults.Has(catalog.FaultAnonymousSubscriptionsUnshared) {
		// Fault anonymous-subscriptions-unshared: anonymous sessions
		// may take every subscription and the whole publishing rate.
		opts.AnonymousShare = 1
	}
	if s.cfg.Faults.Has(catalog.FaultSubscriptionsUnbounded) {
		// Fault subscriptions-unbounded: only the per-session limit,
		// no server-wide publishing rate, publishing every millisecond
		// allowed.
		opts.MaxSubscriptionsTotal = math.MaxInt
		opts.MaxPublishRate = -1
		opts.MinPublishingInterval = time.Millisecond
	}
	// Fault retransmit-unbudgeted: kept messages bounded by count only,
	// charged nowhere.
	opts.RetransmitUnbudgeted = s.cfg.Faults.Has(catalog.FaultRetransmitUnbudgeted)
	opts.Budget = s.budget // nil under no-byte-budget: queues are bounded by count only
	// Fault parked-publish-whole: a parked Publish keeps its whole
	// request, charged nowhere.
	opts.ParkedKeepsRequest = s.cfg.Faults.Has(catalog.FaultParkedPublishWhole)
	if s.cfg.Faults.Has(catalog.FaultItemQueuesUnbounded) {
		// Fault item-queues-unbounded: queue sizes up to 10 000,
		// allocated whole at creation, charged nowhere.
		opts.MaxQueueSize = subscription.UnboundedQueueSize
		opts.EagerQueues = true
		opts.Budget = nil
	}
	s.subs = subscription.New(context.Background(), opts)
}

// minSamplingInterval is the fastest sampling interval granted: 0 (the
// manager's default, 1 ms), or MinSamplingQuirk under the quirk
// min-sampling-50ms.
func (s *Server) minSamplingInterval() time.Duration {
	if s.cfg.Quirks.Has(catalog.QuirkMinSampling50ms) {
		return MinSamplingQuirk
	}
	return 0
}

// transferAllowed applies Part 4's rule for TransferSubscriptions
// (5.14.7.1, 1.05) to a subscription of session from moving to session to,
// whose channel is secured (Sign or SignAndEncrypt) or not: a session of
// the same user takes it; an anonymous session takes one of an anonymous
// session only when both have the same client ApplicationUri, its own
// channel is secured (over None, anyone could claim that ApplicationUri)
// and both were created with the same client certificate: a server that
// trusts any certificate cannot take a claimed ApplicationUri, even one a
// self-signed certificate names, for the client's identity. Under the
// fault claimed-uri-trusted the ApplicationUri alone decides.
func transferAllowed(from, to *session.Session, secured, claimedURI bool) bool {
	if from == to {
		return true
	}
	_, fromUser, _ := from.State()
	_, toUser, _ := to.State()
	if toUser != "" || fromUser != "" {
		return fromUser == toUser
	}
	if !secured || from.ClientAppURI() != to.ClientAppURI() {
		return false
	}
	return claimedURI || (from.ClientCertificate() != "" && from.ClientCertificate() == to.ClientCertificate())
}

// anonymousSession reports whether the session keyed key
// (subscription.Options.Anonymous) has no user identity now, as
// transferAllowed tells a user's session.
func anonymousSession(key any) bool {
	sess, ok := key.(*session.Session)
	if !ok {
		return false
	}
	_, user, _ := sess.State()
	return user == ""
}

// boundedSource refuses a NodeId over Config.MaxNodeIDLength with
// BadNodeIdInvalid before any source looks it up (nodeIDTooLong).
type boundedSource struct {
	s    *Server
	next subscription.Source
}

// Resolve implements subscription.Source.
func (b boundedSource) Resolve(node *ua.NodeID, attr ua.AttributeID) (subscription.ReadFunc, ua.StatusCode) {
	if b.s.nodeIDTooLong(node) {
		return nil, ua.StatusBadNodeIDInvalid
	}
	return b.next.Resolve(node, attr)
}

// nodeSource lets monitored items sample the server's other nodes (not the
// Slow and Busy nodes, which would stall a sampling group).
type nodeSource struct{ s *Server }

// Resolve implements subscription.Source. A node is resolved once: its name is taken from the NodeId here (StringID copies
// it) and the sampler reads the value by that name, so a sample never
// copies or re-decodes the NodeId. (Fault long-nodeids-kept: any length,
// and every sample takes the name from the NodeId again.)
func (n nodeSource) Resolve(node *ua.NodeID, attr ua.AttributeID) (subscription.ReadFunc, ua.StatusCode) {
	if node.Namespace() == 1 && node.Type() == ua.NodeIDTypeString {
		if id := node.StringID(); strings.HasPrefix(id, "Slow.") || strings.HasPrefix(id, "Busy.") {
			return nil, ua.StatusBadNodeIDUnknown
		}
	}
	ctx := context.Background()
	value := func() (any, bool, error) { return n.s.value(ctx, node) }
	if !n.s.cfg.Faults.Has(catalog.FaultLongNodeIDsKept) {
		value = n.s.resolveValue(node)
	}
	if _, ok, _ := value(); !ok {
		return nil, ua.StatusBadNodeIDUnknown
	}
	if attr != ua.AttributeIDValue {
		return nil, ua.StatusBadAttributeIDInvalid
	}
	return func(t subscription.SampleTime) *ua.DataValue {
		v, ok, _ := value()
		if !ok {
			return &ua.DataValue{EncodingMask: ua.DataValueStatusCode, Status: ua.StatusBadNodeIDUnknown}
		}
		variant, err := ua.NewVariant(v)
		if err != nil {
			return &ua.DataValue{EncodingMask: ua.DataValueStatusCode, Status: ua.StatusBadInternalError}
		}
		return &ua.DataValue{
			EncodingMask:    ua.DataValueValue | ua.DataValueSourceTimestamp,
			Value:           variant,
			SourceTimestamp: t.Wall,
		}
	}, ua.StatusOK
}

// itemCost is what a monitored item of node is charged beside its queue
// (subscription.Options.ItemCost): its NodeId's bytes and the item's own
// state and filter. Nil under the fault long-nodeids-kept: an item is
// charged its queue only.
func (s *Server) itemCost() func(*ua.NodeID) int64 {
	if s.cfg.Faults.Has(catalog.FaultLongNodeIDsKept) {
		return nil
	}
	return func(n *ua.NodeID) int64 { return itemOverhead + int64(nodeIDLength(n)) }
}

// itemOverhead is a monitored item's fixed cost beyond its queue and its
// NodeId's identifier: the MonitoredItem, its NodeId, its sampler entry,
// its trigger (the only part of a DataChangeFilter kept) and its closure.
const itemOverhead = 512

// subscriptionState returns the subscription state of a session, creating
// it (and arranging its deletion when the session closes) on first use.
func (s *Server) subscriptionState(sess *session.Session) *subscription.Session {
	ss, created := s.subs.Session(sess)
	if created {
		sess.OnClose(func() { s.subs.CloseSession(sess) })
	}
	return ss
}

// isSubscriptionService reports whether req is served by subscriptionService.
func isSubscriptionService(req ua.Request) bool {
	switch req.(type) {
	case *ua.CreateSubscriptionRequest, *ua.ModifySubscriptionRequest, *ua.DeleteSubscriptionsRequest,
		*ua.SetPublishingModeRequest, *ua.CreateMonitoredItemsRequest, *ua.ModifyMonitoredItemsRequest,
		*ua.DeleteMonitoredItemsRequest, *ua.SetMonitoringModeRequest, *ua.PublishRequest, *ua.RepublishRequest,
		*ua.TransferSubscriptionsRequest:
		return true
	}
	return false
}

// subscriptionService serves a subscription service on the channel's reader
// (all are cheap; Publish is queued and answered later). It answers the
// request itself.
func (s *Server) subscriptionService(cn *conn, ch *channel.Channel, reqID uint32, req ua.Request, now time.Time) {
	countRejected := func(r ua.Response) {
		if f, ok := r.(*ua.ServiceFault); ok && f.ResponseHeader.ServiceResult != ua.StatusOK {
			s.stats.rejectedRequests.Add(1)
		}
	}
	respond := func(r ua.Response) {
		countRejected(r)
		ch.Respond(reqID, r)
	}
	sess, code := s.checkSession(cn, req.Header(), now)
	if code != ua.StatusOK {
		ch.Respond(reqID, s.fault(req, code))
		return
	}
	ss := s.subscriptionState(sess)
	switch r := req.(type) {
	case *ua.CreateSubscriptionRequest:
		respond(ss.CreateSubscription(r))
	case *ua.ModifySubscriptionRequest:
		respond(ss.ModifySubscription(r))
	case *ua.DeleteSubscriptionsRequest:
		respond(ss.DeleteSubscriptions(r))
	case *ua.SetPublishingModeRequest:
		respond(ss.SetPublishingMode(r))
	case *ua.CreateMonitoredItemsRequest:
		respond(ss.CreateMonitoredItems(r))
	case *ua.ModifyMonitoredItemsRequest:
		respond(ss.ModifyMonitoredItems(r))
	case *ua.DeleteMonitoredItemsRequest:
		respond(ss.DeleteMonitoredItems(r))
	case *ua.SetMonitoringModeRequest:
		respond(ss.SetMonitoringMode(r))
	case *ua.RepublishRequest:
		respond(ss.Republish(r))
	case *ua.TransferSubscriptionsRequest:
		respond(s.transferSubscriptions(cn, sess, ss, r))
	case *ua.PublishRequest:
		// A Publish waits for its subscription, not for a worker: parked,
		// it holds no backpressure slot, so a client's outstanding
		// Publishes never stop the reader (the session's queue bounds
		// them: MaxPublishRequests, then BadTooManyPublishRequests). It
		// runs on the reader and never occupies a worker.
		ch.Park()
		ss.Publish(subscription.PublishCall{
			Request: r,
			Budget:  cn.maxResponse,
			Done:    cn.ctx.Done(),
			Respond: func(r ua.Response) {
				countRejected(r)
				ch.RespondParked(reqID, r)
			},
			Dropped: ch.ForgetParked, // publish-drop: no answer, but no stalled channel
		})
	default:
		respond(s.fault(req, ua.StatusBadServiceUnsupported))
	}
}

// subscriptionValue serves the counter and subscription diagnostics nodes
// of namespace 1.
func (s *Server) subscriptionValue(name string) (any, bool) {
	if v, _, ok := s.counters.Value(name); ok && s.testNodes() {
		return v, true
	}
	if !strings.HasPrefix(name, "Subscription.") && !strings.HasPrefix(name, "Sampling.") {
		return nil, false
	}
	st := s.subs.Stats()
	switch name {
	case NodeSubscriptions:
		return int64(st.Subscriptions), true
	case NodeMonitoredItems:
		return int64(st.Items), true
	case NodeNotifications:
		return st.Notifications, true
	case NodeNotificationMessages:
		return st.Messages, true
	case NodeKeepAlives:
		return st.KeepAlives, true
	case NodePublishDropped:
		return st.Dropped, true
	case NodeSamplingCycles:
		return st.Sampling.Cycles, true
	case NodeSamplingSamples:
		return st.Sampling.Samples, true
	case NodeSamplingLate:
		return st.Sampling.Late, true
	case NodeSamplingMissed:
		return st.Sampling.Missed, true
	case NodeSamplingMaxLateness:
		return int64(st.Sampling.MaxLateness / time.Microsecond), true
	}
	return nil, false
}

// transferSubscriptions serves TransferSubscriptions (Part 4 5.13.7) on
// channel cn: each subscription moves to sess if transferAllowed says so,
// BadUserAccessDenied otherwise, BadSubscriptionIDInvalid for one no
// session owns. A moved subscription
// keeps its items, queued values, sequence numbers and retransmission
// queue; the result lists the sequence numbers available for Republish.
// The old session is not sent a StatusChangeNotification
// (BadSubscriptionTransferred): its client asked for the transfer.
func (s *Server) transferSubscriptions(cn *conn, sess *session.Session, ss *subscription.Session, r *ua.TransferSubscriptionsRequest) ua.Response {
	if len(r.SubscriptionIDs) == 0 {
		return s.fault(r, ua.StatusBadNothingToDo)
	}
	secured := cn.security().Secured()
	results := make([]*ua.TransferResult, len(r.SubscriptionIDs))
	for i, id := range r.SubscriptionIDs {
		res := &ua.TransferResult{}
		results[i] = res
		key, ok := s.subs.Owner(id)
		if !ok {
			res.StatusCode = ua.StatusBadSubscriptionIDInvalid
			continue
		}
		if owner, ok := key.(*session.Session); ok && !transferAllowed(owner, sess, secured, s.cfg.Faults.Has(catalog.FaultClaimedURITrusted)) {
			res.StatusCode = ua.StatusBadUserAccessDenied
			continue
		}
		res.AvailableSequenceNumbers, res.StatusCode = s.subs.Transfer(id, key, ss, r.SendInitialValues, s.cfg.Faults.Has(catalog.FaultTransferDrops))
	}
	return &ua.TransferSubscriptionsResponse{ResponseHeader: respHeader(r, ua.StatusOK), Results: results}
}
