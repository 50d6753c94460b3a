package server

import (
	"sync"
	"time"

	"github.com/gopcua/opcua/ua"
)

// rsaWork is the server's budget of RSA private-key operations per peer
// address: the blocks of secured OpenSecureChannel requests it decrypts
// and the signatures of CreateSession on secured channels. Each costs
// about a millisecond of CPU (RSA-2048; several for RSA-4096) and the peer
// next to nothing: without a bound one address keeps the server's cores
// busy for nothing. Each address has a token bucket of Config.RSAOpsPerPeer
// operations a second, at most Config.RSABurstPerPeer saved up; an
// operation the bucket cannot pay for is refused, not done.
//
// Memory is bounded: at most maxLoginPeers addresses are tracked; a full
// table first forgets the addresses whose bucket is full again (the same
// as an address never seen), then one at random.
type rsaWork struct {
	rate, burst float64

	mu    sync.Mutex
	peers map[string]*rsaBucket
}

// rsaBucket is one address's tokens as of last.
type rsaBucket struct {
	tokens float64
	last   time.Time
}

func newRSAWork(perSecond, burst int) *rsaWork {
	return &rsaWork{rate: float64(perSecond), burst: float64(burst), peers: make(map[string]*rsaBucket)}
}

// take spends n operations of ip's budget at now and reports whether it
// could; refused, nothing is spent.
func (w *rsaWork) take(ip string, n int, now time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	b := w.peers[ip]
	if b == nil {
		if len(w.peers) >= maxLoginPeers {
			w.evict(now)
		}
		b = &rsaBucket{tokens: w.burst, last: now}
		w.peers[ip] = b
	}
	w.refill(b, now)
	if float64(n) > b.tokens {
		return false
	}
	b.tokens -= float64(n)
	return true
}

// refill adds the tokens earned since b.last. w.mu held.
func (w *rsaWork) refill(b *rsaBucket, now time.Time) {
	if d := now.Sub(b.last); d > 0 {
		b.tokens = min(w.burst, b.tokens+d.Seconds()*w.rate)
		b.last = now
	}
}

// evict forgets the addresses whose bucket is full again, or one at random
// if none is. w.mu held.
func (w *rsaWork) evict(now time.Time) {
	for ip, b := range w.peers {
		w.refill(b, now)
		if b.tokens >= w.burst {
			delete(w.peers, ip)
		}
	}
	if len(w.peers) < maxLoginPeers {
		return
	}
	for ip := range w.peers { // map order is random
		delete(w.peers, ip)
		return
	}
}

// takeRSA spends n private-key operations of ip's budget for what (the
// service, for the log) and reports whether it could; a refusal is
// counted (Counter.RSARefused).
func (s *Server) takeRSA(ip string, n int, what string) bool {
	if s.rsa.take(ip, n, time.Now()) {
		return true
	}
	s.stats.rsaRefused.Add(1)
	s.log.Debug("refused over the peer's budget of RSA work", "remote", ip, "service", what, "operations", n)
	return false
}

// payForSecret pays the RSA blocks of an identity token's encrypted secret
// from the server-wide budget of secret decryption (Config.SecretOpsPerSecond)
// when the attempt comes from an address that failed LoginFreeFailures
// logins or more, and reports whether it may be decrypted. Other tokens,
// addresses without failed logins and secrets over MaxSecretBlocks (refused
// undecrypted anyway) cost nothing. A refusal is counted
// (Counter.SecretsRefused). With Config.unbudgetedSecrets every secret may
// be decrypted.
func (s *Server) payForSecret(ip string, eo *ua.ExtensionObject, now time.Time) bool {
	if s.cfg.unbudgetedSecrets || eo == nil {
		return true
	}
	t, ok := eo.Value.(*ua.UserNameIdentityToken)
	if !ok || t.EncryptionAlgorithm == "" || len(t.Password) == 0 {
		return true
	}
	n := s.secretBlocks(t.Password)
	if n > s.cfg.MaxSecretBlocks || !s.logins.suspect(ip, now) {
		return true
	}
	if s.secrets.take("", n, now) {
		return true
	}
	s.stats.secretsRefused.Add(1)
	s.log.Debug("login refused undecrypted over the server-wide budget of secret decryption", "remote", ip, "blocks", n)
	return false
}
