package subscription

import (
	"strings"
	"testing"

	"github.com/gopcua/opcua/ua"
)

// anonKeys makes the sessions whose key starts with "anon" anonymous.
func anonKeys(key any) bool {
	s, ok := key.(string)
	return ok && strings.HasPrefix(s, "anon")
}

// create asks session s for a subscription publishing every ms and
// returns its id, or 0 and the status it was refused with.
func create(t *testing.T, s *Session, ms float64) (uint32, ua.StatusCode) {
	t.Helper()
	r := s.CreateSubscription(&ua.CreateSubscriptionRequest{RequestHeader: hdr(), RequestedPublishingInterval: ms,
		RequestedMaxKeepAliveCount: 10, RequestedLifetimeCount: 100, PublishingEnabled: true})
	switch r := r.(type) {
	case *ua.CreateSubscriptionResponse:
		return r.SubscriptionID, ua.StatusOK
	case *ua.ServiceFault:
		return 0, r.ResponseHeader.ServiceResult
	}
	t.Fatalf("CreateSubscription answered %T", r)
	return 0, 0
}

// accounting checks the manager's live subscriptions and rate (cycles a
// second), all and anonymous.
func accounting(t *testing.T, m *Manager, subs, anonSubs int, rate, anonRate float64) {
	t.Helper()
	st := m.Stats()
	if st.Subscriptions != subs || st.AnonymousSubs != anonSubs || st.Rate != rate || st.AnonymousRate != anonRate {
		t.Fatalf("%d subscriptions (%d anonymous), %v cycles a second (%v anonymous); want %d (%d), %v (%v)",
			st.Subscriptions, st.AnonymousSubs, st.Rate, st.AnonymousRate, subs, anonSubs, rate, anonRate)
	}
}

// TestAnonymousShareOfSubscriptions: with 10 subscriptions server-wide,
// anonymous sessions together get 5 (the default ½), the sixth is
// BadTooManySubscriptions while a user session still gets the other 5;
// deleting an anonymous one makes room for an anonymous one again, and
// closing the anonymous sessions releases their whole class.
func TestAnonymousShareOfSubscriptions(t *testing.T) {
	h := newHarness(t, Options{MaxSubscriptionsTotal: 10, Anonymous: anonKeys})
	m := h.m
	a1, _ := m.Session("anon-1")
	a2, _ := m.Session("anon-2")
	user := h.s // "s1": a user's session
	var first uint32
	for i := range 6 {
		s := a1
		if i%2 == 1 {
			s = a2
		}
		id, st := create(t, s, 1000)
		if i < 5 && st != ua.StatusOK {
			t.Fatalf("anonymous subscription %d: %v", i+1, st)
		}
		if i == 5 && st != ua.StatusBadTooManySubscriptions {
			t.Fatalf("anonymous subscription 6 beyond the share: %v, want BadTooManySubscriptions", st)
		}
		if i == 0 {
			first = id
		}
	}
	accounting(t, m, 5, 5, 5, 5)
	for i := range 5 {
		if _, st := create(t, user, 1000); st != ua.StatusOK {
			t.Fatalf("user subscription %d: %v", i+1, st)
		}
	}
	if _, st := create(t, user, 1000); st != ua.StatusBadTooManySubscriptions {
		t.Fatalf("user subscription beyond the server-wide limit: %v", st)
	}
	accounting(t, m, 10, 5, 10, 5)
	// a deleted anonymous subscription gives its place back to its class
	// only once the server-wide limit has room too
	r := a1.DeleteSubscriptions(&ua.DeleteSubscriptionsRequest{RequestHeader: hdr(), SubscriptionIDs: []uint32{first}})
	if d, ok := r.(*ua.DeleteSubscriptionsResponse); !ok || d.Results[0] != ua.StatusOK {
		t.Fatalf("DeleteSubscriptions: %#v", r)
	}
	accounting(t, m, 9, 4, 9, 4)
	if _, st := create(t, a2, 1000); st != ua.StatusOK {
		t.Fatalf("anonymous subscription after a delete: %v", st)
	}
	accounting(t, m, 10, 5, 10, 5)
	m.CloseSession("anon-1")
	m.CloseSession("anon-2")
	accounting(t, m, 5, 0, 5, 0)
}

// TestAnonymousShareUnshared: with AnonymousShare 1 (the fault
// anonymous-subscriptions-unshared) anonymous sessions take all 10 and
// the user gets none.
func TestAnonymousShareUnshared(t *testing.T) {
	h := newHarness(t, Options{MaxSubscriptionsTotal: 10, Anonymous: anonKeys, AnonymousShare: 1})
	a, _ := h.m.Session("anon-1")
	for i := range 10 {
		if _, st := create(t, a, 1000); st != ua.StatusOK {
			t.Fatalf("anonymous subscription %d: %v", i+1, st)
		}
	}
	if _, st := create(t, h.s, 1000); st != ua.StatusBadTooManySubscriptions {
		t.Fatalf("user subscription: %v, want BadTooManySubscriptions", st)
	}
	accounting(t, h.m, 10, 10, 10, 10)
}

// TestAnonymousShareOfRate: with 100 publishing cycles a second,
// anonymous sessions get 50 (five at 100 ms; a sixth is refused), a user
// the rest. ModifySubscription charges the subscription's class: an
// anonymous one sped up beyond the share keeps its interval, slowed down
// gives back to the class, and sped up again within it is charged.
func TestAnonymousShareOfRate(t *testing.T) {
	h := newHarness(t, Options{MaxPublishRate: 100, Anonymous: anonKeys})
	m := h.m
	a, _ := m.Session("anon-1")
	var ids []uint32
	for range 5 {
		id, st := create(t, a, 100)
		if st != ua.StatusOK {
			t.Fatalf("anonymous at 100 ms: %v", st)
		}
		ids = append(ids, id)
	}
	if _, st := create(t, a, 100); st != ua.StatusBadTooManySubscriptions {
		t.Fatalf("anonymous beyond the rate share: %v", st)
	}
	for range 5 {
		if _, st := create(t, h.s, 100); st != ua.StatusOK {
			t.Fatalf("user at 100 ms: %v", st)
		}
	}
	accounting(t, m, 10, 5, 100, 50)
	modify := func(id uint32, ms float64) float64 {
		t.Helper()
		r := a.ModifySubscription(&ua.ModifySubscriptionRequest{RequestHeader: hdr(), SubscriptionID: id, RequestedPublishingInterval: ms,
			RequestedMaxKeepAliveCount: 10, RequestedLifetimeCount: 100})
		mr, ok := r.(*ua.ModifySubscriptionResponse)
		if !ok {
			t.Fatalf("ModifySubscription: %#v", r)
		}
		return mr.RevisedPublishingInterval
	}
	if got := modify(ids[0], 1000); got != 1000 {
		t.Fatalf("slowed to %v ms", got)
	}
	accounting(t, m, 10, 5, 91, 41)
	// 9 cycles of the anonymous share free, but the server's rate has
	// room for 9 too: 50 ms (20 a second) fits neither
	if got := modify(ids[0], 50); got != 1000 {
		t.Fatalf("sped up past the share: %v ms, want the 1000 it had", got)
	}
	if got := modify(ids[0], 100); got != 100 {
		t.Fatalf("back to 100 ms: %v", got)
	}
	accounting(t, m, 10, 5, 100, 50)
	m.CloseSession("anon-1")
	accounting(t, m, 5, 0, 50, 0)
}

// TestAnonymousClassKeptAcrossTransfer: a subscription keeps the class
// it was charged to when it moves to a user's session and back; deleting
// it releases that class, whoever owns it then.
func TestAnonymousClassKeptAcrossTransfer(t *testing.T) {
	h := newHarness(t, Options{MaxSubscriptionsTotal: 4, MaxPublishRate: 100, Anonymous: anonKeys})
	m := h.m
	a, _ := m.Session("anon-1")
	id, st := create(t, a, 100)
	if st != ua.StatusOK {
		t.Fatal(st)
	}
	if _, code := m.Transfer(id, "anon-1", h.s, false, false); code != ua.StatusOK {
		t.Fatalf("transfer to the user: %v", code)
	}
	accounting(t, m, 1, 1, 10, 10)
	// the user's session has it, still charged to the anonymous class:
	// the anonymous share (2) has room for one more only
	if _, st := create(t, a, 1000); st != ua.StatusOK {
		t.Fatalf("second anonymous: %v", st)
	}
	if _, st := create(t, a, 1000); st != ua.StatusBadTooManySubscriptions {
		t.Fatalf("third anonymous: %v, want BadTooManySubscriptions", st)
	}
	r := h.s.DeleteSubscriptions(&ua.DeleteSubscriptionsRequest{RequestHeader: hdr(), SubscriptionIDs: []uint32{id}})
	if d, ok := r.(*ua.DeleteSubscriptionsResponse); !ok || d.Results[0] != ua.StatusOK {
		t.Fatalf("DeleteSubscriptions: %#v", r)
	}
	accounting(t, m, 1, 1, 1, 1)
	// and a user's subscription moved to an anonymous session stays the
	// user's
	uid, st := create(t, h.s, 100)
	if st != ua.StatusOK {
		t.Fatal(st)
	}
	if _, code := m.Transfer(uid, "s1", a, false, false); code != ua.StatusOK {
		t.Fatalf("transfer to the anonymous session: %v", code)
	}
	accounting(t, m, 2, 1, 11, 1)
	m.CloseSession("anon-1")
	accounting(t, m, 0, 0, 0, 0)
}
