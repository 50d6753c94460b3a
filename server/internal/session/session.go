// Package session keeps the reference server's sessions: creation with a
// random authentication token and server nonce, activation with a user
// identity (each issuing a new server nonce), lookup by token on every
// service call, close and timeout.
//
// The table cannot be locked by a flood: at MaxUnactivated the oldest
// unactivated session makes room for a new one; anonymous sessions hold at
// most MaxAnonymous places; and a session whose secure channel closed
// (an orphan, see Manager.ChannelClosed) stays resumable on a new channel
// until it expires, or, if anonymous, until a new session needs its place.
package session

import (
	"bytes"
	"crypto/rand"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gopcua/opcua/ua"
)

// Session is one OPC UA session.
type Session struct {
	// ID is the public session id.
	ID *ua.NodeID
	// Token is the secret authentication token clients put in every header.
	Token *ua.NodeID
	// Name is the client's session name.
	Name string
	// Timeout is the revised session timeout.
	Timeout time.Duration

	key      string
	lastSeen atomic.Int64 // unix nanos
	created  time.Time
	m        *Manager
	seq      uint64 // creation order

	// Guarded by m.mu (the manager's bookkeeping).
	anon   bool   // activated with the anonymous identity: counted in m.anonymous
	orphan uint64 // when its channel closed (the manager's orphan sequence); 0 while bound to an open channel
	bound  bool   // activated and counted in m.bound under boundTo (its channel open)
	// boundTo is the channel it is counted under in m.bound.
	boundTo uint32
	// peer is the network address (host) of the channel it was last
	// activated on: anonymous places yield by peer (anonymousPlaceLocked).
	peer string

	mu        sync.Mutex
	activated bool
	user      string // "" when anonymous
	channelID uint32
	nonce     []byte // the last server nonce sent to the client
	closed    bool
	onClose   []func()
	appURI    string // the client's ApplicationUri (CreateSession)
	certHash  string // the SHA-256 of the client certificate of its channel at CreateSession; "" on None
}

// SetClient records the client's ApplicationUri from CreateSession and the
// SHA-256 of the client certificate its secure channel was opened with
// ("" on a channel without security).
func (s *Session) SetClient(appURI, certHash string) {
	s.mu.Lock()
	s.appURI, s.certHash = appURI, certHash
	s.mu.Unlock()
}

// ClientCertificate returns the SHA-256 of the client certificate the
// session was created with, "" if none.
func (s *Session) ClientCertificate() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.certHash
}

// ClientAppURI returns the client's ApplicationUri from CreateSession.
func (s *Session) ClientAppURI() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.appURI
}

// Touch records activity now; the session times out Timeout after the last
// activity.
func (s *Session) Touch(now time.Time) { s.lastSeen.Store(now.UnixNano()) }

// NonceSize is the length of a server nonce (Part 4 asks for at least 32
// bytes).
const NonceSize = 32

func newNonce() []byte {
	b := make([]byte, NonceSize)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return b
}

// ServerNonce returns the last server nonce sent to the client: the one of
// CreateSession, or of the last successful ActivateSession. A client proves
// it knows it in the identity token's encrypted secret.
func (s *Session) ServerNonce() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return bytes.Clone(s.nonce)
}

// Activate marks the session active for user ("" for anonymous) on the
// secure channel channelID of the peer address peer, if nonce (the
// ServerNonce the caller checked the identity against) is still the
// session's server nonce, and issues and returns the next server nonce.
// On refusal it returns the status and why, and changes nothing: BadIdentityTokenInvalid when another activation
// replaced the nonce in between, BadSessionIDInvalid when the session was
// closed meanwhile; under Limits.AnonymousRefuse, BadTooManySessions when
// the session would become anonymous beyond the manager's anonymous share
// and no orphaned anonymous session can make room. (Without it an
// anonymous session always makes room: see anonymousPlaceLocked.)
func (s *Session) Activate(user string, channelID uint32, peer string, nonce []byte) (next []byte, code ua.StatusCode, why string) {
	next = newNonce()
	m := s.m
	m.mu.Lock()
	s.mu.Lock()
	var evicted *Session
	evictedOrphan := false
	switch {
	case m.byKey[s.key] != s:
		code, why = ua.StatusBadSessionIDInvalid, "session closed"
	case !bytes.Equal(nonce, s.nonce):
		code, why = ua.StatusBadIdentityTokenInvalid, "server nonce replaced by a concurrent activation"
	case user == "" && !s.anon:
		if evicted = m.anonymousPlaceLocked(s, peer); evicted != nil {
			evictedOrphan = evicted.orphan != 0
		} else if len(m.anonymous) >= m.lim.MaxAnonymous {
			m.anonRefused++
			code, why = ua.StatusBadTooManySessions, "too many anonymous sessions"
		}
	}
	if code != ua.StatusOK {
		s.mu.Unlock()
		m.mu.Unlock()
		return nil, code, why
	}
	s.activated = true
	s.user = user
	s.channelID = channelID
	s.nonce = next
	s.mu.Unlock()
	// Bound to an open channel again: no longer an orphan.
	s.orphan = 0
	s.peer = peer
	m.unbindLocked(s)
	s.bound, s.boundTo = true, channelID
	m.bound[channelID]++
	delete(m.unactivated, s)
	switch {
	case user == "":
		s.anon = true
		m.anonymous[s] = struct{}{}
	case s.anon:
		s.anon = false
		delete(m.anonymous, s)
	}
	m.mu.Unlock()
	if evicted != nil {
		m.log.Info("closed an anonymous session to make room for an anonymous activation",
			"closed", evicted.ID.String(), "name", evicted.Name, "orphaned", evictedOrphan,
			"idle", time.Since(time.Unix(0, evicted.lastSeen.Load())).Round(time.Millisecond),
			"session", s.ID.String(), "max_anonymous", m.lim.MaxAnonymous)
		evicted.close()
	}
	return bytes.Clone(next), ua.StatusOK, ""
}

// State returns whether the session is activated, its user name ("" when
// anonymous) and the secure channel it is bound to.
func (s *Session) State() (activated bool, user string, channelID uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.activated, s.user, s.channelID
}

// OnClose registers f to run once when the session is closed or times out.
// If the session is already closed, f runs at once. It reports whether the
// session was still open.
func (s *Session) OnClose(f func()) bool {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		f()
		return false
	}
	s.onClose = append(s.onClose, f)
	s.mu.Unlock()
	return true
}

// Closed reports whether the session has been closed.
func (s *Session) Closed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

func (s *Session) close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	fs := s.onClose
	s.onClose = nil
	s.mu.Unlock()
	for _, f := range fs {
		f()
	}
}

// Limits bound session timeouts and counts.
type Limits struct {
	MinTimeout     time.Duration // default 100 ms
	MaxTimeout     time.Duration // default 1 h
	DefaultTimeout time.Duration // used when the client asks for 0; default 60 s
	MaxSessions    int           // default 1000
	// MaxUnactivated bounds sessions created but never activated; default
	// MaxSessions/2, so that sessions nobody activates cannot take every
	// slot.
	MaxUnactivated int
	// UnactivatedTimeout closes a session not activated within it after
	// its creation (whatever its session timeout); default 30 s.
	UnactivatedTimeout time.Duration
	// MaxAnonymous bounds the sessions activated with the anonymous
	// identity (default MaxSessions/2), so anonymous clients cannot take
	// the places of user logins. Beyond it an anonymous activation closes
	// the oldest orphaned anonymous session, else the idlest anonymous
	// session of the peer address holding the most: anonymous sessions on
	// live channels cannot lock another peer's fresh anonymous client out.
	MaxAnonymous int
	// AnonymousRefuse is the anonymous-full-refuses fault: at MaxAnonymous
	// an anonymous activation closes an orphaned anonymous session or is
	// refused BadTooManySessions; sessions on live channels never yield.
	AnonymousRefuse bool
	// YieldIdle is how long an anonymous session on a live channel must
	// have been idle (no request) to yield its place to an activation from
	// a peer address holding as many anonymous sessions as its own
	// (default DefaultYieldIdle): a client's busy sessions keep theirs, so
	// a server at its anonymous share still refuses that client one more
	// beside them. A peer holding fewer takes the place at once.
	YieldIdle time.Duration
	// NeverExpire is the sessions-never-expire fault: an activated session
	// idle for longer than its timeout is never closed. Sessions not yet
	// activated still expire (UnactivatedTimeout, and their own timeout).
	NeverExpire bool
	// OutliveChannels is the sessions-outlive-channels fault: anonymous
	// sessions have no share of their own (MaxAnonymous is MaxSessions)
	// and an orphaned session is never closed to make room: it stays for
	// its full timeout.
	OutliveChannels bool
	// UnactivatedRefuse is the unactivated-refuse fault: CreateSession is
	// refused at MaxUnactivated (and at MaxSessions) instead of closing the
	// oldest unactivated session.
	UnactivatedRefuse bool
	// Logger receives the evictions (slog.Default()).
	Logger *slog.Logger
}

// DefaultMaxSessions is Limits.MaxSessions when it is not set.
const DefaultMaxSessions = 1000

// DefaultYieldIdle is Limits.YieldIdle when it is not set.
const DefaultYieldIdle = 2 * time.Second

// Counts are the manager's diagnostics.
type Counts struct {
	Current     int
	Cumulated   int64
	Timeouts    int64 // timed out, unactivated ones included
	Rejected    int64 // CreateSession refused (too many sessions, or unactivated ones)
	Closed      int64 // closed by CloseSession
	Unactivated int   // created, not yet activated
	// UnactivatedExpired counts sessions closed because they were not
	// activated in time (also counted in Timeouts).
	UnactivatedExpired int64
	// Anonymous are the sessions activated with the anonymous identity;
	// Orphaned the activated sessions whose channel closed.
	Anonymous, Orphaned int
	// AnonymousYielded counts anonymous sessions on live channels closed
	// (the one idle longest) to make room for an anonymous activation at
	// the anonymous share.
	AnonymousYielded int64
	// UnactivatedEvicted counts unactivated sessions closed to make room
	// for a new one; OrphansEvicted orphaned anonymous sessions closed to
	// make room; AnonymousRefused anonymous activations refused
	// BadTooManySessions (the anonymous share was full).
	UnactivatedEvicted, OrphansEvicted, AnonymousRefused int64
}

// Manager holds all sessions of a server.
type Manager struct {
	lim Limits
	log *slog.Logger

	// mu is taken before a Session's mu, never after.
	mu          sync.Mutex
	byKey       map[string]*Session
	unactivated map[*Session]struct{}
	anonymous   map[*Session]struct{} // activated with the anonymous identity
	// bound counts, per open secure channel, the activated sessions bound
	// to it (Holds).
	bound       map[uint32]int
	nextID      uint32
	orphanSeq   uint64
	cumulated   int64
	timeouts    int64
	rejected    int64
	closed      int64
	unactExpire int64
	unactEvict  int64
	orphanEvict int64
	anonRefused int64
	anonYield   int64
}

// NewManager returns an empty manager.
func NewManager(lim Limits) *Manager {
	if lim.MinTimeout <= 0 {
		lim.MinTimeout = 100 * time.Millisecond
	}
	if lim.MaxTimeout <= 0 {
		lim.MaxTimeout = time.Hour
	}
	if lim.DefaultTimeout <= 0 {
		lim.DefaultTimeout = 60 * time.Second
	}
	if lim.MaxSessions <= 0 {
		lim.MaxSessions = DefaultMaxSessions
	}
	if lim.MaxUnactivated <= 0 {
		lim.MaxUnactivated = max(1, lim.MaxSessions/2)
	}
	if lim.MaxAnonymous <= 0 {
		lim.MaxAnonymous = max(1, lim.MaxSessions/2)
	}
	if lim.OutliveChannels {
		// Fault sessions-outlive-channels: anonymous sessions may take
		// the whole table.
		lim.MaxAnonymous = lim.MaxSessions
	}
	if lim.UnactivatedTimeout <= 0 {
		lim.UnactivatedTimeout = 30 * time.Second
	}
	if lim.YieldIdle <= 0 {
		lim.YieldIdle = DefaultYieldIdle
	}
	if lim.Logger == nil {
		lim.Logger = slog.Default()
	}
	return &Manager{lim: lim, log: lim.Logger, byKey: make(map[string]*Session),
		unactivated: make(map[*Session]struct{}), anonymous: make(map[*Session]struct{}), bound: make(map[uint32]int)}
}

// Create creates an unactivated session with the requested timeout (revised
// into the limits) and its first server nonce. At MaxUnactivated
// unactivated sessions it closes the oldest of them to make room; at
// MaxSessions it closes the oldest orphaned anonymous session, else the
// oldest unactivated one. It returns nil (BadTooManySessions) when no
// session can make room. Under the unactivated-refuse fault it returns nil
// at either limit instead.
func (m *Manager) Create(name string, requested time.Duration, now time.Time) *Session {
	switch {
	case requested <= 0:
		requested = m.lim.DefaultTimeout
	case requested < m.lim.MinTimeout:
		requested = m.lim.MinTimeout
	case requested > m.lim.MaxTimeout:
		requested = m.lim.MaxTimeout
	}
	tok := make([]byte, 32)
	_, _ = rand.Read(tok) // never fails (crypto/rand)
	token := ua.NewByteStringNodeID(0, tok)
	s := &Session{Token: token, Name: name, Timeout: requested, key: token.String(), created: now, m: m, nonce: newNonce()}
	s.Touch(now)

	var evicted []*Session // closed once m.mu is released
	m.mu.Lock()
	if len(m.unactivated) >= m.lim.MaxUnactivated {
		if m.lim.UnactivatedRefuse {
			// Fault unactivated-refuse: whoever holds the unactivated
			// places locks new clients out.
			m.rejected++
			m.mu.Unlock()
			return nil
		}
		v := m.oldestLocked(m.unactivated, false)
		m.remove(v)
		m.unactEvict++
		evicted = append(evicted, v)
	}
	if len(m.byKey) >= m.lim.MaxSessions {
		var v *Session
		if !m.lim.OutliveChannels {
			v = m.oldestLocked(m.anonymous, true)
		}
		if v != nil {
			m.orphanEvict++
		} else if !m.lim.UnactivatedRefuse {
			if v = m.oldestLocked(m.unactivated, false); v != nil {
				m.unactEvict++
			}
		}
		if v == nil {
			m.rejected++
			m.mu.Unlock()
			return nil
		}
		m.remove(v)
		evicted = append(evicted, v)
	}
	m.nextID++
	s.seq = uint64(m.nextID)
	s.ID = ua.NewNumericNodeID(1, 1_000_000+m.nextID)
	m.byKey[s.key] = s
	m.unactivated[s] = struct{}{}
	m.cumulated++
	m.mu.Unlock()
	for _, v := range evicted {
		activated, user, _ := v.State()
		m.log.Info("closed a session to make room for a new one", "closed", v.ID.String(), "name", v.Name,
			"activated", activated, "anonymous", activated && user == "", "session", s.ID.String(),
			"max_sessions", m.lim.MaxSessions, "max_unactivated", m.lim.MaxUnactivated)
		v.close()
	}
	return s
}

// oldestLocked returns the session of set created first, or, with orphans,
// the one of set orphaned first among those whose channel closed; nil if
// none. m.mu held.
func (m *Manager) oldestLocked(set map[*Session]struct{}, orphans bool) *Session {
	var best *Session
	for s := range set {
		switch {
		case orphans && s.orphan == 0:
		case best == nil,
			orphans && s.orphan < best.orphan,
			!orphans && s.seq < best.seq:
			best = s
		}
	}
	return best
}

// anonymousPlaceLocked makes room for s, about to become anonymous on a
// channel of peer, when the anonymous share is full: it removes and
// returns the orphaned anonymous session orphaned first; else (but under
// anonymous-full-refuses) an anonymous session on a live channel yields:
// the one idle longest of the peer address holding the most anonymous
// sessions, at once when peer holds fewer (a peer that filled the share
// cannot lock another peer's fresh client out, however busy it keeps its
// sessions), only once it has been idle for YieldIdle when peer itself
// holds as many (a client's busy sessions keep their places beside one
// more of its own). It returns nil when nothing yields. m.mu held.
func (m *Manager) anonymousPlaceLocked(s *Session, peer string) *Session {
	if len(m.anonymous) < m.lim.MaxAnonymous || m.lim.OutliveChannels {
		return nil
	}
	if v := m.oldestLocked(m.anonymous, true); v != nil && v != s {
		m.remove(v)
		m.orphanEvict++
		return v
	}
	if m.lim.AnonymousRefuse {
		// Fault anonymous-full-refuses: live anonymous sessions keep
		// their places.
		return nil
	}
	held := map[string]int{} // anonymous sessions per peer, s left out
	for o := range m.anonymous {
		if o != s {
			held[o.peer]++
		}
	}
	most := 0
	for _, n := range held {
		most = max(most, n)
	}
	var idlest *Session // the idlest of the peers holding the most
	for o := range m.anonymous {
		if o != s && held[o.peer] == most && (idlest == nil || o.lastSeen.Load() < idlest.lastSeen.Load()) {
			idlest = o
		}
	}
	if idlest == nil {
		return nil
	}
	if held[peer] >= most && time.Since(time.Unix(0, idlest.lastSeen.Load())) < m.lim.YieldIdle {
		return nil
	}
	m.remove(idlest)
	m.anonYield++
	return idlest
}

// ChannelClosed tells the manager that secure channel id closed: the
// sessions activated on it become orphans. An orphan stays resumable by
// ActivateSession on a new channel until it expires or, if anonymous, is
// closed to make room for a new session.
func (m *Manager) ChannelClosed(id uint32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range m.byKey {
		// channelID only changes with m.mu held (Activate).
		if s.orphan != 0 || s.channelID != id {
			continue
		}
		if _, unactivated := m.unactivated[s]; unactivated {
			continue
		}
		m.orphanSeq++
		s.orphan = m.orphanSeq
		s.bound = false
	}
	delete(m.bound, id)
}

// Holds reports whether secure channel id holds an activated session
// now: one activated on it, not closed, not moved to another channel. A
// channel whose sessions were all closed holds none, whatever it held
// before.
func (m *Manager) Holds(id uint32) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.bound[id] > 0
}

// unbindLocked takes s out of its channel's count in m.bound; m.mu held.
func (m *Manager) unbindLocked(s *Session) {
	if !s.bound {
		return
	}
	s.bound = false
	if m.bound[s.boundTo]--; m.bound[s.boundTo] <= 0 {
		delete(m.bound, s.boundTo)
	}
}

// remove deletes s from the maps; m.mu held.
func (m *Manager) remove(s *Session) {
	m.unbindLocked(s)
	delete(m.byKey, s.key)
	delete(m.unactivated, s)
	delete(m.anonymous, s)
}

// Lookup returns the session for an authentication token, or nil.
func (m *Manager) Lookup(token *ua.NodeID) *Session {
	if token == nil {
		return nil
	}
	key := token.String()
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.byKey[key]
}

// Close closes the session with token; it reports false for unknown tokens.
func (m *Manager) Close(token *ua.NodeID) (*Session, bool) {
	if token == nil {
		return nil, false
	}
	key := token.String()
	m.mu.Lock()
	s := m.byKey[key]
	if s != nil {
		m.remove(s)
		m.closed++
	}
	m.mu.Unlock()
	if s == nil {
		return nil, false
	}
	s.close()
	return s, true
}

// Expire closes every session idle for longer than its timeout, and every
// session not activated within UnactivatedTimeout of its creation, and
// returns them. Under Limits.NeverExpire activated sessions are left open
// however long they were idle.
func (m *Manager) Expire(now time.Time) []*Session {
	var out []*Session
	m.mu.Lock()
	for s := range m.unactivated {
		if now.Sub(s.created) > m.lim.UnactivatedTimeout {
			m.remove(s)
			m.timeouts++
			m.unactExpire++
			out = append(out, s)
		}
	}
	for _, s := range m.byKey {
		if _, unactivated := m.unactivated[s]; m.lim.NeverExpire && !unactivated {
			// Fault sessions-never-expire: an activated session stays.
			continue
		}
		if now.Sub(time.Unix(0, s.lastSeen.Load())) > s.Timeout {
			m.remove(s)
			m.timeouts++
			out = append(out, s)
		}
	}
	m.mu.Unlock()
	for _, s := range out {
		s.close()
	}
	return out
}

// CloseAll closes every session (server shutdown).
func (m *Manager) CloseAll() {
	m.mu.Lock()
	all := make([]*Session, 0, len(m.byKey))
	for _, s := range m.byKey {
		m.remove(s)
		all = append(all, s)
	}
	m.mu.Unlock()
	for _, s := range all {
		s.close()
	}
}

// Counts returns the manager's diagnostics.
func (m *Manager) Counts() Counts {
	m.mu.Lock()
	defer m.mu.Unlock()
	orphaned := 0
	for _, s := range m.byKey {
		if s.orphan != 0 {
			orphaned++
		}
	}
	return Counts{Current: len(m.byKey), Cumulated: m.cumulated, Timeouts: m.timeouts, Rejected: m.rejected, Closed: m.closed,
		Unactivated: len(m.unactivated), UnactivatedExpired: m.unactExpire,
		Anonymous: len(m.anonymous), Orphaned: orphaned,
		UnactivatedEvicted: m.unactEvict, OrphansEvicted: m.orphanEvict, AnonymousRefused: m.anonRefused,
		AnonymousYielded: m.anonYield}
}

// SweepInterval is how often Expire should run for timeouts to be enforced
// within about a quarter of the smallest timeout.
func (m *Manager) SweepInterval() time.Duration {
	return max(min(m.lim.MinTimeout, m.lim.UnactivatedTimeout)/4, 10*time.Millisecond)
}
