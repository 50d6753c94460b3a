package session

import (
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/gopcua/opcua/ua"
)

// quiet returns limits that log nowhere.
func quiet(lim Limits) Limits {
	lim.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	return lim
}

// activateOn activates s for user on channel ch (of the peer "peer") and
// returns the status.
func activateOn(s *Session, user string, ch uint32) ua.StatusCode {
	return activateFrom(s, user, ch, "peer")
}

// activateFrom activates s for user on channel ch of peer and returns the
// status.
func activateFrom(s *Session, user string, ch uint32, peer string) ua.StatusCode {
	_, code, _ := s.Activate(user, ch, peer, s.ServerNonce())
	return code
}

// TestUnactivatedEviction: at MaxUnactivated CreateSession closes the
// oldest unactivated session instead of refusing; under the
// unactivated-refuse fault it refuses.
func TestUnactivatedEviction(t *testing.T) {
	for _, fault := range []bool{false, true} {
		m := NewManager(quiet(Limits{MaxSessions: 20, MaxUnactivated: 3, UnactivatedRefuse: fault}))
		now := time.Now()
		var old []*Session
		for i := range 3 {
			old = append(old, m.Create("flood", time.Hour, now.Add(time.Duration(i)*time.Millisecond)))
		}
		fresh := m.Create("fresh", time.Hour, now.Add(time.Second))
		if fault {
			if fresh != nil {
				t.Error("unactivated-refuse: a fourth unactivated session was created")
			}
			if c := m.Counts(); c.Rejected != 1 || c.UnactivatedEvicted != 0 {
				t.Errorf("unactivated-refuse: counts %+v", c)
			}
			continue
		}
		if fresh == nil {
			t.Fatal("a new session was refused at MaxUnactivated")
		}
		if !old[0].Closed() || m.Lookup(old[0].Token) != nil || old[1].Closed() || old[2].Closed() {
			t.Error("not the oldest unactivated session was closed")
		}
		if code := activateOn(old[0], "", 1); code != ua.StatusBadSessionIDInvalid {
			t.Errorf("activating an evicted session: %v", code)
		}
		if code := activateOn(fresh, "user", 2); code != ua.StatusOK {
			t.Errorf("activating the new session: %v", code)
		}
		if c := m.Counts(); c.Current != 3 || c.Unactivated != 2 || c.UnactivatedEvicted != 1 || c.Rejected != 0 {
			t.Errorf("counts %+v", c)
		}
	}
}

// TestAnonymousShare: anonymous sessions hold at most MaxAnonymous places;
// beyond, an anonymous activation closes the oldest orphan first (under
// anonymous-full-refuses: or is refused), and a user login always finds a
// place. Under the sessions-outlive-channels fault anonymous sessions fill
// the table.
func TestAnonymousShare(t *testing.T) {
	m := NewManager(quiet(Limits{MaxSessions: 6, AnonymousRefuse: true}))
	now := time.Now()
	var anon []*Session
	for i := range 4 {
		s := m.Create("anon", time.Hour, now)
		code := activateOn(s, "", uint32(10+i))
		if i < 3 && code != ua.StatusOK || i == 3 && code != ua.StatusBadTooManySessions {
			t.Fatalf("anonymous activation %d: %v", i, code)
		}
		anon = append(anon, s)
	}
	if activated, _, _ := anon[3].State(); activated {
		t.Fatal("a refused activation activated the session")
	}
	// Channel 11 closes: its session is an orphan, the first to go.
	m.ChannelClosed(11)
	if c := m.Counts(); c.Anonymous != 3 || c.Orphaned != 1 || c.AnonymousRefused != 1 {
		t.Fatalf("counts %+v", c)
	}
	if code := activateOn(anon[3], "", 13); code != ua.StatusOK {
		t.Fatalf("anonymous activation with an orphan to close: %v", code)
	}
	if !anon[1].Closed() || anon[0].Closed() || anon[2].Closed() {
		t.Error("not the orphan was closed")
	}
	// A user login finds a place beside the full anonymous share.
	u := m.Create("user", time.Hour, now)
	if u == nil || activateOn(u, "user", 20) != ua.StatusOK {
		t.Fatal("user login refused beside the anonymous share")
	}
	// A user session may become anonymous only within the share.
	if code := activateOn(u, "", 20); code != ua.StatusBadTooManySessions {
		t.Errorf("user session turning anonymous beyond the share: %v", code)
	}
	if c := m.Counts(); c.Anonymous != 3 || c.OrphansEvicted != 1 {
		t.Errorf("counts %+v", c)
	}

	f := NewManager(quiet(Limits{MaxSessions: 6, OutliveChannels: true}))
	for i := range 6 {
		if s := f.Create("anon", time.Hour, now); s == nil || activateOn(s, "", uint32(i)) != ua.StatusOK {
			t.Fatalf("sessions-outlive-channels: anonymous session %d refused", i)
		}
		f.ChannelClosed(uint32(i))
	}
	if f.Create("user", time.Hour, now) != nil {
		t.Error("sessions-outlive-channels: an orphan was closed for a user login")
	}
}

// TestAnonymousShareYields (issue 44, item 3): with the anonymous share
// full of sessions on live channels used a moment ago, an anonymous
// activation is refused; once one was idle for YieldIdle, the activation
// closes the one idle longest and is served. Under anonymous-full-refuses
// it is refused BadTooManySessions.
func TestAnonymousShareYields(t *testing.T) {
	for _, fault := range []bool{false, true} {
		m := NewManager(quiet(Limits{MaxSessions: 6, AnonymousRefuse: fault}))
		now := time.Now()
		var anon []*Session
		for i := range 3 {
			s := m.Create("anon", time.Hour, now)
			if code := activateOn(s, "", uint32(10+i)); code != ua.StatusOK {
				t.Fatalf("fault=%v: anonymous activation %d: %v", fault, i, code)
			}
			anon = append(anon, s)
		}
		// Used a moment ago: none yields to a fresh activation.
		fresh := m.Create("fresh", time.Hour, now)
		if code := activateOn(fresh, "", 20); code != ua.StatusBadTooManySessions {
			t.Fatalf("fault=%v: anonymous activation beside busy sessions: %v, want BadTooManySessions", fault, code)
		}
		// anon[1] idle longest (beyond YieldIdle), anon[0] and anon[2]
		// used since.
		anon[1].Touch(now.Add(-time.Minute))
		anon[0].Touch(now.Add(-time.Second))
		code := activateOn(fresh, "", 20)
		if fault {
			if code != ua.StatusBadTooManySessions {
				t.Errorf("anonymous-full-refuses: fresh anonymous activation %v, want BadTooManySessions", code)
			}
			if c := m.Counts(); c.AnonymousYielded != 0 || c.AnonymousRefused != 2 {
				t.Errorf("anonymous-full-refuses: counts %+v", c)
			}
			continue
		}
		if code != ua.StatusOK {
			t.Fatalf("fresh anonymous activation at a full share of live sessions: %v", code)
		}
		if !anon[1].Closed() || anon[0].Closed() || anon[2].Closed() {
			t.Error("not the session idle longest was closed")
		}
		if c := m.Counts(); c.Anonymous != 3 || c.AnonymousYielded != 1 || c.AnonymousRefused != 1 {
			t.Errorf("counts %+v", c)
		}
	}
}

// TestAnonymousShareYieldsToAnotherPeer (issue 44, item 3): a peer that
// filled the anonymous share with sessions it keeps busy cannot lock
// another peer's fresh client out: the fresh client's activation closes
// the idlest session of the peer holding the most, at once; a peer that
// holds as many as any other waits for YieldIdle like the flooding peer
// itself. Under anonymous-full-refuses the fresh client is refused.
func TestAnonymousShareYieldsToAnotherPeer(t *testing.T) {
	for _, fault := range []bool{false, true} {
		m := NewManager(quiet(Limits{MaxSessions: 8, AnonymousRefuse: fault}))
		now := time.Now()
		var flood []*Session
		for i := range 4 {
			s := m.Create("flood", time.Hour, now)
			if code := activateFrom(s, "", uint32(10+i), "attacker"); code != ua.StatusOK {
				t.Fatalf("fault=%v: anonymous activation %d: %v", fault, i, code)
			}
			flood = append(flood, s)
		}
		flood[2].Touch(now.Add(-time.Second)) // the flood's idlest, under YieldIdle
		// the flooding peer's next one: refused, its sessions busy
		if code := activateFrom(m.Create("flood", time.Hour, now), "", 20, "attacker"); code != ua.StatusBadTooManySessions {
			t.Fatalf("fault=%v: one more of the flooding peer: %v, want BadTooManySessions", fault, code)
		}
		fresh := m.Create("fresh", time.Hour, now)
		code := activateFrom(fresh, "", 21, "victim")
		if fault {
			if code != ua.StatusBadTooManySessions {
				t.Errorf("anonymous-full-refuses: another peer's fresh client %v, want BadTooManySessions", code)
			}
			continue
		}
		if code != ua.StatusOK {
			t.Fatalf("another peer's fresh client at a share full of one peer's busy sessions: %v", code)
		}
		if !flood[2].Closed() || flood[0].Closed() || flood[1].Closed() || flood[3].Closed() {
			t.Error("not the flooding peer's idlest session was closed")
		}
		// the victim's peer (1) still holds fewer than the attacker (3)
		second := m.Create("fresh", time.Hour, now)
		if code := activateFrom(second, "", 22, "victim"); code != ua.StatusOK {
			t.Fatalf("a second fresh client of the peer holding fewer: %v", code)
		}
		// 2 against 2: the victim's peer now waits for YieldIdle too
		if code := activateFrom(m.Create("fresh", time.Hour, now), "", 23, "victim"); code != ua.StatusBadTooManySessions {
			t.Errorf("a peer holding as many as any other, beside busy sessions: %v, want BadTooManySessions", code)
		}
		if fresh.Closed() || second.Closed() {
			t.Error("a session of the peer holding fewer was closed")
		}
		if c := m.Counts(); c.AnonymousYielded != 2 {
			t.Errorf("counts %+v: want 2 yielded", c)
		}
	}
}

// TestOrphansMakeRoom: at MaxSessions CreateSession closes the oldest
// orphaned anonymous session, then the oldest unactivated one, and only
// then refuses; an orphan is resumable on a new channel until then, and a
// user session's orphan is never closed for room.
func TestOrphansMakeRoom(t *testing.T) {
	m := NewManager(quiet(Limits{MaxSessions: 4, MaxUnactivated: 4, MaxAnonymous: 4}))
	now := time.Now()
	a := m.Create("a", time.Hour, now)
	b := m.Create("b", time.Hour, now)
	u := m.Create("u", time.Hour, now)
	for i, s := range []*Session{a, b} {
		if code := activateOn(s, "", uint32(i+1)); code != ua.StatusOK {
			t.Fatal(code)
		}
	}
	if code := activateOn(u, "user", 3); code != ua.StatusOK {
		t.Fatal(code)
	}
	pending := m.Create("pending", time.Hour, now)
	for _, ch := range []uint32{3, 2, 1} { // u orphaned first, then b, then a
		m.ChannelClosed(ch)
	}
	// b resumes on a new channel: no longer an orphan.
	if code := activateOn(b, "", 9); code != ua.StatusOK {
		t.Fatalf("orphan not resumable: %v", code)
	}
	if c := m.Counts(); c.Orphaned != 2 {
		t.Fatalf("counts %+v", c)
	}
	// Full: the orphaned anonymous a goes first, then the unactivated
	// pending; the user's orphan u and the resumed b stay.
	if m.Create("x", time.Hour, now) == nil || !a.Closed() {
		t.Fatal("the orphaned anonymous session did not make room")
	}
	if m.Create("y", time.Hour, now) == nil || !pending.Closed() {
		t.Fatal("the oldest unactivated session did not make room")
	}
	if u.Closed() || b.Closed() {
		t.Error("a user orphan or a resumed session was closed")
	}
	// x is now the oldest unactivated session.
	if m.Create("z", time.Hour, now) == nil {
		t.Fatal("x did not make room")
	}
	if code := activateOn(u, "user", 10); code != ua.StatusOK {
		t.Errorf("the user's orphan is not resumable: %v", code)
	}
	if c := m.Counts(); c.OrphansEvicted != 1 || c.UnactivatedEvicted != 2 || c.Current != 4 {
		t.Errorf("counts %+v", c)
	}
}
