package corrupt_test

import (
	"bytes"
	"encoding/json"
	"io"
	"math/bits"
	"net"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/stream"
	"github.com/Shopify/toxiproxy/v2/toxics"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/opcua-chaos/opcua-chaos/toxics/corrupt"
)

// pipe runs toxic over chunks on a stub, as Toxiproxy does for one
// connection, and returns what came out.
func pipe(t *testing.T, toxic *corrupt.Toxic, chunks [][]byte) [][]byte {
	t.Helper()
	input := make(chan *stream.StreamChunk)
	output := make(chan *stream.StreamChunk, len(chunks))
	stub := toxics.NewToxicStub(input, output)
	stub.State = toxic.NewState()
	done := make(chan struct{})
	go func() {
		toxic.Pipe(stub)
		close(done)
	}()
	for _, c := range chunks {
		input <- &stream.StreamChunk{Data: c, Timestamp: time.Now()}
	}
	close(input)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Pipe did not return after its input closed")
	}
	var out [][]byte
	for c := range output { // Close closed it
		out = append(out, c.Data)
	}
	return out
}

// flips counts the bits in which a and b differ.
func flips(a, b []byte) int {
	n := 0
	for i := range a {
		n += bits.OnesCount8(a[i] ^ b[i])
	}
	return n
}

func chunks(n, size int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = bytes.Repeat([]byte{byte(i)}, size)
	}
	return out
}

func TestPipe(t *testing.T) {
	in := chunks(1000, 64)
	orig := make([][]byte, len(in))
	for i, c := range in {
		orig[i] = bytes.Clone(c)
	}
	for _, tc := range []struct {
		name     string
		toxic    corrupt.Toxic
		min, max int // corrupted chunks
		bitsEach int
	}{
		{"probability 0 passes everything", corrupt.Toxic{Probability: 0, Seed: 1}, 0, 0, 0},
		{"probability 1 corrupts every chunk by one bit", corrupt.Toxic{Probability: 1, Seed: 1}, 1000, 1000, 1},
		{"probability 0.1 corrupts about a tenth", corrupt.Toxic{Probability: 0.1, Seed: 1, Bits: 3}, 60, 140, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := pipe(t, &tc.toxic, in)
			if len(out) != len(in) {
				t.Fatalf("%d chunks out, %d in", len(out), len(in))
			}
			corrupted := 0
			for i := range out {
				if len(out[i]) != len(in[i]) {
					t.Fatalf("chunk %d: %d bytes out, %d in", i, len(out[i]), len(in[i]))
				}
				if n := flips(out[i], in[i]); n > 0 {
					corrupted++
					if n != tc.bitsEach {
						t.Errorf("chunk %d: %d bits flipped, want %d", i, n, tc.bitsEach)
					}
				}
				if !bytes.Equal(in[i], orig[i]) {
					t.Fatalf("chunk %d: the input buffer was written", i)
				}
			}
			if corrupted < tc.min || corrupted > tc.max {
				t.Errorf("%d chunks corrupted, want %d..%d", corrupted, tc.min, tc.max)
			}
		})
	}
}

// TestPipeSeeded: the same seed corrupts the same bits; another seed
// others.
func TestPipeSeeded(t *testing.T) {
	in := chunks(200, 32)
	a := pipe(t, &corrupt.Toxic{Probability: 0.5, Seed: 42}, in)
	b := pipe(t, &corrupt.Toxic{Probability: 0.5, Seed: 42}, in)
	c := pipe(t, &corrupt.Toxic{Probability: 0.5, Seed: 43}, in)
	same, differ := true, false
	for i := range a {
		same = same && bytes.Equal(a[i], b[i])
		differ = differ || !bytes.Equal(a[i], c[i])
	}
	if !same {
		t.Error("seed 42 twice: different output")
	}
	if !differ {
		t.Error("seeds 42 and 43: same output")
	}
}

// TestPipeInterrupted: an interrupt (the toxic being replaced) returns
// without closing the output.
func TestPipeInterrupted(t *testing.T) {
	input := make(chan *stream.StreamChunk)
	output := make(chan *stream.StreamChunk)
	stub := toxics.NewToxicStub(input, output)
	done := make(chan struct{})
	go func() {
		(&corrupt.Toxic{Probability: 1}).Pipe(stub)
		close(done)
	}()
	select {
	case stub.Interrupt <- struct{}{}: // what InterruptToxic sends
	case <-time.After(5 * time.Second):
		t.Fatal("interrupt not taken")
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Pipe did not return after an interrupt")
	}
	if stub.Closed() {
		t.Error("output closed by an interrupt")
	}
}

// TestThroughAProxy adds the toxic by type name, as the API does, to a
// Toxiproxy proxy in front of an echo server: data written upstream comes
// back corrupted, of the same length.
func TestThroughAProxy(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, "corrupt-test", "127.0.0.1:0", echo.Addr().String())
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	body, _ := json.Marshal(map[string]any{"name": "corrupt_upstream", "type": corrupt.Type, "stream": "upstream",
		"attributes": map[string]any{"probability": 1, "seed": 7, "bits": 2}})
	if _, err := p.Toxics.AddToxicJson(bytes.NewReader(body)); err != nil {
		t.Fatalf("add toxic: %v", err)
	}
	c, err := net.DialTimeout("tcp", p.Listen, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	msg := bytes.Repeat([]byte("opcua"), 20)
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if n := flips(got, msg); n != 2 {
		t.Errorf("%d bits flipped, want 2 (%q)", n, got)
	}
}
