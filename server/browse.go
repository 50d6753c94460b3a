package server

import (
	"context"
	"strings"
	"sync"

	"github.com/gopcua/opcua/id"
	"github.com/gopcua/opcua/ua"

	"github.com/opcua-chaos/opcua-chaos/server/catalog"
	"github.com/opcua-chaos/opcua-chaos/server/internal/budget"
)

// Browse (Part 4, 5.8.2) serves a small static address space: the
// hierarchical references from Root (i=84) down to the standard nodes the
// Read service serves (see standardValue), and a namespace-1 folder,
// FolderNode, under Objects that organizes the server's fixed diagnostic
// nodes. It goes through the fair queue like Read (same owners,
// backpressure, Cancel, TimeoutHint), and:
//
//   - an empty NodesToBrowse is BadNothingToDo, more than MaxNodesPerBrowse
//     BadTooManyOperations (on arrival, like a Read over MaxNodesPerRead),
//     a View other than the null NodeId BadViewIdUnknown (ServiceFaults);
//   - a string or opaque NodeId over Config.MaxNodeIDLength is a
//     BrowseResult BadNodeIdInvalid (never looked up);
//   - an unknown node is a BrowseResult BadNodeIdUnknown, a BrowseDirection
//     other than Forward, Inverse or Both BadBrowseDirectionInvalid, a
//     ReferenceTypeId outside namespace 0 BadReferenceTypeIdInvalid;
//   - a null ReferenceTypeId matches every reference; otherwise a
//     reference matches its own type and, with IncludeSubtypes, any of its
//     supertypes (HasComponent and HasProperty are Aggregates, HasChild,
//     HierarchicalReferences, References; Organizes is
//     HierarchicalReferences, References). A namespace-0 type the server
//     does not know matches nothing;
//   - Inverse gives the reference from the node's parent (every node but
//     Root has one), Both the forward references then that one;
//   - NodeClassMask 0 takes every target, else the classes it has a bit
//     of; ResultMask picks the fields returned, the others are zero values
//     (the null NodeId, an empty name and text, NodeClass Unspecified); the
//     target NodeId is always returned;
//   - RequestedMaxReferencesPerNode (0: no limit) caps each result to its
//     first references. There are no continuation points (BrowseNext is
//     not served): the rest is not returned and ContinuationPoint is null.
//
// Only the Value attribute is served by Read, so the Object nodes Browse
// returns (the folders, Server, ServerCapabilities, ...) read as
// BadNodeIdUnknown; every Variable it returns reads Good.

// MaxNodesPerBrowse is the most NodesToBrowse one Browse request may
// carry: the Read limit.
const MaxNodesPerBrowse = MaxNodesPerRead

// FolderNode is the string id of the namespace-1 folder (ns=1;s=Nodes)
// under Objects that organizes the fixed namespace-1 diagnostic nodes: the
// Counter.*, Memory.*, Queue.* and Channel.* nodes of nodes.go (not the
// per-owner, service-time or subscription nodes).
const FolderNode = "Nodes"

// browseNode is a node of the address space Browse serves, with the
// fields of a ReferenceDescription that point at it.
type browseNode struct {
	id      *ua.NodeID
	target  *ua.ExpandedNodeID // id, as a reference's target
	name    *ua.QualifiedName
	display *ua.LocalizedText
	class   ua.NodeClass
	typeDef *ua.ExpandedNodeID
	channel bool        // a Channel.* node (hidden under late-resume-silent)
	forward []reference // to its children, in order
	inverse *reference  // to its parent; nil for Root
}

// reference is one reference of a browseNode.
type reference struct {
	typ    uint32      // ReferenceType, namespace 0
	typeID *ua.NodeID  // typ as a NodeId
	node   *browseNode // the other end
}

// nodeKey identifies a node: a numeric id (namespace 0) or a string id
// (namespace 1).
type nodeKey struct {
	ns  uint16
	num uint32
	str string
}

// addressSpace is the browsable hierarchy, built once.
type addressSpace struct {
	nodes map[nodeKey]*browseNode
}

// The zero values of the ReferenceDescription fields a ResultMask leaves
// out; shared (the encoder only reads them).
var (
	nullNodeID   = ua.NewTwoByteNodeID(0)
	nullExpanded = ua.NewTwoByteExpandedNodeID(0)
	emptyName    = &ua.QualifiedName{}
	emptyText    = &ua.LocalizedText{}
)

// refSupertype maps each reference type the hierarchy uses to its
// supertype (Part 5, 11), up to References.
var refSupertype = map[uint32]uint32{
	id.HasComponent:           id.Aggregates,
	id.HasProperty:            id.Aggregates,
	id.Aggregates:             id.HasChild,
	id.HasChild:               id.HierarchicalReferences,
	id.Organizes:              id.HierarchicalReferences,
	id.HierarchicalReferences: id.References,
}

// standardNodes are the namespace-0 nodes of the hierarchy, each after its
// parent: the Variables are those standardValue serves, the Objects the
// folders and objects on their paths from Root. A BrowseName is name, or
// the last part of the id's name in gopcua's id package.
var standardNodes = []struct {
	id, parent, ref uint32
	class           ua.NodeClass
	typeDef         uint32
	name            string
}{
	{id.RootFolder, 0, 0, ua.NodeClassObject, id.FolderType, "Root"},
	{id.ObjectsFolder, id.RootFolder, id.Organizes, ua.NodeClassObject, id.FolderType, "Objects"},
	{id.TypesFolder, id.RootFolder, id.Organizes, ua.NodeClassObject, id.FolderType, "Types"},
	{id.ViewsFolder, id.RootFolder, id.Organizes, ua.NodeClassObject, id.FolderType, "Views"},
	{id.Server, id.ObjectsFolder, id.Organizes, ua.NodeClassObject, id.ServerType, "Server"},

	{id.Server_ServerArray, id.Server, id.HasProperty, ua.NodeClassVariable, id.PropertyType, ""},
	{id.Server_NamespaceArray, id.Server, id.HasProperty, ua.NodeClassVariable, id.PropertyType, ""},
	{id.Server_ServerStatus, id.Server, id.HasComponent, ua.NodeClassVariable, id.ServerStatusType, ""},
	{id.Server_ServerCapabilities, id.Server, id.HasComponent, ua.NodeClassObject, id.ServerCapabilitiesType, ""},
	{id.Server_ServerDiagnostics, id.Server, id.HasComponent, ua.NodeClassObject, id.ServerDiagnosticsType, ""},

	{id.Server_ServerStatus_StartTime, id.Server_ServerStatus, id.HasComponent, ua.NodeClassVariable, id.BaseDataVariableType, ""},
	{id.Server_ServerStatus_CurrentTime, id.Server_ServerStatus, id.HasComponent, ua.NodeClassVariable, id.BaseDataVariableType, ""},
	{id.Server_ServerStatus_State, id.Server_ServerStatus, id.HasComponent, ua.NodeClassVariable, id.BaseDataVariableType, ""},
	{id.Server_ServerStatus_BuildInfo, id.Server_ServerStatus, id.HasComponent, ua.NodeClassVariable, id.BuildInfoType, ""},
	{id.Server_ServerStatus_SecondsTillShutdown, id.Server_ServerStatus, id.HasComponent, ua.NodeClassVariable, id.BaseDataVariableType, ""},
	{id.Server_ServerStatus_ShutdownReason, id.Server_ServerStatus, id.HasComponent, ua.NodeClassVariable, id.BaseDataVariableType, ""},

	{id.Server_ServerCapabilities_MaxSessions, id.Server_ServerCapabilities, id.HasProperty, ua.NodeClassVariable, id.PropertyType, ""},
	{id.Server_ServerCapabilities_MaxMonitoredItemsPerSubscription, id.Server_ServerCapabilities, id.HasProperty, ua.NodeClassVariable, id.PropertyType, ""},
	{id.Server_ServerCapabilities_MaxMonitoredItems, id.Server_ServerCapabilities, id.HasProperty, ua.NodeClassVariable, id.PropertyType, ""},
	{id.Server_ServerCapabilities_OperationLimits, id.Server_ServerCapabilities, id.HasComponent, ua.NodeClassObject, id.OperationLimitsType, ""},
	{id.Server_ServerCapabilities_OperationLimits_MaxNodesPerRead, id.Server_ServerCapabilities_OperationLimits, id.HasProperty, ua.NodeClassVariable, id.PropertyType, ""},
	{id.Server_ServerCapabilities_OperationLimits_MaxMonitoredItemsPerCall, id.Server_ServerCapabilities_OperationLimits, id.HasProperty, ua.NodeClassVariable, id.PropertyType, ""},

	{id.Server_ServerDiagnostics_ServerDiagnosticsSummary, id.Server_ServerDiagnostics, id.HasComponent, ua.NodeClassVariable, id.ServerDiagnosticsSummaryType, ""},
	{id.Server_ServerDiagnostics_EnabledFlag, id.Server_ServerDiagnostics, id.HasProperty, ua.NodeClassVariable, id.PropertyType, ""},
	{id.Server_ServerDiagnostics_ServerDiagnosticsSummary_ServerViewCount, id.Server_ServerDiagnostics_ServerDiagnosticsSummary, id.HasComponent, ua.NodeClassVariable, id.BaseDataVariableType, ""},
	{id.Server_ServerDiagnostics_ServerDiagnosticsSummary_CurrentSessionCount, id.Server_ServerDiagnostics_ServerDiagnosticsSummary, id.HasComponent, ua.NodeClassVariable, id.BaseDataVariableType, ""},
	{id.Server_ServerDiagnostics_ServerDiagnosticsSummary_CumulatedSessionCount, id.Server_ServerDiagnostics_ServerDiagnosticsSummary, id.HasComponent, ua.NodeClassVariable, id.BaseDataVariableType, ""},
	{id.Server_ServerDiagnostics_ServerDiagnosticsSummary_SecurityRejectedSessionCount, id.Server_ServerDiagnostics_ServerDiagnosticsSummary, id.HasComponent, ua.NodeClassVariable, id.BaseDataVariableType, ""},
	{id.Server_ServerDiagnostics_ServerDiagnosticsSummary_RejectedSessionCount, id.Server_ServerDiagnostics_ServerDiagnosticsSummary, id.HasComponent, ua.NodeClassVariable, id.BaseDataVariableType, ""},
	{id.Server_ServerDiagnostics_ServerDiagnosticsSummary_SessionTimeoutCount, id.Server_ServerDiagnostics_ServerDiagnosticsSummary, id.HasComponent, ua.NodeClassVariable, id.BaseDataVariableType, ""},
	{id.Server_ServerDiagnostics_ServerDiagnosticsSummary_SessionAbortCount, id.Server_ServerDiagnostics_ServerDiagnosticsSummary, id.HasComponent, ua.NodeClassVariable, id.BaseDataVariableType, ""},
	{id.Server_ServerDiagnostics_ServerDiagnosticsSummary_PublishingIntervalCount, id.Server_ServerDiagnostics_ServerDiagnosticsSummary, id.HasComponent, ua.NodeClassVariable, id.BaseDataVariableType, ""},
	{id.Server_ServerDiagnostics_ServerDiagnosticsSummary_CurrentSubscriptionCount, id.Server_ServerDiagnostics_ServerDiagnosticsSummary, id.HasComponent, ua.NodeClassVariable, id.BaseDataVariableType, ""},
	{id.Server_ServerDiagnostics_ServerDiagnosticsSummary_CumulatedSubscriptionCount, id.Server_ServerDiagnostics_ServerDiagnosticsSummary, id.HasComponent, ua.NodeClassVariable, id.BaseDataVariableType, ""},
	{id.Server_ServerDiagnostics_ServerDiagnosticsSummary_SecurityRejectedRequestsCount, id.Server_ServerDiagnostics_ServerDiagnosticsSummary, id.HasComponent, ua.NodeClassVariable, id.BaseDataVariableType, ""},
	{id.Server_ServerDiagnostics_ServerDiagnosticsSummary_RejectedRequestsCount, id.Server_ServerDiagnostics_ServerDiagnosticsSummary, id.HasComponent, ua.NodeClassVariable, id.BaseDataVariableType, ""},
}

// folderNodes are the string ids of the Variables in FolderNode.
func folderNodes() []string {
	names := []string{
		NodeReads, NodeReadRequests, NodeRequests, NodeRejected, NodeTimeouts,
		NodeSessions, NodeSessionsCumulated, NodeChannels, NodeChannelsCumulated,
		NodeTooBusy, NodeCancelled, NodeConnections, NodeRefused, NodeEvicted,
		NodePanics, NodeDecodingErrors, NodeLoginsDelayed, NodeRSARefused, NodeSecretsRefused, NodeUnactivated,
		NodeMemoryBudget, NodeMemoryCharged,
	}
	for _, c := range budget.Classes() {
		names = append(names, NodeMemoryCharged+"."+c.String(), "Memory.Refused."+c.String())
	}
	return append(names,
		NodeQueueDepth, NodeQueueSlots, NodeQueueLimit, NodeQueueOwnerLimit,
		NodeQueueEnqueued, NodeQueueDispatched, NodeQueueRejected, NodeQueueCancelled,
		NodeQueueWorkers, NodeQueueWorkersBusy, NodeQueueWorkersWaiting,
		NodeBackpressurePauses, NodeMaxPending, NodeLowestResume, NodePending, NodeParked,
	)
}

// space is the address space, built on first use.
var space = sync.OnceValue(buildSpace)

func buildSpace() *addressSpace {
	a := &addressSpace{nodes: make(map[nodeKey]*browseNode)}
	for _, n := range standardNodes {
		name := n.name
		if name == "" {
			full := id.Name(n.id)
			name = full[strings.LastIndexByte(full, '_')+1:]
		}
		nid := ua.NewNumericNodeID(0, n.id)
		node := a.add(nodeKey{num: n.id}, nid, &ua.QualifiedName{Name: name}, n.class, n.typeDef)
		if n.parent != 0 {
			a.link(a.nodes[nodeKey{num: n.parent}], node, n.ref)
		}
	}
	objects := a.nodes[nodeKey{num: id.ObjectsFolder}]
	folder := a.add(nodeKey{ns: 1, str: FolderNode}, ua.NewStringNodeID(1, FolderNode),
		&ua.QualifiedName{NamespaceIndex: 1, Name: FolderNode}, ua.NodeClassObject, id.FolderType)
	a.link(objects, folder, id.Organizes)
	for _, name := range folderNodes() {
		node := a.add(nodeKey{ns: 1, str: name}, ua.NewStringNodeID(1, name),
			&ua.QualifiedName{NamespaceIndex: 1, Name: name}, ua.NodeClassVariable, id.BaseDataVariableType)
		node.channel = strings.HasPrefix(name, "Channel.")
		a.link(folder, node, id.Organizes)
	}
	return a
}

// add creates a node.
func (a *addressSpace) add(k nodeKey, nid *ua.NodeID, name *ua.QualifiedName, class ua.NodeClass, typeDef uint32) *browseNode {
	n := &browseNode{
		id:      nid,
		target:  ua.NewExpandedNodeID(nid, "", 0),
		name:    name,
		display: ua.NewLocalizedText(name.Name),
		class:   class,
		typeDef: ua.NewNumericExpandedNodeID(0, typeDef),
	}
	a.nodes[k] = n
	return n
}

// link adds the reference of type typ from parent to child and its
// inverse.
func (a *addressSpace) link(parent, child *browseNode, typ uint32) {
	typeID := ua.NewNumericNodeID(0, typ)
	parent.forward = append(parent.forward, reference{typ: typ, typeID: typeID, node: child})
	child.inverse = &reference{typ: typ, typeID: typeID, node: parent}
}

// lookup returns the node n names, nil if the space has none.
func (a *addressSpace) lookup(n *ua.NodeID) *browseNode {
	if n == nil {
		return nil
	}
	var k nodeKey
	switch n.Type() {
	case ua.NodeIDTypeTwoByte, ua.NodeIDTypeFourByte, ua.NodeIDTypeNumeric:
		k = nodeKey{ns: n.Namespace(), num: n.IntID()}
	case ua.NodeIDTypeString:
		k = nodeKey{ns: n.Namespace(), str: n.StringID()}
	default:
		return nil
	}
	return a.nodes[k]
}

// isNull reports whether n is the null NodeId (absent, or namespace 0 with
// a numeric 0 or an empty string).
func isNull(n *ua.NodeID) bool {
	if n == nil {
		return true
	}
	if n.Namespace() != 0 {
		return false
	}
	switch n.Type() {
	case ua.NodeIDTypeTwoByte, ua.NodeIDTypeFourByte, ua.NodeIDTypeNumeric:
		return n.IntID() == 0
	case ua.NodeIDTypeString:
		return n.StringID() == ""
	}
	return false
}

// refFilter is a BrowseDescription's ReferenceTypeId and IncludeSubtypes.
type refFilter struct {
	all  bool   // null ReferenceTypeId: every reference
	want uint32 // else this type (namespace 0)
	sub  bool   // and its subtypes
}

// matches reports whether a reference of type typ passes f.
func (f refFilter) matches(typ uint32) bool {
	if f.all || typ == f.want {
		return true
	}
	if !f.sub {
		return false
	}
	for t, ok := refSupertype[typ]; ok; t, ok = refSupertype[t] {
		if t == f.want {
			return true
		}
	}
	return false
}

// browse serves a Browse request.
func (s *Server) browse(ctx context.Context, r *ua.BrowseRequest) ua.Response {
	switch {
	case len(r.NodesToBrowse) == 0:
		return s.fault(r, ua.StatusBadNothingToDo)
	case len(r.NodesToBrowse) > MaxNodesPerBrowse:
		// admit refuses such a Browse on arrival; only a caller other
		// than the queue gets here.
		return s.fault(r, ua.StatusBadTooManyOperations)
	case r.View != nil && !isNull(r.View.ViewID):
		return s.fault(r, ua.StatusBadViewIDUnknown)
	}
	a := space()
	hideChannel := s.cfg.Faults.Has(catalog.FaultLateResumeSilent)
	results := make([]*ua.BrowseResult, len(r.NodesToBrowse))
	for i, d := range r.NodesToBrowse {
		if i&1023 == 1023 && ctx.Err() != nil {
			// The TimeoutHint passed or the channel closed, as a Read's.
			code := ctxStatus(ctx.Err())
			if code == ua.StatusBadTimeout {
				s.stats.timeouts.Add(1)
			}
			return s.fault(r, code)
		}
		if d != nil && s.nodeIDTooLong(d.NodeID) {
			results[i] = &ua.BrowseResult{StatusCode: ua.StatusBadNodeIDInvalid}
			continue
		}
		results[i] = a.browseNode(d, r.RequestedMaxReferencesPerNode, hideChannel)
	}
	return &ua.BrowseResponse{ResponseHeader: respHeader(r, ua.StatusOK), Results: results}
}

// browseNode browses one node: at most limit references (0: all),
// Channel.* nodes left out when hideChannel.
func (a *addressSpace) browseNode(d *ua.BrowseDescription, limit uint32, hideChannel bool) *ua.BrowseResult {
	if d == nil {
		return &ua.BrowseResult{StatusCode: ua.StatusBadNodeIDUnknown}
	}
	n := a.lookup(d.NodeID)
	if n == nil || (hideChannel && n.channel) {
		return &ua.BrowseResult{StatusCode: ua.StatusBadNodeIDUnknown}
	}
	var f refFilter
	switch t := d.ReferenceTypeID; {
	case isNull(t):
		f.all = true
	case t.Namespace() != 0 || (t.Type() != ua.NodeIDTypeTwoByte && t.Type() != ua.NodeIDTypeFourByte && t.Type() != ua.NodeIDTypeNumeric):
		// Every reference type of the hierarchy is a standard one.
		return &ua.BrowseResult{StatusCode: ua.StatusBadReferenceTypeIDInvalid}
	default:
		f = refFilter{want: t.IntID(), sub: d.IncludeSubtypes}
	}
	var fwd, inv bool
	switch d.BrowseDirection {
	case ua.BrowseDirectionForward:
		fwd = true
	case ua.BrowseDirectionInverse:
		inv = true
	case ua.BrowseDirectionBoth:
		fwd, inv = true, true
	default:
		return &ua.BrowseResult{StatusCode: ua.StatusBadBrowseDirectionInvalid}
	}
	mask := ua.BrowseResultMask(d.ResultMask)
	var refs []*ua.ReferenceDescription
	add := func(ref *reference, forward bool) bool {
		if limit > 0 && uint32(len(refs)) >= limit {
			return false // capped: no continuation points
		}
		t := ref.node
		switch {
		case !f.matches(ref.typ),
			d.NodeClassMask != 0 && d.NodeClassMask&uint32(t.class) == 0,
			hideChannel && t.channel:
			return true
		}
		refs = append(refs, describe(ref, forward, mask))
		return true
	}
	if fwd {
		for i := range n.forward {
			if !add(&n.forward[i], true) {
				break
			}
		}
	}
	if inv && n.inverse != nil {
		add(n.inverse, false)
	}
	return &ua.BrowseResult{StatusCode: ua.StatusOK, References: refs}
}

// describe is the ReferenceDescription of ref with the fields mask asks
// for; the others are zero values, the target NodeId is always set.
func describe(ref *reference, forward bool, mask ua.BrowseResultMask) *ua.ReferenceDescription {
	t := ref.node
	rd := &ua.ReferenceDescription{
		ReferenceTypeID: nullNodeID,
		NodeID:          t.target,
		BrowseName:      emptyName,
		DisplayName:     emptyText,
		TypeDefinition:  nullExpanded,
	}
	if mask&ua.BrowseResultMaskReferenceTypeID != 0 {
		rd.ReferenceTypeID = ref.typeID
	}
	if mask&ua.BrowseResultMaskIsForward != 0 {
		rd.IsForward = forward
	}
	if mask&ua.BrowseResultMaskNodeClass != 0 {
		rd.NodeClass = t.class
	}
	if mask&ua.BrowseResultMaskBrowseName != 0 {
		rd.BrowseName = t.name
	}
	if mask&ua.BrowseResultMaskDisplayName != 0 {
		rd.DisplayName = t.display
	}
	if mask&ua.BrowseResultMaskTypeDefinition != 0 && (t.class == ua.NodeClassObject || t.class == ua.NodeClassVariable) {
		rd.TypeDefinition = t.typeDef
	}
	return rd
}
