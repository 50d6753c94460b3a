package main

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"
)

func TestLease(t *testing.T) {
	renew := make(chan os.Signal, 1)
	start := time.Now()
	done := make(chan string, 1)
	go func() { done <- lease(context.Background(), 100*time.Millisecond, renew) }()
	for range 5 {
		time.Sleep(50 * time.Millisecond)
		renew <- syscall.SIGUSR1
	}
	if why := <-done; why != "expired" || time.Since(start) < 300*time.Millisecond {
		t.Errorf("lease %s after %v, want expired after ≥ 300 ms of renewals", why, time.Since(start))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if why := lease(ctx, time.Hour, renew); why != "released" {
		t.Errorf("cancelled lease: %s", why)
	}
}
