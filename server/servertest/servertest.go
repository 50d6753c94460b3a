// Package servertest runs the reference server in process for the tests of
// its clients (load driver, identity, probe).
package servertest

import (
	"context"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/opcua-chaos/opcua-chaos/server"
)

// Start serves cfg on 127.0.0.1:0 and returns its endpoint and a stop
// function (also run when the test ends; calling it twice, from any
// goroutine, is safe). A nil cfg.Logger logs nowhere. Stop fails the test
// when the server does not stop within 10 s or Serve returns an error.
func Start(t testing.TB, cfg server.Config) (endpoint string, stop func()) {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, l) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("serve: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Errorf("server did not stop")
			}
		})
	}
	t.Cleanup(stop)
	return "opc.tcp://" + l.Addr().String(), stop
}
