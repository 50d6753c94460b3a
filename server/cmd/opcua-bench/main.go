// Command opcua-bench compares the reference server with gopcua's stock
// server (github.com/gopcua/opcua/server) side by side in one run: Read of
// one value (i=2258 CurrentTime), S sessions × K outstanding requests, on
// loopback. Each server runs in this process; the load runs in a child
// process (this binary with -client), so the server's CPU time is this
// process's CPU time (getrusage). It prints requests/s and requests per
// server CPU-second for both, and their ratio.
//
//	go run ./server/cmd/opcua-bench -sessions 10 -outstanding 100 -duration 5s
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gopcua/opcua"
	"github.com/gopcua/opcua/id"
	stock "github.com/gopcua/opcua/server"
	"github.com/gopcua/opcua/ua"

	"github.com/opcua-chaos/opcua-chaos/server"
)

func main() {
	client := flag.String("client", "", "run as load client against this endpoint (internal)")
	sessions := flag.Int("sessions", 10, "client sessions")
	outstanding := flag.Int("outstanding", 100, "outstanding reads per session")
	duration := flag.Duration("duration", 5*time.Second, "measured window per server")
	warmup := flag.Duration("warmup", time.Second, "warm-up before the window")
	flag.Parse()
	if *client != "" {
		os.Exit(runClient(*client, *sessions, *outstanding, *duration, *warmup))
	}
	var results []result
	for _, name := range []string{"reference", "gopcua-stock"} {
		r, err := measure(name, *sessions, *outstanding, *duration, *warmup)
		if err != nil {
			fmt.Fprintf(os.Stderr, "opcua-bench: %s: %v\n", name, err)
			os.Exit(1)
		}
		results = append(results, r)
		fmt.Printf("%-13s %8.0f req/s  %8.0f req per server CPU-s  server CPU %.2f cores  errors %d\n",
			name, r.rate(), r.perCPU(), r.cpu.Seconds()/r.wall.Seconds(), r.errors)
	}
	fmt.Printf("ratio reference/stock: %.2f× req/s, %.2f× req per server CPU-s (%d sessions × %d outstanding, %v)\n",
		results[0].rate()/results[1].rate(), results[0].perCPU()/results[1].perCPU(), *sessions, *outstanding, *duration)
}

type result struct {
	reads, errors int64
	wall, cpu     time.Duration
}

func (r result) rate() float64   { return float64(r.reads) / r.wall.Seconds() }
func (r result) perCPU() float64 { return float64(r.reads) / r.cpu.Seconds() }

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startServer starts the named server on loopback and returns its endpoint
// and a stop function.
func startServer(name string) (string, func(), error) {
	port, err := freePort()
	if err != nil {
		return "", nil, err
	}
	endpoint := fmt.Sprintf("opc.tcp://127.0.0.1:%d", port)
	ctx, cancel := context.WithCancel(context.Background())
	switch name {
	case "reference":
		srv, err := server.New(server.Config{
			Listen: fmt.Sprintf("127.0.0.1:%d", port),
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		})
		if err != nil {
			cancel()
			return "", nil, err
		}
		done := make(chan struct{})
		go func() { defer close(done); _ = srv.ListenAndServe(ctx) }()
		time.Sleep(100 * time.Millisecond)
		return endpoint, func() { cancel(); <-done }, nil
	default:
		s := stock.New(
			stock.EndPoint("127.0.0.1", port),
			stock.EnableSecurity("None", ua.MessageSecurityModeNone),
			stock.EnableAuthMode(ua.UserTokenTypeAnonymous),
		)
		if err := s.Start(ctx); err != nil {
			cancel()
			return "", nil, err
		}
		return endpoint, func() { _ = s.Close(); cancel() }, nil
	}
}

func measure(name string, sessions, outstanding int, duration, warmup time.Duration) (result, error) {
	endpoint, stop, err := startServer(name)
	if err != nil {
		return result{}, err
	}
	defer stop()
	self, err := os.Executable()
	if err != nil {
		return result{}, err
	}
	cmd := exec.Command(self, "-client", endpoint,
		"-sessions", strconv.Itoa(sessions), "-outstanding", strconv.Itoa(outstanding),
		"-duration", duration.String(), "-warmup", warmup.String())
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return result{}, err
	}
	if err := cmd.Start(); err != nil {
		return result{}, err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	var r result
	var t0 time.Time
	var c0 time.Duration
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 1 && f[0] == "START":
			t0, c0 = time.Now(), cpuTime()
		case len(f) == 3 && f[0] == "DONE":
			r.wall, r.cpu = time.Since(t0), cpuTime()-c0
			r.reads, _ = strconv.ParseInt(f[1], 10, 64)
			r.errors, _ = strconv.ParseInt(f[2], 10, 64)
			return r, nil
		}
	}
	return r, fmt.Errorf("client ended without a result")
}

func runClient(endpoint string, sessions, outstanding int, duration, warmup time.Duration) int {
	ctx, cancel := context.WithTimeout(context.Background(), warmup+duration+30*time.Second)
	defer cancel()
	var clients []*opcua.Client
	for range sessions {
		c, err := opcua.NewClient(endpoint, opcua.SecurityMode(ua.MessageSecurityModeNone), opcua.AutoReconnect(false))
		if err == nil {
			err = c.Connect(ctx)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "client: %v\n", err)
			return 1
		}
		defer c.Close(context.Background())
		clients = append(clients, c)
	}
	var counting atomic.Bool
	var reads, errs atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	for _, c := range clients {
		for range outstanding {
			wg.Go(func() {
				req := func() *ua.ReadRequest {
					return &ua.ReadRequest{NodesToRead: []*ua.ReadValueID{{NodeID: ua.NewNumericNodeID(0, id.Server_ServerStatus_CurrentTime), AttributeID: ua.AttributeIDValue}}}
				}
				for !stop.Load() && ctx.Err() == nil {
					_, err := c.Read(ctx, req())
					if !counting.Load() {
						continue
					}
					if err != nil {
						errs.Add(1)
					} else {
						reads.Add(1)
					}
				}
			})
		}
	}
	time.Sleep(warmup)
	counting.Store(true)
	fmt.Println("START")
	time.Sleep(duration)
	counting.Store(false)
	fmt.Printf("DONE %d %d\n", reads.Load(), errs.Load())
	stop.Store(true)
	wg.Wait()
	return 0
}
