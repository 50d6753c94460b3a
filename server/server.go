package server

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gopcua/opcua/ua"

	"github.com/opcua-chaos/opcua-chaos/server/internal/channel"
	"github.com/opcua-chaos/opcua-chaos/server/internal/fairqueue"
	"github.com/opcua-chaos/opcua-chaos/server/internal/session"
	"github.com/opcua-chaos/opcua-chaos/server/internal/subscription"
)

// ReadyMessage is the message of the one log line the server writes once it
// is listening; the test harness waits for it.
const ReadyMessage = "opcua-chaos server ready"

// handshakeTimeout bounds the UACP Hello/Acknowledge exchange.
const handshakeTimeout = 10 * time.Second

// Server is the reference OPC UA server. Create it with New and run it with
// Serve or ListenAndServe.
type Server struct {
	cfg      Config
	log      *slog.Logger
	sessions *session.Manager
	start    time.Time
	creds    credentials // certificate and user-name secret decryption

	nextChannelID atomic.Uint32
	nextTokenID   atomic.Uint32

	stats       stats
	queue       *fairqueue.Queue[*job]
	busyWorkers atomic.Int64
	chans       chanStats
	subs        *subscription.Manager  // subscriptions of all sessions
	counters    *subscription.Counters // SampledCounter / FastCounter nodes

	connsMu sync.Mutex
	conns   map[*conn]struct{} // live secure channels

	addrMu sync.Mutex
	addr   net.Addr

	wg sync.WaitGroup // connections and requests in flight
}

// stats are the server-wide counters, readable as ns=1 nodes.
type stats struct {
	requests          atomic.Int64 // service requests received
	readRequests      atomic.Int64 // Read requests answered
	reads             atomic.Int64 // Read operations (ReadValueIds) answered
	rejectedRequests  atomic.Int64 // requests answered with a Bad service result
	securityRejected  atomic.Int64 // ActivateSession with a bad identity
	timeouts          atomic.Int64 // requests answered BadTimeout
	tooBusy           atomic.Int64 // requests refused BadServerTooBusy
	cancelled         atomic.Int64 // queued requests cancelled by the Cancel service
	channels          atomic.Int64 // current secure channels
	channelsCumulated atomic.Int64
}

// New validates cfg, fills in defaults and returns a server.
func New(cfg Config) (*Server, error) {
	if cfg.Listen == "" {
		cfg.Listen = DefaultListen
	}
	if cfg.Users == nil {
		users, err := ParseUsers(DefaultUsers)
		if err != nil {
			return nil, err
		}
		cfg.Users = users
	}
	if cfg.OwnerWeights == nil {
		cfg.OwnerWeights = map[string]int{}
	}
	if cfg.Workers <= 0 {
		cfg.Workers = max(8, 2*runtime.GOMAXPROCS(0))
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = DefaultQueueSize
	}
	if cfg.OwnerQueueSize <= 0 {
		cfg.OwnerQueueSize = max(1, cfg.QueueSize/2)
	}
	if cfg.HighMark <= 0 {
		cfg.HighMark = DefaultHighMark
	}
	if cfg.LowMark <= 0 {
		cfg.LowMark = min(DefaultLowMark, cfg.HighMark/2)
	}
	if cfg.LowMark >= cfg.HighMark {
		return nil, fmt.Errorf("server: low mark %d must be below high mark %d", cfg.LowMark, cfg.HighMark)
	}
	if cfg.Faults == nil {
		cfg.Faults = Faults{}
	}
	for f := range cfg.Faults {
		if _, err := ParseFaults(string(f)); err != nil {
			return nil, fmt.Errorf("server: %v", err)
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	creds, err := newCredentials(cfg.PrivateKey, cfg.Certificate)
	if err != nil {
		return nil, err
	}
	s := &Server{
		cfg:   cfg,
		log:   cfg.Logger,
		creds: creds,
		sessions: session.NewManager(session.Limits{
			MinTimeout:  cfg.MinSessionTimeout,
			MaxSessions: cfg.MaxSessions,
		}),
		start: time.Now(),
		queue: newQueue(cfg),
		chans: chanStats{live: map[*channel.Channel]struct{}{}},
		conns: map[*conn]struct{}{},
	}
	s.newSubscriptions()
	var seed [8]byte
	_, _ = rand.Read(seed[:])
	s.nextChannelID.Store(binary.LittleEndian.Uint32(seed[:4]) >> 1)
	s.nextTokenID.Store(binary.LittleEndian.Uint32(seed[4:]) >> 1)
	return s, nil
}

// Addr returns the address the server listens on, or nil before Serve.
func (s *Server) Addr() net.Addr {
	s.addrMu.Lock()
	defer s.addrMu.Unlock()
	return s.addr
}

// ListenAndServe listens on Config.Listen and serves until ctx is done.
func (s *Server) ListenAndServe(ctx context.Context) error {
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("server: listen: %w", err)
	}
	return s.Serve(ctx, l)
}

// Serve accepts connections on l until ctx is done, then closes l and every
// connection, waits for in-flight work and returns nil. It returns an error
// if accepting fails for another reason.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	s.addrMu.Lock()
	s.addr = l.Addr()
	s.addrMu.Unlock()

	s.log.Info("starting",
		"faults", s.cfg.Faults.String(),
		"workers", s.workers(),
		"weights", weightsString(s.cfg.OwnerWeights),
		"queue", s.cfg.QueueSize,
		"owner_queue", s.cfg.OwnerQueueSize,
		"backpressure_high", s.cfg.HighMark,
		"backpressure_low", s.cfg.LowMark,
		"users", len(s.cfg.Users),
		"anonymous", !s.cfg.NoAnonymous,
		"certificate_sha1", s.creds.thumbprint())
	s.log.Info(ReadyMessage, "listen", l.Addr().String())

	var workers sync.WaitGroup
	for range s.workers() {
		workers.Go(s.work)
	}
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		<-ctx.Done()
		l.Close()
	}()
	go func() {
		defer s.wg.Done()
		s.expireSessions(ctx)
	}()

	var err error
	for {
		var c net.Conn
		c, err = l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				err = nil
				break
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			err = fmt.Errorf("server: accept: %w", err)
			break
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serveConn(ctx, c)
		}()
	}
	// Queued requests are answered BadServerHalted; running ones see their
	// channel's context end.
	s.haltQueued()
	cancel()
	workers.Wait()
	s.wg.Wait()
	s.sessions.CloseAll()
	s.subs.Close()
	s.log.Info("stopped")
	return err
}

// expireSessions closes sessions that outlived their timeout.
func (s *Server) expireSessions(ctx context.Context) {
	t := time.NewTicker(s.sessions.SweepInterval())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			for _, sess := range s.sessions.Expire(now) {
				s.log.Info("session timed out", "session", sess.ID.String(), "name", sess.Name, "timeout", sess.Timeout)
			}
		}
	}
}

// conn is the server's state of one secure channel.
type conn struct {
	id          uint32
	remoteIP    string
	endpointURL string
	localAddr   string
	ctx         context.Context // cancelled when the channel is gone
	queued      queued          // its requests in the fair queue
	maxResponse int             // largest response the client accepts
}

func (s *Server) serveConn(ctx context.Context, c net.Conn) {
	remote := c.RemoteAddr().String()
	local := c.LocalAddr().String()
	id := s.nextChannelID.Add(1)
	t, err := channel.Accept(c, channel.IDs{
		SecureChannelID: id,
		SequenceNumber:  1,
		TokenID:         s.nextTokenID.Add(1),
	}, handshakeTimeout)
	if err != nil {
		s.log.Debug("handshake failed", "remote", remote, "err", err)
		return
	}
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cn := &conn{id: id, remoteIP: host, endpointURL: t.EndpointURL, localAddr: local, ctx: ctx, maxResponse: t.MaxResponseSize}
	cn.queued.jobs = make(map[*job]struct{})

	s.stats.channels.Add(1)
	s.stats.channelsCumulated.Add(1)
	defer s.stats.channels.Add(-1)
	s.log.Debug("channel open", "channel", id, "remote", remote)

	ch := channel.New(t, channel.Options{
		HighMark:        s.cfg.HighMark,
		LowMark:         s.cfg.LowMark,
		NoBackpressure:  s.cfg.Faults.Has(FaultNoBackpressure),
		FaultOnOverflow: s.cfg.Faults.Has(FaultFaultOnOverflow),
		Logger:          s.log.With("channel", id),
	})
	s.chans.add(ch)
	s.connsMu.Lock()
	s.conns[cn] = struct{}{}
	s.connsMu.Unlock()
	defer func() {
		s.connsMu.Lock()
		delete(s.conns, cn)
		s.connsMu.Unlock()
	}()
	err = ch.Run(ctx, func(ch *channel.Channel, msg channel.Message) {
		s.handle(cn, ch, msg)
	})
	cancel()
	// A lost connection cancels its queued requests: their slots return now.
	n := s.cancelQueued(cn, func(*job) bool { return true }, ua.StatusBadSecureChannelClosed)
	s.chans.remove(ch)
	s.log.Debug("channel closed", "channel", id, "remote", remote, "err", err, "cancelled", n)
}

// chanStats aggregates the backpressure counters of all channels.
type chanStats struct {
	mu         sync.Mutex
	live       map[*channel.Channel]struct{}
	pauses     int64 // of closed channels
	maxPending int   // of closed channels
}

func (c *chanStats) add(ch *channel.Channel) {
	c.mu.Lock()
	c.live[ch] = struct{}{}
	c.mu.Unlock()
}

func (c *chanStats) remove(ch *channel.Channel) {
	st := ch.Stats()
	c.mu.Lock()
	delete(c.live, ch)
	c.pauses += st.Pauses
	c.maxPending = max(c.maxPending, st.MaxPending)
	c.mu.Unlock()
}

// totals returns backpressure pauses, the highest pending count seen on any
// channel, and the responses pending now.
func (c *chanStats) totals() (pauses int64, maxPending, pending int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	pauses, maxPending = c.pauses, c.maxPending
	for ch := range c.live {
		st := ch.Stats()
		pauses += st.Pauses
		maxPending = max(maxPending, st.MaxPending)
		pending += st.Pending
	}
	return pauses, maxPending, pending
}

func weightsString(w map[string]int) string {
	if len(w) == 0 {
		return "none"
	}
	names := make([]string, 0, len(w))
	for n := range w {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for i, n := range names {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s:%d", n, w[n])
	}
	return b.String()
}
