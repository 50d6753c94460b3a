// Command gopcua-stock runs gopcua's stock server (github.com/gopcua/opcua/
// server, v0.8.0) unchanged, as the "gopcua" target profile of the suites:
// a server nobody here wrote, so the suites show what they find in it
// (one goroutine serves every request; Cancel unsupported; monitored items
// never sampled). It listens on 0.0.0.0:4840 with SecurityPolicy None and
// anonymous identity only, and prints the ready line the harness waits for.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/gopcua/opcua/server"
	"github.com/gopcua/opcua/ua"
)

// readyLine is what the harness waits for (env.ServerReadyLine).
const readyLine = "opcua-chaos server ready"

func main() {
	host := flag.String("host", "0.0.0.0", "address to listen on")
	port := flag.Int("port", 4840, "port to listen on")
	flag.Parse()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	s := server.New(
		server.EndPoint(*host, *port),
		server.EnableSecurity("None", ua.MessageSecurityModeNone),
		server.EnableAuthMode(ua.UserTokenTypeAnonymous),
		server.ServerName("gopcua stock server (opcua-chaos target)"),
	)
	if err := s.Start(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "gopcua-stock: start:", err)
		os.Exit(1)
	}
	logger.Info(readyLine, "listen", fmt.Sprintf("%s:%d", *host, *port), "server", "gopcua v0.8.0 stock")
	<-ctx.Done()
	if err := s.Close(); err != nil {
		logger.Error("close", "err", err)
	}
}
