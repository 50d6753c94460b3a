// Command opcua-subcap finds the sampling capacity of the reference server:
// the largest number of monitored items at which every item still gets
// ≥ 99 % of its samples at 100 Hz (issue 5 item 6).
//
// By default it runs the server in a child process (this binary with
// -serve) limited to -cpus CPUs: GOMAXPROCS=cpus and, on Linux, pinned to
// CPUs [-pin, -pin+cpus) with sched_setaffinity. The client runs in this
// process (on the other CPUs). With -endpoint it measures a server started
// elsewhere instead (e.g. the harness's container at 1 CPU).
//
// The search doubles the item count from -min until a level fails or -max
// passes, then bisects down to -resolution. Each level subscribes one fresh
// session to SampledCounter.0…N-1 at -sampling with -outstanding Publish
// requests outstanding and judges the median over -windows windows of the
// smallest per-item fraction (best of -attempts runs; a busy machine only
// makes a run look worse). -measure progress (default) is the .NET
// harness's "counters" scenario: counter delta over grid points, queue size
// 1, so the client decodes only the latest value per item and publishing
// interval; -measure delivered counts every sample received (queue sized
// for the publishing interval), which also loads the client with every
// notification.
//
//	go run ./server/cmd/opcua-subcap -cpus 1 -min 256 -max 8192
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"github.com/gopcua/opcua/ua"

	"github.com/opcua-chaos/opcua-chaos/server"
	"github.com/opcua-chaos/opcua-chaos/server/internal/subprobe"
)

type options struct {
	serve       bool
	counters    int
	faults      string
	endpoint    string
	cpus        int
	pin         int
	min, max    int
	resolution  int
	sampling    time.Duration
	publishing  time.Duration
	outstanding int
	windows     int
	window      time.Duration
	warmup      time.Duration
	attempts    int
	measure     string
}

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	var o options
	fs := flag.NewFlagSet("opcua-subcap", flag.ContinueOnError)
	fs.BoolVar(&o.serve, "serve", false, "run the server (child mode): print its address, serve until stdin closes")
	fs.IntVar(&o.counters, "counters", 0, "counter nodes of each kind (default: -max)")
	fs.StringVar(&o.faults, "faults", "", "server fault switches (e.g. sampling-drift)")
	fs.StringVar(&o.endpoint, "endpoint", "", "measure this server instead of starting one")
	fs.IntVar(&o.cpus, "cpus", 1, "CPUs for the child server (GOMAXPROCS and affinity)")
	fs.IntVar(&o.pin, "pin", 0, "first CPU the child server is pinned to (-1: no pinning)")
	fs.IntVar(&o.min, "min", 256, "smallest item count")
	fs.IntVar(&o.max, "max", 8192, "largest item count")
	fs.IntVar(&o.resolution, "resolution", 256, "bisection resolution in items")
	fs.DurationVar(&o.sampling, "sampling", 10*time.Millisecond, "sampling interval")
	fs.DurationVar(&o.publishing, "publishing", 100*time.Millisecond, "publishing interval")
	fs.IntVar(&o.outstanding, "outstanding", 8, "Publish requests outstanding")
	fs.IntVar(&o.windows, "windows", 3, "windows per run (median)")
	fs.DurationVar(&o.window, "window", 2*time.Second, "window length")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "warm-up before the first window")
	fs.IntVar(&o.attempts, "attempts", 2, "runs per level (best counts)")
	fs.StringVar(&o.measure, "measure", "progress", "progress (counter delta) or delivered (every sample received)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if o.counters <= 0 {
		o.counters = o.max
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if o.serve {
		return serve(ctx, o)
	}
	if err := search(ctx, o); err != nil {
		fmt.Fprintf(os.Stderr, "opcua-subcap: %v\n", err)
		return 1
	}
	return 0
}

// serve is the child: a server on 127.0.0.1:0 whose address goes to stdout.
func serve(ctx context.Context, o options) int {
	faults, err := server.ParseFaults(o.faults)
	if err != nil {
		fmt.Fprintf(os.Stderr, "opcua-subcap: %v\n", err)
		return 2
	}
	srv, err := server.New(server.Config{
		Counters: o.counters,
		Faults:   faults,
		Logger:   slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "opcua-subcap: %v\n", err)
		return 2
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintf(os.Stderr, "opcua-subcap: %v\n", err)
		return 1
	}
	fmt.Printf("listen %s\n", l.Addr())
	ctx, cancel := context.WithCancel(ctx)
	go func() { // the parent closes stdin (or dies): stop
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	if err := srv.Serve(ctx, l); err != nil {
		fmt.Fprintf(os.Stderr, "opcua-subcap: %v\n", err)
		return 1
	}
	return 0
}

// child is a server started by startChild.
type child struct {
	cmd   *exec.Cmd
	stdin io.Closer
	url   string
}

func startChild(ctx context.Context, o options) (*child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, exe, "-serve", "-counters", strconv.Itoa(o.counters), "-faults", o.faults)
	cmd.Env = append(os.Environ(), "GOMAXPROCS="+strconv.Itoa(o.cpus))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := startPinned(cmd, o.pin, o.cpus); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, stdin: stdin}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		c.stop()
		return nil, fmt.Errorf("server did not start: %w", err)
	}
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "listen ")
	if !ok {
		c.stop()
		return nil, fmt.Errorf("unexpected server output %q", line)
	}
	c.url = "opc.tcp://" + addr
	return c, nil
}

func (c *child) stop() {
	_ = c.stdin.Close()
	done := make(chan struct{})
	go func() { _ = c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-done
	}
}

// startPinned starts cmd with its CPU affinity set to [first, first+n)
// (first < 0: unpinned). The child inherits the affinity of the thread that
// forks it, so this thread is pinned for the fork and restored after.
func startPinned(cmd *exec.Cmd, first, n int) error {
	if first < 0 {
		return cmd.Start()
	}
	if runtime.GOOS != "linux" {
		return errors.New("CPU pinning needs Linux (use -pin -1)")
	}
	if first+n > runtime.NumCPU() {
		return fmt.Errorf("cannot pin to CPUs %d-%d: only %d CPUs", first, first+n-1, runtime.NumCPU())
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var old, mask [16]uint64 // up to 1024 CPUs
	if err := affinity(syscall.SYS_SCHED_GETAFFINITY, &old); err != nil {
		return err
	}
	for c := first; c < first+n; c++ {
		mask[c/64] |= 1 << (c % 64)
	}
	if err := affinity(syscall.SYS_SCHED_SETAFFINITY, &mask); err != nil {
		return err
	}
	err := cmd.Start()
	if rerr := affinity(syscall.SYS_SCHED_SETAFFINITY, &old); rerr != nil && err == nil {
		err = rerr
	}
	return err
}

// affinity gets or sets the calling thread's CPU mask.
func affinity(trap uintptr, mask *[16]uint64) error {
	_, _, errno := syscall.RawSyscall(trap, 0, unsafe.Sizeof(*mask), uintptr(unsafe.Pointer(mask)))
	if errno != 0 {
		return errno
	}
	return nil
}

// cpuTime returns the user+system CPU time of pid (Linux /proc).
func cpuTime(pid int) (time.Duration, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, false
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(ut+st) * (time.Second / 100), true // USER_HZ = 100
}

// samplingStats reads Sampling.Cycles, .Late and .Missed (nil on error).
func samplingStats(ctx context.Context, endpoint string) []int64 {
	c, err := subprobe.Dial(ctx, endpoint)
	if err != nil {
		return nil
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = c.Close(cctx)
	}()
	req := &ua.ReadRequest{}
	for _, n := range []string{server.NodeSamplingCycles, server.NodeSamplingLate, server.NodeSamplingMissed} {
		req.NodesToRead = append(req.NodesToRead, &ua.ReadValueID{NodeID: ua.NewStringNodeID(1, n), AttributeID: ua.AttributeIDValue})
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := c.Read(rctx, req)
	if err != nil || len(resp.Results) != 3 {
		return nil
	}
	out := make([]int64, 3)
	for i, dv := range resp.Results {
		if dv.Value == nil {
			return nil
		}
		out[i], _ = dv.Value.Value().(int64)
	}
	return out
}

func search(ctx context.Context, o options) error {
	measure := subprobe.Progress
	switch o.measure {
	case "progress":
	case "delivered":
		measure = subprobe.Delivered
	default:
		return fmt.Errorf("-measure: want progress or delivered, got %q", o.measure)
	}
	endpoint, pid := o.endpoint, 0
	if endpoint == "" {
		c, err := startChild(ctx, o)
		if err != nil {
			return err
		}
		defer c.stop()
		endpoint, pid = c.url, c.cmd.Process.Pid
		pinned := "not pinned"
		if o.pin >= 0 {
			pinned = fmt.Sprintf("pinned to CPUs %d-%d", o.pin, o.pin+o.cpus-1)
		}
		fmt.Printf("server: child pid %d, GOMAXPROCS=%d, %s, %s\n", pid, o.cpus, pinned, endpoint)
	}
	fmt.Printf("criterion: every item ≥ 99 %% of its samples at %v (measure %s, median of %d × %v windows, best of %d runs), host CPUs %d\n",
		o.sampling, measure, o.windows, o.window, o.attempts, runtime.NumCPU())
	level := func(n int) (bool, error) {
		cfg := subprobe.Config{
			Endpoint: endpoint, Kind: "SampledCounter", Items: n,
			Sampling: o.sampling, Publishing: o.publishing, Outstanding: o.outstanding,
			Warmup: o.warmup, Windows: o.windows, Window: o.window, Measure: measure,
		}
		var cpu0 time.Duration
		if pid > 0 {
			cpu0, _ = cpuTime(pid)
		}
		st0 := samplingStats(ctx, endpoint)
		t0 := time.Now()
		res, err := subprobe.Best(ctx, cfg, o.attempts, 0.99, func(a int, r subprobe.Result) {
			fmt.Printf("  %5d items, run %d: %v\n", n, a, r)
		})
		if err != nil {
			return false, err
		}
		usage := ""
		if pid > 0 {
			if cpu1, ok := cpuTime(pid); ok {
				usage = fmt.Sprintf(", server CPU %.0f %% of one CPU", 100*float64(cpu1-cpu0)/float64(time.Since(t0)))
			}
		}
		if st0 != nil {
			if st1 := samplingStats(ctx, endpoint); st1 != nil {
				usage += fmt.Sprintf(", server sampling: %d cycles, %d late ≥ 1 interval, %d grid points missed",
					st1[0]-st0[0], st1[1]-st0[1], st1[2]-st0[2])
			}
		}
		ok := res.Median >= 0.99 && res.Gaps == 0
		verdict := "FAIL"
		if ok {
			verdict = "pass"
		}
		fmt.Printf("%5d items: %s, median %.4f (worst item %d)%s\n", n, verdict, res.Median, res.Worst, usage)
		return ok, nil
	}
	best, worst := 0, 0
	for n := o.min; n <= o.max; n *= 2 {
		ok, err := level(n)
		if err != nil {
			return err
		}
		if !ok {
			worst = n
			break
		}
		best = n
		if n < o.max && n*2 > o.max {
			n = o.max / 2 // test -max itself next
		}
	}
	for worst > 0 && worst-best > o.resolution {
		mid := (best + worst) / 2 / o.resolution * o.resolution
		if mid <= best {
			break
		}
		ok, err := level(mid)
		if err != nil {
			return err
		}
		if ok {
			best = mid
		} else {
			worst = mid
		}
	}
	switch {
	case best == 0:
		fmt.Printf("capacity: below %d items\n", o.min)
	case worst == 0:
		fmt.Printf("capacity: at least %d items (the -max)\n", best)
	default:
		fmt.Printf("capacity: %d items pass, %d fail\n", best, worst)
	}
	return nil
}
