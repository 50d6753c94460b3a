package server

import (
	"crypto/rsa"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/opcua-chaos/opcua-chaos/server/catalog"
	"github.com/opcua-chaos/opcua-chaos/server/internal/budget"
	"github.com/opcua-chaos/opcua-chaos/server/internal/channel"
	"github.com/opcua-chaos/opcua-chaos/server/internal/subscription"
)

// Default values of Config.
const (
	DefaultListen    = "0.0.0.0:4840"
	DefaultUsers     = "user1:password,user2:password1,heavy:heavy,light:light"
	DefaultWeights   = "heavy:3,light:1"
	DefaultHighMark  = 100
	DefaultLowMark   = 50
	DefaultQueueSize = 10000
	// MaxCounters bounds Config.Counters (OPCUA_COUNTERS).
	MaxCounters = 1_000_000

	// DefaultMaxConnections bounds open TCP connections, handshakes
	// included.
	DefaultMaxConnections = 1000
	// DefaultHandshakeTimeout bounds the time from connect to the end of
	// the first OpenSecureChannel.
	DefaultHandshakeTimeout = 10 * time.Second
	// DefaultMinChannelLifetime is the shortest secure channel token
	// lifetime granted (real servers keep a minimum too, e.g. Eclipse
	// Milo's 60 s by default).
	DefaultMinChannelLifetime = 10 * time.Second
	// DefaultUnactivatedTimeout closes a session not activated within it.
	DefaultUnactivatedTimeout = 30 * time.Second
	// DefaultMaxMessageSize bounds one request (all its chunks), and
	// DefaultMaxChunkCount its chunks (gopcua's values).
	DefaultMaxMessageSize = 2 << 20
	DefaultMaxChunkCount  = 512
	// DefaultLoginDelay is the delay after the first failed login beyond
	// DefaultLoginFreeFailures; it doubles with each further failure up to
	// DefaultLoginDelayMax.
	DefaultLoginDelay        = 100 * time.Millisecond
	DefaultLoginDelayMax     = 5 * time.Second
	DefaultLoginFreeFailures = 3
	// DefaultShutdownTimeout bounds the wait for in-flight work when the
	// server stops (below Docker's 10 s between SIGTERM and SIGKILL).
	DefaultShutdownTimeout = 5 * time.Second
	// DefaultMemoryBudget is Config.MemoryBudget's default (256 MiB).
	DefaultMemoryBudget = budget.DefaultLimit
	// DefaultIdleTimeout closes a channel with no activated session that
	// long after OpenSecureChannel.
	DefaultIdleTimeout = 10 * time.Second
	// DefaultWriteTimeout closes a channel whose peer takes none of its
	// responses for that long (a write without progress).
	DefaultWriteTimeout = 20 * time.Second
	// DefaultMaxUnsent is a channel's share of response bytes waiting to
	// be sent (8 MiB): its reader stops above it.
	DefaultMaxUnsent = channel.DefaultMaxUnsent
	// DefaultMaxHeldLogins bounds the logins held by the throttle per
	// peer IP.
	DefaultMaxHeldLogins = 16
	// DefaultMaxSecretBlocks bounds an encrypted secret's RSA blocks
	// (16 blocks of a 4096-bit key carry about 7 KB).
	DefaultMaxSecretBlocks = 16
	// DefaultMaxStringLength bounds the client strings a session keeps.
	DefaultMaxStringLength = 4096
	// DefaultMaxNodeIDLength bounds the identifier of a string or opaque
	// NodeId the server resolves (4 KiB: no node of this server has a
	// name near it).
	DefaultMaxNodeIDLength = 4096
	// DefaultMaxOPNBlocks bounds the RSA blocks of a secured
	// OpenSecureChannel request (a real one has 2 to 5).
	DefaultMaxOPNBlocks = 16
	// DefaultRSAOpsPerPeer is the RSA private-key operations per second
	// (OpenSecureChannel blocks decrypted, CreateSession signatures)
	// one peer address may cost the server (about a quarter of a core);
	// DefaultRSABurstPerPeer the most it may spend at once (a few hundred
	// secured channels and sessions opened together from one address, as
	// a proxy's clients do).
	DefaultRSAOpsPerPeer   = 200
	DefaultRSABurstPerPeer = 2000
	// DefaultSecretOpsPerSecond is the server-wide budget of RSA blocks a
	// second decrypted for the user secrets of addresses with failed
	// logins (about a quarter of a core), at most twice it at once.
	DefaultSecretOpsPerSecond = 200
	// DefaultMaxSubscriptions bounds live subscriptions of all sessions
	// (10 000); each session may have at most 1000.
	DefaultMaxSubscriptions = subscription.DefaultMaxSubscriptionsTotal
	// DefaultAnonymousSubscriptionShare is the share of MaxSubscriptions
	// and of MaxPublishRate anonymous sessions together may hold (½).
	DefaultAnonymousSubscriptionShare = subscription.DefaultAnonymousShare
	// DefaultMinPublishingInterval is the fastest publishing interval
	// granted (10 ms): every subscription's loop wakes once an interval.
	DefaultMinPublishingInterval = 10 * time.Millisecond
)

// Parameters of the fault switches.
const (
	// LostResponseEvery is the lost-response fault's period: the 500th,
	// 1000th, … Read of each channel gets no answer.
	LostResponseEvery = 500
	// RetainPerRequest is what the retain-memory fault keeps per served
	// Read request (16 KiB).
	RetainPerRequest = 16 << 10
	// SlowLeakPerRequest is what the slow-leak fault keeps per served
	// Read request (64 B).
	SlowLeakPerRequest = 64
	// TrickleLeakPerSecond is what the trickle-leak fault keeps per
	// second of wall time (4 KiB: about 14 MiB/hour).
	TrickleLeakPerSecond = 4 << 10
	// TrickleLeakEvery is how often the trickle-leak fault keeps what
	// the time since the server started owes.
	TrickleLeakEvery = time.Second
	// SkipSequenceEvery is the skipped-sequence fault's period: sequence
	// numbers 50, 100, … are skipped.
	SkipSequenceEvery = 50
	// DuplicateSampleEvery is the duplicate-samples fault's period: the
	// 200th, 400th, … sample of each monitored item is queued twice.
	DuplicateSampleEvery = 200
)

// Faults is a set of enabled fault switches.
type Faults map[catalog.Fault]bool

// Has reports whether f is on.
func (fs Faults) Has(f catalog.Fault) bool { return fs[f] }

// String lists the enabled faults, sorted, comma separated ("none" if empty).
func (fs Faults) String() string { return switchList(fs) }

// ParseFaults parses a comma separated list of fault names, each with
// "=value" where the switch takes one (catalog.CheckFault); the values
// are ParseFaultValues'.
func ParseFaults(s string) (Faults, error) {
	fs, _, err := ParseFaultValues(s)
	return fs, err
}

// ParseFaultValues parses a fault list as ParseFaults does and returns
// the slow-read fault's value too (its default when the switch is given
// without one; zero when it is off).
func ParseFaultValues(s string) (Faults, catalog.SlowRead, error) {
	set := Faults{}
	var slow catalog.SlowRead
	for _, item := range splitList(s) {
		f, v, err := catalog.CheckFault(item)
		if err != nil {
			return nil, slow, err
		}
		set[f] = true
		if f == catalog.FaultSlowRead {
			slow, _ = catalog.ParseSlowRead(v) // checked by CheckFault
		}
	}
	return set, slow, nil
}

// switchList lists the switches on in set, sorted, comma separated ("none"
// if none is).
func switchList[S ~map[K]bool, K ~string](set S) string {
	var names []string
	for k, on := range set {
		if on {
			names = append(names, string(k))
		}
	}
	if len(names) == 0 {
		return "none"
	}
	sort.Strings(names)
	return strings.Join(names, ",")
}

// parseSwitches parses a comma separated list of switch names, each one of
// all; kind names a switch in the error.
func parseSwitches[S ~map[K]bool, K ~string](s, kind string, all []K) (S, error) {
	set := S{}
	for _, name := range splitList(s) {
		k := K(name)
		if !slices.Contains(all, k) {
			valid := make([]string, len(all))
			for i, a := range all {
				valid[i] = string(a)
			}
			return nil, fmt.Errorf("unknown %s %q (valid: %s)", kind, name, strings.Join(valid, ", "))
		}
		set[k] = true
	}
	return set, nil
}

// ParseUsers parses "name:password,name2:password2".
func ParseUsers(s string) (map[string]string, error) {
	users := map[string]string{}
	for _, item := range splitList(s) {
		name, pass, ok := strings.Cut(item, ":")
		if !ok || name == "" {
			return nil, fmt.Errorf("bad user entry %q: want name:password", item)
		}
		if _, dup := users[name]; dup {
			return nil, fmt.Errorf("user %q listed twice", name)
		}
		users[name] = pass
	}
	return users, nil
}

// ParseWeights parses "owner:weight,owner2:weight2" with weights ≥ 1.
func ParseWeights(s string) (map[string]int, error) {
	weights := map[string]int{}
	for _, item := range splitList(s) {
		name, w, ok := strings.Cut(item, ":")
		n, err := strconv.Atoi(w)
		if !ok || name == "" || err != nil || n < 1 || n > 1_000_000 {
			return nil, fmt.Errorf("bad owner weight %q: want owner:weight with weight 1..1000000", item)
		}
		weights[name] = n
	}
	return weights, nil
}

func splitList(s string) []string {
	var out []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

// Config configures a Server. The zero value of a field means its default.
type Config struct {
	// Listen is the TCP address ListenAndServe listens on (DefaultListen).
	Listen string
	// Users maps user names to passwords for UserName identity tokens.
	Users map[string]string
	// NoAnonymous rejects anonymous sessions.
	NoAnonymous bool
	// PrivateKey and Certificate (DER) are the application instance
	// key and certificate, advertised in the endpoints and used to decrypt
	// user-name passwords. Set both or neither: without them New generates
	// an RSA-2048 key and a self-signed certificate with ApplicationURI in
	// its subjectAltName. A given certificate must name ApplicationURI
	// too, with an RSA key of 2048 to 4096 bits.
	PrivateKey  *rsa.PrivateKey
	Certificate []byte
	// OwnerWeights are the fair queue weights per owner (default 1).
	OwnerWeights map[string]int
	// Workers is the worker pool size (default max(8, 2×GOMAXPROCS)).
	Workers int
	// QueueSize bounds the number of queued requests (DefaultQueueSize).
	QueueSize int
	// OwnerQueueSize bounds one owner's queued requests (default QueueSize/2).
	OwnerQueueSize int
	// HighMark and LowMark are the per-channel backpressure marks
	// (DefaultHighMark, DefaultLowMark).
	HighMark, LowMark int
	// MinSessionTimeout is the smallest revised session timeout (100 ms).
	MinSessionTimeout time.Duration
	// MaxSessions bounds concurrent sessions (1000). At it CreateSession
	// closes the oldest orphaned anonymous session (its channel closed),
	// else the oldest unactivated one, and only then answers
	// BadTooManySessions; user sessions are never closed to make room.
	MaxSessions int
	// MaxMonitoredItemsPerCall bounds the items of one CreateMonitoredItems
	// call (BadTooManyOperations beyond; advertised in
	// ServerCapabilities.OperationLimits); MaxMonitoredItemsPerSession and
	// MaxMonitoredItems bound live items per session and in all (an item
	// beyond gets BadTooManyMonitoredItems). Defaults:
	// subscription.DefaultMaxItemsPerCall, DefaultMaxItemsPerSession,
	// DefaultMaxItemsTotal (10000, 20000, 100000).
	MaxMonitoredItemsPerCall, MaxMonitoredItemsPerSession, MaxMonitoredItems int
	// MaxSubscriptions bounds live subscriptions of all sessions
	// (DefaultMaxSubscriptions; each session may have at most 1000):
	// CreateSubscription beyond it is answered BadTooManySubscriptions.
	MaxSubscriptions int
	// MaxPublishRate bounds the publishing cycles per second of all
	// subscriptions together (subscription.DefaultMaxPublishRate,
	// 100 000: 1000 subscriptions at 10 ms): each cycle wakes the
	// subscription's loop. CreateSubscription that would go past it is
	// answered BadTooManySubscriptions.
	MaxPublishRate float64
	// AnonymousSubscriptionShare is the share of MaxSubscriptions and of
	// MaxPublishRate that the subscriptions of anonymous sessions (no
	// user identity at CreateSubscription) may hold together
	// (DefaultAnonymousSubscriptionShare, ½; at most 1, which shares
	// nothing): beyond it an anonymous CreateSubscription is answered
	// BadTooManySubscriptions while user sessions still get theirs, so
	// anonymous clients cannot take every subscription from the users. A
	// subscription keeps the class it was charged to, also when it is
	// transferred.
	AnonymousSubscriptionShare float64
	// MinPublishingInterval is the fastest publishing interval granted
	// (DefaultMinPublishingInterval); requests below it are revised up
	// to it. Sampling intervals are separate (1 ms at the fastest).
	MinPublishingInterval time.Duration
	// Counters is the number of SampledCounter.<i> and FastCounter.<i>
	// nodes (subscription.DefaultCounters, 4096).
	Counters int

	// MaxConnections bounds open TCP connections, handshakes included
	// (DefaultMaxConnections). At it, the oldest connection without an
	// activated session (a handshake, or a channel no session was
	// activated on) is closed to make room; only when every connection
	// has one does a new connection get an ERR message
	// BadMaxConnectionsReached and is closed.
	MaxConnections int
	// HandshakeTimeout bounds the time from connect to the end of the first
	// OpenSecureChannel (DefaultHandshakeTimeout).
	HandshakeTimeout time.Duration
	// MinChannelLifetime is the shortest security token lifetime granted
	// in OpenSecureChannel; a shorter request is revised up to it
	// (DefaultMinChannelLifetime).
	MinChannelLifetime time.Duration
	// MaxUnactivatedSessions bounds sessions created but not yet activated
	// (default MaxSessions/2): at it CreateSession closes the oldest
	// unactivated session to make room (the fault unactivated-refuse
	// answers BadTooManySessions instead).
	MaxUnactivatedSessions int
	// UnactivatedTimeout closes a session that is not activated within it
	// (DefaultUnactivatedTimeout).
	UnactivatedTimeout time.Duration
	// MaxMessageSize bounds one request, all chunks (DefaultMaxMessageSize);
	// MaxChunkCount bounds its chunks (DefaultMaxChunkCount). Beyond
	// either the channel is closed with ERR BadRequestTooLarge.
	MaxMessageSize, MaxChunkCount int
	// MaxBufferedChunks and MaxBufferedBytes bound the chunks held per
	// channel for requests not yet complete, all request ids together
	// (default MaxChunkCount and MaxMessageSize). Beyond either the
	// channel is closed with ERR BadTcpMessageTooLarge.
	MaxBufferedChunks, MaxBufferedBytes int
	// MaxDecodeDepth bounds the nesting of values in a request
	// (uabin.DefaultMaxDepth, 100).
	MaxDecodeDepth int
	// LoginDelay, LoginDelayMax and LoginFreeFailures slow down failed
	// logins per peer IP and user name: after LoginFreeFailures failed
	// ActivateSession calls, the next one is checked and answered
	// LoginDelay after it arrived, each further one twice as late, up to
	// LoginDelayMax; a success resets (DefaultLoginDelay,
	// DefaultLoginDelayMax, DefaultLoginFreeFailures). User-name logins
	// are also counted per user and per peer IP, each of those delays
	// capped at 1 s; a login waits the largest that applies. The wait is
	// a timer: no worker or channel reader sleeps.
	LoginDelay, LoginDelayMax time.Duration
	LoginFreeFailures         int
	// MemoryBudget is the byte budget of memory hostile peers can make the
	// server hold (budget.DefaultLimit, 256 MiB): unfinished chunks of all
	// channels, queued requests by size, held logins, monitored-item
	// queues, per-session strings, responses waiting to be sent, parked
	// Publish requests and retransmission queues, each class within a
	// share of it (see package budget). A request that does not fit is refused with a
	// status, never held.
	MemoryBudget int64
	// IdleTimeout closes a secure channel on which no session was
	// activated within it after OpenSecureChannel
	// (DefaultIdleTimeout); the token lifetime is enforced beside it
	// (a channel not renewed within 125 % of its lifetime is closed).
	IdleTimeout time.Duration
	// WriteTimeout closes a secure channel when a write of its responses
	// makes no progress for that long (DefaultWriteTimeout), releasing
	// what its send queue held.
	WriteTimeout time.Duration
	// MaxUnsentPerChannel is one channel's share of encoded response
	// bytes waiting to be sent (DefaultMaxUnsent): its reader stops above
	// it, and a further large response is answered
	// BadResourceUnavailable. All channels together are bounded by the
	// memory budget's responses class.
	MaxUnsentPerChannel int64
	// MaxHeldLoginsPerPeer bounds the ActivateSession calls the login
	// throttle holds for one peer IP (DefaultMaxHeldLogins); beyond it
	// an ActivateSession is answered BadTooManyOperations at once.
	MaxHeldLoginsPerPeer int
	// MaxSecretBlocks bounds the RSA blocks of an encrypted user secret
	// (DefaultMaxSecretBlocks); a longer one is BadIdentityTokenInvalid,
	// never decrypted.
	MaxSecretBlocks int
	// MaxStringLength bounds the client strings a session keeps (session
	// name, endpoint URL, ...): longer ones are truncated
	// (DefaultMaxStringLength).
	MaxStringLength int
	// MaxNodeIDLength bounds the identifier of a string or opaque NodeId
	// the server resolves, in bytes (DefaultMaxNodeIDLength): a longer
	// one is BadNodeIdInvalid in Read, Browse and CreateMonitoredItems,
	// never looked up, kept or sampled.
	MaxNodeIDLength int
	// MaxOPNBlocks bounds the RSA blocks of a secured OpenSecureChannel
	// request (DefaultMaxOPNBlocks): a longer one closes the channel with
	// BadSecurityChecksFailed before any block is decrypted.
	MaxOPNBlocks int
	// RSAOpsPerPeer and RSABurstPerPeer are one peer address's budget of
	// RSA private-key operations (DefaultRSAOpsPerPeer a second, at most
	// DefaultRSABurstPerPeer at once): the blocks of its secured
	// OpenSecureChannel requests and the signatures of its CreateSession
	// calls. An OpenSecureChannel over it is refused with ERR
	// BadTcpServerTooBusy, a CreateSession with BadTooManyOperations,
	// neither decrypted nor signed.
	RSAOpsPerPeer, RSABurstPerPeer int
	// SecretOpsPerSecond is the server-wide budget of RSA blocks
	// decrypted a second (DefaultSecretOpsPerSecond, at most twice it at
	// once) for the encrypted user secrets of ActivateSession from peer
	// addresses that failed LoginFreeFailures logins or more: over it
	// such an attempt is answered BadTooManyOperations, not decrypted.
	// Many addresses each within their own throttle cannot together
	// keep the server's cores decrypting; an address without failed
	// logins is not charged, so a client that knows its password is
	// never refused for others' guesses.
	SecretOpsPerSecond int
	// MaxAnonymousSessions bounds the sessions of anonymous identity
	// (default MaxSessions/2), so anonymous clients cannot take the
	// places of user logins.
	MaxAnonymousSessions int
	// AnonymousYieldIdle is how long an anonymous session on a live
	// channel must have gone without a request to yield its place to a
	// fresh anonymous activation at MaxAnonymousSessions from a peer
	// address holding as many anonymous sessions as its own (0:
	// session.DefaultYieldIdle, 2 s); from a peer holding fewer, the
	// idlest session of the peer holding the most yields at once.
	AnonymousYieldIdle time.Duration
	// NoServiceTimeNodes removes the Slow.<ms> and Busy.<µs> nodes, which
	// let any client pin the workers (for deployments that must not offer
	// them).
	NoServiceTimeNodes bool
	// ShutdownTimeout bounds how long Serve waits for in-flight work once
	// its context is done (DefaultShutdownTimeout).
	ShutdownTimeout time.Duration
	// Faults are the enabled fault switches.
	Faults Faults
	// SlowRead is the slow-read fault's work per Read (its default,
	// catalog.DefaultSlowReadShare, when the fault is on and this is
	// zero).
	SlowRead catalog.SlowRead
	// Quirks are the enabled quirk switches: conformant variations.
	Quirks Quirks
	// TrustDir is the folder of trusted client certificates under the
	// quirk trusted-certs-only (default TrustedCertsDir).
	TrustDir string
	// Security is the set of message security modes offered (nil: all of
	// None, Sign and SignAndEncrypt; see ParseSecurityModes).
	Security SecurityModes
	// Logger receives the server's log; nil means slog.Default().
	Logger *slog.Logger

	// unthrottledSigning and unbudgetedSecrets undo the per-address
	// budget of CreateSession signatures and the server-wide budget of
	// user-secret decryption, for the in-process tests that show each
	// holds. They are not fault switches: a signature costs about 1 ms,
	// far under what the amplification checks allow, and the suites
	// reach the server from two peer addresses, each held by its own
	// throttle, so black-box neither is told from the protected server
	// (catalog.AllFaults lists only what the suites are shown to catch).
	unthrottledSigning, unbudgetedSecrets bool
}

// LoadConfig builds a Config from command line args (without the program
// name) with environment fallback through getenv:
//
//	-listen / OPCUA_LISTEN            listen address (0.0.0.0:4840)
//	OPCUA_USERS                       name:password,... (DefaultUsers)
//	OPCUA_ANONYMOUS                   "false" rejects anonymous sessions
//	OPCUA_OWNER_WEIGHTS               owner:weight,... (DefaultWeights)
//	-workers / OPCUA_WORKERS          worker pool size
//	-queue / OPCUA_QUEUE_SIZE         total queue bound
//	OPCUA_OWNER_QUEUE_SIZE            per-owner queue ceiling
//	OPCUA_BACKPRESSURE                high:low pending responses (100:50)
//	OPCUA_COUNTERS                    SampledCounter/FastCounter nodes (4096)
//	OPCUA_FAULTS                      fault switches, comma separated
//	OPCUA_QUIRKS                      quirk switches, comma separated
//	OPCUA_SECURITY                    modes offered: none,sign,sign-encrypt (all)
//	OPCUA_MAX_CONNECTIONS             open connections (1000)
//	OPCUA_HANDSHAKE_TIMEOUT           connect to first OpenSecureChannel (10s)
//	OPCUA_MIN_CHANNEL_LIFETIME        shortest channel token lifetime granted (10s)
//	OPCUA_MAX_SESSIONS                sessions (1000)
//	OPCUA_MAX_UNACTIVATED_SESSIONS    sessions not yet activated (sessions/2)
//	OPCUA_UNACTIVATED_TIMEOUT         activation deadline of a session (30s)
//	OPCUA_MAX_MESSAGE_SIZE            bytes of one request (2097152)
//	OPCUA_MAX_CHUNK_COUNT             chunks of one request (512)
//	OPCUA_MAX_BUFFERED_CHUNKS         chunks of unfinished requests per channel (512)
//	OPCUA_MAX_BUFFERED_BYTES          their bytes (2097152)
//	OPCUA_MAX_DECODE_DEPTH            nesting of values in a request (100)
//	OPCUA_MAX_MONITORED_ITEMS_PER_CALL    items of one CreateMonitoredItems (10000)
//	OPCUA_MAX_MONITORED_ITEMS_PER_SESSION live items of one session (20000)
//	OPCUA_MAX_MONITORED_ITEMS         live items, all sessions (100000)
//	OPCUA_LOGIN_DELAY                 first delay of a failed login (100ms)
//	OPCUA_LOGIN_DELAY_MAX             its cap (5s)
//	OPCUA_LOGIN_FREE_FAILURES         failed logins (per peer IP and user, user, peer IP) before delays (3)
//	OPCUA_SHUTDOWN_TIMEOUT            wait for in-flight work on stop (5s)
//	OPCUA_MEMORY_BUDGET               bytes hostile peers can make it hold (268435456)
//	OPCUA_IDLE_TIMEOUT                channel open without an activated session (10s)
//	OPCUA_MAX_HELD_LOGINS             logins the throttle holds per peer IP (16)
//	OPCUA_MAX_SECRET_BLOCKS           RSA blocks of an encrypted user secret (16)
//	OPCUA_MAX_STRING_LENGTH           client strings a session keeps (4096)
//	OPCUA_MAX_ANONYMOUS_SESSIONS      anonymous sessions (sessions/2)
//	OPCUA_MAX_SUBSCRIPTIONS           live subscriptions, all sessions (10000)
//	OPCUA_ANONYMOUS_SUBSCRIPTION_SHARE  share of them and of the publishing rate anonymous sessions may hold (0.5)
//	OPCUA_SERVICE_TIME_NODES          "false" removes the Slow/Busy nodes
//
// Durations are Go durations ("10s", "250ms").
//
// Errors name the offending flag or variable.
func LoadConfig(args []string, getenv func(string) string, output io.Writer) (Config, error) {
	var cfg Config
	env := func(k, def string) string {
		if v := getenv(k); v != "" {
			return v
		}
		return def
	}
	fset := flag.NewFlagSet("opcua-refserver", flag.ContinueOnError)
	fset.SetOutput(output)
	listen := fset.String("listen", env("OPCUA_LISTEN", DefaultListen), "listen address host:port (env OPCUA_LISTEN)")
	workers := fset.String("workers", env("OPCUA_WORKERS", ""), "worker pool size (env OPCUA_WORKERS)")
	queue := fset.String("queue", env("OPCUA_QUEUE_SIZE", ""), "total request queue bound (env OPCUA_QUEUE_SIZE)")
	faults := fset.String("faults", env("OPCUA_FAULTS", ""), "fault switches, comma separated (env OPCUA_FAULTS)")
	quirks := fset.String("quirks", env("OPCUA_QUIRKS", ""), "quirk switches, comma separated (env OPCUA_QUIRKS)")
	if err := fset.Parse(args); err != nil {
		return cfg, err
	}
	if fset.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected argument %q", fset.Arg(0))
	}

	if _, _, err := net.SplitHostPort(*listen); err != nil {
		return cfg, fmt.Errorf("bad listen address %q (-listen/OPCUA_LISTEN): %v", *listen, err)
	}
	cfg.Listen = *listen

	var err error
	if cfg.Users, err = ParseUsers(env("OPCUA_USERS", DefaultUsers)); err != nil {
		return cfg, fmt.Errorf("OPCUA_USERS: %v", err)
	}
	switch v := strings.ToLower(getenv("OPCUA_ANONYMOUS")); v {
	case "", "true", "1", "yes":
	case "false", "0", "no":
		cfg.NoAnonymous = true
	default:
		return cfg, fmt.Errorf("OPCUA_ANONYMOUS: want true or false, got %q", v)
	}
	if cfg.OwnerWeights, err = ParseWeights(env("OPCUA_OWNER_WEIGHTS", DefaultWeights)); err != nil {
		return cfg, fmt.Errorf("OPCUA_OWNER_WEIGHTS: %v", err)
	}
	if cfg.Workers, err = positive(*workers, "-workers/OPCUA_WORKERS"); err != nil {
		return cfg, err
	}
	if cfg.QueueSize, err = positive(*queue, "-queue/OPCUA_QUEUE_SIZE"); err != nil {
		return cfg, err
	}
	if cfg.OwnerQueueSize, err = positive(getenv("OPCUA_OWNER_QUEUE_SIZE"), "OPCUA_OWNER_QUEUE_SIZE"); err != nil {
		return cfg, err
	}
	if cfg.Counters, err = positive(getenv("OPCUA_COUNTERS"), "OPCUA_COUNTERS"); err != nil {
		return cfg, err
	}
	if cfg.Counters > MaxCounters {
		return cfg, fmt.Errorf("OPCUA_COUNTERS: at most %d, got %d", MaxCounters, cfg.Counters)
	}
	for _, v := range []struct {
		env string
		dst *int
	}{
		{"OPCUA_MAX_CONNECTIONS", &cfg.MaxConnections},
		{"OPCUA_MAX_SESSIONS", &cfg.MaxSessions},
		{"OPCUA_MAX_UNACTIVATED_SESSIONS", &cfg.MaxUnactivatedSessions},
		{"OPCUA_MAX_MESSAGE_SIZE", &cfg.MaxMessageSize},
		{"OPCUA_MAX_CHUNK_COUNT", &cfg.MaxChunkCount},
		{"OPCUA_MAX_BUFFERED_CHUNKS", &cfg.MaxBufferedChunks},
		{"OPCUA_MAX_BUFFERED_BYTES", &cfg.MaxBufferedBytes},
		{"OPCUA_MAX_DECODE_DEPTH", &cfg.MaxDecodeDepth},
		{"OPCUA_MAX_MONITORED_ITEMS_PER_CALL", &cfg.MaxMonitoredItemsPerCall},
		{"OPCUA_MAX_MONITORED_ITEMS_PER_SESSION", &cfg.MaxMonitoredItemsPerSession},
		{"OPCUA_MAX_MONITORED_ITEMS", &cfg.MaxMonitoredItems},
		{"OPCUA_MAX_SUBSCRIPTIONS", &cfg.MaxSubscriptions},
		{"OPCUA_LOGIN_FREE_FAILURES", &cfg.LoginFreeFailures},
		{"OPCUA_MAX_HELD_LOGINS", &cfg.MaxHeldLoginsPerPeer},
		{"OPCUA_MAX_SECRET_BLOCKS", &cfg.MaxSecretBlocks},
		{"OPCUA_MAX_STRING_LENGTH", &cfg.MaxStringLength},
		{"OPCUA_MAX_NODEID_LENGTH", &cfg.MaxNodeIDLength},
		{"OPCUA_MAX_OPN_BLOCKS", &cfg.MaxOPNBlocks},
		{"OPCUA_RSA_OPS_PER_PEER", &cfg.RSAOpsPerPeer},
		{"OPCUA_RSA_BURST_PER_PEER", &cfg.RSABurstPerPeer},
		{"OPCUA_SECRET_OPS_PER_SECOND", &cfg.SecretOpsPerSecond},
		{"OPCUA_MAX_ANONYMOUS_SESSIONS", &cfg.MaxAnonymousSessions},
	} {
		if *v.dst, err = positive(getenv(v.env), v.env); err != nil {
			return cfg, err
		}
	}
	for _, v := range []struct {
		env string
		dst *time.Duration
	}{
		{"OPCUA_HANDSHAKE_TIMEOUT", &cfg.HandshakeTimeout},
		{"OPCUA_MIN_CHANNEL_LIFETIME", &cfg.MinChannelLifetime},
		{"OPCUA_UNACTIVATED_TIMEOUT", &cfg.UnactivatedTimeout},
		{"OPCUA_LOGIN_DELAY", &cfg.LoginDelay},
		{"OPCUA_LOGIN_DELAY_MAX", &cfg.LoginDelayMax},
		{"OPCUA_SHUTDOWN_TIMEOUT", &cfg.ShutdownTimeout},
		{"OPCUA_IDLE_TIMEOUT", &cfg.IdleTimeout},
	} {
		if *v.dst, err = duration(getenv(v.env), v.env); err != nil {
			return cfg, err
		}
	}
	if v := getenv("OPCUA_ANONYMOUS_SUBSCRIPTION_SHARE"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || !(f > 0 && f <= 1) {
			return cfg, fmt.Errorf("OPCUA_ANONYMOUS_SUBSCRIPTION_SHARE: want a share above 0, at most 1, got %q", v)
		}
		cfg.AnonymousSubscriptionShare = f
	}
	if v := getenv("OPCUA_MEMORY_BUDGET"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1<<20 {
			return cfg, fmt.Errorf("OPCUA_MEMORY_BUDGET: want bytes, at least 1048576, got %q", v)
		}
		cfg.MemoryBudget = n
	}
	switch v := strings.ToLower(getenv("OPCUA_SERVICE_TIME_NODES")); v {
	case "", "true", "1", "yes":
	case "false", "0", "no":
		cfg.NoServiceTimeNodes = true
	default:
		return cfg, fmt.Errorf("OPCUA_SERVICE_TIME_NODES: want true or false, got %q", v)
	}
	if bp := getenv("OPCUA_BACKPRESSURE"); bp != "" {
		hi, lo, ok := strings.Cut(bp, ":")
		h, err1 := strconv.Atoi(hi)
		l, err2 := strconv.Atoi(lo)
		if !ok || err1 != nil || err2 != nil || h < 2 || l < 1 || l >= h {
			return cfg, fmt.Errorf("OPCUA_BACKPRESSURE: want high:low with high > low ≥ 1, got %q", bp)
		}
		cfg.HighMark, cfg.LowMark = h, l
	}
	if cfg.Faults, cfg.SlowRead, err = ParseFaultValues(*faults); err != nil {
		return cfg, fmt.Errorf("OPCUA_FAULTS: %v", err)
	}
	if cfg.Quirks, err = ParseQuirks(*quirks); err != nil {
		return cfg, fmt.Errorf("OPCUA_QUIRKS: %v", err)
	}
	if cfg.Security, err = ParseSecurityModes(getenv("OPCUA_SECURITY")); err != nil {
		return cfg, fmt.Errorf("OPCUA_SECURITY: %v", err)
	}
	return cfg, nil
}

func positive(s, name string) (int, error) {
	if s == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("%s: want a positive integer, got %q", name, s)
	}
	return n, nil
}

// duration parses a positive Go duration; "" gives 0 (the default).
func duration(s, name string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%s: want a positive duration such as 10s, got %q", name, s)
	}
	return d, nil
}

// ErrHelp is returned by LoadConfig for -h/-help.
var ErrHelp = flag.ErrHelp
