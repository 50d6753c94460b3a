package server

import (
	"crypto/rand"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gopcua/opcua/ua"

	"github.com/opcua-chaos/opcua-chaos/server/catalog"
)

// Tests of issue 44 item 8: CPU amplifiers of secured channels.

// TestOPNBlocksBounded: a well-formed, signed OpenSecureChannel request of
// about 240 RSA blocks (60 KB) is refused with ERR BadSecurityChecksFailed
// before any block is decrypted, while one of 2 blocks opens the channel;
// under the fault opn-blocks-unbounded every block is decrypted and the
// channel opens (it took that much longer).
func TestOPNBlocksBounded(t *testing.T) {
	const audit = 50_000
	key, cert := clientCredentials(t, testClientURI)
	for _, fault := range []bool{false, true} {
		t.Run(map[bool]string{false: "protected", true: string(catalog.FaultOPNBlocksUnbounded)}[fault], func(t *testing.T) {
			ts := runServer(t, Config{Faults: Faults{catalog.FaultOPNBlocksUnbounded: fault}})
			ep := secureEndpoint(t, ts.endpoint)
			big := sealedOPN(t, ep, key, cert, audit)
			if code, _ := sendOPN(t, ts.endpoint, sealedOPN(t, ep, key, cert, 0)); code != ua.StatusOK {
				t.Fatalf("OpenSecureChannel of 2 blocks: %v", code)
			}
			code, took := sendOPN(t, ts.endpoint, big)
			blocks := (len(big) + 255) / 256
			t.Logf("OpenSecureChannel of %d bytes (~%d blocks): %v after %v", len(big), blocks, code, took.Round(time.Millisecond))
			want := ua.StatusBadSecurityChecksFailed
			if fault {
				want = ua.StatusOK
			}
			if code != want {
				t.Errorf("OpenSecureChannel of %d bytes: %v, want %v", len(big), code, want)
			}
		})
	}
}

// TestOPNPerPeerBudget: with a budget of 10 RSA operations per peer
// address (1 a second), OpenSecureChannel requests of 2 blocks from one
// address are decrypted until the budget is spent, then refused with ERR
// BadTcpServerTooBusy (Counter.RSARefused counts them); under the fault
// opn-blocks-unbounded all are served.
func TestOPNPerPeerBudget(t *testing.T) {
	const tries = 10
	key, cert := clientCredentials(t, testClientURI)
	for _, fault := range []bool{false, true} {
		t.Run(map[bool]string{false: "protected", true: string(catalog.FaultOPNBlocksUnbounded)}[fault], func(t *testing.T) {
			ts := runServer(t, Config{RSAOpsPerPeer: 1, RSABurstPerPeer: 10, Faults: Faults{catalog.FaultOPNBlocksUnbounded: fault}})
			ep := secureEndpoint(t, ts.endpoint)
			opn := sealedOPN(t, ep, key, cert, 0)
			served, busy := 0, 0
			for range tries {
				switch code, _ := sendOPN(t, ts.endpoint, opn); code {
				case ua.StatusOK:
					served++
				case ua.StatusBadTCPServerTooBusy:
					busy++
				default:
					t.Fatalf("OpenSecureChannel: %v", code)
				}
			}
			t.Logf("%d of %d OpenSecureChannel served, %d refused BadTcpServerTooBusy; Counter.RSARefused %d", served, tries, busy, ts.stats.rsaRefused.Load())
			switch {
			case !fault && (served < 4 || served > 6 || int64(busy) != ts.stats.rsaRefused.Load()):
				t.Errorf("%d served, %d refused (%d counted): want 5 served (10 operations of 2 blocks), the rest refused and counted", served, busy, ts.stats.rsaRefused.Load())
			case fault && served != tries:
				t.Errorf("under the fault %d of %d served", served, tries)
			}
		})
	}
}

// TestCreateSessionSigningBudget: on a secured channel, with a budget of
// 10 RSA operations per peer address (1 a second), 20 CreateSession
// calls are signed until the budget (which the channel's
// OpenSecureChannel and the client's own session used too) is spent, the
// rest refused BadTooManyOperations unsigned; with the budget undone
// (Config.unthrottledSigning) all 20 are signed.
func TestCreateSessionSigningBudget(t *testing.T) {
	const calls = 20
	key, cert := clientCredentials(t, testClientURI)
	sc := secureClient{policy: ua.SecurityPolicyURIBasic256Sha256, mode: ua.MessageSecurityModeSignAndEncrypt, key: key, cert: cert}
	for _, fault := range []bool{false, true} {
		t.Run(map[bool]string{false: "protected", true: "unthrottled"}[fault], func(t *testing.T) {
			ts := runServer(t, Config{RSAOpsPerPeer: 1, RSABurstPerPeer: 10, MaxSessions: 100, MaxUnactivatedSessions: 50,
				unthrottledSigning: fault})
			c := connect(t, ts.endpoint, sc.options(t, ts.endpoint, ua.UserTokenTypeAnonymous)...)
			signed, refused := 0, 0
			for range calls {
				nonce := make([]byte, 32)
				_, _ = rand.Read(nonce)
				resp, err := sendRaw(t, c, &ua.CreateSessionRequest{ClientDescription: clientDescription(), ClientCertificate: cert,
					ClientNonce: nonce, RequestedSessionTimeout: 10000}, nil)
				switch {
				case errors.Is(err, ua.StatusBadTooManyOperations):
					refused++
				case err != nil:
					t.Fatalf("CreateSession: %v", err)
				case len(resp.(*ua.CreateSessionResponse).ServerSignature.Signature) == 0:
					t.Fatal("CreateSession answered without a signature")
				default:
					signed++
				}
			}
			t.Logf("%d of %d CreateSession signed, %d refused BadTooManyOperations", signed, calls, refused)
			switch {
			case !fault && (signed == 0 || signed > 9 || refused != calls-signed):
				t.Errorf("%d signed, %d refused: want at most 9 signed (10 operations, one the channel's own session's), the rest refused", signed, refused)
			case fault && signed != calls:
				t.Errorf("under the fault %d of %d signed", signed, calls)
			}
		})
	}
}

// TestSecretDecryptionBudget: 8 addresses each try 10 logins under fresh
// user names with a junk secret of 16 RSA blocks. Each address's first
// LoginFreeFailures (3) are decrypted; after them its secrets are paid
// from the server-wide budget of 16 blocks a second (32 at once), and the
// rest are refused BadTooManyOperations undecrypted (Counter.SecretsRefused),
// however many addresses there are; alice, from an address without
// failed logins, logs in at once. With the budget undone
// (Config.unbudgetedSecrets) every secret is decrypted.
func TestSecretDecryptionBudget(t *testing.T) {
	const addrs, tries, blocks = 8, 10, 16
	for _, fault := range []bool{false, true} {
		t.Run(map[bool]string{false: "protected", true: "unbudgeted"}[fault], func(t *testing.T) {
			ts := runServer(t, Config{Users: map[string]string{"alice": "secret"}, LoginDelay: time.Millisecond, LoginDelayMax: 10 * time.Millisecond,
				LoginFreeFailures: 3, SecretOpsPerSecond: 16, unbudgetedSecrets: fault})
			keyLen := ts.creds.key.Size()
			var mu sync.Mutex
			decrypted, refused := 0, 0
			start := time.Now()
			var wg sync.WaitGroup
			for a := range addrs {
				r := createRaw(t, newRawChannelFrom(t, ts.endpoint, fmt.Sprintf("127.0.0.%d", 40+a)))
				wg.Go(func() {
					for i := range tries {
						err := r.activate(junkSecret(fmt.Sprintf("guess-%d-%d", a, i), blocks*keyLen))
						mu.Lock()
						switch {
						case errors.Is(err, ua.StatusBadIdentityTokenInvalid):
							decrypted++
						case errors.Is(err, ua.StatusBadTooManyOperations):
							refused++
						default:
							t.Errorf("login %d from address %d: %v", i, a, err)
						}
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			took := time.Since(start)
			home := createRaw(t, newRawChannelFrom(t, ts.endpoint, "127.0.0.9"))
			d, err := timedActivate(home, home.user("alice", "secret", home.nonce))
			if err != nil {
				t.Errorf("alice from a clean address: %v", err)
			}
			t.Logf("%d of %d secrets of %d blocks decrypted, %d refused undecrypted, in %v from %d addresses (Counter.SecretsRefused %d); alice logged in after %v",
				decrypted, addrs*tries, blocks, refused, took.Round(time.Millisecond), addrs, ts.stats.secretsRefused.Load(), d.Round(time.Millisecond))
			budget := 2 + int(took.Seconds()) + 1 // 32 blocks at once, 16 a second
			switch {
			case !fault && (decrypted > addrs*3+budget || int64(refused) != ts.stats.secretsRefused.Load() || refused == 0):
				t.Errorf("%d decrypted, %d refused: want at most %d free and %d from the budget, the rest refused and counted", decrypted, refused, addrs*3, budget)
			case fault && decrypted != addrs*tries:
				t.Errorf("under the fault %d of %d decrypted", decrypted, addrs*tries)
			}
		})
	}
}
