package uasec

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/gopcua/opcua/id"
	"github.com/gopcua/opcua/ua"
	"github.com/gopcua/opcua/uacp"
	"github.com/gopcua/opcua/uapolicy"
	"github.com/gopcua/opcua/uasc"
)

func encodeService(t *testing.T, typeID uint16, v any) []byte {
	t.Helper()
	a, err := ua.Encode(ua.NewFourByteExpandedNodeID(0, typeID))
	if err != nil {
		t.Error(err)
	}
	b, err := ua.Encode(v)
	if err != nil {
		t.Error(err)
	}
	return append(a, b...)
}

func respHeader(handle uint32) *ua.ResponseHeader {
	return &ua.ResponseHeader{
		Timestamp:          time.Now(),
		RequestHandle:      handle,
		ServiceDiagnostics: &ua.DiagnosticInfo{},
		StringTable:        []string{},
		AdditionalHeader:   ua.NewExtensionObject(nil),
	}
}

// uasecServer answers one secured channel with this package: the OPN
// (server side of Asymmetric), one ReadRequest answered in two chunks, and
// the CloseSecureChannel. It returns what went wrong, if anything.
func uasecServer(t *testing.T, ctx context.Context, l *uacp.Listener, mode ua.MessageSecurityMode, srv keyPair, values int) error {
	c, err := l.Accept(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	b, err := c.Receive()
	if err != nil {
		return err
	}
	h, err := ParseOPNHeader(b)
	if err != nil {
		return err
	}
	asym, err := NewAsymmetric(h.PolicyURI, mode, srv.key, srv.cert, h.SenderCert)
	if err != nil {
		return err
	}
	_, seq, reqID, body, err := asym.OpenOPN(b)
	if err != nil {
		return fmt.Errorf("open gopcua's OPN: %w", err)
	}
	_, v, err := ua.DecodeService(body)
	if err != nil {
		return err
	}
	opn, ok := v.(*ua.OpenSecureChannelRequest)
	if !ok || opn.SecurityMode != mode {
		return fmt.Errorf("OPN request %T %+v", v, v)
	}
	sn, err := asym.MakeNonce()
	if err != nil {
		return err
	}
	resp := &ua.OpenSecureChannelResponse{
		ResponseHeader: respHeader(opn.RequestHeader.RequestHandle),
		SecurityToken:  &ua.ChannelSecurityToken{ChannelID: 5, TokenID: 1, CreatedAt: time.Now(), RevisedLifetime: opn.RequestedLifetime},
		ServerNonce:    sn,
	}
	out, err := asym.SealOPN(nil, 5, 1, reqID, encodeService(t, id.OpenSecureChannelResponse_Encoding_DefaultBinary, resp))
	if err != nil {
		return err
	}
	if _, err := c.Write(out); err != nil {
		return err
	}
	sym, err := NewSymmetric(h.PolicyURI, mode, sn, opn.ClientNonce)
	if err != nil {
		return err
	}
	last := seq
	b, err = c.Receive()
	if err != nil {
		return err
	}
	if mode == ua.MessageSecurityModeSign && !bytes.Contains(b, []byte{0x77, 0x02}) { // ReadRequest type id 631 in clear
		return errors.New("Sign mode: gopcua's ReadRequest not readable")
	}
	tok, seq, reqID, body, err := sym.Open(b)
	if err != nil {
		return fmt.Errorf("open gopcua's MSG: %w", err)
	}
	if tok != 1 || !SeqFollows(last, seq) {
		return fmt.Errorf("MSG token %d, sequence %d after %d", tok, seq, last)
	}
	_, v, err = ua.DecodeService(body)
	if err != nil {
		return err
	}
	rr, ok := v.(*ua.ReadRequest)
	if !ok {
		return fmt.Errorf("request %T", v)
	}
	results := make([]*ua.DataValue, values)
	for i := range results {
		results[i] = &ua.DataValue{EncodingMask: ua.DataValueValue, Value: ua.MustVariant(int32(i))}
	}
	rb := encodeService(t, id.ReadResponse_Encoding_DefaultBinary, &ua.ReadResponse{ResponseHeader: respHeader(rr.RequestHeader.RequestHandle), Results: results, DiagnosticInfos: []*ua.DiagnosticInfo{}})
	// two chunks: an intermediate one as large as 8 KiB allows, the rest
	split := min(sym.MaxBody(8192), len(rb)/2)
	out = sym.Seal(nil, "MSG", 'C', 5, 1, 2, reqID, rb[:split])
	out = sym.Seal(out, "MSG", 'F', 5, 1, 3, reqID, rb[split:])
	if _, err := c.Write(out); err != nil {
		return err
	}
	b, err = c.Receive()
	if err != nil {
		return err
	}
	if string(b[:3]) != "CLO" {
		return fmt.Errorf("got %q, want CLO", b[:3])
	}
	if _, _, _, _, err := sym.Open(b); err != nil {
		return fmt.Errorf("open gopcua's CLO: %w", err)
	}
	return nil
}

// TestInteropGopcuaClient: gopcua's own uasc client opens a secured channel
// against chunks sealed by this package (OPN response, a two-chunk MSG),
// and this package opens gopcua's OPN, MSG and CLO, for every policy and
// mode, and with 3072-bit keys on either side (ExtraPaddingSize).
func TestInteropGopcuaClient(t *testing.T) {
	type interopCase struct {
		keys     string
		cli, srv keyPair
		policy   string
		mode     ua.MessageSecurityMode
	}
	var cases []interopCase
	for _, policy := range policies {
		for _, mode := range modes {
			cases = append(cases, interopCase{"2048", testKey(t, "client2048", 2048), testKey(t, "server2048", 2048), policy, mode})
		}
	}
	cases = append(cases,
		interopCase{"server3072", testKey(t, "client2048", 2048), testKey(t, "server3072", 3072), ua.SecurityPolicyURIAes256Sha256RsaPss, ua.MessageSecurityModeSignAndEncrypt},
		interopCase{"client3072", testKey(t, "client3072", 3072), testKey(t, "server2048", 2048), ua.SecurityPolicyURIAes256Sha256RsaPss, ua.MessageSecurityModeSignAndEncrypt})
	for _, tc := range cases {
		policy, mode, cli, srv := tc.policy, tc.mode, tc.cli, tc.srv
		t.Run(fmt.Sprintf("%s/%v/%s", uapolicyShort(policy), mode, tc.keys), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			l, err := uacp.Listen(ctx, "opc.tcp://127.0.0.1:0", nil)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			const values = 3000
			done := make(chan error, 1)
			go func() { done <- uasecServer(t, ctx, l, mode, srv, values) }()
			ep := "opc.tcp://" + l.Addr().String()
			conn, err := uacp.Dial(ctx, ep)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			errCh := make(chan error, 4)
			sc, err := uasc.NewSecureChannel(ep, conn, &uasc.Config{
				SecurityPolicyURI: policy,
				SecurityMode:      mode,
				Certificate:       cli.cert,
				LocalKey:          cli.key,
				RemoteCertificate: srv.cert,
				Thumbprint:        uapolicy.Thumbprint(srv.cert),
				Lifetime:          uint32(time.Hour / time.Millisecond),
				RequestTimeout:    10 * time.Second,
			}, errCh)
			if err != nil {
				t.Fatal(err)
			}
			if err := sc.Open(ctx); err != nil {
				t.Fatalf("gopcua opens the channel: %v (server: %v)", err, drain(done))
			}
			var got *ua.ReadResponse
			err = sc.SendRequest(ctx, &ua.ReadRequest{NodesToRead: []*ua.ReadValueID{{NodeID: ua.NewNumericNodeID(0, 2258), AttributeID: ua.AttributeIDValue, DataEncoding: &ua.QualifiedName{}}}}, nil, func(v ua.Response) error {
				r, ok := v.(*ua.ReadResponse)
				if !ok {
					return fmt.Errorf("response %T", v)
				}
				got = r
				return nil
			})
			if err != nil {
				t.Fatalf("gopcua reads: %v (server: %v)", err, drain(done))
			}
			if len(got.Results) != values || got.Results[values-1].Value.Value() != int32(values-1) {
				t.Fatalf("gopcua decoded %d results", len(got.Results))
			}
			_ = sc.Close()
			if err := <-done; err != nil {
				t.Fatalf("server: %v", err)
			}
		})
	}
}

func drain(ch chan error) error {
	select {
	case err := <-ch:
		return err
	case <-time.After(time.Second):
		return errors.New("still running")
	}
}
