package subscription

import (
	"encoding/binary"
	"math"
	"time"

	"github.com/gopcua/opcua/id"
	"github.com/gopcua/opcua/ua"
)

// DataChange is the notification data of a data message: a
// DataChangeNotification that encodes itself. gopcua encodes structures by
// reflection, at about 1.3 µs per MonitoredItemNotification, which was
// the largest server cost at 100 Hz; this encoder writes the same bytes
// without reflection for scalar values (others fall back to gopcua).
type DataChange struct {
	ua.DataChangeNotification
}

// newDataChangeObject wraps notifications in an ExtensionObject whose type
// id is DataChangeNotification's.
func newDataChangeObject(notes []*ua.MonitoredItemNotification) *ua.ExtensionObject {
	return &ua.ExtensionObject{
		TypeID:       ua.NewFourByteExpandedNodeID(0, id.DataChangeNotification_Encoding_DefaultBinary),
		EncodingMask: ua.ExtensionObjectBinary,
		Value: &DataChange{ua.DataChangeNotification{
			MonitoredItems:  notes,
			DiagnosticInfos: []*ua.DiagnosticInfo{},
		}},
	}
}

// Encode implements ua.BinaryEncoder.
func (d *DataChange) Encode() ([]byte, error) {
	b := make([]byte, 0, 8+len(d.MonitoredItems)*32)
	if d.MonitoredItems == nil {
		b = binary.LittleEndian.AppendUint32(b, math.MaxUint32)
	} else {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(d.MonitoredItems)))
	}
	var err error
	for _, n := range d.MonitoredItems {
		if n == nil {
			n = &ua.MonitoredItemNotification{}
		}
		b = binary.LittleEndian.AppendUint32(b, n.ClientHandle)
		if b, err = appendDataValue(b, n.Value); err != nil {
			return nil, err
		}
	}
	if d.DiagnosticInfos == nil {
		b = binary.LittleEndian.AppendUint32(b, math.MaxUint32)
		return b, nil
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(d.DiagnosticInfos)))
	for _, di := range d.DiagnosticInfos {
		enc, err := ua.Encode(di)
		if err != nil {
			return nil, err
		}
		b = append(b, enc...)
	}
	return b, nil
}

// Decode implements ua.BinaryDecoder (for symmetry; the server only
// encodes).
func (d *DataChange) Decode(b []byte) (int, error) {
	return ua.Decode(b, &d.DataChangeNotification)
}

func appendTime(b []byte, t time.Time) []byte {
	if t.IsZero() {
		return binary.LittleEndian.AppendUint64(b, 0)
	}
	return binary.LittleEndian.AppendUint64(b, uint64(t.UTC().UnixNano()/100+116444736000000000))
}

func appendDataValue(b []byte, d *ua.DataValue) ([]byte, error) {
	if d == nil {
		d = &ua.DataValue{}
	}
	b = append(b, d.EncodingMask)
	if d.Has(ua.DataValueValue) {
		var err error
		if b, err = appendVariant(b, d.Value); err != nil {
			return nil, err
		}
	}
	if d.Has(ua.DataValueStatusCode) {
		b = binary.LittleEndian.AppendUint32(b, uint32(d.Status))
	}
	if d.Has(ua.DataValueSourceTimestamp) {
		b = appendTime(b, d.SourceTimestamp)
	}
	if d.Has(ua.DataValueSourcePicoseconds) {
		b = binary.LittleEndian.AppendUint16(b, d.SourcePicoseconds)
	}
	if d.Has(ua.DataValueServerTimestamp) {
		b = appendTime(b, d.ServerTimestamp)
	}
	if d.Has(ua.DataValueServerPicoseconds) {
		b = binary.LittleEndian.AppendUint16(b, d.ServerPicoseconds)
	}
	return b, nil
}

func appendVariant(b []byte, v *ua.Variant) ([]byte, error) {
	if v == nil {
		v = &ua.Variant{}
	}
	mask := v.EncodingMask()
	if mask&(ua.VariantArrayValues|ua.VariantArrayDimensions) == 0 {
		le := binary.LittleEndian
		switch x := v.Value().(type) {
		case nil:
			if v.Type() == ua.TypeIDNull {
				return append(b, mask), nil
			}
		case bool:
			if x {
				return append(b, mask, 1), nil
			}
			return append(b, mask, 0), nil
		case int8:
			return append(b, mask, byte(x)), nil
		case uint8:
			return append(b, mask, x), nil
		case int16:
			return le.AppendUint16(append(b, mask), uint16(x)), nil
		case uint16:
			return le.AppendUint16(append(b, mask), x), nil
		case int32:
			return le.AppendUint32(append(b, mask), uint32(x)), nil
		case uint32:
			return le.AppendUint32(append(b, mask), x), nil
		case ua.StatusCode:
			return le.AppendUint32(append(b, mask), uint32(x)), nil
		case int64:
			return le.AppendUint64(append(b, mask), uint64(x)), nil
		case uint64:
			return le.AppendUint64(append(b, mask), x), nil
		case float32:
			return le.AppendUint32(append(b, mask), math.Float32bits(x)), nil
		case float64:
			return le.AppendUint64(append(b, mask), math.Float64bits(x)), nil
		case time.Time:
			return appendTime(append(b, mask), x), nil
		}
	}
	enc, err := v.Encode()
	if err != nil {
		return nil, err
	}
	return append(b, enc...), nil
}
