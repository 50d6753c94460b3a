// Command toxiproxy-server is the Toxiproxy v2.5.0 API server of the
// opcua-chaos toxiproxy image; custom toxics get registered here by a blank
// import of their package (corrupt: bit flips, toxics/corrupt). It is the entry point of the
// toxiproxy image the fixtures build (FROM scratch, static binary).
//
// Unlike upstream's server it listens on 0.0.0.0 by default (it runs in a
// container whose ports are published on 127.0.0.1 only), logs through
// log/slog, and prints one ready line once the API accepts connections.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	// Custom toxics, registered by their init.
	_ "github.com/opcua-chaos/opcua-chaos/toxics/corrupt"
)

// readyLine is printed once the API listens; the harness waits for it.
const readyLine = "opcua-chaos toxiproxy ready"

func main() {
	host := flag.String("host", envOr("TOXIPROXY_HOST", "0.0.0.0"), "address for the API to listen on")
	port := flag.String("port", envOr("TOXIPROXY_PORT", "8474"), "port for the API to listen on")
	leaseTTL := flag.Duration("lease-ttl", 0, "run as a harness lease instead: exit unless renewed (SIGUSR1) within this time")
	flag.Parse()

	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if *leaseTTL > 0 {
		renew := make(chan os.Signal, 1)
		signal.Notify(renew, syscall.SIGUSR1)
		logger.Info("lease held", "ttl", *leaseTTL)
		why := lease(ctx, *leaseTTL, renew)
		logger.Info("lease ended", "why", why)
		return
	}
	if err := run(ctx, logger, net.JoinHostPort(*host, *port)); err != nil {
		fmt.Fprintln(os.Stderr, "toxiproxy-server:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, logger *slog.Logger, addr string) error {
	// Toxiproxy logs each proxy and toxic change through zerolog; keep it
	// on stdout so that a failed spec's saved log shows what was injected.
	zl := zerolog.New(os.Stdout).With().Timestamp().Logger().Level(zerolog.InfoLevel)
	api := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zl)

	// ApiServer.Listen blocks and exits the process on error; start it in
	// the background and report readiness once its port answers.
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("parse listen address: %w", err)
	}
	go api.Listen(host, port)

	probe := "http://" + net.JoinHostPort(loopbackFor(host), port) + "/version"
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(probe) //nolint:noctx // bounded by deadline below
		if err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("api did not come up on %s: %w", addr, err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(20 * time.Millisecond):
		}
	}
	logger.Info(readyLine, "listen", addr, "version", toxiproxy.Version)
	<-ctx.Done()
	if errors.Is(ctx.Err(), context.Canceled) {
		logger.Info("toxiproxy stopping")
	}
	return nil
}

// lease runs the harness's lease (see fixtures/docker): it returns
// "expired" once ttl passed without a value on renew, or "released" when
// ctx ends (the harness stops the container). A running lease container is
// how a run tells other runs, on any host and through any Docker engine,
// that the objects labelled with its lease are in use.
func lease(ctx context.Context, ttl time.Duration, renew <-chan os.Signal) string {
	t := time.NewTimer(ttl)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return "released"
		case <-renew:
			t.Reset(ttl)
		case <-t.C:
			return "expired"
		}
	}
}

func loopbackFor(host string) string {
	if host == "" || host == "0.0.0.0" || host == "::" {
		return "127.0.0.1"
	}
	return host
}

func envOr(key, def string) string {
	if v, ok := os.LookupEnv(key); ok && v != "" {
		return v
	}
	return def
}
