package uabin

import (
	"reflect"
	"testing"

	"github.com/gopcua/opcua/ua"
)

func bigRead(b testing.TB, n int) []byte {
	req := &ua.ReadRequest{RequestHeader: header(), TimestampsToReturn: ua.TimestampsToReturnBoth}
	for i := range n {
		req.NodesToRead = append(req.NodesToRead, &ua.ReadValueID{NodeID: ua.NewNumericNodeID(0, uint32(2258+i%3)), AttributeID: ua.AttributeIDValue, DataEncoding: &ua.QualifiedName{}})
	}
	return encodeService(b, req)
}

// BenchmarkCheck compares the guard's walk with gopcua's decode of a Read
// of 1000 nodes.
func BenchmarkCheck(b *testing.B) {
	msg := bigRead(b, 1000)
	body := msg[4:]
	typ := reflect.TypeFor[*ua.ReadRequest]()
	d := NewDecoder(Limits{})
	b.Run("check", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := d.Check(body, typ); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("gopcua", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, err := ua.DecodeService(msg); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// bigPublish is a Publish of n acknowledgements (250 000: about 2 MB,
// the exhaustion catalogue's publish/parked-acks).
func bigPublish(b testing.TB, n int) []byte {
	req := &ua.PublishRequest{RequestHeader: header(), SubscriptionAcknowledgements: make([]*ua.SubscriptionAcknowledgement, n)}
	for i := range n {
		req.SubscriptionAcknowledgements[i] = &ua.SubscriptionAcknowledgement{SubscriptionID: uint32(i % 7), SequenceNumber: uint32(i)}
	}
	return encodeService(b, req)
}

// BenchmarkDecodePublish is the server's decode of a 2 MB Publish.
func BenchmarkDecodePublish(b *testing.B) {
	msg := bigPublish(b, 250_000)
	d := NewDecoder(Limits{})
	b.ReportAllocs()
	for b.Loop() {
		if _, err := d.DecodeService(msg); err != nil {
			b.Fatal(err)
		}
	}
}
