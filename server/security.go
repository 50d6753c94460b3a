package server

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/gopcua/opcua/ua"

	"github.com/opcua-chaos/opcua-chaos/server/catalog"
	"github.com/opcua-chaos/opcua-chaos/server/internal/budget"
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

// throttledActivate serves ActivateSession through the login throttle: an
// attempt whose keys (see loginKeys) have too many failed logins is checked
// (and answered) only after a delay. The delay is a timer, so neither the
// channel's reader nor a worker waits, and other clients and this
// channel's other requests go on.
//
// A held attempt keeps only a trimmed copy of its request (see
// heldRequest: no oversized secret, no certificates, clipped strings,
// nothing that points into the request's buffer), is charged to the
// budget's Logins class, counts against its peer IP's MaxHeldLoginsPerPeer,
// and is dropped, its charge released, as soon as its channel closes. An
// attempt that cannot be held is answered BadTooManyOperations at once,
// unchecked.
func (s *Server) throttledActivate(cn *conn, ch *channel.Channel, reqID uint32, r *ua.ActivateSessionRequest, now time.Time) {
	if s.cfg.Faults.Has(catalog.FaultLoginHoldsRequests) {
		s.holdWholeActivate(cn, ch, reqID, r, now)
		return
	}
	keys := s.loginKeys(cn.remoteIP, r.UserIdentityToken)
	wait, over := s.logins.reserve(keys, now, false)
	if over {
		// The user's failed-login budget is spent for the next
		// second, whatever address this comes from: answered at once,
		// unchecked, so it tells a guesser nothing.
		s.stats.loginsOverBudget.Add(1)
		s.log.Debug("login refused: the user's failed-login budget is spent", "remote", cn.remoteIP, "user", keys.user)
		ch.Respond(reqID, s.fault(r, ua.StatusBadTooManyOperations))
		return
	}
	if wait <= 0 {
		resp := s.activateSession(cn, r, now)
		s.logins.done(keys, loginOutcome(resp), time.Now())
		ch.Respond(reqID, resp)
		return
	}
	refuse := func(why string) {
		s.logins.done(keys, loginCancelled, now)
		s.log.Debug("login refused instead of held", "remote", cn.remoteIP, "user", keys.user, "reason", why)
		ch.Respond(reqID, s.fault(r, ua.StatusBadTooManyOperations))
	}
	if !s.logins.hold(cn.remoteIP, s.cfg.MaxHeldLoginsPerPeer) {
		refuse("MaxHeldLoginsPerPeer logins held for the peer")
		return
	}
	held, size := s.heldRequest(r)
	if !s.budget.Charge(budget.Logins, size) {
		s.logins.unhold(cn.remoteIP)
		refuse("memory budget of held logins")
		return
	}
	s.stats.loginsDelayed.Add(1)
	s.log.Info("login delayed after failed logins", "remote", cn.remoteIP, "user", keys.user, "delay", wait)
	h := &heldLogin{s: s, cn: cn, ch: ch, reqID: reqID, req: held, keys: keys, size: size}
	// fire and drop wait for mu, so both see timer and stop set.
	h.mu.Lock()
	h.timer = time.AfterFunc(wait, h.fire)
	h.stop = context.AfterFunc(cn.ctx, h.drop)
	h.mu.Unlock()
}

// holdWholeActivate is throttledActivate under the fault
// login-holds-requests: the timer holds the whole request, secret and all,
// with no cap per peer and no charge to the budget; it runs after the
// channel closed, and the delays queue up, each penalty growing with the
// attempts waiting.
func (s *Server) holdWholeActivate(cn *conn, ch *channel.Channel, reqID uint32, r *ua.ActivateSessionRequest, now time.Time) {
	keys := s.loginKeys(cn.remoteIP, r.UserIdentityToken)
	run := func() {
		if cn.ctx.Err() != nil {
			ch.Respond(reqID, s.fault(r, ua.StatusBadSecureChannelClosed)) // dropped: the channel is gone
			s.logins.done(keys, loginCancelled, time.Now())
			return
		}
		resp := s.activateSession(cn, r, time.Now())
		s.logins.done(keys, loginOutcome(resp), time.Now())
		ch.Respond(reqID, resp)
	}
	wait, _ := s.logins.reserve(keys, now, true)
	if wait <= 0 {
		run()
		return
	}
	s.stats.loginsDelayed.Add(1)
	s.log.Info("login delayed after failed logins", "fault", catalog.FaultLoginHoldsRequests, "remote", cn.remoteIP, "user", keys.user, "delay", wait)
	time.AfterFunc(wait, run)
}

// heldLoginOverhead is what the budget is charged for a held login beyond
// the bytes of its trimmed request: the timer, the context callback, the
// heldLogin and the trimmed request's structs.
const heldLoginOverhead = 1 << 10

// Bounds of what a held login keeps of its request.
const (
	// maxHeldString bounds a policy id, algorithm URI or unknown user
	// name kept: longer ones are clipped, which keeps them invalid (no
	// valid one is that long).
	maxHeldString = 256
	// maxHeldSignature bounds a client signature kept (an RSA-4096
	// signature is 512 bytes); a longer one is dropped, which fails its
	// check as a missing signature would.
	maxHeldSignature = 1024
)

// heldLogin is an ActivateSession held by the login throttle until its
// timer fires or its channel closes, whichever comes first.
type heldLogin struct {
	s     *Server
	cn    *conn
	ch    *channel.Channel
	reqID uint32
	req   *ua.ActivateSessionRequest // trimmed (heldRequest)
	keys  loginKeys
	size  int64 // charged to budget.Logins

	mu    sync.Mutex
	done  bool
	timer *time.Timer
	stop  func() bool // unregisters drop from the channel's context
}

// finish marks h done; it reports false if fire or drop already did.
func (h *heldLogin) finish() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.done {
		return false
	}
	h.done = true
	return true
}

// release returns h's charge and its place among its peer's held logins.
func (h *heldLogin) release() {
	h.s.budget.Release(budget.Logins, h.size)
	h.s.logins.unhold(h.cn.remoteIP)
}

// fire checks and answers the held login when its delay is over.
func (h *heldLogin) fire() {
	if !h.finish() {
		return
	}
	h.stop()
	defer h.release()
	if h.cn.ctx.Err() != nil {
		h.s.logins.done(h.keys, loginCancelled, time.Now())
		return
	}
	resp := h.s.activateSession(h.cn, h.req, time.Now())
	h.s.logins.done(h.keys, loginOutcome(resp), time.Now())
	h.ch.Respond(h.reqID, resp)
}

// drop forgets the held login when its channel closed: no answer can reach
// the client, so nothing is checked.
func (h *heldLogin) drop() {
	if !h.finish() {
		return
	}
	h.timer.Stop()
	h.release()
	h.s.logins.done(h.keys, loginCancelled, time.Now())
	h.s.log.Debug("held login dropped: its channel closed", "remote", h.cn.remoteIP, "user", h.keys.user)
}

// heldRequest returns the part of an ActivateSession request a held login
// keeps, and the bytes to charge for it. Everything kept is copied, so
// nothing points into the request's buffer: the header's handle and
// timestamps, the session's own authentication token (nil for an unknown
// one), the client signature unless oversized, and the identity token
// trimmed (heldToken). Client software certificates, locale ids and the
// user token signature, which ActivateSession does not check, are dropped.
func (s *Server) heldRequest(r *ua.ActivateSessionRequest) (*ua.ActivateSessionRequest, int64) {
	held := &ua.ActivateSessionRequest{RequestHeader: &ua.RequestHeader{}}
	if hdr := r.RequestHeader; hdr != nil {
		held.RequestHeader.RequestHandle = hdr.RequestHandle
		held.RequestHeader.Timestamp = hdr.Timestamp
		held.RequestHeader.TimeoutHint = hdr.TimeoutHint
		held.RequestHeader.ReturnDiagnostics = hdr.ReturnDiagnostics
		if sess := s.sessions.Lookup(hdr.AuthenticationToken); sess != nil {
			held.RequestHeader.AuthenticationToken = sess.Token
		}
	}
	size := int64(heldLoginOverhead)
	if sig := r.ClientSignature; sig != nil {
		held.ClientSignature = &ua.SignatureData{Algorithm: clip(sig.Algorithm, maxHeldString)}
		if len(sig.Signature) <= maxHeldSignature {
			held.ClientSignature.Signature = bytes.Clone(sig.Signature)
		}
		size += int64(len(held.ClientSignature.Algorithm) + len(held.ClientSignature.Signature))
	}
	var n int64
	held.UserIdentityToken, n = s.heldToken(r.UserIdentityToken)
	return held, size + n
}

// droppedToken stands for an identity token of a type the server does not
// offer, which a held login does not keep: authenticate rejects it by type.
type droppedToken struct{ typ string }

// heldToken trims an identity token for a held login and returns the bytes
// it keeps. The decision authenticate takes on it stays the same: clipped
// strings are still invalid, an unknown user name stays unknown, and a
// secret of more than MaxSecretBlocks RSA blocks is dropped (it would be
// refused without decrypting; a missing secret is refused with the same
// status).
func (s *Server) heldToken(eo *ua.ExtensionObject) (*ua.ExtensionObject, int64) {
	if eo == nil {
		return nil, 0
	}
	var v any
	var n int
	switch t := eo.Value.(type) {
	case nil:
	case *ua.AnonymousIdentityToken:
		a := &ua.AnonymousIdentityToken{PolicyID: clip(t.PolicyID, maxHeldString)}
		v, n = a, len(a.PolicyID)
	case *ua.UserNameIdentityToken:
		u := &ua.UserNameIdentityToken{
			PolicyID:            clip(t.PolicyID, maxHeldString),
			UserName:            s.clipUser(t.UserName),
			EncryptionAlgorithm: clip(t.EncryptionAlgorithm, maxHeldString),
		}
		if s.secretBlocks(t.Password) <= s.cfg.MaxSecretBlocks || s.cfg.Faults.Has(catalog.FaultRSABlocksUnbounded) {
			u.Password = bytes.Clone(t.Password)
		}
		v = u
		n = len(u.PolicyID) + len(u.UserName) + len(u.EncryptionAlgorithm) + len(u.Password)
	default:
		v = droppedToken{typ: fmt.Sprintf("%T", t)}
	}
	return &ua.ExtensionObject{EncodingMask: ua.ExtensionObjectBinary, Value: v}, int64(n)
}

// clip returns s, or a copy of its first n bytes if it is longer.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.Clone(s[:n])
}

// clipUser returns a user name as the throttle and held logins keep it: a
// configured user's name whole, an unknown one clipped to maxHeldString
// bytes and marked with a NUL (no configured name has one), so that it
// stays unknown.
func (s *Server) clipUser(name string) string {
	if _, ok := s.cfg.Users[name]; ok || len(name) <= maxHeldString {
		return name
	}
	return name[:maxHeldString] + "\x00"
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

// loginKeys are what the login throttle counts failures by:
//
//   - the pair of peer IP and user name: a client guessing one user's
//     password, without slowing the other users behind the same address
//     (every client of the suites comes through one proxy) beyond the
//     shared keys' short delays;
//   - the user name alone (user-name tokens only), from any address: many
//     addresses guessing one user's password. This key is a server-wide
//     budget: once its free failures are spent (failed or in flight),
//     its attempts are spaced userGuessSpacing apart at least, and one
//     that would wait beyond the key's cap is refused at once,
//     unchecked (BadTooManyOperations): at most 1/userGuessSpacing
//     failed logins a second per user, whatever the number of addresses
//     and attempts in flight. An address the user logged in from
//     (trustedPairs) is spared it while its pair key has fewer than
//     free failures, so an attacker guessing a user's password does not
//     lock the user out where it logged in before;
//   - the peer IP alone, for any user (user-name tokens only): one
//     address guessing with a fresh user name every few tries.
//
// Anonymous and other tokens have only the pair key (peer IP and ""):
// they guess no secret, and the other clients behind an address, which
// mostly log in anonymously, are not held back (nor refused at
// MaxHeldLoginsPerPeer) by a user-name guesser among them.
//
// The shared keys' delays are capped at sharedDelayMax, so an attacker
// cannot lock a real user, or the other clients behind an address, out
// for long. Under the fault throttle-pair-only only the pair counts; under
// guesses-across-addresses the user key is capped like the peer IP's, not
// a budget: attempts from many addresses each wait at most its cap,
// however many are in flight.
type loginKeys struct {
	ip       string
	user     string // clipped (clipUser); "" for anonymous and other tokens
	pairOnly bool
	// capped is the fault guesses-across-addresses: the user key is no
	// budget.
	capped bool
}

// loginKeys returns the throttle keys of an attempt from ip with identity.
func (s *Server) loginKeys(ip string, identity *ua.ExtensionObject) loginKeys {
	return loginKeys{ip: ip, user: s.clipUser(userName(identity)), pairOnly: s.cfg.Faults.Has(catalog.FaultThrottlePairOnly),
		capped: s.cfg.Faults.Has(catalog.FaultGuessesAcrossAddresses)}
}

// pair is the key of the pair table.
func (k loginKeys) pair() string { return k.ip + "\x00" + k.user }

// loginOutcome classifies an ActivateSession response for the throttle.
func loginOutcome(resp ua.Response) outcome {
	if loginFailed(resp) {
		return loginFailure
	}
	if f, ok := resp.(*ua.ServiceFault); ok && f.ResponseHeader.ServiceResult != ua.StatusOK {
		// Refused for another reason (a bad signature, a closed
		// session ...): neither a guess that failed nor a proof.
		return loginCancelled
	}
	return loginSuccess
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

// outcome is how an attempt the throttle reserved for ended.
type outcome int

const (
	loginFailure   outcome = iota // a failed login (loginFailed)
	loginSuccess                  // the session was activated
	loginCancelled                // not checked, or refused for another reason
)

// loginThrottle slows down failed logins per key (see loginKeys). After
// free failures of a key, its attempts are spaced: each is checked no
// earlier than the key's next slot, which moves on by a penalty that
// doubles with every failure, from base up to the key's cap (max for the
// pair, sharedDelayMax for the user and the peer IP); an attempt waits the
// largest delay of its keys. Each delay is measured from the attempt's
// arrival and is at most the key's cap: attempts arriving faster than
// their penalty all wait the cap, they never queue minutes out (the
// number held per peer IP and the budget bound how many wait at once). A
// successful login with a user name forgets its three keys (an anonymous
// one only its pair), and so does forgetAfter without attempts.
//
// Memory is bounded: each table holds at most maxLoginPeers keys; when
// one is full, expired keys go first, then the one with the fewest
// failures among a random sample.
type loginThrottle struct {
	free int
	base time.Duration

	mu                sync.Mutex
	pairs, users, ips loginTable
	held              map[string]int // held logins per peer IP
	// trusted holds, per pair key, the last successful login with a
	// user name from that address (at most maxLoginPeers).
	trusted map[string]time.Time
}

// loginTable is the throttle state of one kind of key.
type loginTable struct {
	cap    time.Duration // the longest delay the key imposes
	forget time.Duration // a key quiet this long starts afresh
	peers  map[string]*loginPeer
}

// loginPeer is the throttle state of one key.
type loginPeer struct {
	failures int       // failed logins since the last success
	waiting  int       // attempts reserved and not yet done
	next     time.Time // no attempt is checked before this
	last     time.Time // last activity
}

// Bounds of the throttle.
const (
	maxLoginPeers = 10_000
	forgetAfter   = 10 * time.Minute
	// sharedDelayMax caps the delay of the user and peer-IP keys, which
	// others share with an attacker; sharedForgetAfter forgets them
	// sooner than the pair, so a burst of guessing does not slow a
	// proxy's clients for minutes after it stopped.
	sharedDelayMax    = time.Second
	sharedForgetAfter = time.Minute
	// evictSample is how many keys a full table looks at to evict one.
	evictSample = 16
	// userGuessSpacing spaces the attempts of a user key past its free
	// failures: at most 4 failed logins a second per user, server-wide.
	userGuessSpacing = 250 * time.Millisecond
)

func newLoginThrottle(free int, base, max time.Duration) *loginThrottle {
	table := func(cap, forget time.Duration) loginTable {
		return loginTable{cap: cap, forget: forget, peers: make(map[string]*loginPeer)}
	}
	return &loginThrottle{
		free:    free,
		base:    base,
		pairs:   table(max, forgetAfter),
		users:   table(min(max, sharedDelayMax), sharedForgetAfter),
		ips:     table(min(max, sharedDelayMax), sharedForgetAfter),
		held:    make(map[string]int),
		trusted: make(map[string]time.Time),
	}
}

// budgeted reports whether the user key of k is a budget for this attempt
// (see loginKeys): a user-name attempt from an address the user did not
// log in from lately, or whose pair key has failed free times. l.mu held.
func (l *loginThrottle) budgeted(k loginKeys, now time.Time) bool {
	if k.user == "" || k.pairOnly || k.capped {
		return false
	}
	at, ok := l.trusted[k.pair()]
	if !ok || now.Sub(at) > forgetAfter {
		return true
	}
	p := l.pairs.peer(k.pair(), now)
	return p != nil && p.failures >= l.free
}

// trust records a successful login with a user name from k's address.
// l.mu held.
func (l *loginThrottle) trust(k loginKeys, now time.Time) {
	if k.user == "" {
		return
	}
	if _, ok := l.trusted[k.pair()]; !ok && len(l.trusted) >= maxLoginPeers {
		for key, at := range l.trusted { // map order is random
			if now.Sub(at) > forgetAfter || len(l.trusted) >= maxLoginPeers {
				delete(l.trusted, key)
			}
			if len(l.trusted) < maxLoginPeers {
				break
			}
		}
	}
	l.trusted[k.pair()] = now
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// penalty is the spacing after n failures (n ≥ free), at most limit.
func (l *loginThrottle) penalty(n int, limit time.Duration) time.Duration {
	d := l.base << min(max(n-l.free, 0), 30)
	if d <= 0 || d > limit {
		return limit
	}
	return d
}

// each calls f with every table and key that applies to k; l.mu held.
func (l *loginThrottle) each(k loginKeys, f func(t *loginTable, key string)) {
	f(&l.pairs, k.pair())
	if k.pairOnly {
		return
	}
	if k.user != "" {
		f(&l.users, k.user)
		f(&l.ips, k.ip)
	}
}

// reserve returns how long an attempt with keys k arriving at now must
// wait before it is checked: the largest delay of its keys, each at most
// its key's cap. It reserves the attempt's slot with every key. legacy is
// the fault login-holds-requests: slots queue without a cap, and each
// penalty grows with the attempts waiting.
//
// over reports an attempt refused by its user key's budget (see
// loginKeys): its free failures spent and its next slot beyond its cap.
// Nothing is reserved for it; it must be answered unchecked.
func (l *loginThrottle) reserve(k loginKeys, now time.Time, legacy bool) (wait time.Duration, over bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	budget := !legacy && l.budgeted(k, now)
	// an address the user logged in from lately is spared the user key
	trusted := !legacy && !budget && k.user != "" && !k.pairOnly && !k.capped
	if budget {
		if p := l.users.peer(k.user, now); p != nil && p.failures+p.waiting >= l.free && p.next.After(now.Add(l.users.cap)) {
			p.last = now
			return 0, true
		}
	}
	l.each(k, func(t *loginTable, key string) {
		if t == &l.users && budget {
			wait = max(wait, l.budgetSlot(t, key, now))
			return
		}
		if t == &l.users && trusted {
			return
		}
		p := t.peer(key, now)
		if p == nil {
			return
		}
		p.waiting++
		p.last = now
		if p.failures < l.free {
			return
		}
		slot := p.next
		if slot.Before(now) {
			slot = now
		}
		if legacy {
			p.next = slot.Add(l.penalty(p.failures+p.waiting, t.cap))
		} else {
			if limit := now.Add(t.cap); slot.After(limit) {
				slot = limit
			}
			// The penalty this attempt earns if it fails too.
			p.next = slot.Add(l.penalty(p.failures+1, t.cap))
		}
		wait = max(wait, slot.Sub(now))
	})
	return wait, false
}

// budgetSlot reserves an attempt's slot with a user key used as a budget
// and returns its wait: none while its failures and attempts in flight
// are fewer than free, else its next slot, which moves on by the penalty
// and at least userGuessSpacing, at most the key's cap (reserve refused
// it if that slot was beyond the cap). l.mu held.
func (l *loginThrottle) budgetSlot(t *loginTable, key string, now time.Time) time.Duration {
	p := t.peer(key, now)
	if p == nil {
		p = t.add(key, now)
	}
	inFlight := p.waiting
	p.waiting++
	p.last = now
	if p.failures+inFlight < l.free {
		return 0
	}
	slot := p.next
	if slot.Before(now) {
		slot = now
	}
	// spaced userGuessSpacing at least, but never beyond the key's cap
	// (a LoginDelayMax configured below it): an attempt that waited for
	// its slot is never refused
	p.next = slot.Add(min(max(l.penalty(p.failures+1, t.cap), userGuessSpacing), t.cap))
	return slot.Sub(now)
}

// done records how an attempt with keys k ended.
func (l *loginThrottle) done(k loginKeys, o outcome, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.each(k, func(t *loginTable, key string) {
		p := t.peer(key, now)
		switch {
		case o == loginSuccess && t == &l.users && !k.capped:
			// The user's budget is not reset by a success: the user
			// logging in elsewhere must not hand the guessers a fresh
			// burst (the user's own addresses are spared it: trust).
			if p != nil {
				p.waiting = max(p.waiting-1, 0)
			}
		case o == loginSuccess && (k.user != "" || t == &l.pairs):
			delete(t.peers, key)
			if t == &l.pairs {
				l.trust(k, now)
			}
		case o == loginFailure:
			if p == nil {
				p = t.add(key, now)
			}
			p.waiting = max(p.waiting-1, 0)
			p.failures++
			p.last = now
			if p.failures == l.free {
				// The next attempt waits the first penalty (or its
				// slot reserved already, if later).
				p.next = later(p.next, now.Add(l.penalty(p.failures, t.cap)))
			}
		case p != nil:
			p.waiting = max(p.waiting-1, 0)
		}
	})
}

// suspect reports whether the peer address ip failed free logins or more
// with a user name lately (its peer-IP key).
func (l *loginThrottle) suspect(ip string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	p := l.ips.peer(ip, now)
	return p != nil && p.failures >= l.free
}

// hold takes one of ip's at most limit held logins; it reports false if
// all are taken.
func (l *loginThrottle) hold(ip string, limit int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held[ip] >= limit {
		return false
	}
	l.held[ip]++
	return true
}

// unhold returns one of ip's held logins.
func (l *loginThrottle) unhold(ip string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.held[ip] <= 1 {
		delete(l.held, ip)
		return
	}
	l.held[ip]--
}

// peer returns the state of key, nil if none; a key quiet for t.forget
// starts afresh. The throttle's mu held.
func (t *loginTable) peer(key string, now time.Time) *loginPeer {
	p := t.peers[key]
	if p != nil && p.waiting == 0 && now.Sub(p.last) > t.forget {
		delete(t.peers, key)
		return nil
	}
	return p
}

// add adds a fresh key, making room first if the table is full. The
// throttle's mu held.
func (t *loginTable) add(key string, now time.Time) *loginPeer {
	if len(t.peers) >= maxLoginPeers {
		t.evict(now)
	}
	p := &loginPeer{}
	t.peers[key] = p
	return p
}

// evict forgets one key of a full table: among a random sample (map order
// is random), an expired one if any, else the one with the fewest
// failures and no attempt waiting, so keys that throttle an attacker are
// the last to go. The throttle's mu held.
func (t *loginTable) evict(now time.Time) {
	var victim string
	var best *loginPeer
	seen := 0
	for key, p := range t.peers {
		if p.waiting == 0 && now.Sub(p.last) > t.forget {
			delete(t.peers, key)
			return
		}
		if best == nil || less(p, best) {
			victim, best = key, p
		}
		if seen++; seen >= evictSample {
			break
		}
	}
	delete(t.peers, victim)
}

// less orders keys for eviction: idle before waiting, fewer failures
// first, then the older.
func less(a, b *loginPeer) bool {
	if (a.waiting == 0) != (b.waiting == 0) {
		return a.waiting == 0
	}
	if a.failures != b.failures {
		return a.failures < b.failures
	}
	return a.last.Before(b.last)
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

// firstCertificate keeps the first client certificate it is given: the
// fault cert-cached-across-channels.
type firstCertificate struct {
	mu   sync.Mutex
	cert []byte
}

// take returns the first certificate ever given to f (sent, the first
// time).
func (f *firstCertificate) take(sent []byte) []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cert == nil {
		f.cert = bytes.Clone(sent)
	}
	return f.cert
}

// channelCertificate is channel.Security.ChannelCertificate: nil (each
// channel keeps the certificate it opened with) unless the fault
// cert-cached-across-channels is on, then the first client certificate
// the server ever saw, for every secured channel.
func (s *Server) channelCertificate() func(sent []byte) []byte {
	if !s.cfg.Faults.Has(catalog.FaultCertCachedAcrossChannels) {
		return nil
	}
	return s.firstCert.take
}
