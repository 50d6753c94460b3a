// Command opcua-refserver runs the opcua-chaos reference OPC UA server.
//
// Configuration comes from flags with environment fallback (see
// server.LoadConfig): -listen/OPCUA_LISTEN, OPCUA_USERS, OPCUA_OWNER_WEIGHTS,
// -workers/OPCUA_WORKERS, -queue/OPCUA_QUEUE_SIZE, OPCUA_OWNER_QUEUE_SIZE,
// OPCUA_BACKPRESSURE, OPCUA_COUNTERS, -faults/OPCUA_FAULTS,
// -quirks/OPCUA_QUIRKS, and the limits against hostile clients
// (OPCUA_MAX_CONNECTIONS, OPCUA_HANDSHAKE_TIMEOUT,
// OPCUA_MAX_SESSIONS, OPCUA_MAX_UNACTIVATED_SESSIONS,
// OPCUA_UNACTIVATED_TIMEOUT, OPCUA_MAX_MESSAGE_SIZE, OPCUA_MAX_CHUNK_COUNT,
// OPCUA_MAX_BUFFERED_CHUNKS, OPCUA_MAX_BUFFERED_BYTES,
// OPCUA_MAX_DECODE_DEPTH, OPCUA_LOGIN_DELAY, OPCUA_LOGIN_DELAY_MAX,
// OPCUA_LOGIN_FREE_FAILURES, OPCUA_SHUTDOWN_TIMEOUT). A bad value prints one
// error line and exits with status 2. SIGINT/SIGTERM shut the server down
// within OPCUA_SHUTDOWN_TIMEOUT (exit status 1 if work was still running).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/opcua-chaos/opcua-chaos/server"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	cfg, err := server.LoadConfig(args, os.Getenv, io.Discard)
	if errors.Is(err, server.ErrHelp) {
		_, _ = server.LoadConfig([]string{"-h"}, os.Getenv, os.Stderr)
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "opcua-refserver: %v\n", err)
		return 2
	}
	level := slog.LevelInfo
	if os.Getenv("OPCUA_DEBUG") != "" {
		level = slog.LevelDebug
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))

	srv, err := server.New(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "opcua-refserver: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := srv.ListenAndServe(ctx); err != nil {
		cfg.Logger.Error("server failed", "err", err)
		return 1
	}
	return 0
}
