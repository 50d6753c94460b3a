// Package corrupt is a Toxiproxy toxic that flips bits in the bytes it
// passes: type "corrupt", registered on import (the opcua-chaos
// toxiproxy-server imports it). It stands for a link or a middlebox that
// damages data without breaking the TCP connection, which TCP's checksum
// does not always catch and which no stock toxic simulates.
//
// Attributes (JSON):
//
//	probability  fraction of chunks corrupted, 0..1 (a chunk is one read
//	             of the proxy, up to 32 KiB)
//	seed         seed of the choices: the same seed corrupts the same
//	             chunks at the same bits on every connection
//	bits         bits flipped in a corrupted chunk (default 1)
//
// The toxic never changes a chunk's length and never drops one; the
// stream the other side reads stays a byte stream of the same size.
package corrupt

import (
	"math/rand/v2"

	"github.com/Shopify/toxiproxy/v2/stream"
	"github.com/Shopify/toxiproxy/v2/toxics"
)

// Type is the toxic's type name in Toxiproxy's API.
const Type = "corrupt"

// Toxic flips Bits random bits in a Probability fraction of chunks.
type Toxic struct {
	// Probability is the fraction of chunks corrupted (0..1).
	Probability float64 `json:"probability"`
	// Seed seeds the choice of chunks and bits, per connection.
	Seed int64 `json:"seed"`
	// Bits is the number of bits flipped in a corrupted chunk (0 means 1).
	Bits int `json:"bits"`
}

// state is one connection's random stream.
type state struct{ rng *rand.Rand }

// NewState implements toxics.StatefulToxic: every connection draws from a
// stream of its own, seeded with Seed, so what it corrupts does not
// depend on other connections.
func (t *Toxic) NewState() any {
	return &state{rng: rand.New(rand.NewPCG(uint64(t.Seed), 0x636f7272757074))} // "corrupt"
}

// Pipe implements toxics.Toxic: it passes chunks on until the link closes
// or the toxic is interrupted, corrupting a copy of the chosen ones (the
// input's buffer is never written).
func (t *Toxic) Pipe(stub *toxics.ToxicStub) {
	st, ok := stub.State.(*state)
	if !ok {
		st = t.NewState().(*state)
		stub.State = st
	}
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
			stub.Output <- t.corrupt(st.rng, c)
		}
	}
}

// corrupt returns c, or a copy of it with bits flipped.
func (t *Toxic) corrupt(rng *rand.Rand, c *stream.StreamChunk) *stream.StreamChunk {
	if len(c.Data) == 0 || rng.Float64() >= t.Probability {
		return c
	}
	data := append([]byte(nil), c.Data...)
	// Distinct bits, so that Bits flips never cancel out.
	n := min(max(t.Bits, 1), 8*len(data))
	flipped := make(map[int]bool, n)
	for len(flipped) < n {
		bit := rng.IntN(8 * len(data))
		if flipped[bit] {
			continue
		}
		flipped[bit] = true
		data[bit/8] ^= 1 << (bit % 8)
	}
	return &stream.StreamChunk{Data: data, Timestamp: c.Timestamp}
}

func init() {
	toxics.Register(Type, new(Toxic))
}
