package uabin

import (
	"errors"
	"reflect"
	"testing"

	"github.com/gopcua/opcua/ua"
)

// FuzzDecodeService feeds arbitrary service message bodies to the guarded
// decoder. Whatever Check lets through must decode with gopcua's own
// decoder without a panic (the fuzzer's process would die of an
// out-of-memory or stack overflow just the same), and where both succeed
// they consume the same bytes. The seed corpus (valid requests and the
// malicious encodings of the tests) runs with every go test.
//
//	go test -run XXX -fuzz FuzzDecodeService -fuzztime 30s ./server/internal/uabin
func FuzzDecodeService(f *testing.F) {
	for _, req := range requests() {
		f.Add(encodeService(f, req))
	}
	f.Add(negativeVariantLength(f))
	f.Add(hugeCount(f))
	d := NewDecoder(Limits{})
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := d.DecodeService(b)
		if errors.Is(err, ErrPanic) {
			t.Fatalf("Check passed but gopcua panicked: %v", err)
		}
		if err == nil && v == nil {
			t.Fatal("no value and no error")
		}
		if err != nil {
			var code ua.StatusCode
			if !errors.As(err, &code) {
				t.Fatalf("error without a status code: %v", err)
			}
			return
		}
		// Decoded: Check and gopcua agree on the length.
		c := checker{d: d, b: b, lim: d.lim}
		_ = c.expandedNodeID()
		body := b[c.pos:]
		n, err := d.Check(body, reflect.TypeOf(v))
		if err != nil {
			t.Fatalf("Check failed on the second run: %v", err)
		}
		m, err := ua.Decode(body, reflect.New(reflect.TypeOf(v).Elem()).Interface())
		if err == nil && m != n {
			t.Fatalf("Check consumed %d bytes, gopcua %d", n, m)
		}
	})
}
