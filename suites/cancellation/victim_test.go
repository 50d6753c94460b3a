package cancellation_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/gopcua/opcua/ua"

	"github.com/opcua-chaos/opcua-chaos/fixtures/history"
	"github.com/opcua-chaos/opcua-chaos/fixtures/load"
	"github.com/opcua-chaos/opcua-chaos/fixtures/secure"
	"github.com/opcua-chaos/opcua-chaos/fixtures/target"
	"github.com/opcua-chaos/opcua-chaos/fixtures/uaclient"
)

// The race spec's victims: sessions with reads in flight that are closed,
// timed out or reset mid-flight (race).

// victim is one gopcua session that keeps reads (slow, or of many
// standard nodes) in flight until it is closed or its connection dies,
// recording every read, each stamped with the server's response time.
type victim struct {
	name    string
	owner   string
	rec     *history.Recorder
	c       *uaclient.Client
	req     load.Request
	wg      sync.WaitGroup
	closing atomic.Bool
	// inflight counts its reads sent and not yet ended.
	inflight atomic.Int32
	// closed is called right after the CloseSession response, if set;
	// its error is close's.
	closed func(ctx context.Context) error
}

// victimSpec shapes a victim: anonymous with victimOutstanding reads unless
// set.
type victimSpec struct {
	// user, if set, gives the victim an owner of its own.
	user *target.User
	// outstanding is its number of reads in flight.
	outstanding int
	// publishes, if set, is its number of Publish requests parked on a
	// subscription without items (victim.subscribe).
	publishes int
}

// openVictim opens a victim session on endpoint with the channel security
// sec, reading req; the open is recorded as a session op. The caller
// closes its client once the run is over (victim.close closes it
// earlier).
func openVictim(ctx context.Context, rec *history.Recorder, sec secure.Config, endpoint, name string, req load.Request, vs ...victimSpec) (*victim, error) {
	shape := victimSpec{outstanding: victimOutstanding}
	if len(vs) > 0 {
		shape = vs[0]
	}
	v := &victim{name: name, owner: "anonymous", rec: rec, req: req}
	opts := []uaclient.Option{uaclient.RequestTimeout(victimRequestTimeout), uaclient.SessionTimeout(victimSessionTimeout), uaclient.Security(sec)}
	if shape.user != nil {
		v.owner = shape.user.Name
		opts = append(opts, uaclient.User(shape.user.Name, shape.user.Password))
	}
	ref := rec.Invoke(v.op(history.KindSession, endpoint))
	c, err := uaclient.Open(ctx, endpoint, opts...)
	if err != nil {
		rec.Fail(ref, 0, err)
	} else {
		rec.OK(ref)
	}
	if err != nil {
		return nil, fmt.Errorf("open victim %s: %w", name, err)
	}
	v.c = c
	if shape.publishes > 0 {
		if err := v.subscribe(ctx, shape.publishes); err != nil {
			return v, err
		}
	}
	for range shape.outstanding {
		v.wg.Add(1)
		go func() {
			defer v.wg.Done()
			for !v.closing.Load() && v.read(ctx) {
			}
		}()
	}
	return v, nil
}

func (v *victim) op(kind history.Kind, node string) history.Op {
	return history.Op{Client: v.name, Session: v.name, Owner: v.owner, Kind: kind, Node: node}
}

// read sends one read and records its outcome, stamped with the
// server's response time (closed-session compares it with the close's);
// false once the connection is gone. A read the server never answers on a
// live connection (the client's timeout) is a lost response
// (history.Lost).
func (v *victim) read(ctx context.Context) bool {
	ref := v.rec.Invoke(v.op(kindVictim, v.req.Node.String()))
	v.inflight.Add(1)
	// the client's own request timeout (victimRequestTimeout) bounds it
	c, hdr := load.SendRequest(ctx, ctx, v.c, v.req.Message(), victimRequestTimeout)
	v.inflight.Add(-1)
	c.Value = serverTime(hdr)
	// a read never answered is in the history as a lost response
	// (race-exactly-once judges it)
	v.rec.Complete(ref, c)
	return c.Outcome != history.Info
}

// close closes the session with reads in flight, then waits for them (the
// channel stays open until they are answered) and closes the client. It
// returns the error of the closed callback; a failed CloseSession is in
// the history.
func (v *victim) close(ctx context.Context) error {
	v.closing.Store(true)
	ref := v.rec.Invoke(v.op(history.KindCloseSession, ""))
	// sent here rather than by v.c.CloseSession, for the response's
	// server timestamp
	var auth *ua.NodeID
	if s := v.c.Session(); s != nil {
		auth = s.AuthToken
	}
	req := &ua.CloseSessionRequest{DeleteSubscriptions: true}
	if resp, err := v.c.RoundTrip(ctx, req, auth); err != nil {
		v.rec.Fail(ref, 0, err)
	} else {
		v.c.Detach() // closed: Close closes only the channel
		// the handle gopcua gave it is its place in the channel's send
		// order (closed-session: a read recorded before it may have
		// gone out after it)
		var handle uint32
		if req.RequestHeader != nil {
			handle = req.RequestHeader.RequestHandle
		}
		v.rec.Complete(ref, history.Completion{Outcome: history.OK, Value: serverTime(resp.Header()), Handle: handle, RequestID: handle})
	}
	var err error
	if v.closed != nil {
		err = v.closed(ctx)
	}
	v.wg.Wait()
	_ = v.c.Close(ctx)
	return err
}

// inflight is the number of vs' reads in flight.
func inflight(vs []*victim) int {
	n := 0
	for _, v := range vs {
		n += int(v.inflight.Load())
	}
	return n
}
