package server

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gopcua/opcua/ua"

	"github.com/opcua-chaos/opcua-chaos/server/internal/channel"
	"github.com/opcua-chaos/opcua-chaos/server/internal/session"
)

// identityChange applies Part 4's rules for ActivateSession on a session
// that is already activated, for an identity user ("" for anonymous) that
// authenticated: the session may move to another secure channel, or be
// activated again on its own, only with the same user identity: anonymous
// stays anonymous, a user stays that user (and proved it, with the right
// password). Anything else is BadIdentityChangeNotSupported, and the
// session stays with its owner's channel. A session not yet activated takes
// any identity.
func (s *Server) identityChange(cn *conn, sess *session.Session, user string) ua.StatusCode {
	activated, owner, chID := sess.State()
	if !activated || owner == user {
		return ua.StatusOK
	}
	s.log.Warn("identity change refused", "session", sess.ID.String(), "channel", cn.id,
		"owner_channel", chID, "anonymous", user == "", "remote", cn.remoteIP)
	return ua.StatusBadIdentityChangeNotSupported
}

// throttledActivate serves ActivateSession through the login throttle: a
// peer with too many failed logins has its next attempt checked (and
// answered) only after a delay. The delay is a timer, so neither the
// channel's reader nor a worker waits, and other clients and this
// channel's other requests go on.
func (s *Server) throttledActivate(cn *conn, ch *channel.Channel, reqID uint32, r *ua.ActivateSessionRequest, now time.Time) {
	key := loginKey(cn.remoteIP, r.UserIdentityToken)
	run := func() {
		if cn.ctx.Err() != nil {
			ch.Respond(reqID, s.fault(r, ua.StatusBadSecureChannelClosed)) // dropped: the channel is gone
			s.logins.done(key, false, time.Now())
			return
		}
		resp := s.activateSession(cn, r, time.Now())
		s.logins.done(key, loginFailed(resp), time.Now())
		ch.Respond(reqID, resp)
	}
	wait := s.logins.reserve(key, now)
	if wait <= 0 {
		run()
		return
	}
	s.stats.loginsDelayed.Add(1)
	s.log.Info("login delayed after failed logins", "remote", cn.remoteIP, "user", userName(r.UserIdentityToken), "delay", wait)
	time.AfterFunc(wait, run)
}

// userName returns the user name of a UserName identity token, else "".
func userName(eo *ua.ExtensionObject) string {
	if eo != nil {
		if t, ok := eo.Value.(*ua.UserNameIdentityToken); ok {
			return t.UserName
		}
	}
	return ""
}

// loginKey is what the login throttle counts failures by: the peer IP and
// the user name ("" for anonymous and other tokens). Keying by both keeps
// a client guessing one user's password from slowing down the other users
// behind the same address (every client of the suites comes through one
// proxy).
func loginKey(ip string, identity *ua.ExtensionObject) string {
	return ip + "\x00" + userName(identity)
}

// loginFailed reports whether an ActivateSession response is a failed
// login: a rejected identity, or an authentication token the server does
// not know (guessing tokens is guessing too).
func loginFailed(resp ua.Response) bool {
	f, ok := resp.(*ua.ServiceFault)
	if !ok {
		return false
	}
	switch f.ResponseHeader.ServiceResult {
	case ua.StatusBadUserAccessDenied, ua.StatusBadIdentityTokenInvalid, ua.StatusBadIdentityTokenRejected,
		ua.StatusBadIdentityChangeNotSupported, ua.StatusBadSessionIDInvalid:
		return true
	}
	return false
}

// loginThrottle slows down failed logins per key (peer IP and user name,
// see loginKey). After free failures, attempts with that key are spaced: each is checked no earlier than the
// previous slot plus a penalty that doubles with every failure (and every
// attempt still waiting), from base up to max. Reserving a slot when the
// attempt arrives, not when it is answered, spaces pipelined attempts too:
// 500 guesses sent at once are checked over minutes, not at once. A
// successful login forgets the peer, and so does forgetAfter without
// attempts. Memory is bounded by maxLoginPeers peers.
type loginThrottle struct {
	free      int
	base, max time.Duration

	mu    sync.Mutex
	peers map[string]*loginPeer
}

// loginPeer is the throttle state of one key.
type loginPeer struct {
	failures int       // failed logins since the last success
	waiting  int       // attempts reserved and not yet done
	next     time.Time // no attempt is checked before this
	last     time.Time // last activity
}

// Bounds of the throttle's memory.
const (
	maxLoginPeers = 10_000
	forgetAfter   = 10 * time.Minute
)

func newLoginThrottle(free int, base, max time.Duration) *loginThrottle {
	return &loginThrottle{free: free, base: base, max: max, peers: make(map[string]*loginPeer)}
}

// penalty is the spacing after n failures (n ≥ free).
func (l *loginThrottle) penalty(n int) time.Duration {
	d := l.base << min(max(n-l.free, 0), 30)
	if d <= 0 || d > l.max {
		return l.max
	}
	return d
}

// reserve returns how long an attempt with key ip arriving at now must wait
// before it is checked, and reserves its slot.
func (l *loginThrottle) reserve(ip string, now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.peer(ip, now)
	if p == nil || p.failures < l.free {
		if p != nil {
			p.waiting++
		}
		return 0
	}
	slot := p.next
	if slot.Before(now) {
		slot = now
	}
	p.waiting++
	p.next = slot.Add(l.penalty(p.failures + p.waiting))
	p.last = now
	return slot.Sub(now)
}

// done records the outcome of an attempt with key ip.
func (l *loginThrottle) done(ip string, failed bool, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.peer(ip, now)
	if !failed {
		delete(l.peers, ip)
		return
	}
	if p == nil {
		l.makeRoom(now)
		p = &loginPeer{}
		l.peers[ip] = p
	}
	p.waiting = max(p.waiting-1, 0)
	p.failures++
	p.last = now
	if p.failures == l.free {
		// The next attempt waits the first penalty.
		p.next = now.Add(l.penalty(p.failures))
	}
}

// peer returns the state of key ip, nil if none; a peer quiet for forgetAfter
// starts afresh. l.mu held.
func (l *loginThrottle) peer(ip string, now time.Time) *loginPeer {
	p := l.peers[ip]
	if p != nil && p.waiting == 0 && now.Sub(p.last) > forgetAfter {
		delete(l.peers, ip)
		return nil
	}
	return p
}

// makeRoom forgets quiet peers once the map is full, and arbitrary ones if
// that is not enough; l.mu held.
func (l *loginThrottle) makeRoom(now time.Time) {
	if len(l.peers) < maxLoginPeers {
		return
	}
	for ip, p := range l.peers {
		if now.Sub(p.last) > forgetAfter && p.waiting == 0 {
			delete(l.peers, ip)
		}
	}
	for ip := range l.peers {
		if len(l.peers) < maxLoginPeers {
			break
		}
		delete(l.peers, ip)
	}
}

// SecurityModes is the set of message security modes the server offers
// (OPCUA_SECURITY). Sign and SignAndEncrypt are offered with every policy
// of SecurityPolicies.
type SecurityModes map[ua.MessageSecurityMode]bool

// SecurityPolicies are the security policies of the secured endpoints,
// weakest first.
var SecurityPolicies = []string{
	ua.SecurityPolicyURIBasic256Sha256,
	ua.SecurityPolicyURIAes128Sha256RsaOaep,
	ua.SecurityPolicyURIAes256Sha256RsaPss,
}

// securityModeNames are the names of OPCUA_SECURITY.
var securityModeNames = []struct {
	name string
	mode ua.MessageSecurityMode
}{
	{"none", ua.MessageSecurityModeNone},
	{"sign", ua.MessageSecurityModeSign},
	{"sign-encrypt", ua.MessageSecurityModeSignAndEncrypt},
}

// ParseSecurityModes parses a comma separated list of "none", "sign" and
// "sign-encrypt"; "" means all three.
func ParseSecurityModes(s string) (SecurityModes, error) {
	names := splitList(s)
	if len(names) == 0 {
		return nil, nil
	}
	ms := SecurityModes{}
	for _, name := range names {
		i := slices.IndexFunc(securityModeNames, func(n struct {
			name string
			mode ua.MessageSecurityMode
		}) bool {
			return n.name == name
		})
		if i < 0 {
			return nil, fmt.Errorf("unknown security mode %q (valid: none, sign, sign-encrypt)", name)
		}
		ms[securityModeNames[i].mode] = true
	}
	return ms, nil
}

// Has reports whether mode is offered (a nil set offers all).
func (ms SecurityModes) Has(mode ua.MessageSecurityMode) bool {
	if ms == nil {
		return mode == ua.MessageSecurityModeNone || mode == ua.MessageSecurityModeSign || mode == ua.MessageSecurityModeSignAndEncrypt
	}
	return ms[mode]
}

// String lists the offered modes by name, comma separated.
func (ms SecurityModes) String() string {
	var names []string
	for _, n := range securityModeNames {
		if ms.Has(n.mode) {
			names = append(names, n.name)
		}
	}
	return strings.Join(names, ",")
}

// offers reports whether the server offers policy with mode.
func (s *Server) offers(policy string, mode ua.MessageSecurityMode) bool {
	if !s.cfg.Security.Has(mode) {
		return false
	}
	if mode == ua.MessageSecurityModeNone {
		return policy == ua.SecurityPolicyURINone
	}
	return slices.Contains(SecurityPolicies, policy)
}
