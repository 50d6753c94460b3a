package uabin

import (
	"encoding/binary"
	"errors"
	"reflect"
	"testing"

	"github.com/gopcua/opcua/ua"
)

// TestDecodePublishAsGopcua: the Publish fast path decodes what gopcua's
// decoder decodes, for a null list, an empty one and lists of 1 to
// 250 000 acknowledgements, trailing bytes ignored as gopcua ignores them.
func TestDecodePublishAsGopcua(t *testing.T) {
	d := NewDecoder(Limits{})
	msgs := map[string][]byte{
		"null":     encodeService(t, &ua.PublishRequest{RequestHeader: header()}),
		"empty":    encodeService(t, &ua.PublishRequest{RequestHeader: header(), SubscriptionAcknowledgements: []*ua.SubscriptionAcknowledgement{}}),
		"one":      bigPublish(t, 1),
		"250000":   bigPublish(t, 250_000),
		"trailing": append(bigPublish(t, 3), 1, 2, 3),
	}
	for name, msg := range msgs {
		t.Run(name, func(t *testing.T) {
			_, want, err := ua.DecodeService(msg)
			if err != nil {
				t.Fatalf("gopcua: %v", err)
			}
			got, err := d.DecodeService(msg)
			if err != nil {
				t.Fatal(err)
			}
			w, g := want.(*ua.PublishRequest), got.(*ua.PublishRequest)
			if !reflect.DeepEqual(g.RequestHeader, w.RequestHeader) {
				t.Errorf("header %+v, gopcua %+v", g.RequestHeader, w.RequestHeader)
			}
			if len(g.SubscriptionAcknowledgements) != len(w.SubscriptionAcknowledgements) {
				t.Fatalf("%d acknowledgements, gopcua %d", len(g.SubscriptionAcknowledgements), len(w.SubscriptionAcknowledgements))
			}
			for i, a := range w.SubscriptionAcknowledgements {
				if *g.SubscriptionAcknowledgements[i] != *a {
					t.Fatalf("acknowledgement %d: %+v, gopcua %+v", i, *g.SubscriptionAcknowledgements[i], *a)
				}
			}
		})
	}
}

// TestDecodePublishRefusesBadCounts: a count below -1, one beyond the
// bytes left and one above MaxArrayLength are refused as Check refuses
// them, without allocating for them; a header cut short too.
func TestDecodePublishRefusesBadCounts(t *testing.T) {
	d := NewDecoder(Limits{MaxArrayLength: 100})
	withCount := func(n int32) []byte {
		msg := bigPublish(t, 2)
		at := len(msg) - 2*ackSize - 4
		binary.LittleEndian.PutUint32(msg[at:], uint32(n))
		return msg
	}
	for name, tc := range map[string]struct {
		msg  []byte
		code ua.StatusCode
	}{
		"negative":      {withCount(-2), ua.StatusBadDecodingError},
		"beyond bytes":  {withCount(3), ua.StatusBadDecodingError},
		"above limit":   {withCount(1 << 30), ua.StatusBadEncodingLimitsExceeded},
		"header cut":    {bigPublish(t, 0)[:10], ua.StatusBadDecodingError},
		"no count left": {encodeService(t, &ua.PublishRequest{RequestHeader: header()})[:len(encodeService(t, &ua.PublishRequest{RequestHeader: header()}))-4], ua.StatusBadDecodingError},
	} {
		t.Run(name, func(t *testing.T) {
			v, err := d.DecodeService(tc.msg)
			if !errors.Is(err, tc.code) {
				t.Errorf("DecodeService = %v, %v; want an error wrapping %v", v, err, tc.code)
			}
		})
	}
}
