package server

import (
	"context"

	"github.com/gopcua/opcua/ua"

	"github.com/opcua-chaos/opcua-chaos/server/catalog"
)

// nodeIDLength returns the length in bytes of n's string or opaque
// identifier, 0 for numeric and GUID NodeIds (and nil). It copies the
// identifier once (ua.NodeID.StringID).
func nodeIDLength(n *ua.NodeID) int {
	if n == nil {
		return 0
	}
	switch n.Type() {
	case ua.NodeIDTypeString:
		return len(n.StringID())
	case ua.NodeIDTypeByteString:
		// base64: 4 characters for every 3 bytes
		return len(n.StringID()) / 4 * 3
	}
	return 0
}

// nodeIDTooLong reports whether n's identifier is over
// Config.MaxNodeIDLength: such a NodeId names no node of this server and is
// refused with BadNodeIdInvalid wherever a node is resolved (Read, Browse,
// CreateMonitoredItems) rather than looked up or kept. Never under the
// fault long-nodeids-kept.
func (s *Server) nodeIDTooLong(n *ua.NodeID) bool {
	if s.cfg.Faults.Has(catalog.FaultLongNodeIDsKept) {
		return false
	}
	return nodeIDLength(n) > s.cfg.MaxNodeIDLength
}

// resolveValue resolves n once and returns what reads its value (see
// value) without going back to n: the name of a namespace 1 node is taken
// from n here, not for every read.
func (s *Server) resolveValue(n *ua.NodeID) func() (any, bool, error) {
	ctx := context.Background()
	switch {
	case n.Namespace() == 0:
		return func() (any, bool, error) { return s.value(ctx, n) }
	case n.Namespace() == 1 && n.Type() == ua.NodeIDTypeString:
		name := n.StringID()
		return func() (any, bool, error) { return s.ownValue(ctx, name) }
	}
	return func() (any, bool, error) { return nil, false, nil }
}
