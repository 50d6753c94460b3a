//go:build unix

package server

import "syscall"

// allocChunk maps retainChunk bytes of anonymous memory outside the Go
// heap; nil if the system refuses.
func allocChunk() []byte {
	c, err := syscall.Mmap(-1, 0, retainChunk, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return nil
	}
	return c
}

// freeChunk unmaps a chunk of allocChunk.
func freeChunk(c []byte) { _ = syscall.Munmap(c) }
