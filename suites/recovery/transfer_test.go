package recovery_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gopcua/opcua/ua"

	"github.com/opcua-chaos/opcua-chaos/fixtures/history"
	"github.com/opcua-chaos/opcua-chaos/fixtures/probe"
	"github.com/opcua-chaos/opcua-chaos/fixtures/reconnect"
	"github.com/opcua-chaos/opcua-chaos/fixtures/secure"
	"github.com/opcua-chaos/opcua-chaos/fixtures/uaclient"
	"github.com/opcua-chaos/opcua-chaos/toxics"
)

// noTransferIdentity is why a spec does not transfer when neither identity
// Part 4 (5.14.7.1) lets take a subscription is at hand.
const noTransferIdentity = "no declared user and no signed endpoint: Part 4 allows transfer only for the same user, or anonymous over Sign/SignAndEncrypt"

// identity is how the spec's sessions authenticate so that they may take
// each other's subscriptions (transferAs).
type identity struct {
	// as says how, for the history's labels.
	as string
	// skip is why the spec does not transfer (noTransferIdentity), or "".
	skip string
	// user and password are the sessions' user ("" is anonymous).
	user, password string
	// security is the sessions' channel security (the zero value: None).
	security secure.Config
}

// apply sets cfg's user and channel security to id's.
func (id identity) apply(cfg *reconnect.Config) {
	cfg.User, cfg.Password, cfg.Security = id.user, id.password, id.security
}

// transferAs returns how the spec's sessions authenticate so that they
// may take each other's subscriptions as Part 4 (5.14.7.1) allows:
// anonymous over cond's channel security when cond is secured; else as
// the first declared user (the target's users, OPCUA_CHAOS_USERS) that
// activates; else anonymous over the strongest secured mode the server
// offers, with the run's client certificate (the same ApplicationUri for
// every session); else anonymous over None with a reason to skip the
// transfer (noTransferIdentity). It is an error when the client
// certificate cannot be made. It runs in the spec, before the scenario:
// a secured mode the target does not offer is a *scenario.Lacking error,
// which skips the scenario (h.Security).
func transferAs(cond toxics.Condition) (identity, error) {
	if cond.SecurityMode() != toxics.SecurityNone {
		sec, err := h.Security(cond)
		if err != nil {
			return identity{}, err
		}
		return identity{as: "anonymous over " + sec.Name(), security: sec}, nil
	}
	if users := h.Setup.Probe.Activated(h.Setup.Target.Users); len(users) > 0 {
		u := users[0]
		return identity{as: "user " + u.Name, user: u.Name, password: u.Password}, nil
	}
	if mode := probe.SecuredMode(h.Setup.Probe.Security); mode != ua.MessageSecurityModeNone {
		sec, err := h.Security(cond.WithSecurity(secure.Name(mode)))
		if err != nil {
			return identity{}, err
		}
		return identity{as: "anonymous over " + sec.Name(), security: sec}, nil
	}
	return identity{as: "anonymous over none", skip: noTransferIdentity}, nil
}

// asker is a session of another identity than the stream's that asks for
// its subscription: Part 4 (5.14.7.1) has the server refuse it.
type asker struct {
	// session names it in the history, who says who it is.
	session, who string
	// user and password are its user ("" is anonymous); security its
	// channel security (one client identity).
	user, password string
	security       secure.Config
}

// askers are the sessions of other identities than id's that ask for the
// stream's subscription, each of which Part 4 (5.14.7.1) has the server
// refuse: an anonymous session on a channel without security, always;
// for sessions of a user, a session of another declared user on the same
// channel security and client identity (only the user differs); for
// anonymous sessions over Sign or SignAndEncrypt, an anonymous session
// over the same mode with the run's second client identity (another
// ApplicationUri). Part 4 says nothing of a session of the same user with
// another application certificate, so none is tried.
func askers(id identity) []asker {
	out := []asker{{session: "s3-anonymous", who: "an anonymous session over none"}}
	switch {
	case id.skip != "":
	case id.user != "":
		// the first other declared user that discovery saw activate
		for _, u := range h.Setup.Probe.Activated(h.Setup.Target.Users) {
			if u.Name != id.user {
				out = append(out, asker{session: "s4-" + u.Name, who: "user " + u.Name + " over " + id.security.Name(),
					user: u.Name, password: u.Password, security: id.security.Nth(0)})
				break
			}
		}
	case id.security.Secured() && id.security.Identities() > 1:
		other := id.security.Nth(1)
		out = append(out, asker{session: "s4-identity-2", who: "an anonymous session over " + other.Name() + " as " + other.AppURI(), security: other})
	}
	return out
}

// refusedTransfer asks, from a new session of a (see askers), for sub: a
// conformant server refuses with BadUserAccessDenied (Part 4, 5.14.7.1).
// The answer is a history.KindTransferRefusal op of a's user and client
// identity, judged by check.TransferRefusal; a session that cannot be
// opened (a server that offers no channel without security) asks nothing
// (no op). What it came to is a mark of the history ("refused-transfer").
func refusedTransfer(ctx context.Context, rec *history.Recorder, endpoint string, sub *reconnect.Subscription, a asker) {
	octx, cancel := context.WithTimeout(ctx, maxServe)
	defer cancel()
	opts := []uaclient.Option{uaclient.SessionName(a.session), uaclient.RequestTimeout(5 * time.Second), uaclient.Security(a.security)}
	if a.user != "" {
		opts = append(opts, uaclient.User(a.user, a.password))
	}
	owner := a.user
	if owner == "" {
		owner = "anonymous"
	}
	// the session is an op of its client identity (check.Identities)
	opened := rec.Invoke(history.Op{Client: "c3", Session: a.session, Owner: owner, Identity: a.security.Identity(), Kind: history.KindSession, Node: endpoint})
	c, err := uaclient.Open(octx, endpoint, opts...)
	if err != nil {
		rec.Fail(opened, 0, err)
		rec.Mark("refused-transfer", fmt.Sprintf("%s: %v: its transfer is not tried", a.who, err))
		return
	}
	rec.OK(opened)
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = c.Close(cctx)
	}()
	ref := rec.Invoke(history.Op{Client: "c3", Session: a.session, Owner: owner, Identity: a.security.Identity(), Kind: history.KindTransferRefusal, Node: sub.Label})
	var resp ua.Response
	err = c.Send(octx, &ua.TransferSubscriptionsRequest{SubscriptionIDs: []uint32{sub.ID}}, func(r ua.Response) error { resp = r; return nil })
	if err == nil {
		switch r := resp.(type) {
		case *ua.ServiceFault:
			err = r.ResponseHeader.ServiceResult
		case *ua.TransferSubscriptionsResponse:
			switch {
			case r.ResponseHeader.ServiceResult != ua.StatusOK:
				err = r.ResponseHeader.ServiceResult
			case len(r.Results) != 1:
				err = fmt.Errorf("%d transfer results", len(r.Results))
			case r.Results[0].StatusCode != ua.StatusOK:
				err = r.Results[0].StatusCode
			}
		default:
			err = fmt.Errorf("unexpected response %T", resp)
		}
	}
	if err == nil {
		rec.OK(ref)
		rec.Mark("refused-transfer", fmt.Sprintf("transfer of %s to %s: accepted", sub.Label, a.who))
		return
	}
	var code ua.StatusCode
	status := uint32(0)
	if errors.As(err, &code) {
		status = uint32(code)
	}
	rec.Fail(ref, status, err)
	rec.Mark("refused-transfer", fmt.Sprintf("transfer of %s to %s: %v", sub.Label, a.who, err))
}
