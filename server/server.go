package server

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"runtime"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gopcua/opcua/ua"
	"github.com/gopcua/opcua/uacp"

	"github.com/opcua-chaos/opcua-chaos/server/catalog"
	"github.com/opcua-chaos/opcua-chaos/server/internal/budget"
	"github.com/opcua-chaos/opcua-chaos/server/internal/channel"
	"github.com/opcua-chaos/opcua-chaos/server/internal/fairqueue"
	"github.com/opcua-chaos/opcua-chaos/server/internal/session"
	"github.com/opcua-chaos/opcua-chaos/server/internal/subscription"
	"github.com/opcua-chaos/opcua-chaos/server/internal/uabin"
)

// ReadyMessage is the message of the one log line the server writes once it
// is listening; the test harness waits for it.
const ReadyMessage = "opcua-chaos server ready"

// ErrShutdownTimeout is returned by Serve when work was still running
// Config.ShutdownTimeout after its context ended; Serve returns anyway.
var ErrShutdownTimeout = errors.New("server: shutdown timed out")

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
	decoder     *uabin.Decoder         // guards request decoding
	logins      *loginThrottle         // delays failed logins per peer IP and user
	rsa         *rsaWork               // RSA private-key operations per peer IP
	secrets     *rsaWork               // RSA blocks of user secrets of addresses with failed logins, server-wide (one key)
	openConns   atomic.Int64           // TCP connections being served
	budget      *budget.Budget         // bytes hostile peers can make it hold; nil under no-byte-budget

	// testHook, if set, runs before a worker executes a request (tests
	// only: it can wedge a worker).
	testHook func(ua.Request)

	leak leak // memory kept by the retain-memory fault
	// firstCert is the first client certificate a secured channel opened
	// with, kept by the cert-cached-across-channels fault.
	firstCert firstCertificate
	// trickle is the memory kept by the trickle-leak fault
	trickle leak
	// slowRead is the slow-read fault's work per Read; nil when off.
	slowRead *slowReadFault

	// slots bounds the Reads admitted and not yet answered to the number
	// of workers under the crypto-in-gate fault (see takeSlot); nil
	// otherwise.
	slots chan struct{}

	// connsMu guards conns and evicting.
	connsMu sync.Mutex
	// conns are the connections served, from accept (handshakes
	// included) until their goroutine ends.
	conns map[*conn]struct{}
	// evicting counts the conns evicted (see admitConn) whose goroutine has
	// not ended yet: they no longer count against MaxConnections.
	evicting int

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
	refusedConns      atomic.Int64 // connections refused (MaxConnections)
	evictedConns      atomic.Int64 // connections closed at MaxConnections to admit a new one
	panics            atomic.Int64 // panics recovered (handlers, workers, connections)
	decodingErrors    atomic.Int64 // requests answered BadDecodingError
	loginsDelayed     atomic.Int64 // ActivateSession calls held back by the login throttle
	loginsOverBudget  atomic.Int64 // ActivateSession calls refused unchecked: the user's failed-login budget was spent
	rsaRefused        atomic.Int64 // OpenSecureChannel and CreateSession refused over their peer's budget of RSA work
	secretsRefused    atomic.Int64 // ActivateSession refused undecrypted over the server-wide budget of secret decryption
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
	fill := func(p *int, v int) {
		if *p <= 0 {
			*p = v
		}
	}
	fillDur := func(p *time.Duration, v time.Duration) {
		if *p <= 0 {
			*p = v
		}
	}
	fill(&cfg.MaxConnections, DefaultMaxConnections)
	fill(&cfg.MaxMessageSize, DefaultMaxMessageSize)
	fill(&cfg.MaxChunkCount, DefaultMaxChunkCount)
	fill(&cfg.MaxBufferedChunks, cfg.MaxChunkCount)
	fill(&cfg.MaxBufferedBytes, cfg.MaxMessageSize)
	fill(&cfg.MaxDecodeDepth, uabin.DefaultMaxDepth)
	fill(&cfg.LoginFreeFailures, DefaultLoginFreeFailures)
	fillDur(&cfg.HandshakeTimeout, DefaultHandshakeTimeout)
	fillDur(&cfg.MinChannelLifetime, DefaultMinChannelLifetime)
	fillDur(&cfg.UnactivatedTimeout, DefaultUnactivatedTimeout)
	fillDur(&cfg.LoginDelay, DefaultLoginDelay)
	fillDur(&cfg.LoginDelayMax, max(DefaultLoginDelayMax, cfg.LoginDelay))
	fillDur(&cfg.ShutdownTimeout, DefaultShutdownTimeout)
	fillDur(&cfg.IdleTimeout, DefaultIdleTimeout)
	fillDur(&cfg.MinPublishingInterval, DefaultMinPublishingInterval)
	fill(&cfg.MaxSubscriptions, DefaultMaxSubscriptions)
	if cfg.AnonymousSubscriptionShare <= 0 || cfg.AnonymousSubscriptionShare > 1 || math.IsNaN(cfg.AnonymousSubscriptionShare) {
		cfg.AnonymousSubscriptionShare = DefaultAnonymousSubscriptionShare
	}
	fillDur(&cfg.WriteTimeout, DefaultWriteTimeout)
	if cfg.MaxUnsentPerChannel <= 0 {
		cfg.MaxUnsentPerChannel = DefaultMaxUnsent
	}
	fill(&cfg.MaxHeldLoginsPerPeer, DefaultMaxHeldLogins)
	fill(&cfg.MaxSecretBlocks, DefaultMaxSecretBlocks)
	fill(&cfg.MaxStringLength, DefaultMaxStringLength)
	fill(&cfg.MaxNodeIDLength, DefaultMaxNodeIDLength)
	fill(&cfg.MaxOPNBlocks, DefaultMaxOPNBlocks)
	fill(&cfg.RSAOpsPerPeer, DefaultRSAOpsPerPeer)
	fill(&cfg.RSABurstPerPeer, DefaultRSABurstPerPeer)
	fill(&cfg.SecretOpsPerSecond, DefaultSecretOpsPerSecond)
	fill(&cfg.MaxSessions, session.DefaultMaxSessions)
	if cfg.Quirks.Has(catalog.QuirkMaxSessions20) {
		cfg.MaxSessions = min(cfg.MaxSessions, MaxSessionsQuirk)
	}
	fill(&cfg.MaxAnonymousSessions, max(1, cfg.MaxSessions/2))
	if cfg.MemoryBudget <= 0 {
		cfg.MemoryBudget = budget.DefaultLimit
	}
	if cfg.MaxMessageSize > math.MaxInt32 || cfg.MaxChunkCount > math.MaxInt32 || cfg.MaxBufferedBytes > math.MaxInt32 {
		return nil, fmt.Errorf("server: message size, chunk count and buffered bytes must be below 2^31")
	}
	if cfg.LoginDelayMax < cfg.LoginDelay {
		return nil, fmt.Errorf("server: login delay cap %v below the login delay %v", cfg.LoginDelayMax, cfg.LoginDelay)
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
			MinTimeout:         cfg.MinSessionTimeout,
			MaxSessions:        cfg.MaxSessions,
			MaxUnactivated:     cfg.MaxUnactivatedSessions,
			UnactivatedTimeout: cfg.UnactivatedTimeout,
			NeverExpire:        cfg.Faults.Has(catalog.FaultSessionsNeverExpire),
			MaxAnonymous:       cfg.MaxAnonymousSessions,
			OutliveChannels:    cfg.Faults.Has(catalog.FaultSessionsOutliveChannels),
			UnactivatedRefuse:  cfg.Faults.Has(catalog.FaultUnactivatedRefuse),
			AnonymousRefuse:    cfg.Faults.Has(catalog.FaultAnonymousFullRefuses),
			YieldIdle:          cfg.AnonymousYieldIdle,
			Logger:             cfg.Logger,
		}),
		start:   time.Now(),
		queue:   newQueue(cfg),
		chans:   chanStats{live: map[*channel.Channel]struct{}{}, lowest: -1},
		conns:   map[*conn]struct{}{},
		decoder: uabin.NewDecoder(uabin.Limits{MaxDepth: cfg.MaxDecodeDepth}),
		logins:  newLoginThrottle(cfg.LoginFreeFailures, cfg.LoginDelay, cfg.LoginDelayMax),
		rsa:     newRSAWork(cfg.RSAOpsPerPeer, cfg.RSABurstPerPeer),
		secrets: newRSAWork(cfg.SecretOpsPerSecond, 2*cfg.SecretOpsPerSecond),
	}
	if !cfg.Faults.Has(catalog.FaultNoByteBudget) {
		s.budget = budget.New(cfg.MemoryBudget)
	}
	if cfg.Faults.Has(catalog.FaultCryptoInGate) {
		s.slots = make(chan struct{}, s.workers())
	}
	if cfg.Faults.Has(catalog.FaultSlowRead) {
		s.slowRead = newSlowRead(cfg.SlowRead)
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
		"quirks", s.cfg.Quirks.String(),
		"security", s.cfg.Security.String(),
		"workers", s.workers(),
		"weights", weightsString(s.cfg.OwnerWeights),
		"queue", s.cfg.QueueSize,
		"owner_queue", s.cfg.OwnerQueueSize,
		"backpressure_high", s.cfg.HighMark,
		"backpressure_low", s.cfg.LowMark,
		"users", len(s.cfg.Users),
		"anonymous", !s.cfg.NoAnonymous,
		"max_connections", s.cfg.MaxConnections,
		"handshake_timeout", s.cfg.HandshakeTimeout,
		"min_channel_lifetime", s.cfg.MinChannelLifetime,
		"max_message_size", s.cfg.MaxMessageSize,
		"login_delay", s.cfg.LoginDelay,
		"login_delay_max", s.cfg.LoginDelayMax,
		"memory_budget", s.budget.Limit(),
		"idle_timeout", s.cfg.IdleTimeout,
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
	s.wg.Go(func() { s.returnMemory(ctx) })
	if s.cfg.Quirks.Has(catalog.QuirkRetainFreedMemory) {
		s.wg.Go(func() { s.retainMemory(ctx) })
	}
	if s.cfg.Faults.Has(catalog.FaultTrickleLeak) {
		s.wg.Go(func() { s.trickleLeak(ctx, TrickleLeakEvery) })
	}

	err := s.acceptLoop(ctx, l)
	// Queued requests are answered BadServerHalted; running ones see their
	// channel's context end.
	s.haltQueued()
	cancel()
	stopped := make(chan struct{})
	go func() {
		workers.Wait()
		s.wg.Wait()
		s.sessions.CloseAll()
		s.subs.Close()
		close(stopped)
	}()
	timer := time.NewTimer(s.cfg.ShutdownTimeout)
	defer timer.Stop()
	select {
	case <-stopped:
		s.log.Info("stopped")
	case <-timer.C:
		// A handler that ignores its context must not keep the process
		// alive: SIGTERM always ends it.
		s.log.Error("shutdown timed out: abandoning work still running",
			"timeout", s.cfg.ShutdownTimeout, "busy_workers", s.busyWorkers.Load(), "connections", s.openConns.Load())
		if err == nil {
			err = ErrShutdownTimeout
		}
	}
	return err
}

// acceptLoop accepts connections until ctx is done. Errors other than the
// listener closing (EMFILE, ENFILE, ECONNABORTED, ...) are transient: it
// backs off (5 ms doubling up to 1 s) and keeps accepting.
func (s *Server) acceptLoop(ctx context.Context, l net.Listener) error {
	var backoff time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("server: accept: %w", err)
			}
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.log.Warn("accept failed, retrying", "err", err, "backoff", backoff)
			t := time.NewTimer(backoff)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
			continue
		}
		backoff = 0
		cn := s.admitConn(c)
		if cn == nil {
			s.stats.refusedConns.Add(1)
			s.wg.Go(func() { s.refuse(c) })
			continue
		}
		s.wg.Go(func() {
			defer s.forgetConn(cn)
			s.serveConn(ctx, cn)
		})
	}
}

// errEvicted is why an evicted channel was closed.
var errEvicted = errors.New("evicted at the connection limit: no session activated")

// admitConn registers a new connection, or returns nil if it must be refused.
// At MaxConnections it makes room by evicting the connection that has
// gone longest without an activated session (a handshake pending, or a
// secure channel open that holds no activated session now: none was
// activated, or its sessions were closed), oldest first: one peer's idle
// connections cannot lock every other client out, even when all of them
// come through one proxy address. Only when every connection holds an
// activated session is the new one refused. (Fault
// once-activated-spared: a connection that ever activated one is
// spared.) (Fault unbounded-idle: no
// limit; fault idle-after-open: refuse at the limit, evict nothing.)
func (s *Server) admitConn(c net.Conn) *conn {
	cn := &conn{nc: c, since: time.Now()}
	s.connsMu.Lock()
	defer s.connsMu.Unlock()
	if len(s.conns)-s.evicting >= s.cfg.MaxConnections && !s.cfg.Faults.Has(catalog.FaultUnboundedIdle) {
		if s.cfg.Faults.Has(catalog.FaultIdleAfterOpen) {
			return nil
		}
		var victim *conn
		for o := range s.conns {
			if o.evicted || s.holdsSession(o) {
				continue
			}
			if victim == nil || o.since.Before(victim.since) {
				victim = o
			}
		}
		if victim == nil {
			return nil
		}
		victim.evicted = true
		s.evicting++
		s.stats.evictedConns.Add(1)
		s.wg.Go(func() { s.evictConn(victim) })
	}
	s.conns[cn] = struct{}{}
	s.openConns.Add(1)
	return cn
}

// holdsSession reports whether cn's secure channel holds an activated
// session now: what spares it from eviction at the connection limit and
// from the idle timeout. Under the once-activated-spared fault it is
// whether a session was ever activated on it.
func (s *Server) holdsSession(cn *conn) bool {
	if s.cfg.Faults.Has(catalog.FaultOnceActivatedSpared) {
		return cn.active.Load()
	}
	return cn.active.Load() && s.sessions.Holds(cn.chID)
}

// forgetConn unregisters a connection whose goroutine ends.
func (s *Server) forgetConn(cn *conn) {
	s.connsMu.Lock()
	delete(s.conns, cn)
	if cn.evicted {
		s.evicting--
	}
	s.connsMu.Unlock()
	s.openConns.Add(-1)
}

// evictConn closes a connection admitConn chose to make room: an open secure
// channel gets ERR BadTcpNotEnoughResources first, a handshake is just
// closed.
func (s *Server) evictConn(cn *conn) {
	state := "handshake"
	if t := cn.transport.Load(); t != nil {
		state = "open, no session activated"
		t.Evict(ua.StatusBadTCPNotEnoughResources, errEvicted)
	} else {
		_ = cn.nc.Close()
	}
	s.log.Info("connection evicted: connection limit reached", "remote", cn.nc.RemoteAddr().String(),
		"state", state, "age", time.Since(cn.since).Round(time.Millisecond), "max", s.cfg.MaxConnections)
}

// refuse answers a connection beyond MaxConnections with an ERR message
// and closes it.
func (s *Server) refuse(c net.Conn) {
	s.log.Warn("connection refused: too many connections", "remote", c.RemoteAddr().String(), "max", s.cfg.MaxConnections)
	code := ua.StatusBadMaxConnectionsReached
	body, _ := ua.Encode(&uacp.Error{ErrorCode: uint32(code), Reason: code.Error()})
	msg := binary.LittleEndian.AppendUint32([]byte("ERRF"), uint32(8+len(body)))
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = c.Write(append(msg, body...))
	_ = c.Close()
}

// Memory return after bursts of monitored items (see returnMemory).
const (
	memoryCheckEvery = time.Second
	memoryBurstItems = 5000
)

// returnMemory hands the memory of a deleted burst of monitored items back
// to the OS at once: when memoryBurstItems or more items were deleted since
// it last did (counted, so that a burst created and deleted between two
// checks is seen too), it runs debug.FreeOSMemory (a GC and a scavenge,
// milliseconds on this heap). Left to Go's background scavenger, the tens
// of MB that 20 000 items and the requests that created them took stay in
// the process for minutes after their deletion.
func (s *Server) returnMemory(ctx context.Context) {
	var last int64
	every(ctx, memoryCheckEvery, func(time.Time) {
		deleted := s.subs.Stats().ItemsDeleted
		if deleted-last >= memoryBurstItems {
			start := time.Now()
			debug.FreeOSMemory()
			s.log.Info("returned memory to the OS after deleted monitored items", "deleted", deleted-last, "took", time.Since(start))
			last = deleted
		}
	})
}

// expireSessions closes sessions that outlived their timeout.
func (s *Server) expireSessions(ctx context.Context) {
	every(ctx, s.sessions.SweepInterval(), func(now time.Time) {
		for _, sess := range s.sessions.Expire(now) {
			s.log.Info("session timed out", "session", sess.ID.String(), "name", sess.Name, "timeout", sess.Timeout)
		}
	})
}

// every calls f with the tick's time every period until ctx ends: the
// server's background sweeps.
func every(ctx context.Context, period time.Duration, f func(now time.Time)) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			f(now)
		}
	}
}

// conn is the server's state of one connection and its secure channel.
type conn struct {
	nc        net.Conn                                // the TCP connection
	since     time.Time                               // accepted at
	transport atomic.Pointer[channel.SecureTransport] // set once the handshake is done
	evicted   bool                                    // admitConn chose it to make room; Server.connsMu held

	id          uint32
	remoteIP    string
	endpointURL string
	localAddr   string
	ctx         context.Context // cancelled when the channel is gone
	queued      queued          // its requests in the fair queue
	maxResponse int             // largest response the client accepts
	reads       atomic.Int64    // Reads executed (the lost-response fault counts them)
	// active is set once a session was activated on this channel; only
	// the once-activated-spared fault reads it (holdsSession).
	active atomic.Bool
	// chID is the secure channel id the connection is given before its
	// handshake: the key of its sessions in the session manager.
	chID uint32
	// security returns the channel's security (None until a secured
	// OpenSecureChannel was served).
	security func() channel.ChannelSecurity
}

func (s *Server) serveConn(ctx context.Context, cn *conn) {
	c := cn.nc
	remote := c.RemoteAddr().String()
	local := c.LocalAddr().String()
	crash := s.cfg.Faults.Has(catalog.FaultCrashOnDecode)
	var t *channel.SecureTransport
	if !crash {
		// A panic on this connection's reader closes the connection, not
		// the process. (Fault crash-on-decode: no recover.)
		defer func() {
			if p := recover(); p != nil {
				s.stats.panics.Add(1)
				s.log.Error("panic serving a connection: closing it", "remote", remote, "panic", p, "stack", string(debug.Stack()))
				if t != nil {
					_ = t.Abort(ua.StatusBadInternalError)
				} else {
					_ = c.Close()
				}
			}
		}()
	}
	handshake := s.cfg.HandshakeTimeout
	if s.cfg.Faults.Has(catalog.FaultUnboundedIdle) {
		handshake = 0 // Fault unbounded-idle: wait for the Hello forever.
	}
	// Fault chunks-per-channel-only: unfinished chunks are bounded per
	// channel only, not charged to the memory budget.
	chunks := s.budget
	if s.cfg.Faults.Has(catalog.FaultChunksPerChannelOnly) {
		chunks = nil
	}
	// Fault idle-after-open: a channel may stay open without a session,
	// and its token never expires.
	idle := s.cfg.IdleTimeout
	if s.cfg.Faults.Has(catalog.FaultIdleAfterOpen) {
		idle = 0
	}
	// Fault responses-unbudgeted: a write waits for its peer forever.
	writeTimeout := s.cfg.WriteTimeout
	if s.cfg.Faults.Has(catalog.FaultResponsesUnbudgeted) {
		writeTimeout = 0
	}
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	// Fault opn-blocks-unbounded: every block of any OpenSecureChannel
	// decrypted, from any address as often as it sends them.
	maxOPNBlocks, admitOPN := s.cfg.MaxOPNBlocks, func(blocks int) bool { return s.takeRSA(host, blocks, "OpenSecureChannel") }
	if s.cfg.Faults.Has(catalog.FaultOPNBlocksUnbounded) {
		maxOPNBlocks, admitOPN = 0, nil
	}
	id := s.nextChannelID.Add(1)
	cn.chID = id
	// Shutdown closes a connection still in its handshake at once.
	stopClose := context.AfterFunc(ctx, func() { _ = c.Close() })
	t, err = channel.Accept(c, channel.Config{
		IDs: channel.IDs{
			SecureChannelID: id,
			SequenceNumber:  1,
			TokenID:         s.nextTokenID.Add(1),
		},
		HandshakeTimeout: handshake,
		MinLifetime:      s.cfg.MinChannelLifetime,
		Limits: channel.Limits{
			MaxMessageSize:    uint32(s.cfg.MaxMessageSize),
			MaxChunkCount:     uint32(s.cfg.MaxChunkCount),
			MaxBufferedChunks: s.cfg.MaxBufferedChunks,
			MaxBufferedBytes:  s.cfg.MaxBufferedBytes,
		},
		Decoder:   s.decoder,
		Unguarded: crash,
		Logger:    s.log.With("channel", id, "remote", remote),
		Security: &channel.Security{
			Certificate: s.creds.cert,
			PrivateKey:  s.creds.key,
			Offers:      s.offers,
			Trusts:      s.trusts(),
			// Fault cert-cached-across-channels: the first client
			// certificate for every channel.
			ChannelCertificate: s.channelCertificate(),
		},
		CryptoInGate:    s.cfg.Faults.Has(catalog.FaultCryptoInGate),
		Budget:          chunks,
		IdleTimeout:     idle,
		WriteTimeout:    writeTimeout,
		Active:          func() bool { return s.holdsSession(cn) },
		EnforceLifetime: !s.cfg.Faults.Has(catalog.FaultIdleAfterOpen),
		MaxOPNBlocks:    maxOPNBlocks,
		AdmitOPN:        admitOPN,
	})
	stopClose()
	if err != nil {
		s.log.Debug("handshake failed", "remote", remote, "err", err)
		return
	}
	cn.transport.Store(t)
	s.connsMu.Lock()
	evicted := cn.evicted
	s.connsMu.Unlock()
	if evicted {
		// Evicted while its handshake ran, and not closed in time.
		t.Evict(ua.StatusBadTCPNotEnoughResources, errEvicted)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cn.id, cn.remoteIP, cn.endpointURL, cn.localAddr, cn.ctx = id, host, t.EndpointURL, local, ctx
	cn.maxResponse, cn.security = t.MaxResponseSize, t.Security
	cn.queued.jobs = make(map[*job]struct{})

	s.stats.channels.Add(1)
	s.stats.channelsCumulated.Add(1)
	defer s.stats.channels.Add(-1)
	s.log.Debug("channel open", "channel", id, "remote", remote)

	ch := channel.New(t, channel.Options{
		HighMark:        s.cfg.HighMark,
		LowMark:         s.cfg.LowMark,
		NoBackpressure:  s.cfg.Faults.Has(catalog.FaultNoBackpressure),
		FaultOnOverflow: s.cfg.Faults.Has(catalog.FaultFaultOnOverflow),
		LateResume:      s.cfg.Faults.Has(catalog.FaultLateResume) || s.cfg.Faults.Has(catalog.FaultLateResumeSilent),
		ParkHoldsSlot:   s.cfg.Faults.Has(catalog.FaultPublishBlocksReader),
		WriterDropsKick: s.cfg.Faults.Has(catalog.FaultWriterLostWakeup),
		Budget:          s.budget,
		MaxUnsent:       s.cfg.MaxUnsentPerChannel,
		// Fault responses-unbudgeted: responses wait decoded and
		// uncharged, however large.
		UnbudgetedResponses: s.cfg.Faults.Has(catalog.FaultResponsesUnbudgeted),
		Logger:              s.log.With("channel", id),
		OnPanic:             func() { s.stats.panics.Add(1) },
	})
	s.chans.add(ch)
	// Deferred, so that it also runs when a panic unwinds the reader.
	defer func() {
		cancel()
		// A lost connection cancels its queued requests: their slots
		// return now.
		n := s.cancelQueued(cn, func(*job) bool { return true }, ua.StatusBadSecureChannelClosed)
		s.chans.remove(ch)
		s.sessions.ChannelClosed(id) // its sessions are orphans now (after cancel: see activateSession)
		level := slog.LevelDebug
		var pe *channel.ProtocolError
		if errors.As(err, &pe) {
			level = slog.LevelInfo // a misbehaving peer is worth a line
		}
		s.log.Log(context.Background(), level, "channel closed", "channel", id, "remote", remote, "err", err, "cancelled", n)
	}()
	err = ch.Run(ctx, func(ch *channel.Channel, msg channel.Message) {
		s.handle(cn, ch, msg)
	})
}

// chanStats aggregates the backpressure counters of all channels.
type chanStats struct {
	mu         sync.Mutex
	live       map[*channel.Channel]struct{}
	pauses     int64 // of closed channels
	maxPending int   // of closed channels
	// lowestResume is the lowest pending count at which a closed
	// channel's paused reader resumed; -1 if none did.
	lowest int
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
	c.lowest = lowest(c.lowest, st.LowestResume)
	c.mu.Unlock()
}

// lowest is the lower of two resume counts, where -1 means none.
func lowest(a, b int) int {
	switch {
	case a < 0:
		return b
	case b < 0:
		return a
	}
	return min(a, b)
}

// lowestResume returns the lowest pending count at which any channel's
// paused reader resumed, -1 if none did.
func (c *chanStats) lowestResume() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	low := c.lowest
	for ch := range c.live {
		low = lowest(low, ch.Stats().LowestResume)
	}
	return low
}

// totals returns backpressure pauses, the highest pending count seen on any
// channel, and the responses pending and the requests parked now.
func (c *chanStats) totals() (pauses int64, maxPending, pending, parked int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	pauses, maxPending = c.pauses, c.maxPending
	for ch := range c.live {
		st := ch.Stats()
		pauses += st.Pauses
		maxPending = max(maxPending, st.MaxPending)
		pending += st.Pending
		parked += st.Parked
	}
	return pauses, maxPending, pending, parked
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
