package subscription

import (
	"bytes"
	"testing"
	"time"

	"github.com/gopcua/opcua/ua"
)

// TestDataChangeEncodingMatchesGopcua: the reflection-free encoder writes
// the same bytes as gopcua for every scalar kind, status codes, every
// timestamp combination and the fallback kinds, and gopcua decodes them.
func TestDataChangeEncodingMatchesGopcua(t *testing.T) {
	ts := time.Date(2026, 11, 30, 7, 0, 0, 123456700, time.UTC)
	vals := []any{
		true, false, int8(-3), uint8(200), int16(-30000), uint16(60000), int32(-7), uint32(7),
		int64(-1 << 40), uint64(1 << 63), float32(1.5), float64(-2.25), ts, ua.StatusBadTimeout,
		"text", "", []byte{1, 2, 3}, []int32{1, 2}, ua.NewStringNodeID(1, "x"),
	}
	var notes []*ua.MonitoredItemNotification
	for i, v := range vals {
		for _, mask := range []byte{
			ua.DataValueValue,
			ua.DataValueValue | ua.DataValueSourceTimestamp,
			ua.DataValueValue | ua.DataValueStatusCode | ua.DataValueSourceTimestamp | ua.DataValueServerTimestamp,
			ua.DataValueValue | ua.DataValueSourceTimestamp | ua.DataValueSourcePicoseconds | ua.DataValueServerTimestamp | ua.DataValueServerPicoseconds,
			ua.DataValueStatusCode,
		} {
			notes = append(notes, &ua.MonitoredItemNotification{ClientHandle: uint32(i), Value: &ua.DataValue{
				EncodingMask: mask, Value: ua.MustVariant(v), Status: statusOverflow,
				SourceTimestamp: ts, SourcePicoseconds: 5, ServerTimestamp: ts.Add(time.Millisecond), ServerPicoseconds: 9,
			}})
		}
	}
	notes = append(notes, &ua.MonitoredItemNotification{ClientHandle: 99, Value: &ua.DataValue{EncodingMask: ua.DataValueValue | ua.DataValueSourceTimestamp, Value: ua.MustVariant(int64(1)), SourceTimestamp: time.Time{}}})
	for _, n := range [][]*ua.MonitoredItemNotification{notes, {}} {
		mine := newDataChangeObject(n)
		theirs := ua.NewExtensionObject(&ua.DataChangeNotification{MonitoredItems: n, DiagnosticInfos: []*ua.DiagnosticInfo{}})
		a, err := mine.Encode()
		if err != nil {
			t.Fatal(err)
		}
		b, err := theirs.Encode()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Fatalf("encodings differ for %d notifications:\nmine   %x\ngopcua %x", len(n), a, b)
		}
		var back ua.ExtensionObject
		if _, err := back.Decode(a); err != nil {
			t.Fatal(err)
		}
		dc, ok := back.Value.(*ua.DataChangeNotification)
		if !ok || len(dc.MonitoredItems) != len(n) {
			t.Fatalf("decoded %T with %d items", back.Value, len(dc.MonitoredItems))
		}
	}
}

func BenchmarkEncode1024(b *testing.B) {
	ts := time.Now()
	var notes []*ua.MonitoredItemNotification
	for i := range 1024 {
		notes = append(notes, &ua.MonitoredItemNotification{ClientHandle: uint32(i), Value: int64Value(int64(i), ts)})
	}
	b.Run("fast", func(b *testing.B) {
		eo := newDataChangeObject(notes)
		for range b.N {
			_, _ = eo.Encode()
		}
	})
	b.Run("gopcua", func(b *testing.B) {
		eo := ua.NewExtensionObject(&ua.DataChangeNotification{MonitoredItems: notes, DiagnosticInfos: []*ua.DiagnosticInfo{}})
		for range b.N {
			_, _ = eo.Encode()
		}
	})
}
