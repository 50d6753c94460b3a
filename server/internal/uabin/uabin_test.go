package uabin

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gopcua/opcua/id"
	"github.com/gopcua/opcua/ua"
)

// encodeService encodes v the way a client sends it: four-byte type id,
// then the structure.
func encodeService(t testing.TB, v any) []byte {
	t.Helper()
	typeID := ua.ServiceTypeID(v)
	if typeID == 0 {
		t.Fatalf("%T is not a registered service", v)
	}
	b, err := ua.Encode(ua.NewFourByteExpandedNodeID(0, typeID))
	if err != nil {
		t.Fatal(err)
	}
	body, err := ua.Encode(v)
	if err != nil {
		t.Fatalf("encode %T: %v", v, err)
	}
	return append(b, body...)
}

func header() *ua.RequestHeader {
	return &ua.RequestHeader{
		AuthenticationToken: ua.NewByteStringNodeID(0, []byte("0123456789abcdef")),
		Timestamp:           time.Unix(1700000000, 0),
		RequestHandle:       42,
		TimeoutHint:         1000,
		AdditionalHeader:    ua.NewExtensionObject(nil),
	}
}

// Requests returns valid requests of the services the reference server
// serves (and a few it does not), with nested structures filled in.
func requests() []ua.Request {
	variant := func(v any) *ua.Variant { return ua.MustVariant(v) }
	matrix, _ := ua.NewVariant([][]int32{{1, 2, 3}, {4, 5, 6}})
	return []ua.Request{
		&ua.ReadRequest{RequestHeader: header(), TimestampsToReturn: ua.TimestampsToReturnBoth, NodesToRead: []*ua.ReadValueID{
			{NodeID: ua.NewStringNodeID(1, "Counter.Reads"), AttributeID: ua.AttributeIDValue, DataEncoding: &ua.QualifiedName{}},
			{NodeID: ua.NewNumericNodeID(0, id.Server_ServerStatus), AttributeID: ua.AttributeIDValue, IndexRange: "1:2", DataEncoding: &ua.QualifiedName{NamespaceIndex: 0, Name: "Default Binary"}},
		}},
		&ua.WriteRequest{RequestHeader: header(), NodesToWrite: []*ua.WriteValue{
			{NodeID: ua.NewStringNodeID(1, "x"), AttributeID: ua.AttributeIDValue, Value: &ua.DataValue{EncodingMask: ua.DataValueValue, Value: variant([]int32{1, 2})}},
			{NodeID: ua.NewStringNodeID(1, "y"), AttributeID: ua.AttributeIDValue, Value: &ua.DataValue{EncodingMask: ua.DataValueValue | ua.DataValueSourceTimestamp, Value: matrix, SourceTimestamp: time.Unix(1, 0)}},
			{NodeID: ua.NewStringNodeID(1, "z"), AttributeID: ua.AttributeIDValue, Value: &ua.DataValue{EncodingMask: ua.DataValueValue, Value: variant(ua.NewExtensionObject(&ua.BuildInfo{ProductURI: "p", BuildDate: time.Unix(2, 0)}))}},
			{NodeID: ua.NewStringNodeID(1, "v"), AttributeID: ua.AttributeIDValue, Value: &ua.DataValue{EncodingMask: ua.DataValueValue, Value: variant([]*ua.Variant{variant("a"), variant(3.5), variant([]byte{1, 2})})}},
			{NodeID: ua.NewStringNodeID(1, "d"), AttributeID: ua.AttributeIDValue, Value: &ua.DataValue{EncodingMask: ua.DataValueValue, Value: variant(&ua.DiagnosticInfo{EncodingMask: ua.DiagnosticInfoInnerDiagnosticInfo | ua.DiagnosticInfoAdditionalInfo, AdditionalInfo: "x", InnerDiagnosticInfo: &ua.DiagnosticInfo{}})}},
		}},
		&ua.CreateSessionRequest{RequestHeader: header(), ClientDescription: &ua.ApplicationDescription{ApplicationName: ua.NewLocalizedText("c"), DiscoveryURLs: []string{"opc.tcp://a"}}, ServerURI: "s", EndpointURL: "opc.tcp://x:4840", SessionName: "s", ClientNonce: make([]byte, 32), RequestedSessionTimeout: 60000},
		&ua.ActivateSessionRequest{RequestHeader: header(), ClientSignature: &ua.SignatureData{}, UserIdentityToken: ua.NewExtensionObject(&ua.UserNameIdentityToken{PolicyID: "username", UserName: "user1", Password: []byte("password")}), UserTokenSignature: &ua.SignatureData{}, LocaleIDs: []string{"en"}},
		&ua.ActivateSessionRequest{RequestHeader: header(), ClientSignature: &ua.SignatureData{}, UserIdentityToken: ua.NewExtensionObject(&ua.AnonymousIdentityToken{PolicyID: "anonymous"}), UserTokenSignature: &ua.SignatureData{}},
		&ua.CloseSessionRequest{RequestHeader: header(), DeleteSubscriptions: true},
		&ua.CancelRequest{RequestHeader: header(), RequestHandle: 7},
		&ua.GetEndpointsRequest{RequestHeader: header(), EndpointURL: "opc.tcp://x", LocaleIDs: []string{"en"}, ProfileURIs: []string{"p"}},
		&ua.FindServersRequest{RequestHeader: header(), EndpointURL: "opc.tcp://x"},
		&ua.CreateSubscriptionRequest{RequestHeader: header(), RequestedPublishingInterval: 100, RequestedLifetimeCount: 30, RequestedMaxKeepAliveCount: 10, PublishingEnabled: true},
		&ua.CreateMonitoredItemsRequest{RequestHeader: header(), SubscriptionID: 1, TimestampsToReturn: ua.TimestampsToReturnBoth, ItemsToCreate: []*ua.MonitoredItemCreateRequest{{
			ItemToMonitor:  &ua.ReadValueID{NodeID: ua.NewStringNodeID(1, "Subscription.Count"), AttributeID: ua.AttributeIDValue, DataEncoding: &ua.QualifiedName{}},
			MonitoringMode: ua.MonitoringModeReporting,
			RequestedParameters: &ua.MonitoringParameters{ClientHandle: 1, SamplingInterval: 10, QueueSize: 1, DiscardOldest: true,
				Filter: ua.NewExtensionObject(&ua.DataChangeFilter{Trigger: ua.DataChangeTriggerStatusValue})},
		}, {
			ItemToMonitor:  &ua.ReadValueID{NodeID: ua.NewNumericNodeID(0, id.Server), AttributeID: ua.AttributeIDEventNotifier, DataEncoding: &ua.QualifiedName{}},
			MonitoringMode: ua.MonitoringModeReporting,
			RequestedParameters: &ua.MonitoringParameters{ClientHandle: 2, Filter: ua.NewExtensionObject(&ua.EventFilter{
				SelectClauses: []*ua.SimpleAttributeOperand{{TypeDefinitionID: ua.NewNumericNodeID(0, id.BaseEventType), BrowsePath: []*ua.QualifiedName{{Name: "Message"}}, AttributeID: ua.AttributeIDValue}},
				WhereClause: &ua.ContentFilter{Elements: []*ua.ContentFilterElement{{
					FilterOperator: ua.FilterOperatorEquals,
					FilterOperands: []*ua.ExtensionObject{ua.NewExtensionObject(&ua.LiteralOperand{Value: variant(int32(5))})},
				}}},
			})},
		}}},
		&ua.PublishRequest{RequestHeader: header(), SubscriptionAcknowledgements: []*ua.SubscriptionAcknowledgement{{SubscriptionID: 1, SequenceNumber: 2}}},
		&ua.DeleteSubscriptionsRequest{RequestHeader: header(), SubscriptionIDs: []uint32{1, 2, 3}},
		&ua.BrowseRequest{RequestHeader: header(), View: &ua.ViewDescription{ViewID: ua.NewTwoByteNodeID(0)}, NodesToBrowse: []*ua.BrowseDescription{{NodeID: ua.NewNumericNodeID(0, id.ObjectsFolder), ReferenceTypeID: ua.NewTwoByteNodeID(0)}}},
		&ua.OpenSecureChannelRequest{RequestHeader: header(), RequestType: ua.SecurityTokenRequestTypeIssue, SecurityMode: ua.MessageSecurityModeNone, ClientNonce: []byte{}, RequestedLifetime: 3600000},
	}
}

// TestValidRequestsPass: Check accepts what gopcua encodes and consumes
// exactly what gopcua decodes; DecodeService gives the same value.
func TestValidRequestsPass(t *testing.T) {
	for _, req := range requests() {
		b := encodeService(t, req)
		v, err := NewDecoder(Limits{}).DecodeService(b)
		if err != nil {
			t.Errorf("%T: %v", req, err)
			continue
		}
		if reflect.TypeOf(v) != reflect.TypeOf(req) {
			t.Errorf("%T decoded as %T", req, v)
		}
		_, want, err := ua.DecodeService(b)
		if err != nil {
			t.Errorf("%T: gopcua: %v", req, err)
		}
		if !reflect.DeepEqual(v, want) {
			t.Errorf("%T: guarded decode differs from gopcua's", req)
		}
		body, _ := ua.Encode(req)
		n, err := Check(body, reflect.TypeOf(req), Limits{})
		if err != nil || n != len(body) {
			t.Errorf("%T: Check consumed %d of %d bytes: %v", req, n, len(body), err)
		}
	}
}

// replaceOnce replaces the single occurrence of old in b.
func replaceOnce(t testing.TB, b, old, new []byte) []byte {
	t.Helper()
	if bytes.Count(b, old) != 1 {
		t.Fatalf("pattern % x found %d times", old, bytes.Count(b, old))
	}
	return bytes.Replace(b, old, new, 1)
}

func le32(v int32) []byte { return binary.LittleEndian.AppendUint32(nil, uint32(v)) }

// NegativeVariantLength is the body of issue 14's crash: a WriteRequest
// whose Variant (Int32 array) claims a length of -2.
func negativeVariantLength(t testing.TB) []byte {
	req := &ua.WriteRequest{RequestHeader: header(), NodesToWrite: []*ua.WriteValue{{
		NodeID: ua.NewNumericNodeID(1, 1), AttributeID: ua.AttributeIDValue,
		Value: &ua.DataValue{EncodingMask: ua.DataValueValue, Value: ua.MustVariant([]int32{0x5a5a5a5a})},
	}}}
	b := encodeService(t, req)
	return replaceOnce(t, b, []byte{0x86, 1, 0, 0, 0, 0x5a, 0x5a, 0x5a, 0x5a}, append([]byte{0x86}, le32(-2)...))
}

// TestNegativeVariantLength: gopcua panics (reflect.MakeSlice: negative
// len); the guarded decoder answers BadDecodingError.
func TestNegativeVariantLength(t *testing.T) {
	b := negativeVariantLength(t)
	func() {
		defer func() {
			p := recover()
			if p == nil || !strings.Contains(fmtAny(p), "negative len") {
				t.Errorf("gopcua's decoder: recover() = %v, want the negative len panic (has gopcua been fixed?)", p)
			}
		}()
		_, _, _ = ua.DecodeService(b)
	}()
	_, err := NewDecoder(Limits{}).DecodeService(b)
	if !errors.Is(err, ua.StatusBadDecodingError) || errors.Is(err, ErrPanic) {
		t.Errorf("guarded: err = %v, want BadDecodingError from Check", err)
	}
}

func fmtAny(v any) string {
	if e, ok := v.(error); ok {
		return e.Error()
	}
	if s, ok := v.(string); ok {
		return s
	}
	return reflect.ValueOf(v).String()
}

// hugeCount returns a ReadRequest body whose NodesToRead count claims
// 2^31-1 elements, followed by one real element.
func hugeCount(t testing.TB) []byte {
	req := &ua.ReadRequest{RequestHeader: header(), NodesToRead: []*ua.ReadValueID{
		{NodeID: ua.NewTwoByteNodeID(7), AttributeID: 13, DataEncoding: &ua.QualifiedName{}},
	}}
	b := encodeService(t, req)
	// TimestampsToReturn (0) then the count 1 then the element's NodeId.
	return replaceOnce(t, b, []byte{0, 0, 0, 0, 1, 0, 0, 0, 0, 7}, append(append([]byte{0, 0, 0, 0}, le32(math.MaxInt32)...), 0, 7))
}

// TestHugeArrayClaimAllocatesNothing: a count of 2^31-1 is rejected before
// anything is allocated (gopcua would ask for 16 GiB).
func TestHugeArrayClaimAllocatesNothing(t *testing.T) {
	b := hugeCount(t)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, err := NewDecoder(Limits{}).DecodeService(b)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ua.StatusBadEncodingLimitsExceeded) && !errors.Is(err, ua.StatusBadDecodingError) {
		t.Errorf("err = %v, want a decoding error", err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
		t.Errorf("decoding a 2^31-1 claim allocated %d bytes, want < 1 MiB", grew)
	}
}

// TestMaliciousEncodings: each is rejected with a decoding status, never a
// panic, however gopcua itself would fare.
func TestMaliciousEncodings(t *testing.T) {
	valid := encodeService(t, &ua.ReadRequest{RequestHeader: header(), NodesToRead: []*ua.ReadValueID{{NodeID: ua.NewTwoByteNodeID(7), AttributeID: 13, DataEncoding: &ua.QualifiedName{}}}})
	// Body of a WriteRequest whose value is the given Variant encoding.
	write := func(variant []byte) []byte {
		b := encodeService(t, &ua.WriteRequest{RequestHeader: header(), NodesToWrite: []*ua.WriteValue{{
			NodeID: ua.NewNumericNodeID(1, 1), AttributeID: ua.AttributeIDValue,
			Value: &ua.DataValue{EncodingMask: ua.DataValueValue, Value: ua.MustVariant(uint64(0x1122334455667788))},
		}}})
		return replaceOnce(t, b, []byte{byte(ua.TypeIDUint64), 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11}, variant)
	}
	nest := func(n int, level, leaf []byte) []byte {
		var b []byte
		for range n {
			b = append(b, level...)
		}
		return append(b, leaf...)
	}
	cases := map[string][]byte{
		"truncated":           valid[:len(valid)-3],
		"negative count":      replaceOnce(t, valid, []byte{1, 0, 0, 0, 0, 7}, append(le32(-5), 0, 7)),
		"huge count":          hugeCount(t),
		"string length":       replaceOnce(t, valid, []byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff}, append(le32(math.MaxInt32), 0, 0, 0xff, 0xff, 0xff, 0xff)),
		"variant -2":          negativeVariantLength(t),
		"variant 2^31-1":      write(append([]byte{0x86}, le32(math.MaxInt32)...)),
		"dims count 2^31-1":   write(append(append(append([]byte{0xc6}, le32(1)...), le32(9)...), le32(math.MaxInt32)...)),
		"dims overflow":       write(append(append(append(append(append([]byte{0xc6}, le32(2)...), le32(1)...), le32(2)...), le32(2)...), append(le32(3), le32(1431655766)...)...)),
		"diagnostic nesting":  write(append([]byte{byte(ua.TypeIDDiagnosticInfo)}, nest(100000, []byte{ua.DiagnosticInfoInnerDiagnosticInfo}, []byte{0})...)),
		"variant nesting":     write(nest(100000, []byte{byte(ua.TypeIDVariant)}, []byte{0})),
		"invalid node id":     replaceOnce(t, valid, []byte{0, 7, 13, 0, 0, 0}, []byte{9, 7, 13, 0, 0, 0}),
		"invalid variant":     write([]byte{63}),
		"extension object":    write(append(append([]byte{byte(ua.TypeIDExtensionObject), 1, 0, 1}, le32(math.MaxInt32)...), 0)),
		"unknown service":     append([]byte{1, 0, 0x39, 0x30}, valid[4:]...),
		"variant array bytes": write(append([]byte{0x83}, le32(1<<30)...)),
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := NewDecoder(Limits{}).DecodeService(b)
			var code ua.StatusCode
			if !errors.As(err, &code) || errors.Is(err, ErrPanic) {
				t.Fatalf("err = %v, want a status from Check", err)
			}
			switch code {
			case ua.StatusBadDecodingError, ua.StatusBadEncodingLimitsExceeded, ua.StatusBadServiceUnsupported:
			default:
				t.Errorf("status %v", code)
			}
		})
	}
}

// TestDepthLimit: nesting up to the limit decodes, beyond it is refused.
func TestDepthLimit(t *testing.T) {
	body := func(n int) []byte {
		b := []byte{}
		for range n {
			b = append(b, ua.DiagnosticInfoInnerDiagnosticInfo)
		}
		return append(b, 0)
	}
	typ := reflect.TypeFor[*ua.DiagnosticInfo]()
	if _, err := Check(body(20), typ, Limits{MaxDepth: 30}); err != nil {
		t.Errorf("20 levels, limit 30: %v", err)
	}
	if _, err := Check(body(40), typ, Limits{MaxDepth: 30}); !errors.Is(err, ua.StatusBadEncodingLimitsExceeded) {
		t.Errorf("40 levels, limit 30: err = %v", err)
	}
}

// TestDecodeRequestHeader: the handle of an otherwise undecodable request.
func TestDecodeRequestHeader(t *testing.T) {
	h, err := NewDecoder(Limits{}).DecodeRequestHeader(negativeVariantLength(t))
	if err != nil || h.RequestHandle != 42 {
		t.Errorf("header %+v, %v", h, err)
	}
}
