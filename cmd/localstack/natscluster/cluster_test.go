package natscluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/cmd/localstack/natscluster"
)

// TestClusterSurvivesItsLeadersKillAndTakesItBack: an R3 stream keeps taking
// writes when its leader is killed, and the killed node, restarted on its
// ports and store, catches up with what it missed.
func TestClusterSurvivesItsLeadersKillAndTakesItBack(t *testing.T) {
	c := natscluster.Start(t, natscluster.Config{SyncAlways: true})
	nc, err := nats.Connect(c.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	assert.GreaterOrEqual(t, c.ServerOf(nc), 0, "connected to a node")
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, Replicas: 3})
	require.NoError(t, err)
	publish := func(n int) {
		for range n {
			// A new leader is elected within seconds; each attempt is short
			// so that one sent to the lost leader does not use up the wait.
			require.Eventually(t, func() bool {
				actx, acancel := context.WithTimeout(ctx, 2*time.Second)
				defer acancel()
				_, err := js.Publish(actx, "s.x", []byte("x"))
				return err == nil
			}, 30*time.Second, 50*time.Millisecond)
		}
	}
	publish(10)

	leader := c.WaitForStreamLeader("S", 10*time.Second)
	c.Kill(leader)
	assert.Nil(t, c.Server(leader))
	next := c.WaitForStreamLeader("S", 10*time.Second)
	assert.NotEqual(t, leader, next)
	publish(10)

	c.Restart(leader)
	c.WaitForStreamCurrent(leader, "S", 10*time.Second)
	info, err := c.Server(leader).Jsz(&server.JSzOptions{Streams: true})
	require.NoError(t, err)
	require.Len(t, info.AccountDetails, 1)
	require.Len(t, info.AccountDetails[0].Streams, 1)
	assert.Equal(t, uint64(20), info.AccountDetails[0].Streams[0].State.Msgs, "the restarted node's replica holds every message")
}

// TestProxyCutsAndTakesNewConnections: a cut client reconnects through the
// proxy and carries on.
func TestProxyCutsAndTakesNewConnections(t *testing.T) {
	ns := localstacktest.NATSForTest(t)
	p := natscluster.NewProxy(t, ns.Server().Addr().String())
	reconnected := make(chan struct{}, 1)
	nc, err := nats.Connect(p.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond),
		nats.ReconnectHandler(func(*nats.Conn) { reconnected <- struct{}{} }))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	require.NoError(t, nc.Flush())
	assert.Equal(t, 1, p.CutAll())
	select {
	case <-reconnected:
	case <-time.After(10 * time.Second):
		t.Fatal("no reconnection through the proxy after a cut")
	}
	require.NoError(t, nc.Flush())
}

// TestProxyCutsAsAMessageIsOnItsWay: a message the server sends while the
// trap is armed never reaches the client, and the next one, after the
// client reconnects, does.
func TestProxyCutsAsAMessageIsOnItsWay(t *testing.T) {
	ns := localstacktest.NATSForTest(t)
	p := natscluster.NewProxy(t, ns.Server().Addr().String())
	reconnected := make(chan struct{}, 1)
	sub, err := nats.Connect(p.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond),
		nats.ReconnectHandler(func(*nats.Conn) { reconnected <- struct{}{} }))
	require.NoError(t, err)
	t.Cleanup(sub.Close)
	got := make(chan *nats.Msg, 10)
	_, err = sub.ChanSubscribe("s", got)
	require.NoError(t, err)
	require.NoError(t, sub.Flush())
	pub, err := nats.Connect(ns.ClientURL())
	require.NoError(t, err)
	t.Cleanup(pub.Close)

	cut := p.CutOnNext([]byte("MSG s "))
	require.NoError(t, pub.Publish("s", []byte("lost")))
	select {
	case <-cut:
	case <-time.After(10 * time.Second):
		t.Fatal("the trap did not spring")
	}
	select {
	case <-reconnected:
	case <-time.After(10 * time.Second):
		t.Fatal("no reconnection through the proxy after the cut")
	}
	require.NoError(t, sub.Flush())
	require.NoError(t, pub.Publish("s", []byte("kept")))
	select {
	case m := <-got:
		assert.Equal(t, "kept", string(m.Data), "the message on its way at the cut is lost")
	case <-time.After(10 * time.Second):
		t.Fatal("no message after the reconnection")
	}
}
