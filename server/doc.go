// Package server is the opcua-chaos reference OPC UA server: a target that
// does concurrency right (and, with fault switches, wrong on demand) so the
// chaos suites can prove what they catch.
//
// It is built on gopcua's protocol packages (ua types and codec, uacp
// messages) with its own secure channel transport (internal/channel, in
// place of gopcua's uasc), session layer and dispatch; gopcua's stock
// server.Server is not used.
//
// # Security
//
// Endpoints are offered with SecurityPolicy None and, for Basic256Sha256,
// Aes128_Sha256_RsaOaep and Aes256_Sha256_RsaPss, MessageSecurityMode Sign
// and SignAndEncrypt (Config.Security, OPCUA_SECURITY=none,sign,sign-encrypt
// limits them; a None channel always serves discovery, but CreateSession
// on it is BadSecurityModeRejected when None is not offered). Any
// well-formed client certificate with an RSA key of 2048 to 4096 bits is
// accepted: there is no trust list. On a secured channel CreateSession
// signs the client certificate and nonce, refuses a client certificate
// that is not the channel's (BadCertificateInvalid), and ActivateSession
// checks the client's signature over the server certificate and the last
// server nonce (BadApplicationSignatureInvalid). TransferSubscriptions
// follows Part 4 5.14.7.1: the same user, or anonymous to anonymous with
// the same client ApplicationUri over a Sign or SignAndEncrypt channel.
//
// # Identity
//
// Like real servers (e.g. open62541), ActivateSession accepts an identity
// token only with a PolicyId the endpoints advertise:
// "refserver-anonymous" (PolicyAnonymous; not offered with
// Config.NoAnonymous) and "refserver-username-basic256sha256"
// (PolicyUserName), whose SecurityPolicyUri is Basic256Sha256 (on the
// secured endpoints "refserver-username-channel", PolicyUserNameChannel,
// with an empty SecurityPolicyUri: encrypted with the channel's policy): the
// password must come encrypted with the server certificate (RSA-OAEP,
// EncryptionAlgorithm http://www.w3.org/2001/04/xmlenc#rsa-oaep) in the
// legacy secret layout (4-byte little-endian length of password and nonce,
// password, nonce), with the session's last server nonce (CreateSession and
// every successful ActivateSession issue a new one). The certificate is a
// self-signed RSA-2048 one generated at start with ApplicationURI in its
// subjectAltName (or Config.PrivateKey and Config.Certificate), advertised
// in the EndpointDescriptions and the CreateSessionResponse. An unknown
// PolicyId, a plain password, another EncryptionAlgorithm, a secret that
// does not decrypt, a bad length field or a nonce that is not the
// session's last one give BadIdentityTokenInvalid; an unknown user or a
// wrong password (compared in constant time) BadUserAccessDenied; a token
// type that is not offered BadIdentityTokenRejected. A null identity token
// counts as anonymous. The RSA decryption costs about 1 ms of CPU per
// user-name activation.
//
// # Services
//
// GetEndpoints (advertises the EndpointUrl the client sent, so clients behind
// a proxy keep using the proxy, with the token policies above),
// FindServers, CreateSession, ActivateSession (see Identity; user names and
// passwords from Config.Users; an activated session moves to another
// channel only with the same identity, else BadIdentityChangeNotSupported),
// CloseSession, Cancel, Read, Browse (a static hierarchy from Root i=84
// to the standard nodes Read serves, and ns=1;s=Nodes, a folder of the
// server's fixed diagnostic nodes; no continuation points: a node's
// references are capped at RequestedMaxReferencesPerNode, BrowseNext is
// unsupported) and the subscription services (see Subscriptions). Every
// session service checks the authentication token (BadSessionIdInvalid,
// BadSessionNotActivated, BadSecureChannelIdInvalid when used from another
// secure channel). Other services get a ServiceFault BadServiceUnsupported.
// Sessions time out after their revised timeout without requests. A Read
// honours the request's TimeoutHint (BadTimeout).
//
// # Nodes (Value attribute only; unknown nodes give BadNodeIdUnknown)
//
//	i=2254  Server_ServerArray                 String[]
//	i=2255  Server_NamespaceArray              String[] (ns=1 is NamespaceURI)
//	i=2256  Server_ServerStatus                ExtensionObject ServerStatusDataType
//	i=2257  Server_ServerStatus_StartTime      DateTime
//	i=2258  Server_ServerStatus_CurrentTime    DateTime
//	i=2259  Server_ServerStatus_State          Int32, 0 = Running
//	i=2260  Server_ServerStatus_BuildInfo      ExtensionObject BuildInfo
//	i=2992, i=2993  SecondsTillShutdown, ShutdownReason
//	i=2275  ServerDiagnosticsSummary           ExtensionObject ServerDiagnosticsSummaryDataType
//	i=2277  CurrentSessionCount                UInt32
//	i=2278  CumulatedSessionCount              UInt32
//	i=2279  SecurityRejectedSessionCount       UInt32 (bad identity tokens)
//	i=3705  RejectedSessionCount               UInt32 (too many sessions)
//	i=2281  SessionTimeoutCount                UInt32
//	i=2288  RejectedRequestsCount              UInt32 (requests answered with a Bad service result)
//	i=2276, 2282, 2284–2287  other summary counters, always 0
//	ServerCapabilities (UInt32): OperationLimits.MaxNodesPerRead (10000),
//	        OperationLimits.MaxMonitoredItemsPerCall, MaxMonitoredItems,
//	        MaxMonitoredItemsPerSubscription (Config, see Subscriptions)
//
// Namespace 1 (string ids, Int64 values):
//
//	ns=1;s=Counter.Reads              Read operations (ReadValueIds) answered
//	ns=1;s=Counter.ReadRequests       Read requests answered
//	ns=1;s=Counter.Requests           service requests received
//	ns=1;s=Counter.Rejected           requests answered with a Bad service result
//	ns=1;s=Counter.Timeouts           requests answered BadTimeout
//	ns=1;s=Counter.Sessions           current sessions
//	ns=1;s=Counter.SessionsCumulated  sessions created since start
//	ns=1;s=Counter.Channels           current secure channels
//	ns=1;s=Counter.ChannelsCumulated  secure channels opened since start
//	ns=1;s=Counter.TooBusy            requests refused BadServerTooBusy
//	ns=1;s=Counter.Cancelled          queued requests cancelled by Cancel
//	ns=1;s=Counter.Connections        TCP connections served now
//	ns=1;s=Counter.ConnectionsRefused connections refused (MaxConnections)
//	ns=1;s=Counter.ConnectionsEvicted connections without an activated session
//	                                  closed to make room at MaxConnections
//	ns=1;s=Counter.Panics             panics recovered
//	ns=1;s=Counter.DecodingErrors     requests answered BadDecodingError
//	ns=1;s=Counter.LoginsDelayed      ActivateSession calls delayed by the login throttle
//	ns=1;s=Counter.SessionsUnactivated sessions created, not yet activated
//	ns=1;s=Queue.Depth                requests queued now
//	ns=1;s=Queue.Slots                queue slots held (Depth + leaked slots)
//	ns=1;s=Queue.Limit, Queue.OwnerLimit   total bound, per-owner ceiling
//	ns=1;s=Queue.Enqueued, .Dispatched, .Rejected, .Cancelled
//	ns=1;s=Queue.Workers, .WorkersBusy, .WorkersWaiting
//	ns=1;s=Owner.<owner>.Queued, .Slots, .Enqueued, .Dispatched,
//	       .Rejected, .Cancelled, .Weight   per owner (user name or peer IP)
//	ns=1;s=Owner.<owner>.Emptied      times the owner's queue ran dry
//	ns=1;s=Channel.BackpressurePauses     times a channel stopped reading
//	ns=1;s=Channel.MaxPendingResponses    most responses pending on a channel
//	ns=1;s=Channel.LowestResume           fewest responses pending when a
//	                                      paused reader resumed (-1: none)
//	ns=1;s=Channel.PendingResponses       responses pending now
//	ns=1;s=Channel.ParkedRequests         Publish requests queued now
//	ns=1;s=Memory.Budget              the memory budget's bytes (0: none)
//	ns=1;s=Memory.Charged             bytes charged to it now
//	ns=1;s=Memory.Charged.<class>, Memory.Refused.<class>   one class's bytes
//	                                  and refused charges (chunks, queue,
//	                                  logins, items, sessions)
//	ns=1;s=Slow.<ms>                  sleeps <ms> (0..600000), honouring
//	                                  cancellation and TimeoutHint; value <ms>
//	ns=1;s=Busy.<µs>                  burns CPU for <µs> (0..60000000) by
//	                                  spinning on the monotonic clock; value <µs>
//	                                  (both absent with OPCUA_SERVICE_TIME_NODES=false)
//	ns=1;s=SampledCounter.<i>         i in [0, Config.Counters): increments each
//	                                  time the sampler reads it (a Read does not)
//	ns=1;s=FastCounter.<i>            monotonic µs since start; SourceTimestamp =
//	                                  sample time
//	ns=1;s=Subscription.Count, .Items, .Notifications, .Messages,
//	       .KeepAlives, .PublishDropped
//	ns=1;s=Sampling.Cycles, .Samples, .Late (cycles ≥ 1 interval late),
//	       .Missed (grid points skipped), .MaxLatenessUs
//
// # Subscriptions
//
// CreateSubscription, ModifySubscription, DeleteSubscriptions,
// SetPublishingMode, CreateMonitoredItems, ModifyMonitoredItems,
// DeleteMonitoredItems, SetMonitoringMode, Publish, Republish and
// TransferSubscriptions are served on the channel's reader by internal/subscription. Intervals are revised,
// never rejected: publishing and sampling intervals of 0, below 1 ms or NaN
// become 1 ms; sampling -1 means the publishing interval. Monitored items
// of one sampling interval share one sampler goroutine and timer with
// absolute deadlines t0 + k·interval on the monotonic clock (a late cycle
// samples at once and the grid stays; skipped points count in
// Sampling.Missed); queues honour QueueSize and DiscardOldest (overflow
// bit). Up to 100 Publish requests queue per session (beyond,
// BadTooManyPublishRequests for the oldest). A queued Publish is parked on
// its channel: it holds no backpressure slot (a client with 100 outstanding
// Publishes would otherwise stop its channel's reader at the high mark) and
// no worker. A response carries at most the
// subscription's MaxNotificationsPerPublish and fits one chunk of the
// client's receive buffer (from its Hello): the rest follows with
// MoreNotifications.
// CreateMonitoredItems takes at most Config.MaxMonitoredItemsPerCall items
// per call (BadTooManyOperations beyond); an item beyond
// MaxMonitoredItemsPerSession live items of its session or
// MaxMonitoredItems of all sessions gets BadTooManyMonitoredItems. Once
// 5 000 or more items were deleted since it last did, the server returns the
// freed memory to the OS at once (debug.FreeOSMemory).
// Unacknowledged messages stay in a 256-message retransmission queue for
// Republish, each charged its estimated size to the memory budget's
// retransmit class, of which one session may hold a quarter: beyond it
// the oldest are dropped (Republish answers BadMessageNotAvailable).
// Keep-alives carry the next sequence number. A session may have 1000
// subscriptions, the server Config.MaxSubscriptions (10 000) running at
// most 100 000 publishing cycles a second together (1000 subscriptions at
// 10 ms; beyond either, BadTooManySubscriptions), publishing no faster
// than Config.MinPublishingInterval (10 ms). Anonymous sessions together
// hold at most Config.AnonymousSubscriptionShare (½) of the subscriptions
// and of the publishing rate, so that a user who logs in still gets
// subscriptions; a subscription keeps the class it was charged to. A
// subscription without Publish requests for its lifetime count expires. Closing a
// session deletes its subscriptions.
//
// A session outlives its secure channel (until its timeout): a client
// that reconnects activates it again on its new channel with the same
// identity, and its subscriptions, sequence numbers and retransmission
// queues go on; it Republishes what the broken connection lost.
// TransferSubscriptions moves subscriptions to another session of the
// same user (anonymous to anonymous; BadUserAccessDenied otherwise) with
// their items, queued values and sequence numbers; SendInitialValues
// queues every reporting item's current value. Sessions live in memory: a
// restarted server has none.
//
// # Concurrency
//
// Session and discovery services are answered on the channel's reader;
// Read and Browse requests go through a weighted fair queue (internal/fairqueue) keyed
// by owner (the session's user name, else the peer IP), weights from
// Config.OwnerWeights, served by a pool of Config.Workers workers. A full
// queue or owner share answers StatusBadServerTooBusy. Responses are written
// by a per-channel writer (internal/channel); a channel stops reading above
// Config.HighMark pending responses and resumes at Config.LowMark. Cancel
// completes queued requests with that RequestHandle once with
// BadRequestCancelledByClient (running ones finish); CloseSession
// (BadSessionClosed) and a lost connection cancel the session's or
// channel's queued requests. Stopping answers queued requests
// BadServerHalted. Fault switches (Config.Faults, OPCUA_FAULTS) reproduce
// known bugs on demand; see the Fault constants (sampling-drift,
// sampler-skips, publish-drop, republish-forgets, republish-next,
// transfer-drops, transfer-no-status-change, keepalive-consumes-seq,
// skipped-sequence, duplicate-samples and sample-at-publish are the
// subscription ones;
// per-session-owners keys the fair queue by session instead of user,
// cancel-running-total answers Cancel with a running total,
// cancel-wrong-handle matches Cancel against its own handle (it cancels
// nothing), sessions-never-expire leaves idle activated sessions open,
// and cert-cached-across-channels seals every secured channel for the
// first client certificate the server saw).
//
// # Hostile traffic
//
// Request bodies are checked by internal/uabin before gopcua's decoder sees
// them (array, string and ByteString lengths against the bytes left,
// negative lengths, Variant dimensions, nesting depth up to
// Config.MaxDecodeDepth), and decoded under a recover: a bad request is
// answered with a ServiceFault BadDecodingError and the channel stays. A
// panic in a handler or worker answers BadInternalError and closes only
// that channel (Counter.Panics). Limits, all in Config with OPCUA_*
// variables: MaxConnections (ERR BadMaxConnectionsReached beyond),
// HandshakeTimeout (Hello and first OpenSecureChannel), MaxMessageSize and
// MaxChunkCount per request (ERR BadRequestTooLarge), MaxBufferedChunks and
// MaxBufferedBytes of unfinished requests per channel (ERR
// BadTcpMessageTooLarge), MaxUnactivatedSessions and UnactivatedTimeout.
// Responses are split into chunks within the client's receive buffer; one
// above its MaxMessageSize or MaxChunkCount is answered BadResponseTooLarge.
// Failed logins are delayed per peer IP and user name (LoginDelay doubling
// to LoginDelayMax after LoginFreeFailures), and, for user-name tokens, per
// user and per peer IP too (capped at 1 s, so a guesser cannot lock a real
// user out for long): a login waits the largest delay that applies, on a
// timer, never on a reader or worker, holding a trimmed copy of its request
// charged to the memory budget, at most MaxHeldLoginsPerPeer per peer IP
// (BadTooManyOperations beyond), and dropped with its channel. An encrypted
// secret of more than MaxSecretBlocks RSA blocks is refused undecrypted;
// the secrets of peer addresses with failed logins are decrypted within a
// server-wide SecretOpsPerSecond blocks (BadTooManyOperations beyond).
//
// RSA private-key work is bounded before it is done: a secured
// OpenSecureChannel of more than MaxOPNBlocks encrypted blocks closes with
// ERR BadSecurityChecksFailed undecrypted (its signature is inside the
// encrypted plaintext, so it cannot be checked first), and each peer
// address may spend RSAOpsPerPeer private-key operations a second
// (RSABurstPerPeer at once) on OpenSecureChannel blocks (ERR
// BadTcpServerTooBusy beyond) and CreateSession signatures
// (BadTooManyOperations). String and opaque NodeIds over MaxNodeIDLength
// are BadNodeIdInvalid in Read, Browse and CreateMonitoredItems; a
// monitored item is charged its NodeId beside its queue, and its node is
// resolved once, not for every sample.
//
// Memory hostile peers can make the server hold is charged to one byte
// budget (MemoryBudget, package internal/budget) in classes with shares of
// it: unfinished chunks of all channels (ERR BadTcpNotEnoughResources
// beyond), queued requests by decoded size (BadResourceUnavailable), held
// logins (BadTooManyOperations), monitored-item queues (an item's
// BadResourceUnavailable), per-session strings, capped at
// MaxStringLength (CreateSession BadResourceUnavailable), and responses
// waiting in the channels' send queues, encoded by the worker that answers
// and charged until written: a channel's reader stops while more than
// MaxUnsentPerChannel bytes wait, a large response beyond the budget or
// that share is answered BadResourceUnavailable (a client that reads its
// small answers is always sent them), and a write that makes no progress
// for WriteTimeout closes the channel; and parked Publish requests, each
// keeping only its header and acknowledgement results (BadTooManyPublishRequests
// when they do not fit). A channel on
// which no session was activated within IdleTimeout of its
// OpenSecureChannel is closed, as is one whose token was not renewed within
// 125 % of its lifetime; at MaxConnections the oldest connection without an
// activated session makes room. At MaxUnactivatedSessions the oldest
// unactivated session makes room; anonymous sessions hold at most
// MaxAnonymousSessions, and orphaned ones (their channel closed) make room
// at MaxSessions. At MaxAnonymousSessions an anonymous activation closes an
// orphan, else the idlest session of the peer address holding the most
// anonymous sessions: at once for a peer holding fewer, after
// AnonymousYieldIdle without a request for one holding as many. Transient accept errors (EMFILE) are backed off; Serve
// returns within ShutdownTimeout of its context ending (ErrShutdownTimeout
// if work was still running). The faults crash-on-decode, unbounded-idle
// and the resource-exhaustion faults (no-byte-budget ... parked-publish-whole)
// bring the old behaviour back, one protection each.
//
// # Logging
//
// The server logs with log/slog. Once listening it logs exactly one line
// whose message is ReadyMessage ("opcua-chaos server ready") with the
// attribute listen=<host:port>; just before it, a "starting" line lists the
// enabled fault switches (faults=...).
package server
