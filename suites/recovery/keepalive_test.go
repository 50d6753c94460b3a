package recovery_test

import (
	"context"
	"fmt"
	"time"

	"github.com/gopcua/opcua/ua"

	"github.com/opcua-chaos/opcua-chaos/fixtures/check"
	"github.com/opcua-chaos/opcua-chaos/fixtures/history"
	"github.com/opcua-chaos/opcua-chaos/fixtures/reconnect"
	"github.com/opcua-chaos/opcua-chaos/fixtures/uaclient"
)

// The quiet subscription: beside the stream, whose items change at every
// publishing interval and so never leave a cycle without data, one
// subscription whose item changes more slowly than its keep-alive period,
// so that the server sends keep-alives between its data messages and the
// keep-alive check (Part 4 5.14.1.1: a keep-alive carries the next
// sequence number without using it up) has keep-alives to judge, each
// followed by the data message whose number it announced. Its item is
// CurrentTime (i=2258), the one variable every server keeps changing,
// sampled at quietSampling or four keep-alive periods, whichever is
// longer. It runs on the server's direct endpoint, away from the proxy
// that carries the partition, from the stream's start to before the kill,
// and costs the spec no time.
const (
	// quietLabel labels it in the history.
	quietLabel = "quiet1"
	// quietPublishing and quietKeepAlive ask for a keep-alive every
	// 200 ms without data.
	quietPublishing = 100 * time.Millisecond
	quietKeepAlive  = 2
	// quietSampling is the shortest sampling interval of its item: data
	// at most once a second (S2OPC's CurrentTime changes once a second
	// anyway).
	quietSampling = time.Second
	// quietKeepAliveFactor: the item is sampled at least this many
	// keep-alive periods apart (as granted), so that keep-alives come
	// between its data messages whatever intervals the server grants.
	quietKeepAliveFactor = 4
)

// keepAliveCheck judges the keep-alives of the quiet subscription.
var keepAliveCheck = check.Spec{Name: "keep-alive", Config: check.KeepAliveConfig{Subscriptions: []string{quietLabel}}}

// quietSubscription opens client q1 with a session on endpoint (the server's direct
// one) as cfg says, subscribes it to CurrentTime as the quiet
// subscription and keeps its Publish loop going until stop, which closes
// the session and returns what the loop came to. Every step is an op of
// rec.
func quietSubscription(ctx context.Context, rec *history.Recorder, cfg reconnect.Config, endpoint string) (stop func() string, err error) {
	cfg.Endpoint, cfg.Client = endpoint, "q1"
	c, closeClient, err := open(ctx, rec, cfg, "q1")
	if err != nil {
		return nil, fmt.Errorf("open the quiet subscription's session: %w", err)
	}
	sub, err := c.CreateSubscription(ctx, quietLabel, quietPublishing, quietKeepAlive)
	if err != nil {
		closeClient()
		return nil, err
	}
	sub.Unsampled = true
	sampling := max(quietSampling, quietKeepAliveFactor*sub.KeepAlivePeriod())
	if err := sub.Monitor(ctx, c, []*ua.NodeID{uaclient.ServerStatusCurrentTime}, sampling, 2); err != nil {
		closeClient()
		return nil, err
	}
	rec.Mark("quiet-subscription", fmt.Sprintf("%s of %s: publishing %v, keep-alive every %d intervals (granted: %v, %d), sampled every %v (granted %v): keep-alives between its data messages",
		quietLabel, uaclient.ServerStatusCurrentTime, quietPublishing, quietKeepAlive, sub.Publishing, sub.KeepAlive, sampling, sub.Sampling))
	halt, _ := run(ctx, sub, c)
	return func() string {
		err := halt()
		closeClient()
		return fmt.Sprintf("%d data message(s); loop: %v", sub.Messages(), err)
	}, nil
}
