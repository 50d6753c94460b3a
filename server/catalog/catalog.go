// Package catalog is the one description of the reference server's fault
// switches and quirks: a row each (Faults, Quirks) with its name, the bug
// or variation it plants, how its failure must read and the specs aimed at
// it. The harness reads it without linking the server; the server's code
// paths branch on its constants; docs/faults.md's tables are generated
// from it (fixtures/docsnames).
package catalog

import (
	"regexp"
	"time"
)

// Fault names one deliberate bug the server can switch on (OPCUA_FAULTS), so
// the suites can show that they catch it.
type Fault string

// The fault switches. Each is one small, clearly named code path, and
// has its row in Faults.
const (
	// FaultUnweighted ignores owner weights (plain round robin).
	FaultUnweighted Fault = "unweighted"
	// FaultTurnStall sleeps 1 ms every 7th turn between taking an owner's
	// last turn token and queuing its next turn (seed 001's preemption skew).
	FaultTurnStall Fault = "turn-stall"
	// FaultLostWakeup makes a worker check the queue and then park without
	// re-checking after arming, so a request enqueued in between waits for
	// the next arrival.
	FaultLostWakeup Fault = "lost-wakeup"
	// FaultWriterLostWakeup makes a channel's writer drain its wake-up
	// signal after writing a batch: a response queued while the batch
	// was being written (its wake-up taken for one of the batch) waits
	// until a later response on the same channel wakes the writer. Unlike
	// FaultLostWakeup (a worker that misses a queued request, which any
	// later request to the server rescues) only the same channel's next
	// response releases it.
	FaultWriterLostWakeup Fault = "writer-lost-wakeup"
	// FaultNoBackpressure never stops reading a busy channel.
	FaultNoBackpressure Fault = "no-backpressure"
	// FaultFaultOnOverflow closes a channel with BadTcpNotEnoughResources
	// when more than the high mark of responses are pending.
	FaultFaultOnOverflow Fault = "fault-on-overflow"
	// FaultCancelLeak does not return a cancelled queued request's slot.
	FaultCancelLeak Fault = "cancel-leak"
	// FaultCancelDouble still dispatches a cancelled request, so it
	// completes twice.
	FaultCancelDouble Fault = "cancel-double"
	// FaultCancelStrands makes the compaction that a Cancel runs on an
	// owner's queue (once its cancelled entries outnumber its queued ones
	// and 64) start one past the queue's head: the oldest queued request
	// of that owner, queued before the cancelled one, leaves the queue's
	// order but stays queued. It holds its slot and no worker ever
	// dispatches it; it is answered only when its session closes.
	FaultCancelStrands Fault = "cancel-strands"
	// FaultSerialDispatch serves all requests on one goroutine (gopcua's
	// stock server behaviour).
	FaultSerialDispatch Fault = "serial-dispatch"
	// FaultPublishBlocksReader leaves a parked Publish request in its
	// channel's pending count (channel.Park does not take it out), so
	// parked Publishes count against the reader's high mark: a client
	// with HighMark (100) Publish requests outstanding on one channel,
	// the session's MaxPublishRequests, stops the reader, and nothing
	// sent behind them is read until keep-alives or data answer half of
	// them.
	FaultPublishBlocksReader Fault = "publish-blocks-reader"
	// FaultSamplingDrift makes the sampler wait one interval after each
	// sample instead of keeping absolute deadlines (seed 003's bug).
	FaultSamplingDrift Fault = "sampling-drift"
	// FaultPublishDrop silently drops Publish requests beyond a small number
	// (3) queued per session (gopcua's stock server drops those beyond 100).
	FaultPublishDrop Fault = "publish-drop"
	// FaultCrashOnDecode hands request bodies to gopcua's decoder unchecked
	// and recovers no panic on the connection: a malformed request (a
	// Variant array length of -2) kills the process, as before issue 14.
	FaultCrashOnDecode Fault = "crash-on-decode"
	// FaultUnboundedIdle drops the handshake deadline and the connection
	// limit: connections that never send Hello stay open forever.
	FaultUnboundedIdle Fault = "unbounded-idle"
	// FaultSamplerSkips makes the sampler never sample the targets at
	// positions ≡ 7 (mod 64) of each sampling-interval group, in the order
	// they were added (the server's subscription.SkipModulus and
	// SkipResidue): 16 of 1024 items created together are never sampled,
	// while a lone item (position 0) is sampled normally.
	FaultSamplerSkips Fault = "sampler-skips"
	// FaultCloseRunsQueued makes CloseSession answer Good but leave the
	// session's queued requests in the queue; workers run them afterwards
	// and answer them Good, as if the session were still open.
	FaultCloseRunsQueued Fault = "close-runs-queued"
	// FaultLostResponse drops the answer to every
	// server.LostResponseEvery-th Read request of each secure channel: no
	// response is sent, its pending slot is released, and the channel stays
	// open.
	FaultLostResponse Fault = "lost-response"
	// FaultRetainMemory keeps server.RetainPerRequest bytes per served Read
	// request forever (a leak); backpressure works unchanged.
	FaultRetainMemory Fault = "retain-memory"
	// FaultSlowLeak keeps server.SlowLeakPerRequest bytes per served Read
	// request forever: a leak too slow for the 10-second CI runs' memory
	// bounds, the kind a soak's trend finds (with allocation overhead
	// about 300 MiB/min at 32 000 Reads/s).
	FaultSlowLeak Fault = "slow-leak"
	// FaultTrickleLeak keeps server.TrickleLeakPerSecond bytes (4 KiB,
	// written so they are resident) per second of wall time forever,
	// whatever the load: about 14 MiB/hour, 0.2 MiB over a 1-minute
	// soak's judged 48 s, a leak under what a short soak can tell from
	// GC noise and that an hour's soak must find (the trend checker's
	// per-hour bound). Only soaks of MinSoak(FaultTrickleLeak) or longer
	// are aimed at it.
	FaultTrickleLeak Fault = "trickle-leak"
	// FaultRepublishForgets keeps only the last notification message of a
	// subscription for Republish: messages lost with a broken connection
	// are answered BadMessageNotAvailable instead of being sent again.
	FaultRepublishForgets Fault = "republish-forgets"
	// FaultNoReactivate refuses ActivateSession of an activated session on
	// another secure channel (BadSecureChannelIDInvalid): a session cannot
	// move to the new channel of a client that reconnected, which must
	// create a new one.
	FaultNoReactivate Fault = "no-reactivate"
	// FaultTransferDrops loses a subscription's monitored items in
	// TransferSubscriptions: the subscription arrives in the new session
	// empty, and sends keep-alives only.
	FaultTransferDrops Fault = "transfer-drops"
	// FaultLateResume resumes a channel's paused reader only when no
	// response is pending instead of at LowMark: the pipeline drains
	// empty before the server reads again, in bursts.
	FaultLateResume Fault = "late-resume"
	// FaultCryptoInGate signs and encrypts a secured channel's responses
	// holding the channel's send gate, and has the reader take the gate to
	// verify and decrypt a request and keep it while it hands the request
	// to a worker; the workers send their own responses, so they wait for
	// the gate, and handing over waits for a free worker. Under a deep
	// pipeline over Sign or SignAndEncrypt the channels STALL (readers
	// hold gates waiting for workers, workers wait for those gates: .NET's
	// "SendResponse blocked workers on the channel gate"); under None the
	// reader never takes the gate and nothing changes.
	FaultCryptoInGate Fault = "crypto-in-gate"
	// FaultPerSessionOwners keys the fair queue's owners by session
	// instead of by user: a user with 8 sessions gets 8 shares, and the
	// per-owner diagnostics (Owner.<user>.*) stay at 0.
	FaultPerSessionOwners Fault = "per-session-owners"
	// FaultCancelTotal answers Cancel with the server's running total of
	// cancelled requests as CancelCount instead of the number this Cancel
	// removed.
	FaultCancelTotal Fault = "cancel-running-total"
	// FaultCancelWrongHandle makes Cancel look for the queued requests
	// whose RequestHandle is the Cancel request's own (its
	// RequestHeader.RequestHandle) instead of the one it names
	// (CancelRequest.RequestHandle): it never finds one, so it cancels
	// nothing and answers Good with CancelCount 0. Every request runs as
	// if no Cancel had come; the cancel storm reads not exercised.
	FaultCancelWrongHandle Fault = "cancel-wrong-handle"
	// FaultSessionsNeverExpire never closes a session whose timeout
	// passed without a request: abandoned sessions pile up.
	FaultSessionsNeverExpire Fault = "sessions-never-expire"
	// FaultSkippedSequence skips every server.SkipSequenceEvery-th notification
	// message sequence number of a subscription: the number is never sent
	// nor listed in AvailableSequenceNumbers.
	FaultSkippedSequence Fault = "skipped-sequence"
	// FaultDuplicateSamples queues every server.DuplicateSampleEvery-th sample of
	// a monitored item twice: the client receives a notification the item
	// never had (the same value and source timestamp again).
	FaultDuplicateSamples Fault = "duplicate-samples"
	// FaultSampleAtPublish grants the sampling interval a client asks for
	// (CreateMonitoredItems and ModifyMonitoredItems answer it revised as
	// usual) but samples the item at its subscription's publishing
	// interval when that is longer: at 10 ms asked and 100 ms publishing,
	// one sample in ten. Each sample is a real one (a SampledCounter still
	// moves by one per sample): the sampler is slow, the counter is a
	// counter.
	FaultSampleAtPublish Fault = "sample-at-publish"
	// FaultKeepAliveConsumesSeq makes a keep-alive use up the sequence
	// number it announces: the keep-alive carries number n and the next
	// notification message n+1, so n is never sent (Part 4 5.14.1.1: a
	// keep-alive carries the next number without consuming it).
	FaultKeepAliveConsumesSeq Fault = "keepalive-consumes-seq"
	// FaultTransferNoStatusChange sends no StatusChangeNotification
	// Good_SubscriptionTransferred to the session a subscription left in
	// TransferSubscriptions (Part 4 5.14.7.1): the old session's queued
	// Publish requests are answered BadNoSubscription at once.
	FaultTransferNoStatusChange Fault = "transfer-no-status-change"
	// FaultRepublishNext answers Republish of sequence number n with the
	// message after it (n+1) from the retransmission queue, and with
	// BadMessageNotAvailable when n+1 is not kept (Part 4 5.14.6: the
	// requested message).
	FaultRepublishNext Fault = "republish-next"
	// FaultLateResumeSilent is FaultLateResume in a server that publishes
	// no channel counters (the Channel.* diagnostics nodes are absent), so
	// only the client side can see the late resume.
	FaultLateResumeSilent Fault = "late-resume-silent"
	// FaultCertCachedAcrossChannels makes every secured channel take the
	// first client certificate the server ever saw as its client's, in
	// place of the one its own OpenSecureChannel was signed with: the
	// request is still verified with the certificate it carries, but the
	// response is signed and encrypted for the cached certificate (its
	// ReceiverCertificateThumbprint that certificate's), and so would
	// the session signatures be. The first client application identity
	// is served as before; a second one cannot open its channel.
	FaultCertCachedAcrossChannels Fault = "cert-cached-across-channels"

	// The resource-exhaustion faults: each undoes one protection against
	// hostile traffic, so the robustness suite's attacks are shown to
	// catch it.

	// FaultNoByteBudget removes the memory budget: queued requests,
	// unfinished chunks, held logins, monitored-item queues and session
	// strings are bounded by count only.
	FaultNoByteBudget Fault = "no-byte-budget"
	// FaultLoginHoldsRequests keeps a throttled ActivateSession's whole
	// request (its secret included) in the throttle's timer, with no cap
	// per peer, and keeps the timer running after the channel closed.
	FaultLoginHoldsRequests Fault = "login-holds-requests"
	// FaultChunksPerChannelOnly bounds unfinished chunks per channel only:
	// many connections together may hold any amount.
	FaultChunksPerChannelOnly Fault = "chunks-per-channel-only"
	// FaultItemQueuesUnbounded grants any monitored-item queue size up to
	// 10 000 and allocates every queue at its full size at creation.
	FaultItemQueuesUnbounded Fault = "item-queues-unbounded"
	// FaultLongSessionStrings keeps session names, endpoint URLs and
	// other client strings whole for the session's life, not charged to
	// the memory budget.
	FaultLongSessionStrings Fault = "long-session-strings"
	// FaultIdleAfterOpen never closes a channel that opened but never
	// activated a session, and does not enforce the token lifetime; at
	// the connection limit new clients are refused instead of evicting
	// such channels.
	FaultIdleAfterOpen Fault = "idle-after-open"
	// FaultSessionsOutliveChannels keeps anonymous sessions whose channel
	// closed for their full timeout and gives anonymous sessions the
	// whole session table, so an anonymous flood refuses every login.
	FaultSessionsOutliveChannels Fault = "sessions-outlive-channels"
	// FaultUnactivatedRefuse refuses CreateSession at the unactivated
	// limit instead of closing the oldest unactivated session.
	FaultUnactivatedRefuse Fault = "unactivated-refuse"
	// FaultRSABlocksUnbounded decrypts an encrypted user secret of any
	// number of RSA blocks.
	FaultRSABlocksUnbounded Fault = "rsa-blocks-unbounded"
	// FaultThrottlePairOnly throttles failed logins per peer IP and user
	// only: a fresh user name, or a fresh address, guesses at full speed.
	FaultThrottlePairOnly Fault = "throttle-pair-only"
	// FaultOnceActivatedSpared marks a connection active for good once a
	// session was activated on it: eviction at the connection limit and
	// the idle timeout spare it after its sessions were closed, so
	// connections that activate, close their session and stay idle fill
	// the connection table and every new client is refused at Hello.
	FaultOnceActivatedSpared Fault = "once-activated-spared"
	// FaultAnonymousFullRefuses refuses an anonymous activation at the
	// anonymous share unless an orphaned anonymous session can make room:
	// anonymous sessions on live channels never yield, so a client that
	// holds the share locks every other anonymous client out for its
	// sessions' timeout.
	FaultAnonymousFullRefuses Fault = "anonymous-full-refuses"
	// FaultGuessesAcrossAddresses makes the login throttle's user key a
	// delay capped at one second, like the peer IP's, instead of a
	// server-wide budget of failed logins per user: attempts from many
	// addresses each wait at most the cap however many are in flight, so
	// guesses against one user scale with the addresses.
	FaultGuessesAcrossAddresses Fault = "guesses-across-addresses"
	// FaultClaimedURITrusted takes the ApplicationUri a client claims in
	// CreateSession for its identity: it is not checked against the
	// client certificate's subjectAltName (BadCertificateUriInvalid), and
	// TransferSubscriptions gives an anonymous session's subscription to
	// any anonymous session on a secured channel that claims the same
	// ApplicationUri, whatever its certificate (a self-signed one the
	// attacker made).
	FaultClaimedURITrusted Fault = "claimed-uri-trusted"
	// FaultResponsesUnbudgeted keeps responses waiting in a channel's
	// send queue decoded and uncharged, however many bytes they take
	// (only their count, the high mark, stops the reader), and writes
	// them without a deadline: a client that pipelines large answers and
	// never reads them makes the server hold them all.
	FaultResponsesUnbudgeted Fault = "responses-unbudgeted"
	// FaultParkedPublishWhole keeps a parked Publish request whole (its
	// decoded request with every acknowledgement, besides their results)
	// and charges it nowhere: parked Publishes are bounded by count only
	// (MaxPublishRequests per session), so Publishes of 2 MiB of
	// acknowledgements hold many times that each.
	FaultParkedPublishWhole Fault = "parked-publish-whole"
	// FaultLongNodeIDsKept resolves, keeps and samples NodeIds of any
	// length (no Config.MaxNodeIDLength, BadNodeIdInvalid) and charges a
	// monitored item its queue only, not its NodeId: a diagnostic pattern
	// (Owner.<owner>.<counter>) resolves any name, so items of 2 MB
	// NodeIds hold 2 MB each, uncharged, and every sample looks the whole
	// name up again.
	FaultLongNodeIDsKept Fault = "long-nodeids-kept"
	// FaultOPNBlocksUnbounded decrypts every RSA block of a secured
	// OpenSecureChannel request before its signature (inside the
	// encrypted plaintext) can be checked, however many there are, and
	// from any peer address as often as it sends them: no
	// Config.MaxOPNBlocks and no per-address budget of RSA work for
	// OpenSecureChannel. A 65 KB OPN costs about 0.2 s of CPU each time
	// it is replayed.
	FaultOPNBlocksUnbounded Fault = "opn-blocks-unbounded"
	// FaultRetransmitUnbudgeted keeps the notification messages of a
	// retransmission queue by count only (256 a subscription) and
	// charges them nowhere: a client that never acknowledges makes the
	// server keep 256 full messages for each of its subscriptions.
	FaultRetransmitUnbudgeted Fault = "retransmit-unbudgeted"
	// FaultSubscriptionsUnbounded drops the server-wide subscription
	// limit, the server-wide publishing rate (publishing cycles per
	// second of all subscriptions) and the 10 ms minimum publishing
	// interval: subscriptions are
	// bounded only per session (1000 each) and may publish every
	// millisecond, so many sessions hold as many subscriptions, and their
	// loops' wake-ups, as they like.
	FaultSubscriptionsUnbounded Fault = "subscriptions-unbounded"
	// FaultAnonymousSubscriptionsUnshared lets the subscriptions of
	// anonymous sessions take the whole server-wide subscription limit
	// and publishing rate, instead of at most their share (½): a few
	// anonymous sessions holding every subscription leave a user who
	// logs in none (BadTooManySubscriptions), a lockout without
	// credentials.
	FaultAnonymousSubscriptionsUnshared Fault = "anonymous-subscriptions-unshared"
	// FaultSlowRead adds busy CPU work to every Read request: a share of
	// the server's measured CPU per Read (slow-read=10%) or a set
	// duration (slow-read=20us); slow-read alone is DefaultSlowRead. A
	// planted slowdown: every answer stays right, no property of the
	// suites sees it; `make ab` does, a figure worse (FaultRow.ABFigure).
	FaultSlowRead Fault = "slow-read"
)

// FaultRow is the catalog's row of one fault switch: what the harness and
// the documentation know of it. The switch's code path in server/ is the
// only other place a fault lives; docs/faults.md's table is generated from
// the rows (fixtures/docsnames).
type FaultRow struct {
	// Fault is the switch (OPCUA_FAULTS, the label fault:<name>).
	Fault Fault
	// Bug says in one line the bug the switch plants.
	Bug string
	// Defect, when set, is the pattern (a case-insensitive regular
	// expression) that the first line of every failed spec aimed at the
	// fault must match: the words a reader needs to go to the defect (a
	// sampler running late is "drift", not only "below 99 %"). Loose about
	// wording, strict about the subject. Empty: the name of its Attack,
	// if it has one, else any named checker catches the fault
	// (DefectPattern).
	Defect string
	// Attack, when set, names the exhaustion attack (attack.Attack.Name)
	// whose protection the switch undoes: the specs that run the attack
	// are aimed at the fault (attack.Attack.Fault).
	Attack string
	// MinSoak is the shortest soak (the suites' SOAK setting) in which the
	// specs aimed at the fault can catch it, 0 when any run of them can.
	MinSoak time.Duration
	// Specs says which specs are aimed at the fault and what their
	// failure reads (Markdown). The specs of a suite carry the label
	// themselves (spec.Catches), an exhaustion attack's take it from
	// Attack; `make faults` proves they catch the fault. A fault with
	// ABFigure says instead how `make ab` catches it.
	Specs string
	// ABFigure, when set, makes the fault a planted slowdown that no
	// property of the suites catches: `make ab` catches it, reading this
	// figure (a key of abresult.Figures, e.g. "server_cpu_us_per_req")
	// worse. No spec is aimed at it, the fault matrix skips it (Caught)
	// and the CI profile expects no spec to catch it (SuiteFaults).
	ABFigure string
	// Value, when set, says what value the switch takes after "=" (e.g.
	// slow-read=10%); a switch without Value takes none (CheckFault).
	Value string
}

// DefectPattern returns the pattern the first line of every failed spec
// aimed at the fault must match: its Defect, else the name of its Attack
// (an exhaustion checker's failure names the attack's window), else ""
// (any named checker catches it).
func (r FaultRow) DefectPattern() string {
	if r.Defect == "" && r.Attack != "" {
		return regexp.QuoteMeta(r.Attack)
	}
	return r.Defect
}

// Faults returns the catalog's fault rows, one per switch, in the order
// the fault matrix runs them.
func Faults() []FaultRow {
	return []FaultRow{
		{
			Fault:  FaultUnweighted,
			Bug:    "weights ignored",
			Defect: `weights ignored`,
			Specs:  "fairness: weighted 1:3, cpu-bound and worker-bound (`weights ignored, owners served alike (heavy 50 % for weight 3, light 50 % for weight 1)`)",
		},
		{
			Fault: FaultTurnStall,
			Bug:   "worker preempted between an owner's last turn token and its next turn",
			Specs: "fairness: weighted 1:3, worker-bound (heavy/light below 3.00: [measured](measurements.md#faults); the CPU-bound spec does not see it, its 1 ms requests dwarf the 1 ms stall)",
		},
		{
			Fault: FaultLostWakeup,
			Bug:   "worker parks without re-checking the queue",
			Specs: "wakeups: all five specs (lockstep: `lockstep-nudges`: `N request(s) served only once a nudge reached the server: a worker's lost wakeup`, and `stall(s) ≥ 500ms … ended only after a nudge …: a lost wakeup`)",
		},
		{
			Fault:  FaultWriterLostWakeup,
			Bug:    "the channel writer drains its wake-up after each batch: a response queued during a write goes out only when a later response on the same channel wakes the writer (unlike `lost-wakeup`, whose stranded request any later request to the server rescues)",
			Defect: `lost wakeup in the channel writer`,
			Specs:  "wakeups: lockstep (`lockstep-nudges`: `N response(s) went out only with a later response on their channel: a lost wakeup in the channel writer (answered with the response to a nudge …, 200ms after it was sent …)`: the nudge is a 200 ms read, so a response the writer held arrives with the nudge's response, while a request a worker missed is answered as soon as the nudge reaches the server)",
		},
		{
			Fault:  FaultNoBackpressure,
			Bug:    "never stops reading: responses pile up",
			Defect: `no backpressure`,
			Specs:  "backpressure: both specs",
		},
		{
			Fault:  FaultFaultOnOverflow,
			Bug:    "closes the channel (BadTcpNotEnoughResources) above 100 pending responses",
			Defect: `channel fault`,
			Specs:  "backpressure: both specs",
		},
		{
			Fault: FaultCancelLeak,
			Bug:   "a cancelled request keeps its queue slot",
			Specs: "cancellation: both specs",
		},
		{
			Fault: FaultCancelDouble,
			Bug:   "a cancelled request is still dispatched",
			Specs: "cancellation: both specs",
		},
		{
			Fault:  FaultCancelStrands,
			Bug:    "a Cancel's compaction of an owner's queue (once its cancelled entries outnumber its queued ones and 64) starts one past the head: the oldest queued request leaves the queue's order still queued, holds its slot and is never dispatched (answered only at CloseSession)",
			Defect: `stranded behind a cancel`,
			Specs:  "cancellation: the cancel storm (`storm-exactly-once`: `N request(s) stranded behind a cancel: queued before a request a Cancel removed, never answered while requests sent after them were`; the history separates them from lost responses: a Cancel of their owner removed a request sent after them while they waited, and requests sent after them were answered)",
		},
		{
			Fault: FaultSerialDispatch,
			Bug:   "one goroutine serves every request (gopcua's stock server)",
			Specs: "wakeups: head-of-line (slow `Slow.<ms>` Reads next to fast ones; the other specs' Reads take microseconds, and one goroutine serving them stalls nobody, so they are not aimed at it)",
		},
		{
			Fault:  FaultSamplingDrift,
			Bug:    "waits one interval after each sample",
			Defect: `drift`,
			Specs:  "sampling: both specs (`drift: every item short by the same share in every window, sampled every 10.8ms (median gap 10.57ms) for a 10ms interval`)",
		},
		{
			Fault: FaultPublishDrop,
			Bug:   "drops Publish requests beyond a few per session",
			Specs: "sampling: both specs",
		},
		{
			Fault:  FaultPublishBlocksReader,
			Bug:    "a parked Publish stays in its channel's pending count: Publishes count against the reader's high mark (100), so a client with that many outstanding on one channel stops the reader with only Publishes outstanding",
			Defect: `reader stopped with only parked Publish requests outstanding`,
			Specs:  "robustness (`answers`: `reader stopped with only parked Publish requests outstanding: a Read behind 500 Publish requests never answered, N Publishes unanswered (publish-flood/500, …)`; named where the flood's Read behind its Publishes got no answer while Publishes sent before it were unanswered too; Publishes dropped while the Read is answered, `publish-drop`, are not)",
		},
		{
			Fault:  FaultCrashOnDecode,
			Bug:    "hands request bodies to gopcua's decoder unchecked and recovers no panic: issue 14's request kills the process",
			Defect: `server died after attack`,
			Specs:  "robustness (survival: \"server died after attack malformed/variant-len-minus-2\")",
		},
		{
			Fault:  FaultUnboundedIdle,
			Bug:    "no handshake deadline, no connection limit: connections that never send Hello stay open",
			Defect: `idle/`,
			Specs:  "robustness (answers: `idle/no-hello` and `idle/truncated-hello` get no answer within 15 s)",
		},
		{
			Fault:  FaultSamplerSkips,
			Bug:    "never samples the items at positions ≡ 7 (mod 64) of a sampling group (16 of 1024; a lone item is sampled)",
			Defect: `delivered no sample`,
			Specs:  "sampling: 1024 items (`16 subscribed item(s) delivered no sample at all`)",
		},
		{
			Fault:  FaultCloseRunsQueued,
			Bug:    "CloseSession answers Good but leaves the session's queued requests queued; workers run them afterwards",
			Defect: `after the CloseSession|after closing`,
			Specs:  "cancellation: CloseSession and resets (`request(s) of closed sessions answered Good after the CloseSession response`, `the server dispatched N request(s) of closed sessions after closing them`)",
		},
		{
			Fault:  FaultLostResponse,
			Bug:    "drops the answer to every 500th Read of a channel; the channel stays open",
			Defect: `lost response`,
			Specs:  "backpressure: 10 × 1000 (`lost response(s): never answered on a connection that stayed up`); wakeups: pipeline shapes (both), lockstep, fast next to slow",
		},
		{
			Fault: FaultRetainMemory,
			Bug:   "keeps 16 KiB per served Read for good; backpressure works",
			// a leak fast enough to exhaust the container's memory kills
			// the server: its death by the OOM killer is named first
			Defect: `leak|OOM killed`,
			Specs:  "backpressure: both specs (`retained N MiB after the load drained (bound …; one load: a leak or allocator retention, not told apart)`)",
		},
		{
			Fault: FaultSlowLeak,
			Bug:   "keeps 64 B per served Read for good: a leak too slow for a 10-second CI run's memory bounds ([measured](measurements.md#faults))",
			// a leak fast enough to exhaust the container's memory kills
			// the server: its death by the OOM killer is named first
			Defect: `leak|OOM killed`,
			Specs:  "backpressure soak (`nemesis-trend`: `leak: server memory grows X MiB/min (R² y) after warm-up`)",
		},
		{
			Fault: FaultTrickleLeak,
			Bug:   "keeps 4 KiB of resident memory for every second of wall time, whatever the load (about 14 MiB an hour): 0.2 MiB in a 1-minute soak's judged 48 s, under what it can tell from the garbage collector's sawtooth",
			// a leak fast enough to exhaust the container's memory kills
			// the server: its death by the OOM killer is named first
			Defect: `leak|OOM killed`,
			// 14 MiB/hour: over the 48 judged minutes of an hour's soak
			// about 11 MiB, above the trend's 2 MiB/hour and 10 % bounds
			MinSoak: time.Hour,
			Specs:   "a soak of an hour or more (backpressure `nemesis-trend`: `leak: server memory grows X MiB/hour (R² y) after warm-up`); `make faults` at its 1-minute soak lists it as skipped, with that reason",
		},
		{
			Fault:  FaultRepublishForgets,
			Bug:    "keeps only the last notification message for Republish",
			Defect: `lost by the server`,
			Specs:  "recovery (`sequence`: `N message(s) reported unavailable (BadMessageNotAvailable) > 0`)",
		},
		{
			Fault:  FaultNoReactivate,
			Bug:    "refuses ActivateSession of a session on another channel: a reconnected client must create a new session",
			Defect: `instead of reactivating`,
			Specs:  "recovery (`reactivation`: `a new session … was created … instead of reactivating the old one`)",
		},
		{
			Fault:  FaultTransferDrops,
			Bug:    "TransferSubscriptions loses the subscription's monitored items",
			Defect: `transfer: FAIL: stopped`,
			Specs:  "recovery (`transfer-stream`: items silent after the transfer)",
		},
		{
			Fault:  FaultKeepAliveConsumesSeq,
			Bug:    "a keep-alive uses up the sequence number it announces: the next data message carries the one after",
			Defect: `keep-alive.*consumed`,
			Specs:  "recovery (`keep-alive`: `N keep-alive(s) consumed the sequence number they announced`)",
		},
		{
			Fault:  FaultTransferNoStatusChange,
			Bug:    "TransferSubscriptions sends the old session no StatusChangeNotification `Good_SubscriptionTransferred`: its Publish is answered BadNoSubscription",
			Defect: `old session.*never told.*Good_SubscriptionTransferred`,
			Specs:  "recovery (`transfer-status`: `old session(s) never told of the transfer`)",
		},
		{
			Fault:  FaultRepublishNext,
			Bug:    "Republish of n answers the message n+1 (BadMessageNotAvailable when it is not kept)",
			Defect: `Republish \d+ returned (message \d+|no message)`,
			Specs:  "recovery (`sequence`: `Republish n returned message m`)",
		},
		{
			Fault:  FaultLateResume,
			Bug:    "resumes a paused reader only when no response is pending, not at the low mark 50: the pipeline drains empty before the server reads again",
			Defect: `resume[sd]? (reading )?late|late resume`,
			Specs:  "backpressure: 10 × 1000 (`deep-backpressure`: `a paused reader resumed only at 0 pending responses, below the low mark 50: it resumes late`) and the refill pipeline",
		},
		{
			Fault:  FaultCryptoInGate,
			Bug:    "on Sign/SignAndEncrypt channels the reader decrypts holding the channel's send gate and waits there for a free worker; workers need the gate to send (the seeds' SignAndEncrypt stall)",
			Defect: `deadlock`,
			Specs:  "backpressure 10 × 1000 and wakeups pipeline shapes, both under `baseline+sign-encrypt` (their None rows pass with it on)",
		},
		{
			Fault:  FaultPerSessionOwners,
			Bug:    "the fair queue's owners are sessions, not users: a user with 8 sessions gets 8 shares; the per-owner counters read 0",
			Defect: `shares follow sessions`,
			Specs:  "fairness: the flood (8 sessions) against its victim (2) (`shares follow sessions, not users`); a FAIL, not NOT JUDGED, although the server's own backlog counters fail their assumption",
		},
		{
			Fault:  FaultCancelTotal,
			Bug:    "Cancel answers the server's running total as CancelCount",
			Defect: `CancelCount`,
			Specs:  "cancellation: the cancel storm (`exactly-once`: `CancelCount disagrees with the cancelled results`)",
		},
		{
			Fault:  FaultCancelWrongHandle,
			Bug:    "Cancel looks for its own RequestHandle instead of the one it names: it cancels nothing and answers CancelCount 0",
			Defect: `not exercised: Cancel accepted, 0 of \d+ requests in flight cancelled`,
			Specs:  "cancellation: the cancel storm (`storm-exercised`: `not exercised: Cancel accepted, 0 of N requests in flight cancelled`)",
		},
		{
			Fault:  FaultSessionsNeverExpire,
			Bug:    "an activated session whose timeout passed is never closed",
			Defect: `session.*(expire|time ?out|timed out|not back|never closed|abandoned)`,
			Specs:  "robustness (`settle`: `session_count not back within 15s`)",
		},
		{
			Fault:  FaultSkippedSequence,
			Bug:    "skips every 50th notification sequence number (never sent, never listed in AvailableSequenceNumbers)",
			Defect: `skipped`,
			Specs:  "sampling: both specs (`sequence`: `1 sequence number(s) skipped by the server (never sent, never listed available)`)",
		},
		{
			Fault:  FaultDuplicateSamples,
			Bug:    "queues every 200th sample of an item twice",
			Defect: `duplicate`,
			Specs:  "sampling: both specs (`duplicates: N sample(s) … delivered twice`)",
		},
		{
			Fault:  FaultSampleAtPublish,
			Bug:    "grants the 10 ms sampling interval asked for but samples at the publishing interval (100 ms): one sample in ten, each a real one (the counter still moves by one per sample)",
			Defect: `interval not kept`,
			Specs:  "sampling: both specs (`interval not kept: every item short in every window, sampled every 100ms (median gap) for a 10ms interval`); discovery still finds the counter (it is told by its steps, not by how many samples came)",
		},
		{
			Fault:  FaultLateResumeSilent,
			Bug:    "`late-resume` in a server that publishes no channel counters (the `Channel.*` nodes are absent)",
			Defect: `resume[sd]? (reading )?late|late resume`,
			Specs:  "backpressure: the refill pipeline, from the client side only (`refill-backpressure`: `the server resumed reading late: refill idle 62 % of the backlogged time`)",
		},
		{
			Fault:  FaultCertCachedAcrossChannels,
			Bug:    "every secured channel takes the first client certificate the server saw: a second client identity's OpenSecureChannel response is sealed for the first's certificate",
			Defect: `client certificate kept across channels`,
			Specs:  "smoke `baseline+sign-encrypt` (`identities`: `a client certificate kept across channels: client identity urn:opcua-chaos:client-2 got no secured session … its OpenSecureChannel was answered for urn:opcua-chaos:client's certificate …`)",
		},
		{
			Fault:  FaultNoByteBudget,
			Attack: "queue/bomb-behind-busy",
			Bug:    "no memory budget: queued requests, unfinished chunks, item queues and session strings bounded by count only",
			Defect: `(memory|died).*(queue/|chunk/|strings/|monitored-items/|login/)`,
			Specs:  "resource exhaustion (`survival`: `the server died during attack queue/bomb-behind-busy: … OOM killed`)",
		},
		{
			Fault:  FaultLoginHoldsRequests,
			Attack: "login/held-huge-secrets",
			Bug:    "a throttled ActivateSession is held with its whole request (its 1.9 MB secret), no cap per peer, its timer outlives the channel",
			Specs:  "resource exhaustion (`survival`: `the server died during attack login/held-huge-secrets: … OOM killed`)",
		},
		{
			Fault:  FaultChunksPerChannelOnly,
			Attack: "chunk/held-across-conns",
			Bug:    "unfinished chunks bounded per channel only",
			Specs:  "resource exhaustion (`survival`: `… during attack chunk/held-across-conns: … OOM killed`)",
		},
		{
			Fault:  FaultItemQueuesUnbounded,
			Attack: "monitored-items/queue-bomb",
			Bug:    "monitored-item queue sizes granted up to 10 000 and allocated in full at creation",
			Specs:  "resource exhaustion (`survival`: `… during attack monitored-items/queue-bomb: … OOM killed`)",
		},
		{
			Fault:  FaultLongSessionStrings,
			Attack: "strings/long-session-names",
			Bug:    "session names and endpoint URLs kept whole, not charged",
			Specs:  "resource exhaustion (`memory-peak`: `strings/long-session-names: peak 876 MiB over the bound 640 MiB`)",
		},
		{
			Fault:  FaultIdleAfterOpen,
			Attack: "idle/after-open",
			Bug:    "a channel that never activates a session stays open, its token lifetime is not enforced, and at the connection limit new clients are refused",
			Defect: `lockout.*idle/after-open`,
			Specs:  "resource exhaustion (`lockout`: `idle/after-open: no fresh client could log in for 7.0 s (hello: BadMaxConnectionsReached ×8)`)",
		},
		{
			Fault:  FaultSessionsOutliveChannels,
			Attack: "session-flood/activated",
			Bug:    "anonymous sessions take the whole table and outlive their channels for their hour-long timeout",
			// the sessions of closed channels fill the table in the first
			// attack that leaves any (the long session names, the flood):
			// fresh clients are refused a session there
			Defect: `lockout: .*create: BadTooManySessions`,
			Specs:  "resource exhaustion (`lockout`: `session-flood/activated: no fresh client could log in for 12.0 s (create: BadTooManySessions ×13)`; in the matrix of 2026-12-06 the long-names attack's sessions, outliving their channels, locked clients out first: `strings/long-session-names: no fresh client could log in for 9.3 s (create: BadTooManySessions ×9)`)",
		},
		{
			Fault:  FaultUnactivatedRefuse,
			Attack: "session-flood/unactivated-refill",
			Bug:    "at the unactivated limit CreateSession is refused instead of closing the oldest unactivated session",
			Defect: `lockout: .*create: BadTooManySessions`,
			Specs:  "resource exhaustion (`lockout`: `strings/long-session-names: no fresh client could log in for 13.0 s (create: BadTooManySessions ×14)`: the long-names attack's unactivated sessions fill the table first)",
		},
		{
			Fault:  FaultRSABlocksUnbounded,
			Attack: "amplifier/rsa-blocks",
			Bug:    "an encrypted password of any number of RSA blocks is decrypted",
			Specs:  "resource exhaustion (`amplification`: `amplifier/rsa-blocks: the server spent 4.5 s of CPU per hostile message (4 messages, 17.8 s of CPU; at most 1s each)`)",
		},
		{
			Fault:  FaultThrottlePairOnly,
			Attack: "guess/many-users",
			Bug:    "failed logins throttled per peer and user only: a fresh user name every 3 tries guesses at full speed",
			Specs:  "resource exhaustion (`guess-rate`: `guess/many-users: 631.1 failed logins per second after the first 10 …: password guesses not throttled`)",
		},
		{
			Fault:  FaultOnceActivatedSpared,
			Attack: "idle/after-closed-session",
			Bug:    "a connection that once activated a session is spared by eviction at the connection limit and by the idle timeout for good, after its sessions were closed",
			Defect: `lockout.*idle/after-closed-session`,
			Specs:  "resource exhaustion (`lockout`: `idle/after-closed-session: no fresh client could log in …`)",
		},
		{
			Fault:  FaultAnonymousFullRefuses,
			Attack: "session-flood/anonymous-live",
			Bug:    "at the anonymous share an anonymous activation is refused unless an orphaned anonymous session makes room: anonymous sessions on live channels never yield (the reference server closes the idlest session of the peer address holding the most anonymous sessions: at once for an activation from a peer holding fewer, after 2 s without a request, `Config.AnonymousYieldIdle`, for one holding as many)",
			// anonymous sessions on live channels fill the anonymous share
			// in the first attack that holds many (the long session names,
			// the live flood): the fresh anonymous client is refused its
			// activation there
			Defect: `lockout: .*probe-none-anonymous: activate: BadTooManySessions`,
			Specs:  "resource exhaustion (`lockout`: `session-flood/anonymous-live: no fresh client could log in …` for the fresh anonymous client, `probe-none-anonymous`)",
		},
		{
			Fault:  FaultGuessesAcrossAddresses,
			Attack: "guess/one-user-many-peers",
			Bug:    "the login throttle's user key only delays each attempt by up to 1 s, however many are in flight from however many addresses, instead of a server-wide budget of 4 failed logins a second per user (an address the user logged in from is spared it)",
			Specs:  "resource exhaustion (`guess-rate-one-user`: `guess/one-user-many-peers: … failed logins per second …`; black-box the harness has two peer addresses, the proxy's and its own, and each address's own key still holds its guesses; in-process `TestGuessBudgetAcrossAddresses` shows the fault from 8 addresses)",
		},
		{
			Fault:  FaultClaimedURITrusted,
			Attack: "theft/claimed-uri",
			Bug:    "the ApplicationUri of CreateSession is not checked against the client certificate (BadCertificateUriInvalid) and an anonymous subscription moves to any secured anonymous session that claims the same ApplicationUri, whatever its certificate",
			Defect: `theft: FAIL: theft/claimed-uri`,
			Specs:  "resource exhaustion (`theft`: `theft/claimed-uri: N notification(s) of subscription S, created by victim-…, delivered to attacker-…`)",
		},
		{
			Fault:  FaultResponsesUnbudgeted,
			Attack: "responses/unread-browse",
			Bug:    "responses waiting in a channel's send queue kept decoded and uncharged, only their count stops the reader, no write deadline: a client that pipelines Browses answered many times their size and never reads holds the server's memory",
			Specs:  "resource exhaustion (`memory-peak`: `responses/unread-browse: peak 1006 MiB over the bound 640 MiB`; the protected server peaked at 471 MiB in that window, 16 ms of CPU per message)",
		},
		{
			Fault:  FaultParkedPublishWhole,
			Attack: "publish/parked-acks",
			Bug:    "a parked Publish keeps its whole decoded request (every acknowledgement) and is charged nowhere: parked Publishes bounded by count only",
			Specs:  "resource exhaustion (`memory-peak`: `publish/parked-acks: peak 812 MiB over the bound 640 MiB`)",
		},
		{
			Fault:  FaultLongNodeIDsKept,
			Attack: "monitored-items/long-nodeids",
			Bug:    "NodeIds of any length resolved and kept (no 4096-byte limit, BadNodeIdInvalid), a monitored item charged its queue only, and every sample takes the name from the NodeId again (a copy of it): the diagnostic pattern `Owner.<owner>.<counter>` resolves any name",
			Specs:  "resource exhaustion (`memory-peak`: `monitored-items/long-nodeids: peak 1024 MiB over the bound 640 MiB`). In-process: `TestLongNodeIDsRefused`, `TestSampleResolvedOnce`",
		},
		{
			Fault:  FaultOPNBlocksUnbounded,
			Attack: "amplifier/opn-blocks",
			Bug:    "every RSA block of a secured OpenSecureChannel is decrypted (its signature is inside the encrypted plaintext), however many, from any address as often as it sends them: no 16-block bound, no per-address budget of RSA work for OpenSecureChannel",
			Specs:  "resource exhaustion (`amplification-cpu`: `amplifier/opn-blocks: the server spent 0.2 s of CPU per hostile message …`, at most 50 ms). In-process: `TestOPNBlocksBounded` (a 61 KB OPN refused in 3 ms; 533 ms to open under the fault, -race), `TestOPNPerPeerBudget`",
		},
		{
			Fault:  FaultRetransmitUnbudgeted,
			Attack: "retransmit/never-acked",
			Bug:    "notification messages kept for Republish are bounded by count only (256 a subscription) and charged nowhere, instead of charged by their estimated size to the budget's `retransmit` class (⅛ of it, a session at most ¼ of that; the oldest dropped beyond, Republish of one answers BadMessageNotAvailable)",
			Specs:  "resource exhaustion (`memory-peak`: `retransmit/never-acked: peak 741 MiB over the bound 640 MiB`: one session, 30 fast subscriptions, Publishes never acknowledged)",
		},
		{
			Fault:  FaultSubscriptionsUnbounded,
			Attack: "subscriptions/many-fast",
			Bug:    "no server-wide subscription limit (10 000, `Config.MaxSubscriptions`), no server-wide publishing rate (100 000 cycles a second of all subscriptions: 1000 at 10 ms; BadTooManySubscriptions beyond either) and no 10 ms minimum publishing interval (`Config.MinPublishingInterval`): only the 1000 a session, publishing every 1 ms",
			Specs:  "resource exhaustion (`lockout`: `subscriptions/many-fast: no fresh client could log in for 11.0 s …`: many anonymous sessions each asking for 1000 subscriptions at 1 ms)",
		},
		{
			Fault:  FaultAnonymousSubscriptionsUnshared,
			Attack: "subscriptions/anonymous-fill",
			Bug:    "anonymous sessions may take the whole server-wide subscription limit and publishing rate, instead of at most their share (½, `Config.AnonymousSubscriptionShare`, `OPCUA_ANONYMOUS_SUBSCRIPTION_SHARE`; a subscription keeps the class it was charged to across ModifySubscription and TransferSubscriptions): a few anonymous sessions holding every subscription leave a user who logs in none (BadTooManySubscriptions)",
			Defect: `subscription-lockout: FAIL: subscriptions/anonymous-fill`,
			Specs:  "resource exhaustion (`subscription-lockout`: `subscriptions/anonymous-fill: user \"user1\" was refused a subscription (BadTooManySubscriptions) at 2m13.908s while anonymous sessions held the 10000 they were granted; it got one at rest`: anonymous sessions pipeline CreateSubscription past the server's limit at a 60 s interval, then the user logs in and asks for one). In-process: `TestAnonymousSubscriptionShare`, `TestAnonymousPublishRateShare`",
		},
		{
			Fault:    FaultSlowRead,
			Bug:      "every Read request burns extra CPU: a share of the server's measured CPU per Read (`slow-read=10%`, the default) or a set duration (`slow-read=20us`); every answer stays right",
			Value:    "PCT% of the measured CPU per Read, or a duration (e.g. 20us); default 10%",
			ABFigure: "server_cpu_us_per_req",
			Specs:    "none: a slowdown, not a broken property. Caught by `make ab` (`CAND=reference:faults=slow-read=10%`: server CPU per request worse), not by the suites; `make faults` skips it. In-process: `TestSlowReadAddsCPU`",
		},
	}
}

// SuiteFaults lists the fault switches the suites' specs catch (every
// one but those `make ab` catches, FaultRow.ABFigure), in the order of
// Faults: the faults the fault matrix runs and the CI profile covers.
func SuiteFaults() []Fault {
	var out []Fault
	for _, r := range Faults() {
		if r.ABFigure == "" {
			out = append(out, r.Fault)
		}
	}
	return out
}

// AllFaults lists every fault switch, in the order of Faults.
func AllFaults() []Fault { return names(Faults(), func(r FaultRow) Fault { return r.Fault }) }

// Row returns f's row of the catalog; ok is false for a name that is no
// fault switch.
func (f Fault) Row() (row FaultRow, ok bool) {
	return find(Faults(), f, func(r FaultRow) Fault { return r.Fault })
}

// MinSoak returns the shortest soak (the suites' SOAK setting) in which
// the specs aimed at f can catch it, or 0 when any run of them can
// (FaultRow.MinSoak). The fault matrix (`make faults`) skips, with this
// reason, a fault whose MinSoak exceeds the soak it runs: a 1-minute soak
// that passes under FaultTrickleLeak proves nothing either way.
func MinSoak(f Fault) time.Duration {
	r, _ := f.Row()
	return r.MinSoak
}

// Quirk names one conformant variation the server can switch on
// (OPCUA_QUIRKS): a behaviour the OPC UA specification allows and that
// servers as they ship show (open62541, a C allocator), unlike a Fault,
// which is a bug. A suite that fails a property under a quirk raises a false
// alarm: it checks our server, not the specification.
type Quirk string

// The quirk switches. Each is one small, clearly named code path, and
// has its row in Quirks.
const (
	// QuirkNoCertOnNone makes CreateSession return no ServerCertificate on
	// a channel with SecurityPolicy None when the client sent no client
	// certificate (Part 4, 5.6.2 allows it; open62541 does so).
	QuirkNoCertOnNone Quirk = "no-cert-on-none"
	// QuirkMinSampling50ms revises every requested sampling interval below
	// server.MinSamplingQuirk up to it (open62541's default minimum sampling
	// interval); Part 4, 5.12.1.2 lets the server revise it.
	QuirkMinSampling50ms Quirk = "min-sampling-50ms"
	// QuirkRetainFreedMemory keeps memory freed after a burst with the
	// process, like a C allocator that keeps its pages: after load the
	// server holds a ballast as large as its peak heap growth so far, and
	// grows it only when a later burst needs more than it ever did.
	QuirkRetainFreedMemory Quirk = "retain-freed-memory"
	// QuirkTrustedCertsOnly trusts only the client certificates in the
	// folder server.TrustedCertsDir (DER or PEM files): an unknown client
	// certificate is refused at OpenSecureChannel with
	// BadSecurityChecksFailed, as servers configured with a trust list do
	// (S2OPC's demo server as shipped; Part 4, 6.1.3: the certificate
	// must be trusted). None channels are unaffected.
	QuirkTrustedCertsOnly Quirk = "trusted-certs-only"
	// QuirkNoTestNodes serves only the standard address space's kind of
	// nodes a client can drive: no Slow.<ms> or Busy.<µs> service-time
	// nodes and no SampledCounter.<i> or FastCounter.<i> counters (as
	// every server as it ships: open62541, S2OPC). The read-only ns=1
	// diagnostics stay.
	QuirkNoTestNodes Quirk = "no-test-nodes"
	// QuirkMaxSessions20 caps the session table at server.MaxSessionsQuirk
	// (20) sessions, as S2OPC's demo server ships (Part 4, 5.6.2 lets a
	// server refuse CreateSession with BadTooManySessions at its limit):
	// the suites must learn the limit, size their shapes to it and count a
	// refusal at it as an answer, not an error.
	QuirkMaxSessions20 Quirk = "max-sessions-20"
)

// QuirkRow is the catalog's row of one quirk switch: what the harness and
// the documentation know of it. docs/faults.md's table is generated from
// the rows (fixtures/docsnames).
type QuirkRow struct {
	// Quirk is the switch (OPCUA_QUIRKS).
	Quirk Quirk
	// Does says what the server does under it, and which servers ship so
	// (Markdown).
	Does string
	// SuiteMust says what the suites must do against such a server
	// (Markdown).
	SuiteMust string
	// Cause are the phrases of which a skip the quirk causes must name one
	// (case-insensitive), so that a reader sees the quirk behind it: the
	// quirk matrix (`make quirks`) calls any other skip unexplained.
	Cause []string
}

// Quirks returns the catalog's quirk rows, one per switch, in the order
// the quirk matrix runs them. There is no one-event-loop quirk (every
// session served by one loop, as open62541 does): seen from the wire it
// is the fault serial-dispatch, a slow read holding up every other
// session, which the wakeups suite and discovery rightly report.
func Quirks() []QuirkRow {
	return []QuirkRow{
		{
			Quirk:     QuirkNoCertOnNone,
			Does:      "no ServerCertificate in CreateSession on a None channel when the client sent none (open62541 1.5.7)",
			SuiteMust: "log declared users in with the endpoint's certificate, on every client path",
			Cause:     []string{"certificate"},
		},
		{
			Quirk:     QuirkMinSampling50ms,
			Does:      "revises a 10 ms sampling interval to 50 ms (open62541's default minimum)",
			SuiteMust: "skip the 100 Hz sampling specs naming the revised interval, never blame the counter or fail",
			Cause:     []string{"50 ms", "50ms"},
		},
		{
			Quirk:     QuirkRetainFreedMemory,
			Does:      "keeps memory freed after a burst, as a C allocator keeps its pages; grows only when a later burst needs more",
			SuiteMust: "call memory that stays at its peak across rounds of the same burst retention (pass), and only memory that rises with every round a leak",
			Cause:     []string{"memory", "retain"},
		},
		{
			Quirk:     QuirkTrustedCertsOnly,
			Does:      "trusts only the client certificates in its folder `/pki/trusted` (S2OPC's demo server as shipped, most plants): an unknown certificate is refused at OpenSecureChannel with `BadSecurityChecksFailed`",
			SuiteMust: "run the None rows; skip the Sign and SignAndEncrypt rows with the step that makes the server trust the run's certificate (for an image target, `OPCUA_IMAGE_PKI`)",
			Cause:     []string{"client certificate"},
		},
		{
			Quirk:     QuirkNoTestNodes,
			Does:      "no `Slow.<ms>`/`Busy.<µs>` service-time nodes and no `SampledCounter.<i>` counters, as every server ships (its read-only `ns=1` diagnostics stay)",
			SuiteMust: "run every property on standard nodes where it can, skip only the specs that need a test node, naming it",
			Cause:     []string{"service-time", "counter", "Slow.", "Busy.", "SampledCounter"},
		},
		{
			Quirk:     QuirkMaxSessions20,
			Does:      "a 20-session table (S2OPC's demo server as shipped; the reference server keeps half of it from anonymous clients, so discovery finds 10 anonymous sessions)",
			SuiteMust: "learn the limit, size every shape to it (wakeups' 10×100 and 64×1 become 8×100 and 8×1), count a refusal at it as an answer, skip a shape that cannot fit naming the limit",
			Cause:     []string{"session limit"},
		},
	}
}

// AllQuirks lists every quirk switch, in the order of Quirks.
func AllQuirks() []Quirk { return names(Quirks(), func(r QuirkRow) Quirk { return r.Quirk }) }

// Row returns q's row of the catalog; ok is false for a name that is no
// quirk switch.
func (q Quirk) Row() (row QuirkRow, ok bool) {
	return find(Quirks(), q, func(r QuirkRow) Quirk { return r.Quirk })
}

// names returns the name of each row, in order.
func names[R any, N ~string](rows []R, name func(R) N) []N {
	out := make([]N, len(rows))
	for i, r := range rows {
		out[i] = name(r)
	}
	return out
}

// find returns the row named n.
func find[R any, N ~string](rows []R, n N, name func(R) N) (R, bool) {
	for _, r := range rows {
		if name(r) == n {
			return r, true
		}
	}
	var zero R
	return zero, false
}
