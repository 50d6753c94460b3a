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
	"github.com/opcua-chaos/opcua-chaos/fixtures/target"
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
	if u, ok := declaredUser(); ok {
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

// declaredUser is the first of the target's declared users that
// discovery saw activate (or the first declared, where discovery tried
// none).
func declaredUser() (target.User, bool) {
	users := h.Setup.Target.Users
	for _, u := range users {
		for _, a := range h.Setup.Probe.Users {
			if a.User == u.Name && a.OK {
				return u, true
			}
		}
	}
	if len(users) > 0 && len(h.Setup.Probe.Users) == 0 {
		return users[0], true
	}
	return target.User{}, false
}

// anonymousTransfer asks, from a new anonymous session on a channel
// without security, for sub: a conformant server refuses with
// BadUserAccessDenied (Part 4, 5.14.7.1). The answer is a
// history.KindTransferRefusal op, judged by check.TransferRefusal; a server
// that offers no channel without security is not asked (no op). What it
// came to is a mark of the history ("anonymous-transfer").
func anonymousTransfer(ctx context.Context, rec *history.Recorder, endpoint string, sub *reconnect.Subscription) {
	octx, cancel := context.WithTimeout(ctx, maxServe)
	defer cancel()
	c, err := uaclient.Open(octx, endpoint, uaclient.SessionName("s3-anonymous"), uaclient.RequestTimeout(5*time.Second))
	if err != nil {
		rec.Mark("anonymous-transfer", fmt.Sprintf("anonymous session over none: %v: its transfer is not tried", err))
		return
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = c.Close(cctx)
	}()
	ref := rec.Invoke(history.Op{Client: "c3", Session: "s3-anonymous", Kind: history.KindTransferRefusal, Node: sub.Label})
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
		rec.Mark("anonymous-transfer", fmt.Sprintf("anonymous transfer over none of %s: accepted", sub.Label))
		return
	}
	var code ua.StatusCode
	status := uint32(0)
	if errors.As(err, &code) {
		status = uint32(code)
	}
	rec.Fail(ref, status, err)
	rec.Mark("anonymous-transfer", fmt.Sprintf("anonymous transfer over none of %s: %v", sub.Label, err))
}
