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
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
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

	setMemoryLimit(cfg, os.Getenv)

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

// memoryHeadroom is what the soft memory limit leaves under the declared
// bound of twice the budget plus 128 MiB (docs/properties.md,
// memory-peak): the runtime's own memory and what a reading lags.
const memoryHeadroom = 64 << 20

// setMemoryLimit sets the garbage collector's soft limit (the process's)
// to twice the byte budget plus 64 MiB, unless GOMEMLIMIT sets one (the budget
// OPCUA_MEMORY_BUDGET, else server.DefaultMemoryBudget). The server declares its memory bound as twice the
// budget plus 128 MiB: what the budget lets peers make it hold, and as
// much again for the collector. Without a limit the collector lets the
// heap reach twice its live bytes whatever they are, so the garbage of
// decoding megabyte messages (publish/parked-acks: 100 Publishes of 2 MB)
// on top of a full budget went past the bound (660 MiB over 640, run cold1
// on 2026-12-07); the limit makes it collect sooner there. Memory the
// server holds beyond its budget still goes past it: the limit is soft.
func setMemoryLimit(cfg server.Config, getenv func(string) string) {
	if getenv("GOMEMLIMIT") != "" {
		return
	}
	debug.SetMemoryLimit(2*cmp.Or(cfg.MemoryBudget, server.DefaultMemoryBudget) + memoryHeadroom)
}
