package server

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gopcua/opcua/ua"
	"github.com/gopcua/opcua/uacp"

	"github.com/opcua-chaos/opcua-chaos/server/internal/uatest"
)

// childEnv makes this test binary run TestServerChild as a server process
// with the fault switches in the variable ("none" for none).
const childEnv = "OPCUA_TEST_SERVER_CHILD"

// TestServerChild is the server process of TestFaultCrashOnDecode; it is
// skipped unless childEnv is set. It prints "listen <addr>" and serves for
// at most 30 s.
func TestServerChild(t *testing.T) {
	spec := os.Getenv(childEnv)
	if spec == "" {
		t.Skip("child process of TestFaultCrashOnDecode")
	}
	if spec == "none" {
		spec = ""
	}
	faults, err := ParseFaults(spec)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := New(Config{Faults: faults, Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("listen %s\n", l.Addr())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := srv.Serve(ctx, l); err != nil {
		t.Fatal(err)
	}
}

// child is a server process started by startChild.
type child struct {
	cmd    *exec.Cmd
	addr   string
	mu     sync.Mutex
	output bytes.Buffer  // stdout and stderr
	exited chan struct{} // closed when the process has exited
	err    error         // its exit error, once exited is closed
}

func (c *child) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.output.Write(p)
}

func (c *child) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.output.String()
}

// startChild runs this test binary as a server process with faults.
func startChild(t *testing.T, faults string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", "^TestServerChild$", "-test.v")
	cmd.Env = append(os.Environ(), childEnv+"="+faults, "OPCUA_TEST_FAULTS=")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, exited: make(chan struct{})}
	cmd.Stderr = c
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-c.exited
	})
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(c, line)
			if a, ok := strings.CutPrefix(line, "listen "); ok {
				addr <- a
			}
		}
		c.err = cmd.Wait()
		close(c.exited)
	}()
	select {
	case c.addr = <-addr:
	case <-time.After(30 * time.Second):
		t.Fatalf("server child did not start: %s", c)
	}
	return c
}

// TestFaultCrashOnDecode: with crash-on-decode the malformed request of
// issue 14 kills the server process (gopcua's panic, unrecovered); without
// it, the same process answers and lives on. The server runs in a child
// process, so the crash does not take the test binary with it.
func TestFaultCrashOnDecode(t *testing.T) {
	if testing.Short() {
		t.Skip("starts server processes")
	}
	for _, faults := range []string{"none", string(FaultCrashOnDecode)} {
		t.Run(faults, func(t *testing.T) {
			srv := startChild(t, faults)
			c, err := uatest.Dial(srv.addr, uacp.Hello{})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if err := c.Open(); err != nil {
				t.Fatal(err)
			}
			_ = c.SetDeadline(time.Now().Add(20 * time.Second))
			if _, err := c.SendBody(negativeVariantLength(t)); err != nil {
				t.Fatal(err)
			}
			r, rerr := c.Receive()
			if faults == "none" {
				if rerr != nil || r.Status() != ua.StatusBadDecodingError {
					t.Fatalf("answer %v %v, want BadDecodingError\n%s", r, rerr, srv)
				}
				select {
				case <-srv.exited:
					t.Fatalf("server process exited (%v)\n%s", srv.err, srv)
				case <-time.After(200 * time.Millisecond):
				}
				return
			}
			if rerr == nil {
				t.Fatalf("the crash-on-decode server answered %v", r.Value)
			}
			select {
			case <-srv.exited:
				var ee *exec.ExitError
				if !errors.As(srv.err, &ee) || !strings.Contains(srv.String(), "negative len") {
					t.Fatalf("exit %v, want a crash with gopcua's panic\n%s", srv.err, srv)
				}
				t.Logf("server process died: %v", srv.err)
			case <-time.After(20 * time.Second):
				t.Fatalf("the crash-on-decode server process did not die\n%s", srv)
			}
		})
	}
}

// TestFaultUnboundedIdle: with unbounded-idle, connections that never send
// Hello outlive the handshake timeout and the connection limit does not
// apply (without it: TestHandshakeTimeout, TestConnectionLimit).
func TestFaultUnboundedIdle(t *testing.T) {
	ts := runServer(t, Config{HandshakeTimeout: 100 * time.Millisecond, MaxConnections: 1, Faults: Faults{FaultUnboundedIdle: true}})
	var idle []net.Conn
	for range 3 {
		nc, err := net.Dial("tcp", ts.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		idle = append(idle, nc)
	}
	time.Sleep(500 * time.Millisecond) // five handshake timeouts
	for i, nc := range idle {
		_ = nc.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if _, err := nc.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Errorf("idle connection %d: %v, want still open", i, err)
		}
	}
	if n := ts.openConns.Load(); n != 3 {
		t.Errorf("%d connections served, want 3 (no limit)", n)
	}
	c, err := uatest.Dial(ts.addr, uacp.Hello{})
	if err != nil {
		t.Fatalf("fourth connection refused: %v", err)
	}
	c.Close()
}
