package server

// Issue 44, lockout without credentials: anonymous sessions together
// hold at most a share (Config.AnonymousSubscriptionShare, ½) of the
// server-wide subscription limit and publishing rate, so a user who logs
// in still gets subscriptions (the anonymous-subscriptions-unshared
// fault: anonymous sessions may take it all).

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gopcua/opcua"
	"github.com/gopcua/opcua/ua"

	"github.com/opcua-chaos/opcua-chaos/internal/uawire"
	"github.com/opcua-chaos/opcua-chaos/server/catalog"
)

// subscribeRaw asks for a subscription publishing every ms on an
// anonymous raw session and returns the status it got.
func subscribeRaw(t *testing.T, c *uawire.Conn, ms float64) ua.StatusCode {
	t.Helper()
	r, err := c.Call(&ua.CreateSubscriptionRequest{RequestedPublishingInterval: ms, RequestedLifetimeCount: 10_000,
		RequestedMaxKeepAliveCount: 1000, PublishingEnabled: true})
	if err != nil {
		t.Fatalf("CreateSubscription: %v", err)
	}
	if _, ok := r.Value.(*ua.CreateSubscriptionResponse); ok {
		return ua.StatusOK
	}
	return r.Status()
}

// subscribeClient asks for a subscription publishing every ms on c's
// session and returns the status it got.
func subscribeClient(t *testing.T, c *opcua.Client, ms float64) ua.StatusCode {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var resp ua.Response
	err := c.Send(ctx, &ua.CreateSubscriptionRequest{RequestedPublishingInterval: ms, RequestedLifetimeCount: 10_000,
		RequestedMaxKeepAliveCount: 1000, PublishingEnabled: true}, func(r ua.Response) error {
		resp = r
		return nil
	})
	switch r := resp.(type) {
	case *ua.CreateSubscriptionResponse:
		return ua.StatusOK
	case *ua.ServiceFault:
		return r.ResponseHeader.ServiceResult
	}
	if err != nil {
		if code, ok := err.(ua.StatusCode); ok {
			return code
		}
		t.Fatalf("CreateSubscription: %v", err)
	}
	t.Fatalf("CreateSubscription answered %T", resp)
	return 0
}

// TestAnonymousSubscriptionShare: on a server of 20 subscriptions, 4
// anonymous sessions each ask for 10 (slow publishing, no items).
// Protected, they get 10 together, the other 30 are
// BadTooManySubscriptions, and a user who logs in then gets 10 of their
// own. Under anonymous-subscriptions-unshared the anonymous sessions take
// all 20 and the user gets none (BadTooManySubscriptions).
func TestAnonymousSubscriptionShare(t *testing.T) {
	const (
		limit    = 20
		sessions = 4
		each     = 10
	)
	for _, fault := range []bool{false, true} {
		t.Run(fmt.Sprintf("anonymous-subscriptions-unshared=%v", fault), func(t *testing.T) {
			cfg := Config{MaxSubscriptions: limit}
			if fault {
				cfg.Faults = Faults{catalog.FaultAnonymousSubscriptionsUnshared: true}
			}
			ts := runServer(t, cfg)
			granted, refused := 0, 0
			for range sessions {
				c := rawSessionChannel(t, ts.addr)
				for range each {
					switch st := subscribeRaw(t, c, 10_000); st {
					case ua.StatusOK:
						granted++
					case ua.StatusBadTooManySubscriptions:
						refused++
					default:
						t.Fatalf("anonymous CreateSubscription answered %v", st)
					}
				}
			}
			user := connect(t, ts.endpoint, asUser(t, ts.endpoint, "user1", "password"))
			userGranted := 0
			var userRefused ua.StatusCode
			for range limit {
				st := subscribeClient(t, user, 10_000)
				if st != ua.StatusOK {
					userRefused = st
					break
				}
				userGranted++
			}
			st := ts.subs.Stats()
			t.Logf("anonymous: %d granted, %d refused; user: %d granted, then %v; live %d (%d anonymous)",
				granted, refused, userGranted, userRefused, st.Subscriptions, st.AnonymousSubs)
			if fault {
				if granted != limit || userGranted != 0 || userRefused != ua.StatusBadTooManySubscriptions {
					t.Errorf("anonymous-subscriptions-unshared: anonymous got %d, the user %d then %v: want %d, 0, BadTooManySubscriptions",
						granted, userGranted, userRefused, limit)
				}
				return
			}
			if granted != limit/2 || refused != sessions*each-limit/2 {
				t.Errorf("anonymous: %d granted, %d refused: want %d, %d", granted, refused, limit/2, sessions*each-limit/2)
			}
			if userGranted != limit/2 || userRefused != ua.StatusBadTooManySubscriptions {
				t.Errorf("user: %d granted, then %v: want %d, then BadTooManySubscriptions at the server-wide limit", userGranted, userRefused, limit/2)
			}
			if st.AnonymousSubs != limit/2 {
				t.Errorf("%d subscriptions charged to the anonymous class, want %d", st.AnonymousSubs, limit/2)
			}
		})
	}
}

// TestAnonymousPublishRateShare: on a server of 1000 publishing cycles a
// second, anonymous sessions asking for 10 ms subscriptions (100 a second
// each) get 5 (the anonymous half); a user then gets 5 more. Under
// anonymous-subscriptions-unshared the anonymous sessions get 10 and the
// user none.
func TestAnonymousPublishRateShare(t *testing.T) {
	for _, fault := range []bool{false, true} {
		t.Run(fmt.Sprintf("anonymous-subscriptions-unshared=%v", fault), func(t *testing.T) {
			cfg := Config{MaxPublishRate: 1000}
			if fault {
				cfg.Faults = Faults{catalog.FaultAnonymousSubscriptionsUnshared: true}
			}
			ts := runServer(t, cfg)
			anon := rawSessionChannel(t, ts.addr)
			granted := 0
			for range 20 {
				if subscribeRaw(t, anon, 10) == ua.StatusOK {
					granted++
				}
			}
			user := connect(t, ts.endpoint, asUser(t, ts.endpoint, "user1", "password"))
			userGranted := 0
			for range 20 {
				if subscribeClient(t, user, 10) != ua.StatusOK {
					break
				}
				userGranted++
			}
			t.Logf("at 10 ms: anonymous %d granted, user %d (rate %v cycles a second, %v anonymous)",
				granted, userGranted, ts.subs.Stats().Rate, ts.subs.Stats().AnonymousRate)
			want, wantUser := 5, 5
			if fault {
				want, wantUser = 10, 0
			}
			if granted != want || userGranted != wantUser {
				t.Errorf("anonymous %d, user %d granted: want %d, %d", granted, userGranted, want, wantUser)
			}
		})
	}
}
