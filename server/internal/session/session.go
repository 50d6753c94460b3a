// Package session keeps the reference server's sessions: creation with a
// random authentication token and server nonce, activation with a user
// identity (each issuing a new server nonce), lookup by token on every
// service call, close and timeout.
package session

import (
	"bytes"
	"crypto/rand"
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

	mu        sync.Mutex
	activated bool
	user      string // "" when anonymous
	channelID uint32
	nonce     []byte // the last server nonce sent to the client
	closed    bool
	onClose   []func()
	appURI    string // the client's ApplicationUri (CreateSession)
}

// SetClient records the client's ApplicationUri from CreateSession.
func (s *Session) SetClient(appURI string) {
	s.mu.Lock()
	s.appURI = appURI
	s.mu.Unlock()
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
// secure channel channelID, if nonce (the ServerNonce the caller checked
// the identity against) is still the session's server nonce, and issues
// and returns the next server nonce. It reports false, and changes
// nothing, when another activation replaced the nonce in between.
func (s *Session) Activate(user string, channelID uint32, nonce []byte) (next []byte, ok bool) {
	next = newNonce()
	s.mu.Lock()
	if !bytes.Equal(nonce, s.nonce) {
		s.mu.Unlock()
		return nil, false
	}
	first := !s.activated
	s.activated = true
	s.user = user
	s.channelID = channelID
	s.nonce = next
	s.mu.Unlock()
	if first && s.m != nil {
		s.m.activated(s)
	}
	return bytes.Clone(next), true
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
	// NeverExpire is the sessions-never-expire fault: an activated session
	// idle for longer than its timeout is never closed. Sessions not yet
	// activated still expire (UnactivatedTimeout, and their own timeout).
	NeverExpire bool
}

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
}

// Manager holds all sessions of a server.
type Manager struct {
	lim Limits

	mu          sync.Mutex
	byKey       map[string]*Session
	unactivated map[*Session]struct{}
	nextID      uint32
	cumulated   int64
	timeouts    int64
	rejected    int64
	closed      int64
	unactExpire int64
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
		lim.MaxSessions = 1000
	}
	if lim.MaxUnactivated <= 0 {
		lim.MaxUnactivated = max(1, lim.MaxSessions/2)
	}
	if lim.UnactivatedTimeout <= 0 {
		lim.UnactivatedTimeout = 30 * time.Second
	}
	return &Manager{lim: lim, byKey: make(map[string]*Session), unactivated: make(map[*Session]struct{})}
}

// Create creates an unactivated session with the requested timeout (revised
// into the limits) and its first server nonce. It returns nil when
// MaxSessions sessions, or MaxUnactivated unactivated ones, exist.
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

	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.byKey) >= m.lim.MaxSessions || len(m.unactivated) >= m.lim.MaxUnactivated {
		m.rejected++
		return nil
	}
	m.nextID++
	s.ID = ua.NewNumericNodeID(1, 1_000_000+m.nextID)
	m.byKey[s.key] = s
	m.unactivated[s] = struct{}{}
	m.cumulated++
	return s
}

// activated records the first activation of s.
func (m *Manager) activated(s *Session) {
	m.mu.Lock()
	delete(m.unactivated, s)
	m.mu.Unlock()
}

// remove deletes s from the maps; m.mu held.
func (m *Manager) remove(s *Session) {
	delete(m.byKey, s.key)
	delete(m.unactivated, s)
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
	return Counts{Current: len(m.byKey), Cumulated: m.cumulated, Timeouts: m.timeouts, Rejected: m.rejected, Closed: m.closed,
		Unactivated: len(m.unactivated), UnactivatedExpired: m.unactExpire}
}

// SweepInterval is how often Expire should run for timeouts to be enforced
// within about a quarter of the smallest timeout.
func (m *Manager) SweepInterval() time.Duration {
	return max(min(m.lim.MinTimeout, m.lim.UnactivatedTimeout)/4, 10*time.Millisecond)
}
