// Package uabin guards gopcua's OPC UA binary decoder against hostile input.
//
// gopcua v0.8.0's ua.Decode trusts the length fields of a message: an array
// count is handed to reflect.MakeSlice before a single element is read (a
// count of 2^31−1 asks for 16 GiB of pointers, a Variant array length of −2
// panics with "negative len"), a Variant's ArrayDimensions are allocated
// from their claimed count, dimensions whose product overflows int32 send
// its array splitter into an endless loop, and DiagnosticInfo, Variant,
// DataValue and ExtensionObject nest without a depth limit (a few bytes per
// level: a 2 MB message blows the goroutine stack, which no recover
// catches).
//
// Check is a shadow walk of the same decoder: it visits the encoded value
// with the Go type gopcua will decode it into, field by field, consuming
// exactly the bytes gopcua will consume, and allocates nothing that depends
// on a length field. Every array, string and ByteString count is checked
// against the bytes that are left (a count of n elements needs at least n
// times the smallest encoding of one element), negative lengths other than
// −1 (null) are rejected, Variant dimensions must multiply out exactly to
// the array length, and the nesting depth is bounded. A message that passes
// Check can make gopcua allocate at most a small multiple of its own size.
//
// Why a shadow walk and not a cheaper heuristic: a scan for "any 4-byte
// value larger than the rest of the message" cannot tell length fields from
// data (a Double or a NodeId's numeric id looks the same), so it either
// rejects good requests or misses counts; and a recover around ua.Decode
// catches the negative length but not an out-of-memory or stack-overflow
// fatal error, nor the endless loop. Walking by type is exact, costs less
// than the decode itself (no reflect.Value, no per-element fmt.Sprintf as in
// gopcua) and covers every service type gopcua knows without a per-service
// table. DecodeService runs Check and then gopcua's decoder under a recover,
// as a second line of defence.
package uabin

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"sync"
	"time"

	"github.com/gopcua/opcua/ua"
)

// Defaults of Limits.
const (
	// DefaultMaxDepth bounds nesting (gopcua's own TODO says 100).
	DefaultMaxDepth = 100
	// DefaultMaxArrayLength bounds any array count. It is above every
	// per-request operation limit of the server (100 000) and far above
	// what fits in a default 2 MiB message for anything but bytes.
	DefaultMaxArrayLength = 1 << 20
	// DefaultMaxArrayDimensions bounds a Variant's dimension count.
	DefaultMaxArrayDimensions = 32
)

// Limits bound what Check accepts. Zero values mean the defaults.
type Limits struct {
	// MaxDepth bounds the nesting of values: each structure field, array
	// element, and Variant, DataValue, DiagnosticInfo or ExtensionObject
	// inside another one is one level deeper.
	MaxDepth int
	// MaxArrayLength bounds the element count of any array (not of strings
	// and ByteStrings, which are bounded by the bytes left).
	MaxArrayLength int
	// MaxArrayDimensions bounds the ArrayDimensions of a Variant.
	MaxArrayDimensions int
}

func (l Limits) fill() Limits {
	if l.MaxDepth <= 0 {
		l.MaxDepth = DefaultMaxDepth
	}
	if l.MaxArrayLength <= 0 {
		l.MaxArrayLength = DefaultMaxArrayLength
	}
	if l.MaxArrayDimensions <= 0 {
		l.MaxArrayDimensions = DefaultMaxArrayDimensions
	}
	return l
}

// ErrPanic wraps a panic recovered from gopcua's decoder.
var ErrPanic = errors.New("uabin: panic in decoder")

// errorf returns an error that wraps code, so that errors.Is and errors.As
// find the status code to answer with.
func errorf(code ua.StatusCode, format string, args ...any) error {
	return fmt.Errorf("uabin: %s: %w", fmt.Sprintf(format, args...), code)
}

// The Go types with their own Decode method that gopcua's requests use.
var (
	binaryDecoderType  = reflect.TypeFor[ua.BinaryDecoder]()
	timeType           = reflect.TypeFor[time.Time]()
	nodeIDType         = reflect.TypeFor[*ua.NodeID]()
	expandedNodeIDType = reflect.TypeFor[*ua.ExpandedNodeID]()
	guidType           = reflect.TypeFor[*ua.GUID]()
	localizedTextType  = reflect.TypeFor[*ua.LocalizedText]()
	dataValueType      = reflect.TypeFor[*ua.DataValue]()
	variantType        = reflect.TypeFor[*ua.Variant]()
	diagnosticInfoType = reflect.TypeFor[*ua.DiagnosticInfo]()
	extensionObjType   = reflect.TypeFor[*ua.ExtensionObject]()
)

// Decoder checks and decodes service messages. It caches, per Go type, how
// that type is encoded; it is safe for concurrent use. The zero value is not
// usable: create one with NewDecoder.
type Decoder struct {
	lim Limits

	mu    sync.RWMutex
	plans map[reflect.Type]*plan
}

// NewDecoder returns a decoder with the limits lim (zero fields mean the
// defaults).
func NewDecoder(lim Limits) *Decoder {
	return &Decoder{lim: lim.fill(), plans: make(map[reflect.Type]*plan)}
}

// op is how a plan walks its value.
type op uint8

const (
	opFixed           op = iota // size bytes
	opBytes                     // String, ByteString, XmlElement
	opSlice                     // array of elem
	opArray                     // Go array of elem (ua's decodeArray)
	opStruct                    // fields in order
	opNodeID                    // the types that decode themselves:
	opExpandedNodeID            //
	opLocalizedText             //
	opDataValue                 //
	opVariant                   //
	opDiagnosticInfo            //
	opExtensionObject           //
	opInvalid                   // a type ua.Decode cannot decode (or would panic on)
)

// plan is how a value of one Go type is encoded, as ua.Decode decodes it.
type plan struct {
	typ    reflect.Type
	op     op
	size   int     // opFixed: bytes; opArray: the Go array's length
	elem   *plan   // opSlice, opArray
	fields []*plan // opStruct
	min    int     // smallest encoding in bytes, at least 1
}

// plan returns the plan of type t, building and caching it on first use.
func (d *Decoder) plan(t reflect.Type) *plan {
	d.mu.RLock()
	p := d.plans[t]
	d.mu.RUnlock()
	if p != nil {
		return p
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.build(t)
}

// build returns the plan of t; d.mu is held. A type that contains itself
// finds its own, still incomplete, plan in the map.
func (d *Decoder) build(t reflect.Type) *plan {
	if p := d.plans[t]; p != nil {
		return p
	}
	if t.Kind() == reflect.Ptr && !t.Implements(binaryDecoderType) {
		// A pointer is decoded as what it points to (ua allocates it).
		e := d.build(t.Elem())
		d.plans[t] = e
		return e
	}
	p := &plan{typ: t, op: opInvalid, min: 1}
	d.plans[t] = p
	// The order of the tests is ua's decode: BinaryDecoder, time, kind.
	switch {
	case t.Implements(binaryDecoderType):
		switch t {
		case nodeIDType:
			p.op, p.min = opNodeID, 2
		case expandedNodeIDType:
			p.op, p.min = opExpandedNodeID, 2
		case guidType:
			p.op, p.size, p.min = opFixed, 16, 16
		case localizedTextType:
			p.op = opLocalizedText
		case dataValueType:
			p.op = opDataValue
		case variantType:
			p.op = opVariant
		case diagnosticInfoType:
			p.op = opDiagnosticInfo
		case extensionObjType:
			p.op, p.min = opExtensionObject, 3
		default:
			p.op = opInvalid
		}
		return p
	case t.ConvertibleTo(timeType):
		p.op, p.size, p.min = opFixed, 8, 8
		return p
	}
	switch t.Kind() {
	case reflect.Bool, reflect.Int8, reflect.Uint8:
		p.op, p.size = opFixed, 1
	case reflect.Int16, reflect.Uint16:
		p.op, p.size = opFixed, 2
	case reflect.Int32, reflect.Uint32, reflect.Float32:
		p.op, p.size = opFixed, 4
	case reflect.Int64, reflect.Uint64, reflect.Float64:
		p.op, p.size = opFixed, 8
	case reflect.String:
		p.op = opBytes
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Uint8 {
			p.op = opBytes // ua reads a []byte with ReadN
		} else {
			p.op, p.elem = opSlice, d.build(t.Elem())
		}
	case reflect.Array:
		p.op, p.size, p.elem = opArray, t.Len(), d.build(t.Elem())
	case reflect.Struct:
		p.op = opStruct
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				// ua.Decode would panic setting an unexported field.
				p.op, p.fields = opInvalid, nil
				break
			}
			p.fields = append(p.fields, d.build(f.Type))
		}
	default:
		p.op = opInvalid
	}
	switch p.op {
	case opFixed:
		p.min = p.size
	case opBytes, opSlice, opArray:
		p.min = 4
	case opStruct:
		n := 0
		for _, f := range p.fields {
			n += f.min // 1 for a field whose plan is still being built
		}
		p.min = max(n, 1)
	}
	return p
}

// Check walks b as the encoding of a value of type t the way ua.Decode
// decodes it, and returns the number of bytes ua.Decode will consume. It
// returns an error wrapping ua.StatusBadDecodingError (malformed or
// truncated) or ua.StatusBadEncodingLimitsExceeded (a limit of the
// decoder) where gopcua would fail, panic, loop or allocate more than the
// message is worth. It allocates nothing that depends on the input's length
// fields.
func (d *Decoder) Check(b []byte, t reflect.Type) (int, error) {
	c := checker{d: d, b: b, lim: d.lim}
	if err := c.walk(d.plan(t), 0); err != nil {
		return c.pos, err
	}
	return c.pos, nil
}

// Check is Decoder.Check with a decoder of its own (no cached plans).
func Check(b []byte, t reflect.Type, lim Limits) (int, error) {
	return NewDecoder(lim).Check(b, t)
}

// checker is the state of one Check walk.
type checker struct {
	d   *Decoder
	b   []byte
	pos int
	lim Limits
}

func (c *checker) left() int { return len(c.b) - c.pos }

// skip consumes n bytes.
func (c *checker) skip(n int) error {
	if n < 0 || n > c.left() {
		return errorf(ua.StatusBadDecodingError, "%d bytes needed at offset %d, %d left", n, c.pos, c.left())
	}
	c.pos += n
	return nil
}

func (c *checker) u8() (byte, error) {
	if err := c.skip(1); err != nil {
		return 0, err
	}
	return c.b[c.pos-1], nil
}

func (c *checker) i32() (int32, error) {
	if err := c.skip(4); err != nil {
		return 0, err
	}
	p := c.b[c.pos-4:]
	return int32(uint32(p[0]) | uint32(p[1])<<8 | uint32(p[2])<<16 | uint32(p[3])<<24), nil
}

// bytes consumes a String, ByteString or XmlElement: an Int32 length, −1
// for null, and that many bytes.
func (c *checker) bytes() error {
	at := c.pos
	n, err := c.i32()
	if err != nil {
		return err
	}
	if n < -1 {
		return errorf(ua.StatusBadDecodingError, "negative length %d at offset %d", n, at)
	}
	if int(n) > c.left() {
		return errorf(ua.StatusBadDecodingError, "length %d at offset %d exceeds the %d bytes left", n, at, c.left())
	}
	return c.skip(max(int(n), 0))
}

// count reads an array length and checks it against the bytes left, given
// the smallest encoding of one element. It returns -1 for a null array.
func (c *checker) count(elemMin int) (int, error) {
	at := c.pos
	n, err := c.i32()
	if err != nil {
		return 0, err
	}
	switch {
	case n == -1:
		return -1, nil
	case n < -1:
		return 0, errorf(ua.StatusBadDecodingError, "negative array length %d at offset %d", n, at)
	case int(n) > c.lim.MaxArrayLength:
		return 0, errorf(ua.StatusBadEncodingLimitsExceeded, "array length %d at offset %d above the limit %d", n, at, c.lim.MaxArrayLength)
	case int64(n)*int64(max(elemMin, 1)) > int64(c.left()):
		return 0, errorf(ua.StatusBadDecodingError, "array of %d elements at offset %d exceeds the %d bytes left", n, at, c.left())
	}
	return int(n), nil
}

// walk mirrors ua's decode(b, val, name) for a value with plan p.
func (c *checker) walk(p *plan, depth int) error {
	if depth >= c.lim.MaxDepth {
		return errorf(ua.StatusBadEncodingLimitsExceeded, "nesting deeper than %d at offset %d", c.lim.MaxDepth, c.pos)
	}
	switch p.op {
	case opFixed:
		return c.skip(p.size)
	case opBytes:
		return c.bytes()
	case opSlice:
		n, err := c.count(p.elem.min)
		if err != nil {
			return err
		}
		for range n {
			if err := c.walk(p.elem, depth+1); err != nil {
				return err
			}
		}
		return nil
	case opArray:
		at := c.pos
		n, err := c.count(p.elem.min)
		if err != nil {
			return err
		}
		if n > p.size {
			return errorf(ua.StatusBadDecodingError, "array of %d elements at offset %d for %s", n, at, p.typ)
		}
		for range n {
			if err := c.walk(p.elem, depth+1); err != nil {
				return err
			}
		}
		return nil
	case opStruct:
		for _, f := range p.fields {
			if err := c.walk(f, depth+1); err != nil {
				return err
			}
		}
		return nil
	case opNodeID:
		return c.nodeID()
	case opExpandedNodeID:
		return c.expandedNodeID()
	case opLocalizedText:
		mask, err := c.u8()
		if err != nil {
			return err
		}
		if mask&ua.LocalizedTextLocale != 0 {
			if err := c.bytes(); err != nil {
				return err
			}
		}
		if mask&ua.LocalizedTextText != 0 {
			return c.bytes()
		}
		return nil
	case opDataValue:
		return c.dataValue(depth)
	case opVariant:
		return c.variant(depth)
	case opDiagnosticInfo:
		return c.diagnosticInfo(depth)
	case opExtensionObject:
		return c.extensionObject(depth)
	}
	return errorf(ua.StatusBadDecodingError, "cannot decode type %s", p.typ)
}

// nodeID mirrors ua.NodeID.Decode.
func (c *checker) nodeID() error {
	mask, err := c.u8()
	if err != nil {
		return err
	}
	switch ua.NodeIDType(mask & 0xf) {
	case ua.NodeIDTypeTwoByte:
		return c.skip(1)
	case ua.NodeIDTypeFourByte:
		return c.skip(3)
	case ua.NodeIDTypeNumeric:
		return c.skip(6)
	case ua.NodeIDTypeGUID:
		return c.skip(2 + 16)
	case ua.NodeIDTypeByteString, ua.NodeIDTypeString:
		if err := c.skip(2); err != nil {
			return err
		}
		return c.bytes()
	}
	return errorf(ua.StatusBadDecodingError, "invalid NodeId type %d at offset %d", mask&0xf, c.pos-1)
}

// expandedNodeID mirrors ua.ExpandedNodeID.Decode.
func (c *checker) expandedNodeID() error {
	at := c.pos
	if err := c.nodeID(); err != nil {
		return err
	}
	mask := c.b[at]
	if mask&0x80 != 0 { // namespace URI
		if err := c.bytes(); err != nil {
			return err
		}
	}
	if mask&0x40 != 0 { // server index
		return c.skip(4)
	}
	return nil
}

// dataValue mirrors ua.DataValue.Decode.
func (c *checker) dataValue(depth int) error {
	mask, err := c.u8()
	if err != nil {
		return err
	}
	if mask&ua.DataValueValue != 0 {
		if err := c.walk(c.d.plan(variantType), depth+1); err != nil {
			return err
		}
	}
	n := 0
	if mask&ua.DataValueStatusCode != 0 {
		n += 4
	}
	if mask&ua.DataValueSourceTimestamp != 0 {
		n += 8
	}
	if mask&ua.DataValueSourcePicoseconds != 0 {
		n += 2
	}
	if mask&ua.DataValueServerTimestamp != 0 {
		n += 8
	}
	if mask&ua.DataValueServerPicoseconds != 0 {
		n += 2
	}
	return c.skip(n)
}

// diagnosticInfo mirrors ua.DiagnosticInfo.Decode.
func (c *checker) diagnosticInfo(depth int) error {
	mask, err := c.u8()
	if err != nil {
		return err
	}
	n := 0
	for _, bit := range []byte{ua.DiagnosticInfoSymbolicID, ua.DiagnosticInfoNamespaceURI, ua.DiagnosticInfoLocale, ua.DiagnosticInfoLocalizedText} {
		if mask&bit != 0 {
			n += 4
		}
	}
	if err := c.skip(n); err != nil {
		return err
	}
	if mask&ua.DiagnosticInfoAdditionalInfo != 0 {
		if err := c.bytes(); err != nil {
			return err
		}
	}
	if mask&ua.DiagnosticInfoInnerStatusCode != 0 {
		if err := c.skip(4); err != nil {
			return err
		}
	}
	if mask&ua.DiagnosticInfoInnerDiagnosticInfo != 0 {
		return c.walk(c.d.plan(diagnosticInfoType), depth+1)
	}
	return nil
}

// variantMin is the smallest encoding of one Variant value per type id.
var variantMin = [...]int{
	ua.TypeIDBoolean: 1, ua.TypeIDSByte: 1, ua.TypeIDByte: 1,
	ua.TypeIDInt16: 2, ua.TypeIDUint16: 2,
	ua.TypeIDInt32: 4, ua.TypeIDUint32: 4, ua.TypeIDFloat: 4, ua.TypeIDStatusCode: 4,
	ua.TypeIDInt64: 8, ua.TypeIDUint64: 8, ua.TypeIDDouble: 8, ua.TypeIDDateTime: 8,
	ua.TypeIDString: 4, ua.TypeIDByteString: 4, ua.TypeIDXMLElement: 4,
	ua.TypeIDGUID:   16,
	ua.TypeIDNodeID: 2, ua.TypeIDExpandedNodeID: 2,
	ua.TypeIDQualifiedName:   6,
	ua.TypeIDLocalizedText:   1,
	ua.TypeIDExtensionObject: 3,
	ua.TypeIDDataValue:       1, ua.TypeIDVariant: 1, ua.TypeIDDiagnosticInfo: 1,
}

// variantValue walks one value of a Variant (ua's Variant.decodeValue).
func (c *checker) variantValue(typ ua.TypeID, depth int) error {
	switch typ {
	case ua.TypeIDBoolean, ua.TypeIDSByte, ua.TypeIDByte:
		return c.skip(1)
	case ua.TypeIDInt16, ua.TypeIDUint16:
		return c.skip(2)
	case ua.TypeIDInt32, ua.TypeIDUint32, ua.TypeIDFloat, ua.TypeIDStatusCode:
		return c.skip(4)
	case ua.TypeIDInt64, ua.TypeIDUint64, ua.TypeIDDouble, ua.TypeIDDateTime:
		return c.skip(8)
	case ua.TypeIDString, ua.TypeIDByteString, ua.TypeIDXMLElement:
		return c.bytes()
	case ua.TypeIDGUID:
		return c.skip(16)
	case ua.TypeIDNodeID:
		return c.nodeID()
	case ua.TypeIDExpandedNodeID:
		return c.expandedNodeID()
	case ua.TypeIDQualifiedName:
		if err := c.skip(2); err != nil {
			return err
		}
		return c.bytes()
	case ua.TypeIDLocalizedText:
		return c.walk(c.d.plan(localizedTextType), depth+1)
	case ua.TypeIDExtensionObject:
		return c.walk(c.d.plan(extensionObjType), depth+1)
	case ua.TypeIDDataValue:
		return c.walk(c.d.plan(dataValueType), depth+1)
	case ua.TypeIDVariant:
		return c.walk(c.d.plan(variantType), depth+1)
	case ua.TypeIDDiagnosticInfo:
		return c.walk(c.d.plan(diagnosticInfoType), depth+1)
	}
	return errorf(ua.StatusBadDecodingError, "invalid Variant type %d", typ)
}

// variant mirrors ua.Variant.Decode.
func (c *checker) variant(depth int) error {
	at := c.pos
	mask, err := c.u8()
	if err != nil {
		return err
	}
	typ := ua.TypeID(mask & 0x3f)
	if typ == ua.TypeIDNull {
		return nil
	}
	if int(typ) >= len(variantMin) || variantMin[typ] == 0 {
		return errorf(ua.StatusBadDecodingError, "invalid Variant type %d at offset %d", typ, at)
	}
	if mask&ua.VariantArrayValues == 0 {
		return c.variantValue(typ, depth)
	}
	lenAt := c.pos
	n, err := c.count(variantMin[typ])
	if err != nil {
		return err
	}
	if n > ua.MaxVariantArrayLength {
		return errorf(ua.StatusBadEncodingLimitsExceeded, "Variant array of %d elements at offset %d", n, lenAt)
	}
	for range n {
		if err := c.variantValue(typ, depth); err != nil {
			return err
		}
	}
	if mask&ua.VariantArrayDimensions == 0 {
		return nil
	}
	dimsAt := c.pos
	dims, err := c.count(4)
	if err != nil {
		return err
	}
	if dims < 0 {
		// ua reads the dimension count as Int32 and rejects -1 too.
		return errorf(ua.StatusBadDecodingError, "null ArrayDimensions at offset %d", dimsAt)
	}
	if dims > c.lim.MaxArrayDimensions {
		return errorf(ua.StatusBadEncodingLimitsExceeded, "%d array dimensions at offset %d above the limit %d", dims, dimsAt, c.lim.MaxArrayDimensions)
	}
	// The product of the dimensions must be the array length exactly: ua
	// multiplies in int32, and a product that overflows to the length
	// sends its splitter into an endless loop.
	product := int64(1)
	for range dims {
		d, _ := c.i32() // count checked the bytes
		if d < 1 {
			return errorf(ua.StatusBadDecodingError, "array dimension %d at offset %d", d, c.pos-4)
		}
		product = min(product*int64(d), math.MaxInt32+1)
	}
	if dims > 0 && product != int64(max(n, 0)) {
		return errorf(ua.StatusBadDecodingError, "array dimensions at offset %d multiply to %d, not the length %d", dimsAt, product, n)
	}
	return nil
}

// extensionObject mirrors ua.ExtensionObject.Decode.
func (c *checker) extensionObject(depth int) error {
	typeAt := c.pos
	if err := c.expandedNodeID(); err != nil {
		return err
	}
	typeID := c.b[typeAt:c.pos]
	mask, err := c.u8()
	if err != nil {
		return err
	}
	if mask == ua.ExtensionObjectEmpty {
		return nil
	}
	lenAt := c.pos
	n, err := c.i32()
	if err != nil {
		return err
	}
	if n == 0 || n == -1 {
		return nil // ua stops here, as for an empty body
	}
	if n < -1 || int(n) > c.left() {
		return errorf(ua.StatusBadDecodingError, "ExtensionObject length %d at offset %d, %d bytes left", n, lenAt, c.left())
	}
	body := c.b[c.pos : c.pos+int(n)]
	c.pos += int(n)
	var t reflect.Type
	if mask == ua.ExtensionObjectXML {
		t = reflect.TypeFor[*ua.XMLElement]()
	} else if t = registeredType(typeID); t == nil {
		return nil // unknown type: ua skips the body
	}
	// ua decodes the body from its own buffer: bytes after the value are
	// ignored, the value may not run past the body.
	sub := checker{d: c.d, b: body, lim: c.lim}
	if err := sub.walk(c.d.plan(t), depth+1); err != nil {
		return fmt.Errorf("in ExtensionObject at offset %d: %w", typeAt, err)
	}
	return nil
}

// registeredType returns the Go type gopcua decodes an ExtensionObject body
// with the encoded type id typeID into, or nil if it has none. gopcua's
// registry is not exported, so this asks ua.ExtensionObject.Decode itself:
// it creates the registered value before it decodes the body, and a
// one-byte body fails at once, before anything sized by the input.
func registeredType(typeID []byte) (t reflect.Type) {
	probe := make([]byte, 0, len(typeID)+6)
	probe = append(probe, typeID...)
	probe = append(probe, ua.ExtensionObjectBinary, 1, 0, 0, 0, 0)
	defer func() {
		if recover() != nil {
			t = nil
		}
	}()
	var eo ua.ExtensionObject
	_, _ = eo.Decode(probe)
	if eo.Value == nil {
		return nil
	}
	return reflect.TypeOf(eo.Value)
}

// DecodeService decodes a service message body (an encoded type id and the
// service structure) like ua.DecodeService, but runs Check first and
// recovers a panic of the decoder into an error wrapping ErrPanic and
// ua.StatusBadDecodingError. An unknown type id gives an error wrapping
// ua.StatusBadServiceUnsupported.
func (d *Decoder) DecodeService(b []byte) (v any, err error) {
	c := checker{d: d, b: b, lim: d.lim}
	if err := c.expandedNodeID(); err != nil {
		return nil, err
	}
	typeLen := c.pos
	v, err = newService(b[:typeLen])
	if err != nil {
		return nil, err
	}
	body := b[typeLen:]
	if p, ok := v.(*ua.PublishRequest); ok {
		return d.decodePublish(p, body)
	}
	if _, err := d.Check(body, reflect.TypeOf(v)); err != nil {
		return nil, err
	}
	defer func() {
		if p := recover(); p != nil {
			v, err = nil, fmt.Errorf("%w: %v: %w", ErrPanic, p, ua.StatusBadDecodingError)
		}
	}()
	if _, err := ua.Decode(body, v); err != nil {
		return nil, fmt.Errorf("uabin: %v: %w", err, ua.StatusBadDecodingError)
	}
	return v, nil
}

// newService returns a new value of the service type with the encoded type
// id typeID. ua.DecodeService creates it before decoding the (here empty)
// body, which fails at once.
func newService(typeID []byte) (v any, err error) {
	defer func() {
		if p := recover(); p != nil {
			v, err = nil, fmt.Errorf("%w: %v: %w", ErrPanic, p, ua.StatusBadDecodingError)
		}
	}()
	_, v, err = ua.DecodeService(typeID)
	if v == nil {
		if errors.Is(err, ua.StatusBadServiceUnsupported) {
			return nil, errorf(ua.StatusBadServiceUnsupported, "unknown service type %x", typeID)
		}
		return nil, errorf(ua.StatusBadDecodingError, "service type %x: %v", typeID, err)
	}
	return v, nil
}

// DecodeRequestHeader decodes the RequestHeader at the start of a service
// request body (after the type id), so that a request that cannot be
// decoded as a whole can still be answered with its RequestHandle.
func (d *Decoder) DecodeRequestHeader(b []byte) (h *ua.RequestHeader, err error) {
	c := checker{d: d, b: b, lim: d.lim}
	if err := c.expandedNodeID(); err != nil {
		return nil, err
	}
	h, _, err = d.requestHeader(b[c.pos:])
	return h, err
}

// requestHeader checks and decodes the RequestHeader at the start of body
// and returns it with the bytes it took.
func (d *Decoder) requestHeader(body []byte) (h *ua.RequestHeader, n int, err error) {
	if _, err := d.Check(body, reflect.TypeFor[*ua.RequestHeader]()); err != nil {
		return nil, 0, err
	}
	defer func() {
		if p := recover(); p != nil {
			h, n, err = nil, 0, fmt.Errorf("%w: %v: %w", ErrPanic, p, ua.StatusBadDecodingError)
		}
	}()
	h = new(ua.RequestHeader)
	n, err = ua.Decode(body, h)
	if err != nil {
		return nil, 0, fmt.Errorf("uabin: %v: %w", err, ua.StatusBadDecodingError)
	}
	return h, n, nil
}
