package server

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/subtle"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"os"
	"slices"
	"time"

	"github.com/gopcua/opcua/ua"
	"github.com/gopcua/opcua/uapolicy"

	"github.com/opcua-chaos/opcua-chaos/server/catalog"
)

// Token policy ids advertised in the endpoints. Like real servers, the
// server accepts an identity token only with one of these ids.
const (
	PolicyAnonymous = "refserver-anonymous"
	PolicyUserName  = "refserver-username-basic256sha256"
	// PolicyUserNameChannel is the user-name token policy of the secured
	// endpoints: its SecurityPolicyUri is empty, so the password is
	// encrypted with the secure channel's policy (Part 4, 7.41).
	PolicyUserNameChannel = "refserver-username-channel"
)

// UserNameSecurityPolicy is the security policy of the user-name token
// policy: the password must come encrypted with the server certificate
// (RSA-OAEP with SHA-1), with the session's last server nonce appended.
const UserNameSecurityPolicy = ua.SecurityPolicyURIBasic256Sha256

// RSA key sizes Basic256Sha256 allows.
const (
	minKeyBits = 2048
	maxKeyBits = 4096
)

// credentials are the application instance certificate and what decrypts
// user-name token secrets with its key.
type credentials struct {
	cert    []byte // DER
	key     *rsa.PrivateKey
	userEnc *uapolicy.EncryptionAlgorithm
	// policyEnc decrypts secrets encrypted with a secured policy's
	// asymmetric algorithm, by policy URI.
	policyEnc map[string]*uapolicy.EncryptionAlgorithm
}

// thumbprint returns the certificate's SHA-1 thumbprint in hex, as OPC UA
// tools show it.
func (c credentials) thumbprint() string {
	return hex.EncodeToString(uapolicy.Thumbprint(c.cert))
}

// newCredentials checks a configured key and certificate, or generates both
// when neither is given.
func newCredentials(key *rsa.PrivateKey, cert []byte) (credentials, error) {
	var cr credentials
	switch {
	case key == nil && cert == nil:
		var err error
		if key, cert, err = selfSigned(time.Now()); err != nil {
			return cr, fmt.Errorf("server: generate certificate: %w", err)
		}
	case key == nil || cert == nil:
		return cr, errors.New("server: PrivateKey and Certificate go together: set both or neither")
	default:
		if err := checkCertificate(key, cert); err != nil {
			return cr, fmt.Errorf("server: certificate: %w", err)
		}
	}
	enc, err := uapolicy.Asymmetric(UserNameSecurityPolicy, key, nil)
	if err != nil {
		return cr, fmt.Errorf("server: %w", err)
	}
	policyEnc := make(map[string]*uapolicy.EncryptionAlgorithm, len(SecurityPolicies))
	for _, p := range SecurityPolicies {
		if policyEnc[p], err = uapolicy.Asymmetric(p, key, nil); err != nil {
			return cr, fmt.Errorf("server: %w", err)
		}
	}
	return credentials{cert: cert, key: key, userEnc: enc, policyEnc: policyEnc}, nil
}

// checkCertificate checks that key is valid, cert is key's, of a size
// Basic256Sha256 allows, and names ApplicationURI in its subjectAltName.
func checkCertificate(key *rsa.PrivateKey, cert []byte) error {
	if err := key.Validate(); err != nil {
		return fmt.Errorf("PrivateKey: %w", err)
	}
	c, err := x509.ParseCertificate(cert)
	if err != nil {
		return err
	}
	pub, ok := c.PublicKey.(*rsa.PublicKey)
	if !ok || !pub.Equal(&key.PublicKey) {
		return errors.New("its public key is not PrivateKey's")
	}
	if bits := key.N.BitLen(); bits < minKeyBits || bits > maxKeyBits {
		return fmt.Errorf("RSA key of %d bits, Basic256Sha256 needs %d to %d", bits, minKeyBits, maxKeyBits)
	}
	if !slices.ContainsFunc(c.URIs, func(u *url.URL) bool { return u.String() == ApplicationURI }) {
		return fmt.Errorf("subjectAltName has no URI %s (the ApplicationUri)", ApplicationURI)
	}
	return nil
}

// selfSigned returns a new RSA-2048 key and a self-signed DER application
// instance certificate for it: ApplicationURI and the host names in the
// subjectAltName, valid from an hour ago for a year.
func selfSigned(now time.Time) (*rsa.PrivateKey, []byte, error) {
	key, err := rsa.GenerateKey(rand.Reader, minKeyBits)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, err
	}
	appURI, err := url.Parse(ApplicationURI)
	if err != nil {
		return nil, nil, err
	}
	hosts := []string{"localhost"}
	if h, err := os.Hostname(); err == nil && h != "" && h != "localhost" {
		hosts = append(hosts, h)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: ProductName, Organization: []string{"opcua-chaos"}},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.AddDate(1, 0, 0),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageContentCommitment |
			x509.KeyUsageKeyEncipherment | x509.KeyUsageDataEncipherment | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		BasicConstraintsValid: true,
		URIs:                  []*url.URL{appURI},
		DNSNames:              hosts,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	return key, der, nil
}

// tokenPolicies are the user token policies of an endpoint with
// SecurityPolicy policy: on a secured endpoint the password is encrypted
// with the channel's policy (PolicyUserNameChannel), on the None endpoint
// with Basic256Sha256 (PolicyUserName).
func (s *Server) tokenPolicies(policy string) []*ua.UserTokenPolicy {
	var tokens []*ua.UserTokenPolicy
	if !s.cfg.NoAnonymous {
		tokens = append(tokens, &ua.UserTokenPolicy{
			PolicyID:          PolicyAnonymous,
			TokenType:         ua.UserTokenTypeAnonymous,
			SecurityPolicyURI: ua.SecurityPolicyURINone,
		})
	}
	if policy != ua.SecurityPolicyURINone {
		return append(tokens, &ua.UserTokenPolicy{
			PolicyID:  PolicyUserNameChannel,
			TokenType: ua.UserTokenTypeUserName,
		})
	}
	return append(tokens, &ua.UserTokenPolicy{
		PolicyID:          PolicyUserName,
		TokenType:         ua.UserTokenTypeUserName,
		SecurityPolicyURI: UserNameSecurityPolicy,
	})
}

// authenticate checks an identity token against the advertised token
// policies and, for a user name, the session's last server nonce. It
// returns the user name ("" for anonymous), or the status to reject with
// and why:
//
//   - a token type that is not offered: BadIdentityTokenRejected (a null
//     token counts as anonymous, as Part 4 allows);
//   - a PolicyId that was not advertised, a password not encrypted with the
//     policy's algorithm, a secret that does not decrypt, a bad length
//     field or a nonce that is not the session's: BadIdentityTokenInvalid;
//   - an unknown user or a wrong password: BadUserAccessDenied.
//
// channelPolicy is the SecurityPolicy of the secure channel the request
// came on: PolicyUserNameChannel passwords are encrypted with it (and are
// refused on a None channel), PolicyUserName passwords with
// Basic256Sha256 on any channel.
func (s *Server) authenticate(eo *ua.ExtensionObject, nonce []byte, channelPolicy string) (user string, code ua.StatusCode, why string) {
	var tok any
	if eo != nil {
		tok = eo.Value
	}
	switch t := tok.(type) {
	case nil:
		if s.cfg.NoAnonymous {
			return "", ua.StatusBadIdentityTokenRejected, "anonymous (null token) not offered"
		}
		return "", ua.StatusOK, ""
	case *ua.AnonymousIdentityToken:
		if s.cfg.NoAnonymous {
			return "", ua.StatusBadIdentityTokenRejected, "anonymous not offered"
		}
		if t.PolicyID != PolicyAnonymous {
			return "", ua.StatusBadIdentityTokenInvalid, fmt.Sprintf("anonymous token with unknown PolicyId %q", t.PolicyID)
		}
		return "", ua.StatusOK, ""
	case *ua.UserNameIdentityToken:
		enc := s.creds.userEnc
		switch {
		case t.PolicyID == PolicyUserName:
		case t.PolicyID == PolicyUserNameChannel && s.creds.policyEnc[channelPolicy] != nil:
			enc = s.creds.policyEnc[channelPolicy]
		default:
			return "", ua.StatusBadIdentityTokenInvalid, fmt.Sprintf("user-name token with unknown PolicyId %q", t.PolicyID)
		}
		password, why := s.userPassword(t, nonce, enc)
		if why != "" {
			return "", ua.StatusBadIdentityTokenInvalid, why
		}
		want, ok := s.cfg.Users[t.UserName]
		if !ok || subtle.ConstantTimeCompare([]byte(want), password) != 1 {
			return "", ua.StatusBadUserAccessDenied, "unknown user or wrong password"
		}
		return t.UserName, ua.StatusOK, ""
	case droppedToken:
		// A held login's token of a type not offered (heldToken).
		return "", ua.StatusBadIdentityTokenInvalid, t.typ + " not offered"
	default:
		return "", ua.StatusBadIdentityTokenInvalid, fmt.Sprintf("%T not offered", tok)
	}
}

// userPassword decrypts a user-name token's legacy encrypted secret: the
// 4-byte little-endian length of password and nonce, the password and the
// server nonce, encrypted with the server certificate's key by enc's
// algorithm. It returns the password, or why the secret is invalid.
func (s *Server) userPassword(t *ua.UserNameIdentityToken, nonce []byte, enc *uapolicy.EncryptionAlgorithm) ([]byte, string) {
	if alg := enc.EncryptionURI(); t.EncryptionAlgorithm != alg {
		if t.EncryptionAlgorithm == "" {
			return nil, "password not encrypted (policy " + t.PolicyID + " needs " + alg + ")"
		}
		return nil, fmt.Sprintf("encryption algorithm %q, want %q", t.EncryptionAlgorithm, alg)
	}
	if n := s.secretBlocks(t.Password); n > s.cfg.MaxSecretBlocks && !s.cfg.Faults.Has(catalog.FaultRSABlocksUnbounded) {
		// Each block costs an RSA private-key operation (about 1.3 ms
		// for RSA-2048) and costs the client nothing to send: refused
		// without decrypting any. (Fault rsa-blocks-unbounded: decrypted.)
		return nil, fmt.Sprintf("secret of %d RSA blocks, at most %d", n, s.cfg.MaxSecretBlocks)
	}
	plain, err := enc.Decrypt(t.Password)
	if err != nil || len(plain) < 4 {
		return nil, "secret does not decrypt with the server key"
	}
	n := binary.LittleEndian.Uint32(plain)
	if uint64(n) != uint64(len(plain)-4) || int(n) < len(nonce) {
		return nil, fmt.Sprintf("secret length field %d, decrypted %d bytes after it", n, len(plain)-4)
	}
	data := plain[4:]
	split := len(data) - len(nonce)
	if len(nonce) == 0 || subtle.ConstantTimeCompare(data[split:], nonce) != 1 {
		return nil, "secret nonce is not the session's last server nonce"
	}
	return data[:split], ""
}

// secretBlocks is the number of RSA blocks of an encrypted secret: its
// length over the server key's size, rounded up (every policy encrypts
// with the one application instance key).
func (s *Server) secretBlocks(secret []byte) int {
	k := s.creds.key.Size()
	return (len(secret) + k - 1) / k
}
