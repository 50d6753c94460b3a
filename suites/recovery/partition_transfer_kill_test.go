package recovery_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/opcua-chaos/opcua-chaos/fixtures/check"
	"github.com/opcua-chaos/opcua-chaos/fixtures/env"
	"github.com/opcua-chaos/opcua-chaos/fixtures/history"
	"github.com/opcua-chaos/opcua-chaos/fixtures/nemesis"
	"github.com/opcua-chaos/opcua-chaos/fixtures/reconnect"
	"github.com/opcua-chaos/opcua-chaos/fixtures/scenario"
)

// The partition → transfer → kill experiment (recovers' workload): a
// sequence of client calls, each waiting for what the client saw after
// the last, and the checks of what it measured on the way.

// closeTimeout bounds closing a reconnecting client's session once its
// part of the workload ended.
const closeTimeout = 10 * time.Second

// servesAgain judges that after the kill a Read was served within
// maxServe (the server's restart included).
var servesAgain = check.Spec{Name: "serves-again", Config: check.ServesAgainConfig{Faults: []string{faultKill}, Kinds: []history.Kind{history.KindRead}, MaxDelay: maxServe}}

// readAgain recovers c's session after a broken connection until a Read
// is served, for at most 2 × maxServe: it activates the session on a new
// channel, else (the server refuses: a restarted process lost it) opens
// a new session named session-<ms>. Every step is an op in c's history.
func readAgain(ctx context.Context, c *reconnect.Client, session string) {
	deadline := time.Now().Add(2 * maxServe)
	for served := false; !served && time.Now().Before(deadline) && ctx.Err() == nil; {
		rctx, cancel := context.WithTimeout(ctx, maxServe)
		err := c.Reactivate(rctx)
		cancel()
		if err != nil {
			if err := c.NewSession(ctx, fmt.Sprintf("%s-%d", session, time.Now().UnixMilli())); err != nil {
				scenario.Sleep(ctx, 200*time.Millisecond)
				continue
			}
		}
		served = c.Read(ctx) == nil
	}
}

// servesBeforeKill judges the Reads from the partition's end to the kill
// (from, to): no fault is in place, so every one must be served; a Read
// the server answered Bad or whose connection closed fails it, named by
// the error budget's explanation.
func servesBeforeKill(from, to time.Duration) check.Spec {
	return check.Spec{Name: "serves-before-kill", Config: check.ErrorBudgetConfig{
		Span: check.Span{From: from, To: to}, Kinds: []history.Kind{history.KindRead}}}
}

// open opens a reconnecting client with a new session (reconnect.Open)
// and returns it with its close, bounded by closeTimeout even when ctx has
// ended.
func open(ctx context.Context, rec *history.Recorder, cfg reconnect.Config, session string) (*reconnect.Client, func(), error) {
	c, err := reconnect.Open(ctx, rec, cfg, session)
	closeClient := func() {
		if c == nil {
			return
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), closeTimeout)
		defer cancel()
		_ = c.Close(cctx)
	}
	if err != nil {
		closeClient()
		return nil, nil, err
	}
	return c, closeClient, nil
}

// run runs sub's Publish loop on c in the background until stop; stop
// returns the loop's error (the same on every call); ended is closed when
// the loop ended by itself (a Publish failed) or was stopped.
func run(ctx context.Context, sub *reconnect.Subscription, c *reconnect.Client) (stop func() error, ended <-chan struct{}) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	var err error
	go func() { err = sub.Run(ctx, c, outstanding); close(done) }()
	return sync.OnceValue(func() error { cancel(); <-done; return err }), done
}

// statusWait is how long the spec keeps the old session publishing after
// a transfer for the StatusChangeNotification Good_SubscriptionTransferred
// (Part 4 5.14.7.1): twice sub's keep-alive period, at least
// minStatusWait. A server that tells the old session answers its
// outstanding Publish at once: the wait ends then.
func statusWait(sub *reconnect.Subscription) time.Duration {
	return max(minStatusWait, 2*sub.KeepAlivePeriod())
}

// minStatusWait is statusWait's floor.
const minStatusWait = 2 * time.Second

// awaitTold waits, at most wait, until session was told that sub left it
// (reconnect.Subscription.Moved) or its Publish loop ended by itself (the
// server answered BadNoSubscription), then stops the loop; it says what
// happened, for the history's marks. The transfer-status check judges
// the Publish ops.
func awaitTold(ctx context.Context, sub *reconnect.Subscription, session string, stop func() error, ended <-chan struct{}, wait time.Duration) string {
	start := time.Now()
	what := "the session was told (Good_SubscriptionTransferred)"
	select {
	case <-sub.Moved(session):
	case <-ended:
		what = "its Publish loop ended"
	case <-time.After(wait):
		what = fmt.Sprintf("not told within %v", wait)
	case <-ctx.Done():
		what = "the spec ended"
	}
	return fmt.Sprintf("of the first session %s: %s after %v; loop: %v", session, what, time.Since(start).Round(time.Millisecond), stop())
}

// transferRun is what the steps of recovers' workload share.
type transferRun struct {
	r  *scenario.Run
	id identity
	// cfg configures the reconnecting clients; lt are the lifetimes the
	// server granted, part the partition between them.
	cfg  reconnect.Config
	lt   nemesis.Lifetimes
	part time.Duration
	// st is the stream subscribed to, sub the subscription and pace its
	// pace before the faults.
	st   stream
	sub  *reconnect.Subscription
	pace paced
	// stop stops the Publish loop running now (run); ended is closed
	// once it ended.
	stop  func() error
	ended <-chan struct{}
}

// partitionTransferKill is recovers' workload: a session subscribed to the
// stream (subscribe), a partition it must take its session across to a
// new channel (partition, reactivate), the subscription's transfer to a
// second session (transfer), requests for it from sessions of other
// identities, then kill -9 and the session served again (kill); the
// checks of what it measured on the way last.
func partitionTransferKill(ctx context.Context, r *scenario.Run, id identity) error {
	t := &transferRun{r: r, id: id}
	if err := t.prepare(ctx); err != nil {
		return err
	}
	c1, close1, err := open(ctx, r.Rec, t.cfg, "s1")
	if err != nil {
		return fmt.Errorf("open session: %w", err)
	}
	defer close1()
	if err := t.subscribe(ctx, c1); err != nil {
		return err
	}
	t.stop, t.ended = run(ctx, t.sub, c1)
	defer func() { _ = t.stop() }()
	stopQuiet, err := quietSubscription(ctx, r.Rec, t.cfg, r.Env.DirectEndpoint)
	if err != nil {
		return err
	}
	stopQuiet = sync.OnceValue(stopQuiet)
	defer stopQuiet()
	t.warmUp(ctx)

	quietFrom, err := t.partition(ctx)
	if err != nil {
		return err
	}
	if err := t.reactivate(ctx, c1); err != nil {
		return err
	}
	r.Rec.Mark("transferring the subscription to a new session", "")
	t.cfg.Client = "c2"
	c2, close2, err := open(ctx, r.Rec, t.cfg, "s2")
	if err != nil {
		return fmt.Errorf("open the second session: %w", err)
	}
	// the Publish loop, on either session, stops before the session
	// closes
	defer func() { _ = t.stop(); close2() }()
	owner, transferAt, ran, wait, err := t.transfer(ctx, c1, c2)
	if err != nil {
		return err
	}

	// the sessions of the run's client identities must each be
	// served (an asker may be of the second)
	r.JudgeIdentities(id.security)
	for _, a := range askers(id) {
		r.Rec.Mark("asking for the subscription from a session of another identity, which Part 4 refuses", a.who)
		refusedTransfer(ctx, r.Rec, r.Env.Endpoint, t.sub, a)
	}

	quietTo, err := t.kill(ctx, owner, stopQuiet)
	if err != nil {
		return err
	}

	judgedFrom := max(transferAt-settle, 0)
	// The machine must be quiet while the client recovers its session
	// and stream: from the partition's end to the kill. Not before (the
	// environment's start still runs in the engine; nothing is measured
	// while the partition holds) nor after (the engine restarts the
	// server: its CPU is the fault's own).
	quiet := scenario.Quiet(check.Span{From: quietFrom, To: quietTo, Window: 2 * time.Second})
	quiet.Stage = check.Assumption
	r.Check(
		transferStream(t.sub, t.st.mode, t.pace, check.Span{From: judgedFrom, To: transferAt + ran - 500*time.Millisecond}, id.skip),
		servesBeforeKill(quietFrom, quietTo),
		check.Spec{Name: "transfer-status", Config: check.TransferStatusConfig{Subscriptions: []string{t.sub.Label}, Wait: wait, Skip: id.skip}},
		check.Spec{Name: "transfer-refusal", Config: check.TransferRefusalConfig{}},
		quiet,
	)
	return nil
}

// prepare asks the server for its lifetimes (scenario.Lifetimes, which
// labels the history with them), sizes the partition between them and
// labels the history with it.
func (t *transferRun) prepare(ctx context.Context) error {
	r := t.r
	cfg, lt, err := asked("c1").Ask(ctx, r)
	if err != nil {
		return err
	}
	part, err := nemesis.PartitionFor(lt)
	if err != nil {
		return fmt.Errorf("a partition between the granted channel lifetime and session timeout: %w", err)
	}
	t.id.apply(&cfg)
	t.cfg, t.lt, t.part = cfg, lt, part
	r.Rec.SetLabel("partition", part.String())
	r.Rec.SetLabel("sessions_as", t.id.as)
	r.Figures["partition_ms"] = float64(part / time.Millisecond)
	return nil
}

// subscribe subscribes c1's session to the target's stream (streamFor).
func (t *transferRun) subscribe(ctx context.Context, c1 *reconnect.Client) error {
	st, err := streamFor(t.r.Env.Profile())
	if err != nil {
		return err
	}
	t.st = st
	t.r.Rec.SetLabel("stream", st.on)
	t.sub, err = c1.Subscribe(ctx, subscription, st.nodes, sampling, publishing, queue)
	if err != nil {
		return fmt.Errorf("subscribe: %w", err)
	}
	// The stream is judged at the interval the server granted: a server
	// may revise a short one up to its minimum (open62541: 50 ms).
	if t.sub.Sampling != sampling {
		t.r.Rec.Mark("sampling-revised", fmt.Sprintf("%v requested, %v granted", sampling, t.sub.Sampling))
	}
	return nil
}

// warmUp runs the stream before the faults (warmUp) and reports its pace.
func (t *transferRun) warmUp(ctx context.Context) {
	r, sub := t.r, t.sub
	t.pace = warmUp(ctx, t.st, sub)
	pace := t.pace
	r.Rec.Mark("stream-pace", fmt.Sprintf("%d change(s) of the slowest item, one every %v; judged every %v, streamed %v after the transfer; %d data message(s)",
		pace.Changes, pace.Period, pace.interval, pace.streamed, sub.Messages()))
	r.Figures["stream_period_ms"] = float64(pace.Period) / float64(time.Millisecond)
	r.Figures["stream_judged_every_ms"] = float64(pace.interval) / float64(time.Millisecond)
}

// partition partitions the network for t.part, then stops the Publish
// loop; it returns the partition's end.
func (t *transferRun) partition(ctx context.Context) (end time.Duration, err error) {
	r := t.r
	r.Rec.Mark("partitioning the network", fmt.Sprintf("for %v (channel lifetime %v, session timeout %v)", t.part, t.lt.Channel, t.lt.Session))
	partition, err := nemesis.Inject(ctx, r.Target, r.Rec, nemesis.Partition(faultPartition, env.ProxyName))
	if err != nil {
		return 0, fmt.Errorf("partition: %w", err)
	}
	defer func() { err = errors.Join(err, partition.Undo(ctx)) }()
	scenario.Sleep(ctx, t.part)
	if err := partition.Undo(ctx); err != nil {
		return 0, fmt.Errorf("end the partition: %w", err)
	}
	end = r.Rec.Now()
	r.Rec.Mark("publish-loop", fmt.Sprintf("during the partition: %v", t.stop()))
	return end, nil
}

// reactivate activates c1's session on a new secure channel (else a new
// session, which takes the subscription along), runs the Publish loop
// again for settle and republishes the messages the partition lost.
func (t *transferRun) reactivate(ctx context.Context, c1 *reconnect.Client) error {
	r, sub := t.r, t.sub
	r.Rec.Mark("activating the session on a new secure channel", "")
	rctx, cancel := context.WithTimeout(ctx, 2*maxReactivate)
	rerr := c1.Reactivate(rctx)
	cancel()
	if rerr != nil {
		// What a client does when its session cannot move: a new
		// session, which takes the subscription along.
		r.Rec.Mark("reactivation-refused", fmt.Sprintf("%v: new session and TransferSubscriptions", rerr))
		if err := c1.NewSession(ctx, "s1-new"); err != nil {
			return fmt.Errorf("new session after a refused reactivation: %w", err)
		}
		if err := sub.Transfer(ctx, c1); err != nil {
			return fmt.Errorf("take the subscription to the new session: %w", err)
		}
	}
	t.stop, t.ended = run(ctx, sub, c1)
	scenario.Sleep(ctx, settle)

	r.Rec.Mark("republishing the messages the partition lost", "")
	n, err := sub.Recover(ctx, c1)
	if err != nil {
		return fmt.Errorf("republish: %w", err)
	}
	r.Rec.Mark("republish", fmt.Sprintf("asked for %d message(s)", n))
	r.Figures["republish_asked"] = float64(n)
	return nil
}

// transfer transfers the subscription from c1's session to c2's (opened
// for it) and runs the stream there (on c1's where the transfer is refused
// or not asked for), then republishes what the stream's session missed. It
// returns the stream's session (owner), when the transfer was asked for,
// how long the stream ran after it and how long the old session was kept
// publishing for its status change (statusWait).
func (t *transferRun) transfer(ctx context.Context, c1, c2 *reconnect.Client) (owner *reconnect.Client, at, ran, wait time.Duration, err error) {
	r, sub := t.r, t.sub
	at = r.Rec.Now()
	wait = statusWait(sub)
	// The transfer's answer is an op of the history, judged by the
	// transfer check: a server without TransferSubscriptions
	// (BadServiceUnsupported) leaves the stream on the first session and
	// the check reads skip (the row partial), a refused transfer fails
	// it.
	owner = c2
	if t.id.skip != "" {
		r.Rec.Mark("no-transfer", t.id.skip+": the stream stays on the first session")
		owner = c1
	} else if err := sub.Transfer(ctx, c2); err != nil {
		r.Rec.Mark("no-transfer", fmt.Sprintf("%v: the stream stays on the first session", err))
		owner = c1
	} else {
		// The first session keeps publishing until the server told it
		// the subscription left (Part 4 5.14.7.1), while the new one
		// publishes the stream.
		old, oldEnded := t.stop, t.ended
		t.stop, t.ended = run(ctx, sub, c2)
		r.Rec.Mark("publish-loop", awaitTold(ctx, sub, c1.Session(), old, oldEnded, wait))
	}
	// Only a transferred stream is judged across the transfer: one that
	// stayed runs for streamed, not for its pace's periods.
	ran = t.pace.streamed
	if owner == c1 {
		ran = streamed
	}
	scenario.Sleep(ctx, ran-(r.Rec.Now()-at))
	r.Rec.Mark("publish-loop", fmt.Sprintf("of the stream's session: %v", t.stop()))
	if _, err := sub.Recover(ctx, owner); err != nil {
		return nil, 0, 0, 0, fmt.Errorf("republish after the transfer: %w", err)
	}
	return owner, at, ran, wait, nil
}

// kill reads on owner's session before the kill, stops the quiet
// subscription (stopQuiet), kills the server with SIGKILL for down and
// restarts it, then recovers owner's session until a Read is served. It
// returns when the quiet span ended (before the kill).
func (t *transferRun) kill(ctx context.Context, owner *reconnect.Client, stopQuiet func() string) (quietTo time.Duration, err error) {
	r := t.r
	// The Read before the kill is an op of the history, judged by
	// serves-before-kill: no fault is in place, so a Read the server
	// does not answer (a connection it closed, a Bad status) fails that
	// check, naming the op; the client then does what clients do, and
	// the kill is still judged.
	// It is sent by the stream's client: the other one's session has
	// been idle since the transfer was refused, for longer than a
	// session timeout where the stream ran long, and the server rightly
	// closed it (S2OPC 1.7.3: BadSessionIdInvalid).
	if err := owner.Read(ctx); err != nil {
		r.Rec.Mark("read-before-kill", fmt.Sprintf("Read of the server's CurrentTime on session %s: %v: taking the session to a new channel, else a new session", owner.Session(), err))
		readAgain(ctx, owner, owner.Session()+"-again")
	}
	quietTo = r.Rec.Now()
	r.Rec.Mark("quiet-subscription", "stopped before the kill: "+stopQuiet())
	r.Rec.Mark("killing the server", fmt.Sprintf("with SIGKILL for %v and restarting it", down))
	kill, err := nemesis.Inject(ctx, r.Target, r.Rec, nemesis.Kill(faultKill))
	if err != nil {
		return 0, fmt.Errorf("kill: %w", err)
	}
	defer func() { err = errors.Join(err, kill.Undo(ctx)) }()
	scenario.Sleep(ctx, down)
	if err := kill.Undo(ctx); err != nil {
		return 0, fmt.Errorf("restart: %w", err)
	}
	// The session is gone with the process: reactivate, then a new
	// session, until a Read is served.
	readAgain(ctx, owner, owner.Session()+"-restart")
	return quietTo, nil
}
