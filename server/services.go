package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/gopcua/opcua/ua"
	"github.com/gopcua/opcua/uapolicy"

	"github.com/opcua-chaos/opcua-chaos/server/catalog"
	"github.com/opcua-chaos/opcua-chaos/server/internal/budget"
	"github.com/opcua-chaos/opcua-chaos/server/internal/channel"
	"github.com/opcua-chaos/opcua-chaos/server/internal/session"
)

// Identity of the server in discovery responses.
const (
	ApplicationURI = "urn:opcua-chaos:refserver"
	ProductURI     = "https://github.com/opcua-chaos/opcua-chaos"
	ProductName    = "opcua-chaos reference server"
	transportUABin = "http://opcfoundation.org/UA-Profile/Transport/uatcp-uasc-uabinary"
)

func respHeader(req ua.Request, code ua.StatusCode) *ua.ResponseHeader {
	var handle uint32
	if h := req.Header(); h != nil {
		handle = h.RequestHandle
	}
	return &ua.ResponseHeader{
		Timestamp:          time.Now(),
		RequestHandle:      handle,
		ServiceResult:      code,
		ServiceDiagnostics: &ua.DiagnosticInfo{},
		AdditionalHeader:   ua.NewExtensionObject(nil),
	}
}

func (s *Server) fault(req ua.Request, code ua.StatusCode) ua.Response {
	s.stats.rejectedRequests.Add(1)
	return &ua.ServiceFault{ResponseHeader: respHeader(req, code)}
}

// handle runs on the channel's reader goroutine. Cheap session and discovery
// services are answered at once; Read and Browse go to the dispatcher.
func (s *Server) handle(cn *conn, ch *channel.Channel, msg channel.Message) {
	s.stats.requests.Add(1)
	now := time.Now()
	req := msg.Request
	if msg.Err != nil || req == nil {
		// Unknown services keep their status; anything else that did not
		// decode is BadDecodingError. The channel stays open.
		code := ua.StatusBadDecodingError
		if errors.Is(msg.Err, ua.StatusBadServiceUnsupported) {
			code = ua.StatusBadServiceUnsupported
		} else {
			s.stats.decodingErrors.Add(1)
		}
		s.log.Debug("undecodable request", "channel", cn.id, "request_id", msg.RequestID, "status", code, "err", msg.Err)
		s.stats.rejectedRequests.Add(1)
		ch.Respond(msg.RequestID, &ua.ServiceFault{ResponseHeader: &ua.ResponseHeader{
			Timestamp:          now,
			RequestHandle:      msg.Handle,
			ServiceResult:      code,
			ServiceDiagnostics: &ua.DiagnosticInfo{},
			AdditionalHeader:   ua.NewExtensionObject(nil),
		}})
		return
	}
	hdr := req.Header()
	if hdr == nil {
		ch.Respond(msg.RequestID, s.fault(req, ua.StatusBadDecodingError))
		return
	}
	var resp ua.Response
	switch r := req.(type) {
	case *ua.GetEndpointsRequest:
		resp = &ua.GetEndpointsResponse{
			ResponseHeader: respHeader(r, ua.StatusOK),
			Endpoints:      s.endpoints(s.endpointURL(cn, r.EndpointURL)),
		}
	case *ua.FindServersRequest:
		resp = &ua.FindServersResponse{
			ResponseHeader: respHeader(r, ua.StatusOK),
			Servers:        []*ua.ApplicationDescription{s.application(s.endpointURL(cn, r.EndpointURL))},
		}
	case *ua.CreateSessionRequest:
		resp = s.createSession(cn, r, now)
	case *ua.ActivateSessionRequest:
		s.throttledActivate(cn, ch, msg.RequestID, r, now)
		return
	case *ua.CloseSessionRequest:
		resp = s.closeSession(cn, r, now)
	case *ua.CancelRequest:
		resp = s.cancel(cn, r, now)
	case *ua.ReadRequest, *ua.BrowseRequest:
		sess, code := s.checkSession(cn, hdr, now)
		if code != ua.StatusOK {
			resp = s.fault(r, code)
			break
		}
		j := &job{
			conn:     cn,
			ch:       ch,
			sess:     sess,
			reqID:    msg.RequestID,
			req:      r,
			handle:   hdr.RequestHandle,
			owner:    s.owner(cn, sess),
			received: now,
			size:     msg.Size,
		}
		if s.slots != nil && cn.security().Secured() {
			// Fault crypto-in-gate: on a secured channel, wait for a free
			// worker holding the channel's send gate.
			if !s.takeSlot(cn) {
				resp = s.fault(r, ua.StatusBadSecureChannelClosed)
				break
			}
			j.slot = true
		}
		s.admit(j)
		return
	default:
		if isSubscriptionService(req) {
			s.subscriptionService(cn, ch, msg.RequestID, req, now)
			return
		}
		resp = s.fault(req, ua.StatusBadServiceUnsupported)
	}
	ch.Respond(msg.RequestID, resp)
}

// owner classifies a request the way the .NET server does: the session's
// user name, else the peer IP (there are no signed channels here).
func (s *Server) owner(cn *conn, sess *session.Session) string {
	if sess != nil && s.cfg.Faults.Has(catalog.FaultPerSessionOwners) {
		// Fault per-session-owners: each session is an owner of its own
		// (its public session id; the authentication token is secret), so
		// a user's share grows with its sessions.
		return sess.ID.String()
	}
	if sess != nil {
		if _, user, _ := sess.State(); user != "" {
			return user
		}
	}
	return cn.remoteIP
}

// checkSession validates the authentication token of a session service call.
func (s *Server) checkSession(cn *conn, hdr *ua.RequestHeader, now time.Time) (*session.Session, ua.StatusCode) {
	sess := s.sessions.Lookup(hdr.AuthenticationToken)
	if sess == nil {
		return nil, ua.StatusBadSessionIDInvalid
	}
	activated, _, chID := sess.State()
	if !activated {
		return nil, ua.StatusBadSessionNotActivated
	}
	if chID != cn.id {
		return nil, ua.StatusBadSecureChannelIDInvalid
	}
	sess.Touch(now)
	return sess, ua.StatusOK
}

// ctxStatus maps a context error to the service result of the request.
func ctxStatus(err error) ua.StatusCode {
	if errors.Is(err, context.DeadlineExceeded) {
		return ua.StatusBadTimeout
	}
	return ua.StatusBadShutdown
}

// endpointURL is the URL echoed in GetEndpoints, FindServers and
// CreateSession: the one requested, else the Hello's, else ours; a client's
// is capped like the strings a session keeps (it is echoed twice per
// endpoint).
func (s *Server) endpointURL(cn *conn, requested string) string {
	switch {
	case requested != "":
		return s.keepString(requested)
	case cn.endpointURL != "":
		return s.keepString(cn.endpointURL) // the Hello's
	default:
		return "opc.tcp://" + cn.localAddr
	}
}

func (s *Server) application(url string) *ua.ApplicationDescription {
	return &ua.ApplicationDescription{
		ApplicationURI:  ApplicationURI,
		ProductURI:      ProductURI,
		ApplicationName: &ua.LocalizedText{EncodingMask: ua.LocalizedTextText, Text: ProductName},
		ApplicationType: ua.ApplicationTypeServer,
		DiscoveryURLs:   []string{url},
	}
}

// endpoints advertises url (the URL the client used, so clients behind a
// proxy keep using the proxy) with SecurityPolicy None and, for each of
// SecurityPolicies, Sign and SignAndEncrypt, as far as Config.Security
// offers them: each with the server certificate, its SecurityLevel and
// its token policies.
func (s *Server) endpoints(url string) []*ua.EndpointDescription {
	var eps []*ua.EndpointDescription
	add := func(policy string, mode ua.MessageSecurityMode, level uint8) {
		if !s.offers(policy, mode) {
			return
		}
		eps = append(eps, &ua.EndpointDescription{
			EndpointURL:         url,
			Server:              s.application(url),
			ServerCertificate:   s.creds.cert,
			SecurityMode:        mode,
			SecurityPolicyURI:   policy,
			UserIdentityTokens:  s.tokenPolicies(policy),
			TransportProfileURI: transportUABin,
			SecurityLevel:       level,
		})
	}
	add(ua.SecurityPolicyURINone, ua.MessageSecurityModeNone, 0)
	for _, p := range SecurityPolicies {
		for _, m := range []ua.MessageSecurityMode{ua.MessageSecurityModeSign, ua.MessageSecurityModeSignAndEncrypt} {
			add(p, m, uapolicy.SecurityLevel(p, m))
		}
	}
	return eps
}

// certificateNames checks that the DER certificate cert names uri in its
// subjectAltName.
func certificateNames(cert []byte, uri string) error {
	c, err := x509.ParseCertificate(cert)
	if err != nil {
		return fmt.Errorf("client certificate: %w", err)
	}
	if uri == "" || !slices.ContainsFunc(c.URIs, func(u *url.URL) bool { return u.String() == uri }) {
		return fmt.Errorf("ApplicationUri %q is not a subjectAltName URI of the client certificate (%d URIs)", uri, len(c.URIs))
	}
	return nil
}

// createSession serves CreateSession. On a secured channel the client
// certificate, if sent, must be the channel's (Part 4, 5.6.2:
// BadCertificateInvalid otherwise), the client nonce at least 32 bytes
// (BadNonceInvalid), and the response carries the server's signature over
// the client certificate and nonce, paid from the peer address's budget
// of RSA work (Config.RSAOpsPerPeer: BadTooManyOperations, unsigned, once
// it is spent). On a None channel whose mode is not
// offered, only discovery is served: BadSecurityModeRejected.
func (s *Server) createSession(cn *conn, r *ua.CreateSessionRequest, now time.Time) ua.Response {
	sec := cn.security()
	if !s.offers(sec.PolicyURI, sec.Mode) {
		return s.fault(r, ua.StatusBadSecurityModeRejected)
	}
	sig := &ua.SignatureData{}
	if sec.Secured() {
		if len(r.ClientCertificate) > 0 && !bytes.Equal(r.ClientCertificate, sec.ClientCertificate) {
			s.log.Info("session refused: client certificate is not the channel's", "channel", cn.id)
			return s.fault(r, ua.StatusBadCertificateInvalid)
		}
		if len(r.ClientNonce) < session.NonceSize {
			return s.fault(r, ua.StatusBadNonceInvalid)
		}
		// A private-key operation, paid from the peer's budget of RSA
		// work (rsaWork). (Config.unthrottledSigning: signed for anyone, as
		// often as asked.)
		if !s.cfg.unthrottledSigning && !s.takeRSA(cn.remoteIP, 1, "CreateSession") {
			return s.fault(r, ua.StatusBadTooManyOperations)
		}
		// Over the channel's client certificate and the client nonce.
		var err error
		if sig, err = sec.Asymmetric.SessionSignature(r.ClientNonce); err != nil {
			s.log.Error("cannot sign the session", "channel", cn.id, "err", err)
			return s.fault(r, ua.StatusBadInternalError)
		}
	}
	var clientURI string
	if r.ClientDescription != nil {
		clientURI = r.ClientDescription.ApplicationURI
	}
	certHash := ""
	if sec.Secured() {
		// Part 4, 5.6.2: the ApplicationUri must be the client
		// certificate's subjectAltName URI. (Fault claimed-uri-trusted:
		// not checked.)
		if err := certificateNames(sec.ClientCertificate, clientURI); err != nil && !s.cfg.Faults.Has(catalog.FaultClaimedURITrusted) {
			s.log.Info("session refused: ApplicationUri not in the client certificate", "channel", cn.id, "err", err)
			return s.fault(r, ua.StatusBadCertificateURIInvalid)
		}
		sum := sha256.Sum256(sec.ClientCertificate)
		certHash = string(sum[:])
	}
	// The client strings the session keeps, capped, and their charge.
	name := s.keepString(r.SessionName)
	appURI := s.keepString(clientURI)
	var cost int64
	if !s.cfg.Faults.Has(catalog.FaultLongSessionStrings) {
		// (Fault long-session-strings: kept whole, and not charged.)
		cost = sessionCost(name, appURI)
	}
	// s.budget is nil under the no-byte-budget fault: every charge fits.
	if !s.budget.Charge(budget.Sessions, cost) {
		s.log.Info("session refused: session budget exhausted", "channel", cn.id, "bytes", cost,
			"sessions_bytes", s.budget.UsedBy(budget.Sessions), "limit", s.budget.ClassLimit(budget.Sessions))
		return s.fault(r, ua.StatusBadResourceUnavailable)
	}
	timeout := time.Duration(r.RequestedSessionTimeout * float64(time.Millisecond))
	sess := s.sessions.Create(name, timeout, now)
	if sess == nil {
		s.budget.Release(budget.Sessions, cost)
		return s.fault(r, ua.StatusBadTooManySessions)
	}
	// Given back when the session is closed, expires or the server stops
	// (at once if it is already gone).
	sess.OnClose(func() { s.budget.Release(budget.Sessions, cost) })
	sess.SetClient(appURI, certHash)
	s.log.Debug("session created", "session", sess.ID.String(), "name", sess.Name, "timeout", sess.Timeout, "channel", cn.id)
	cert := s.creds.cert
	if s.cfg.Quirks.Has(catalog.QuirkNoCertOnNone) && !sec.Secured() && len(r.ClientCertificate) == 0 {
		// Quirk no-cert-on-none: like open62541, no certificate on a None
		// channel to a client that sent none (GetEndpoints still has it).
		cert = nil
	}
	return &ua.CreateSessionResponse{
		ResponseHeader:        respHeader(r, ua.StatusOK),
		SessionID:             sess.ID,
		AuthenticationToken:   sess.Token,
		RevisedSessionTimeout: float64(sess.Timeout / time.Millisecond),
		ServerNonce:           sess.ServerNonce(),
		ServerCertificate:     cert,
		ServerEndpoints:       s.endpoints(s.endpointURL(cn, r.EndpointURL)),
		ServerSignature:       sig,
	}
}

// sessionOverhead is a session's fixed cost beyond its client strings: its
// Session, ids, authentication token, server nonce and table entries.
const sessionOverhead = 1024

// sessionCost is what a session keeping the client strings name and appURI
// is charged to budget.Sessions. The client certificate is not kept (it is
// compared with the channel's and dropped), so it is not charged.
func sessionCost(name, appURI string) int64 {
	return sessionOverhead + session.NonceSize + int64(len(name)+len(appURI))
}

// keepString is a client string the server keeps (session name,
// ApplicationUri) or echoes (EndpointUrl): at most cfg.MaxStringLength
// bytes, cut on a rune boundary, and copied so it does not pin the request
// it came from. Under the long-session-strings fault it is kept whole.
func (s *Server) keepString(v string) string {
	if s.cfg.Faults.Has(catalog.FaultLongSessionStrings) {
		return v
	}
	return truncate(v, s.cfg.MaxStringLength)
}

// truncate returns a copy of v's first limit bytes or fewer, ending on a
// rune boundary; v itself when it fits (or limit ≤ 0).
func truncate(v string, limit int) string {
	if limit <= 0 || len(v) <= limit {
		return v
	}
	n := limit
	for n > 0 && !utf8.RuneStart(v[n]) {
		n-- // v[n] continues the rune that starts before it
	}
	return strings.Clone(v[:n])
}

// clientSignature checks ActivateSession's ClientSignature on a secured
// channel: the client's signature, with the channel's policy, over the
// server certificate and the session's last server nonce. It returns why
// it fails, "" when it holds or the channel is None.
func (s *Server) clientSignature(sec channel.ChannelSecurity, sig *ua.SignatureData, nonce []byte) string {
	if !sec.Secured() {
		return ""
	}
	if sig == nil || len(sig.Signature) == 0 {
		return "no client signature"
	}
	if sig.Algorithm != sec.Asymmetric.SignatureURI() {
		return fmt.Sprintf("client signature algorithm %q, want %q", sig.Algorithm, sec.Asymmetric.SignatureURI())
	}
	// Over our certificate and the nonce.
	if err := sec.Asymmetric.VerifySessionSignature(nonce, sig); err != nil {
		return "client signature does not verify"
	}
	return ""
}

// activateSession checks the identity token against the session's last
// server nonce and, if it passes, activates the session and sends the next
// nonce. A rejected activation keeps the nonce.
func (s *Server) activateSession(cn *conn, r *ua.ActivateSessionRequest, now time.Time) ua.Response {
	sess := s.sessions.Lookup(r.RequestHeader.AuthenticationToken)
	if sess == nil {
		return s.fault(r, ua.StatusBadSessionIDInvalid)
	}
	sess.Touch(now)
	nonce := sess.ServerNonce()
	sec := cn.security()
	if why := s.clientSignature(sec, r.ClientSignature, nonce); why != "" {
		s.stats.securityRejected.Add(1)
		s.log.Info("activation rejected", "session", sess.ID.String(), "status", ua.StatusBadApplicationSignatureInvalid, "reason", why)
		return s.fault(r, ua.StatusBadApplicationSignatureInvalid)
	}
	if !s.payForSecret(cn.remoteIP, r.UserIdentityToken, now) {
		return s.fault(r, ua.StatusBadTooManyOperations)
	}
	user, code, why := s.authenticate(r.UserIdentityToken, nonce, sec.PolicyURI)
	if activated, _, chID := sess.State(); code == ua.StatusOK && activated && chID != cn.id && s.cfg.Faults.Has(catalog.FaultNoReactivate) {
		// Fault no-reactivate: the session stays bound to its old channel.
		code, why = ua.StatusBadSecureChannelIDInvalid, "session bound to another channel"
	}
	if code == ua.StatusOK {
		if code = s.identityChange(cn, sess, user); code != ua.StatusOK {
			why = "identity change"
		}
	}
	var next []byte
	if code == ua.StatusOK {
		// Refused if a concurrent activation replaced the nonce, the
		// session was closed meanwhile, or the anonymous share is full.
		next, code, why = sess.Activate(user, cn.id, cn.remoteIP, nonce)
	}
	if code != ua.StatusOK {
		s.stats.securityRejected.Add(1)
		s.log.Info("activation rejected", "session", sess.ID.String(), "status", code, "reason", why)
		return s.fault(r, code)
	}
	cn.active.Store(true)
	if cn.ctx.Err() != nil {
		s.sessions.ChannelClosed(cn.id) // the channel closed during the activation: the session is an orphan
	}
	return &ua.ActivateSessionResponse{
		ResponseHeader: respHeader(r, ua.StatusOK),
		ServerNonce:    next,
	}
}

func (s *Server) closeSession(cn *conn, r *ua.CloseSessionRequest, _ time.Time) ua.Response {
	// An unactivated session may be closed too (e.g. after a failed activation).
	if sess := s.sessions.Lookup(r.RequestHeader.AuthenticationToken); sess != nil {
		if activated, _, chID := sess.State(); activated && chID != cn.id {
			return s.fault(r, ua.StatusBadSecureChannelIDInvalid)
		}
	}
	sess, ok := s.sessions.Close(r.RequestHeader.AuthenticationToken)
	if !ok {
		return s.fault(r, ua.StatusBadSessionIDInvalid)
	}
	if s.cfg.Faults.Has(catalog.FaultCloseRunsQueued) {
		// Fault close-runs-queued: the session's queued requests stay in
		// the queue; workers run them after this Good response.
		s.log.Debug("leaving a closed session's requests queued", "fault", catalog.FaultCloseRunsQueued, "session", sess.ID.String())
	} else {
		// The session's queued requests will not run.
		s.cancelQueued(cn, func(j *job) bool { return j.sess == sess }, ua.StatusBadSessionClosed)
	}
	s.log.Debug("session closed", "session", sess.ID.String(), "name", sess.Name)
	return &ua.CloseSessionResponse{ResponseHeader: respHeader(r, ua.StatusOK)}
}

func (s *Server) cancel(cn *conn, r *ua.CancelRequest, now time.Time) ua.Response {
	sess, code := s.checkSession(cn, r.RequestHeader, now)
	if code != ua.StatusOK {
		return s.fault(r, code)
	}
	// Queued requests with that handle complete now, exactly once, with
	// BadRequestCancelledByClient (before this response: same writer);
	// running ones finish normally.
	handle := r.RequestHandle
	if s.cfg.Faults.Has(catalog.FaultCancelWrongHandle) {
		// Fault cancel-wrong-handle: the Cancel's own handle, which no
		// queued request of the session carries.
		handle = r.RequestHeader.RequestHandle
	}
	n := s.cancelQueued(cn, func(j *job) bool {
		return j.sess == sess && j.handle == handle
	}, ua.StatusBadRequestCancelledByClient)
	total := s.stats.cancelled.Add(int64(n))
	count := uint32(n)
	if s.cfg.Faults.Has(catalog.FaultCancelTotal) {
		// Fault cancel-running-total: the server's running total of
		// requests cancelled by Cancel, not this call's.
		count = uint32(total)
	}
	return &ua.CancelResponse{ResponseHeader: respHeader(r, ua.StatusOK), CancelCount: count}
}
