package session

import (
	"testing"
	"time"

	"github.com/gopcua/opcua/ua"
)

func TestLifecycle(t *testing.T) {
	m := NewManager(Limits{MaxSessions: 2})
	now := time.Now()
	s := m.Create("a", 150*time.Millisecond, now)
	if s == nil || s.Timeout != 150*time.Millisecond {
		t.Fatalf("create: %+v", s)
	}
	if m.Lookup(s.Token) != s {
		t.Fatal("lookup by token failed")
	}
	// The token as a client decodes it is a different value, equal content.
	b, _ := s.Token.Encode()
	var decoded ua.NodeID
	if _, err := decoded.Decode(b); err != nil || m.Lookup(&decoded) != s {
		t.Fatalf("lookup by decoded token failed: %v", err)
	}
	if m.Lookup(ua.NewNumericNodeID(0, 1)) != nil || m.Lookup(nil) != nil {
		t.Error("lookup of a foreign token succeeded")
	}
	if activated, _, _ := s.State(); activated {
		t.Error("new session is activated")
	}
	first := s.ServerNonce()
	if len(first) != NonceSize {
		t.Fatalf("server nonce of %d bytes", len(first))
	}
	next, code, _ := s.Activate("user1", 7, "", first)
	if ok := code == ua.StatusOK; !ok || len(next) != NonceSize || string(next) == string(first) {
		t.Fatalf("activate: ok %v, next nonce %x after %x", ok, next, first)
	}
	if activated, user, ch := s.State(); !activated || user != "user1" || ch != 7 {
		t.Errorf("state after activate: %v %q %d", activated, user, ch)
	}
	if got := s.ServerNonce(); string(got) != string(next) {
		t.Errorf("server nonce %x, want the one activation returned %x", got, next)
	}
	// An activation checked against a replaced nonce changes nothing.
	if _, code, _ := s.Activate("user2", 8, "", first); code != ua.StatusBadIdentityTokenInvalid {
		t.Error("activation with a stale nonce succeeded")
	}
	if _, user, ch := s.State(); user != "user1" || ch != 7 || string(s.ServerNonce()) != string(next) {
		t.Errorf("stale activation changed the session: %q %d", user, ch)
	}

	closed := make(chan struct{})
	s.OnClose(func() { close(closed) })
	// A table full of activated user sessions has no room: none is
	// closed for a new one.
	sb := m.Create("b", 0, now)
	sb.Activate("user2", 8, "", sb.ServerNonce())
	if m.Create("c", 0, now) != nil {
		t.Error("MaxSessions not enforced")
	}
	// Only "a" is idle past its timeout.
	if exp := m.Expire(now.Add(200 * time.Millisecond)); len(exp) != 1 || exp[0] != s {
		t.Fatalf("expired %v, want session a", exp)
	}
	select {
	case <-closed:
	default:
		t.Error("OnClose did not run on timeout")
	}
	if !s.Closed() || m.Lookup(s.Token) != nil {
		t.Error("expired session still open")
	}
	c := m.Counts()
	if c.Current != 1 || c.Cumulated != 2 || c.Timeouts != 1 || c.Rejected != 1 {
		t.Errorf("counts %+v", c)
	}
}

func TestTimeoutRevision(t *testing.T) {
	m := NewManager(Limits{})
	now := time.Now()
	for _, tc := range []struct{ req, want time.Duration }{
		{0, 60 * time.Second},
		{time.Millisecond, 100 * time.Millisecond},
		{10 * time.Hour, time.Hour},
		{5 * time.Second, 5 * time.Second},
	} {
		if got := m.Create("x", tc.req, now).Timeout; got != tc.want {
			t.Errorf("requested %v: revised %v, want %v", tc.req, got, tc.want)
		}
	}
}

// TestUnactivatedSessionsBounded: sessions nobody activates are bounded in
// number and closed after UnactivatedTimeout; activated ones are not.
// (Under the unactivated-refuse fault: see TestUnactivatedEviction.)
func TestUnactivatedSessionsBounded(t *testing.T) {
	m := NewManager(Limits{MaxSessions: 10, MaxUnactivated: 2, UnactivatedTimeout: time.Second, UnactivatedRefuse: true})
	now := time.Now()
	a := m.Create("a", time.Hour, now)
	b := m.Create("b", time.Hour, now)
	if m.Create("c", time.Hour, now) != nil {
		t.Fatal("a third unactivated session was created")
	}
	a.Activate("", 1, "", a.ServerNonce())
	c := m.Create("c", time.Hour, now.Add(500*time.Millisecond))
	if c == nil {
		t.Fatal("activating a did not free a slot")
	}
	// After 1.2 s: b (created at 0) expires, c (at 0.5 s) and a (activated) stay.
	exp := m.Expire(now.Add(1200 * time.Millisecond))
	if len(exp) != 1 || exp[0] != b || !b.Closed() {
		t.Fatalf("expired %v, want b only", exp)
	}
	cnt := m.Counts()
	if cnt.Current != 2 || cnt.Unactivated != 1 || cnt.UnactivatedExpired != 1 || cnt.Rejected != 1 {
		t.Errorf("counts %+v", cnt)
	}
	if _, ok := m.Close(c.Token); !ok || m.Counts().Unactivated != 0 {
		t.Errorf("closing c: counts %+v", m.Counts())
	}
}
