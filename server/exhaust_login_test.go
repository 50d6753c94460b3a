package server

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gopcua/opcua"
	"github.com/gopcua/opcua/ua"
	"github.com/gopcua/opcua/uacp"

	"github.com/opcua-chaos/opcua-chaos/server/catalog"
	"github.com/opcua-chaos/opcua-chaos/server/internal/budget"
)

// Tests of issue 32's login protections (held logins, RSA blocks, the
// throttle's user and peer-IP keys), each beside the fault that undoes it.

// newRawChannelFrom is newRawChannel from the local address ip (any
// 127.0.0.0/8 address reaches the loopback listener), so one test can
// play many peers.
func newRawChannelFrom(t testing.TB, endpoint, ip string) *opcua.Client {
	t.Helper()
	d := &uacp.Dialer{Dialer: &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}}
	c, err := opcua.NewClient(endpoint, opcua.SecurityMode(ua.MessageSecurityModeNone),
		opcua.SecurityPolicy(ua.SecurityPolicyURINone), opcua.AutoReconnect(false), opcua.Dialer(d))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Dial(ctx); err != nil {
		t.Fatalf("dial from %s: %v", ip, err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	return c
}

// timedActivate activates r with tok and returns the outcome and how long
// the answer took.
func timedActivate(r *rawSession, tok any) (time.Duration, error) {
	start := time.Now()
	err := r.activate(tok)
	return time.Since(start), err
}

// junkSecret is a user-name token with a secret of n random bytes: never
// a valid password, so the only question is when and how it is refused.
func junkSecret(name string, n int) *ua.UserNameIdentityToken {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return &ua.UserNameIdentityToken{PolicyID: PolicyUserName, UserName: name, Password: b, EncryptionAlgorithm: rsaOAEP}
}

// waitingFrom returns how many attempts with the peer-IP key ip the
// throttle holds.
func (l *loginThrottle) waitingFrom(ip string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p := l.ips.peers[ip]; p != nil {
		return p.waiting
	}
	return 0
}

// heldBy returns the held logins the throttle counts for ip.
func (l *loginThrottle) heldBy(ip string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.held[ip]
}

// TestHeldLoginsCappedPerPeer: once a peer is throttled, at most
// MaxHeldLoginsPerPeer of its logins are held; the others are answered
// BadTooManyOperations at once, and the held ones keep a few KiB each of
// their 64 KiB requests. Under login-holds-requests every one is held,
// nothing is charged, and the delays queue up.
func TestHeldLoginsCappedPerPeer(t *testing.T) {
	const held, sent = 4, 10
	for _, fault := range []bool{false, true} {
		t.Run(fmt.Sprintf("fault=%v", fault), func(t *testing.T) {
			// Long enough for all to arrive while the first are held
			// (under -race too); shorter under the fault, whose delays
			// queue.
			delay := time.Second
			if fault {
				delay = 200 * time.Millisecond
			}
			cfg := Config{
				Users:      map[string]string{"alice": "secret"},
				LoginDelay: delay, LoginDelayMax: delay, LoginFreeFailures: 1,
				MaxHeldLoginsPerPeer: held, MemoryBudget: 16 << 20,
			}
			if fault {
				cfg.Faults = Faults{catalog.FaultLoginHoldsRequests: true}
			}
			ts := runServer(t, cfg)
			c := newRawChannel(t, ts.endpoint)
			r := createRaw(t, c)
			if err := r.activate(r.user("alice", "guess", r.nonce)); !errors.Is(err, ua.StatusBadUserAccessDenied) {
				t.Fatalf("first guess: %v", err) // free; from now on the peer is throttled
			}
			type answer struct {
				err  error
				took time.Duration
			}
			answers := make(chan answer, sent)
			var wg sync.WaitGroup
			for i := range sent {
				wg.Go(func() {
					// a fresh user name each: held by the peer's key, not
					// refused by a user's failed-login budget
					took, err := timedActivate(r, junkSecret(fmt.Sprintf("fresh%d", i), 64<<10))
					answers <- answer{err, took}
				})
			}
			time.Sleep(delay / 2)
			charged := ts.budget.UsedBy(budget.Logins)
			wg.Wait()
			close(answers)
			var refused, checked int
			var slowestRefusal, lastChecked time.Duration
			for a := range answers {
				switch {
				case errors.Is(a.err, ua.StatusBadTooManyOperations):
					refused++
					slowestRefusal = max(slowestRefusal, a.took)
				case errors.Is(a.err, ua.StatusBadIdentityTokenInvalid), errors.Is(a.err, ua.StatusBadUserAccessDenied):
					checked++
					lastChecked = max(lastChecked, a.took)
					if a.took < delay*8/10 {
						t.Errorf("a held login answered after %v, before its delay %v", a.took, delay)
					}
				default:
					t.Errorf("pipelined login: %v", a.err)
				}
			}
			t.Logf("%d pipelined logins: %d refused (slowest after %v), %d checked (last after %v); Logins charged while held: %d bytes",
				sent, refused, slowestRefusal, checked, lastChecked, charged)
			if fault {
				if refused != 0 || checked != sent {
					t.Errorf("under %s: %d refused, %d checked, want all %d held and checked", catalog.FaultLoginHoldsRequests, refused, checked, sent)
				}
				if lastChecked < time.Duration(sent-1)*delay {
					t.Errorf("under %s the last held login was answered after %v, want the delays queued (≥ %v)", catalog.FaultLoginHoldsRequests, lastChecked, time.Duration(sent-1)*delay)
				}
				return
			}
			if refused != sent-held || checked != held {
				t.Errorf("%d refused, %d checked, want %d refused (beyond MaxHeldLoginsPerPeer %d) and %d checked", refused, checked, sent-held, held, held)
			}
			if slowestRefusal > delay/2 {
				t.Errorf("a refusal took %v, want it at once (≪ the delay %v)", slowestRefusal, delay)
			}
			if lastChecked > 2*delay {
				t.Errorf("the last held login was answered after %v, want each delay from its arrival, at most %v", lastChecked, delay)
			}
			if charged <= 0 || charged > held*4<<10 {
				t.Errorf("Logins charged %d bytes for %d held 64 KiB requests, want > 0 and ≤ %d (the secrets dropped)", charged, held, held*4<<10)
			}
			// a held login's charge goes once its answer is sent, just
			// after the client read it: give the release a moment
			released := time.Now().Add(2 * time.Second)
			for ts.budget.UsedBy(budget.Logins) != 0 && time.Now().Before(released) {
				time.Sleep(10 * time.Millisecond)
			}
			if n := ts.budget.UsedBy(budget.Logins); n != 0 {
				t.Errorf("Logins still charged %d bytes 2 s after every held login was answered", n)
			}
		})
	}
}

// TestHeldLoginsReleasedWithChannel: logins held when their channel closes
// are dropped at once: their charge and their places among the peer's held
// logins are returned and the throttle stops waiting for them. Under
// login-holds-requests their timers outlive the channel.
func TestHeldLoginsReleasedWithChannel(t *testing.T) {
	const delay, held = 2 * time.Second, 4
	for _, fault := range []bool{false, true} {
		t.Run(fmt.Sprintf("fault=%v", fault), func(t *testing.T) {
			cfg := Config{
				Users:      map[string]string{"alice": "secret"},
				LoginDelay: delay, LoginDelayMax: delay, LoginFreeFailures: 1,
				MaxHeldLoginsPerPeer: held, MemoryBudget: 16 << 20,
			}
			if fault {
				cfg.Faults = Faults{catalog.FaultLoginHoldsRequests: true}
			}
			ts := runServer(t, cfg)
			c := newRawChannel(t, ts.endpoint)
			r := createRaw(t, c)
			if err := r.activate(r.user("alice", "guess", r.nonce)); !errors.Is(err, ua.StatusBadUserAccessDenied) {
				t.Fatalf("first guess: %v", err)
			}
			keys := loginKeys{ip: "127.0.0.1", user: "alice"}
			var wg sync.WaitGroup
			for i := range held {
				// a fresh user name each: held by the peer's key, not
				// refused by a user's failed-login budget
				wg.Go(func() { _ = r.activate(r.user(fmt.Sprintf("fresh%d", i), "guess", r.nonce)) })
			}
			deadline := time.Now().Add(time.Second)
			for ts.logins.waitingFrom(keys.ip) < held && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			if n := ts.logins.waitingFrom(keys.ip); n != held {
				t.Fatalf("%d logins held, want %d", n, held)
			}
			charged := ts.budget.UsedBy(budget.Logins)
			closed := time.Now()
			_ = c.Close(context.Background())
			wg.Wait()
			// Give the server's reader time to see the close (not the
			// held logins' delay: under the fault they would fire).
			deadline = time.Now().Add(delay / 4)
			for ts.logins.waitingFrom(keys.ip) > 0 && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			waiting, left, heldBy := ts.logins.waitingFrom(keys.ip), ts.budget.UsedBy(budget.Logins), ts.logins.heldBy(keys.ip)
			t.Logf("%d held logins charged %d bytes; %v after the channel closed: %d waiting, %d bytes charged, %d held for the peer",
				held, charged, time.Since(closed).Round(time.Millisecond), waiting, left, heldBy)
			if fault {
				if waiting != held {
					t.Errorf("under %s %d held logins still wait after the channel closed, want all %d (timers outlive the channel)", catalog.FaultLoginHoldsRequests, waiting, held)
				}
				return
			}
			if charged <= 0 {
				t.Errorf("held logins charged %d bytes to the budget, want > 0", charged)
			}
			if waiting != 0 || left != 0 || heldBy != 0 {
				t.Errorf("after the channel closed: %d waiting, %d bytes charged, %d held, want all 0", waiting, left, heldBy)
			}
			if d := time.Since(closed); d > delay/2 {
				t.Errorf("held logins released %v after the channel closed, want at once (their delay is %v)", d, delay)
			}
		})
	}
}

// TestSecretBlocksCapped: an encrypted secret of 2 000 valid RSA blocks is
// refused BadIdentityTokenInvalid without decrypting any (at once); under
// rsa-blocks-unbounded every block is decrypted first.
func TestSecretBlocksCapped(t *testing.T) {
	const blocks = 2000
	took := map[bool]time.Duration{}
	for _, fault := range []bool{false, true} {
		t.Run(fmt.Sprintf("fault=%v", fault), func(t *testing.T) {
			cfg := Config{Users: map[string]string{"alice": "secret"}, MaxSecretBlocks: 16}
			if fault {
				cfg.Faults = Faults{catalog.FaultRSABlocksUnbounded: true}
			}
			ts := runServer(t, cfg)
			r := createRaw(t, newRawChannel(t, ts.endpoint))
			// RSA-OAEP with SHA-1 carries key size - 42 bytes a block.
			k := r.serverKey().Size()
			plain := make([]byte, blocks*(k-42))
			tok := &ua.UserNameIdentityToken{PolicyID: PolicyUserName, UserName: "alice", EncryptionAlgorithm: rsaOAEP,
				Password: r.encrypt(UserNameSecurityPolicy, plain)}
			if n := len(tok.Password) / k; n != blocks {
				t.Fatalf("secret of %d blocks, want %d", n, blocks)
			}
			d, err := timedActivate(r, tok)
			took[fault] = d
			t.Logf("secret of %d RSA blocks (%d bytes): %v after %v", blocks, len(tok.Password), err, d)
			if !errors.Is(err, ua.StatusBadIdentityTokenInvalid) {
				t.Errorf("secret of %d blocks: %v, want BadIdentityTokenInvalid", blocks, err)
			}
			if !fault && d > 150*time.Millisecond {
				t.Errorf("secret of %d blocks refused after %v, want at once (nothing decrypted)", blocks, d)
			}
		})
	}
	if took[true] < 5*took[false] || took[true] < 200*time.Millisecond {
		t.Errorf("under %s the %d-block secret was answered after %v (%v without the fault), want it decrypted (far slower)",
			catalog.FaultRSABlocksUnbounded, blocks, took[true], took[false])
	}
}

// TestFreshUserNamesDelayed: one address guessing with a fresh user name
// every try is delayed by its peer-IP key after LoginFreeFailures; under
// throttle-pair-only it guesses at full speed.
func TestFreshUserNamesDelayed(t *testing.T) {
	const delay, tries = 100 * time.Millisecond, 8
	for _, fault := range []bool{false, true} {
		t.Run(fmt.Sprintf("fault=%v", fault), func(t *testing.T) {
			cfg := Config{Users: map[string]string{"alice": "secret"}, LoginDelay: delay, LoginDelayMax: time.Second, LoginFreeFailures: 3}
			if fault {
				cfg.Faults = Faults{catalog.FaultThrottlePairOnly: true}
			}
			ts := runServer(t, cfg)
			r := createRaw(t, newRawChannel(t, ts.endpoint))
			var took []time.Duration
			for i := range tries {
				d, err := timedActivate(r, r.user(fmt.Sprintf("user%d", i), "guess", r.nonce))
				if !errors.Is(err, ua.StatusBadUserAccessDenied) {
					t.Fatalf("guess %d: %v", i, err)
				}
				took = append(took, d)
			}
			t.Logf("%d guesses with fresh user names answered after %v", tries, took)
			for i, d := range took[cfg.LoginFreeFailures:] {
				if !fault && d < delay*8/10 {
					t.Errorf("guess %d answered after %v, want delayed (≥ %v)", i+cfg.LoginFreeFailures+1, d, delay)
				}
				if fault && d >= delay*8/10 {
					t.Errorf("under %s guess %d answered after %v, want no delay", catalog.FaultThrottlePairOnly, i+cfg.LoginFreeFailures+1, d)
				}
			}
		})
	}
}

// TestOneUserFromManyAddresses: guesses for one user from many addresses,
// each address below LoginFreeFailures, are delayed by the user's key
// (at most 1 s); under throttle-pair-only they go at full speed.
func TestOneUserFromManyAddresses(t *testing.T) {
	const delay, addrs = 100 * time.Millisecond, 4
	for _, fault := range []bool{false, true} {
		t.Run(fmt.Sprintf("fault=%v", fault), func(t *testing.T) {
			cfg := Config{Users: map[string]string{"alice": "secret"}, LoginDelay: delay, LoginDelayMax: 5 * time.Second, LoginFreeFailures: 3}
			if fault {
				cfg.Faults = Faults{catalog.FaultThrottlePairOnly: true}
			}
			ts := runServer(t, cfg)
			var took []time.Duration
			for i := range addrs {
				r := createRaw(t, newRawChannelFrom(t, ts.endpoint, fmt.Sprintf("127.0.0.%d", 10+i)))
				for range 2 {
					d, err := timedActivate(r, r.user("alice", "guess", r.nonce))
					if !errors.Is(err, ua.StatusBadUserAccessDenied) {
						t.Fatalf("guess from 127.0.0.%d: %v", 10+i, err)
					}
					took = append(took, d)
				}
			}
			t.Logf("%d guesses for one user from %d addresses answered after %v", len(took), addrs, took)
			for i, d := range took[cfg.LoginFreeFailures:] {
				if !fault && (d < delay*8/10 || d > sharedDelayMax+300*time.Millisecond) {
					t.Errorf("guess %d answered after %v, want delayed by the user's key (%v to %v)", i+cfg.LoginFreeFailures+1, d, delay, sharedDelayMax)
				}
				if fault && d >= delay*8/10 {
					t.Errorf("under %s guess %d answered after %v, want no delay", catalog.FaultThrottlePairOnly, i+cfg.LoginFreeFailures+1, d)
				}
			}
		})
	}
}

// TestGuessingDoesNotLockOutOthers: while one address guesses alice's
// password (its own attempts delayed up to LoginDelayMax), bob logs in
// from the same address, and alice herself from another one, each within
// about a second: the shared keys' delays are capped at sharedDelayMax.
func TestGuessingDoesNotLockOutOthers(t *testing.T) {
	const delay = 100 * time.Millisecond
	ts := runServer(t, Config{
		Users:      map[string]string{"alice": "secret", "bob": "builder"},
		LoginDelay: delay, LoginDelayMax: 5 * time.Second, LoginFreeFailures: 3,
	})
	attacker := createRaw(t, newRawChannel(t, ts.endpoint))
	for range 7 { // free, free, free, then 100, 200, 400, 800 ms
		if err := attacker.activate(attacker.user("alice", "guess", attacker.nonce)); !errors.Is(err, ua.StatusBadUserAccessDenied) {
			t.Fatalf("guess: %v", err)
		}
	}
	// The attacker's next guess is held meanwhile (about 1.6 s).
	var wg sync.WaitGroup
	var guessTook time.Duration
	wg.Go(func() {
		guessTook, _ = timedActivate(attacker, attacker.user("alice", "guess", attacker.nonce))
	})
	time.Sleep(20 * time.Millisecond)

	bob := createRaw(t, newRawChannel(t, ts.endpoint))
	bobTook, err := timedActivate(bob, bob.user("bob", "builder", bob.nonce))
	if err != nil {
		t.Fatalf("bob's login from the attacker's address: %v", err)
	}
	alice := createRaw(t, newRawChannelFrom(t, ts.endpoint, "127.0.0.2"))
	aliceTook, err := timedActivate(alice, alice.user("alice", "secret", alice.nonce))
	if err != nil {
		t.Fatalf("alice's login from another address: %v", err)
	}
	wg.Wait()
	t.Logf("bob (same address) logged in after %v, alice (other address) after %v; the attacker's next guess waited %v",
		bobTook, aliceTook, guessTook)
	limit := sharedDelayMax + 300*time.Millisecond
	if bobTook > limit {
		t.Errorf("bob's login took %v while another user was guessed, want ≤ %v", bobTook, limit)
	}
	if aliceTook > limit {
		t.Errorf("alice's own login from another address took %v, want ≤ %v", aliceTook, limit)
	}
	if guessTook < limit {
		t.Errorf("the attacker's next guess waited %v, want its pair's delay (> %v)", guessTook, limit)
	}
}

// TestLoginThrottleBounded: fresh user names cannot grow the throttle's
// tables beyond maxLoginPeers keys each, and a full table evicts keys
// with few failures before a key that throttles a guesser.
func TestLoginThrottleBounded(t *testing.T) {
	l := newLoginThrottle(3, 10*time.Millisecond, time.Second)
	now := time.Now()
	guesser := loginKeys{ip: "192.0.2.1", user: "alice"}
	for range 10 {
		l.done(guesser, loginFailure, now)
	}
	for i := range 3 * maxLoginPeers {
		l.done(loginKeys{ip: "192.0.2.2", user: fmt.Sprintf("fresh%d", i)}, loginFailure, now)
	}
	l.mu.Lock()
	pairs, users, ips := len(l.pairs.peers), len(l.users.peers), len(l.ips.peers)
	_, kept := l.pairs.peers[guesser.pair()]
	l.mu.Unlock()
	t.Logf("after %d fresh user names: %d pair keys, %d user keys, %d peer-IP keys", 3*maxLoginPeers, pairs, users, ips)
	if pairs > maxLoginPeers || users > maxLoginPeers || ips > maxLoginPeers {
		t.Errorf("tables of %d, %d and %d keys, want at most %d each", pairs, users, ips, maxLoginPeers)
	}
	if !kept {
		t.Error("the guesser's pair key (10 failures) was evicted for keys of one failure")
	}
	if d, _ := l.reserve(guesser, now, false); d <= 0 {
		t.Errorf("the guesser's next attempt waits %v, want a delay", d)
	}
	// Quiet keys are forgotten.
	later := now.Add(forgetAfter + time.Second)
	if d, _ := l.reserve(guesser, later, false); d != 0 {
		t.Errorf("after %v quiet the guesser still waits %v", forgetAfter, d)
	}
}

// TestGuessBudgetAcrossAddresses (issue 44, item 9): 8 addresses × 6
// channels guess alice's password as fast as they are answered for 3 s:
// the user's failed-login budget answers at most 1/userGuessSpacing
// failed logins a second past the free ones, whatever the number of
// addresses (the rest are refused BadTooManyOperations, unchecked), and
// alice still logs in at once from the address she logged in from
// before. Under guesses-across-addresses the user key only delays each
// attempt by up to its cap: the guesses scale with the addresses.
func TestGuessBudgetAcrossAddresses(t *testing.T) {
	const (
		addrs, perAddr = 8, 6
		span           = 3 * time.Second
	)
	for _, fault := range []bool{false, true} {
		t.Run(fmt.Sprintf("fault=%v", fault), func(t *testing.T) {
			cfg := Config{Users: map[string]string{"alice": "secret"}, LoginDelay: 100 * time.Millisecond,
				LoginDelayMax: time.Second, LoginFreeFailures: 3, Faults: Faults{catalog.FaultGuessesAcrossAddresses: fault}}
			ts := runServer(t, cfg)
			home := "127.0.0.9"
			r := createRaw(t, newRawChannelFrom(t, ts.endpoint, home))
			if err := r.activate(r.user("alice", "secret", r.nonce)); err != nil {
				t.Fatalf("alice's first login from %s: %v", home, err)
			}
			var guessers []*rawSession
			for a := range addrs {
				for range perAddr {
					guessers = append(guessers, createRaw(t, newRawChannelFrom(t, ts.endpoint, fmt.Sprintf("127.0.0.%d", 20+a))))
				}
			}
			var (
				mu               sync.Mutex
				failed           []time.Time
				refused, unknown int
			)
			start := time.Now()
			var wg sync.WaitGroup
			for _, g := range guessers {
				wg.Go(func() {
					for time.Since(start) < span {
						err := g.activate(g.user("alice", "guess", g.nonce))
						mu.Lock()
						switch {
						case errors.Is(err, ua.StatusBadUserAccessDenied):
							failed = append(failed, time.Now())
						case errors.Is(err, ua.StatusBadTooManyOperations):
							refused++
						default:
							unknown++
						}
						mu.Unlock()
					}
				})
			}
			time.Sleep(span / 2)
			home2 := createRaw(t, newRawChannelFrom(t, ts.endpoint, home))
			d, err := timedActivate(home2, home2.user("alice", "secret", home2.nonce))
			wg.Wait()
			if err != nil || (!fault && d > 500*time.Millisecond) {
				t.Errorf("alice from %s during the guessing: %v after %v, want logged in at once", home, err, d)
			}
			if unknown > 0 {
				t.Errorf("%d guesses answered neither BadUserAccessDenied nor BadTooManyOperations", unknown)
			}
			// The rate after the first second: the free failures and the
			// slots the budget hands out within its one-second window
			// come at once.
			slices.SortFunc(failed, func(a, b time.Time) int { return a.Compare(b) })
			steady := slices.DeleteFunc(slices.Clone(failed), func(at time.Time) bool { return at.Before(start.Add(time.Second)) })
			rate := 0.0
			if len(steady) > 1 {
				rate = float64(len(steady)-1) / steady[len(steady)-1].Sub(steady[0]).Seconds()
			}
			t.Logf("%d failed logins (%.1f/s after the first second), %d refused unchecked, from %d addresses; alice logged in after %v",
				len(failed), rate, refused, addrs, d)
			limit := float64(time.Second) / float64(userGuessSpacing)
			if !fault && rate > limit*1.15 {
				t.Errorf("%.1f failed logins a second for one user from %d addresses, over the budget of %.0f", rate, addrs, limit)
			}
			if fault && rate < 3*limit {
				t.Errorf("under %s: %.1f failed logins a second from %d addresses, want far over %.0f", catalog.FaultGuessesAcrossAddresses, rate, addrs, limit)
			}
		})
	}
}
