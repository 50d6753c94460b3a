//go:build !unix

package server

// allocChunk allocates retainChunk bytes on the Go heap (systems without
// mmap).
func allocChunk() []byte { return make([]byte, retainChunk) }

// freeChunk drops a chunk of allocChunk to the garbage collector.
func freeChunk([]byte) {}
