package fanout

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/domain"
)

// TestAwaitAcksGivesUpOnAnAckNeverSent publishes where a subscriber takes
// the message and never answers, as a node killed while it stores one: the
// planner's wait ends, with an error, rather than never.
func TestAwaitAcksGivesUpOnAnAckNeverSent(t *testing.T) {
	nc, err := nats.Connect(localstacktest.NATSForTest(t).ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	sub, err := nc.SubscribeSync("work.lost")
	require.NoError(t, err)
	ack, err := js.PublishAsync("work.lost", []byte("w"))
	require.NoError(t, err)
	_, err = sub.NextMsg(5 * time.Second)
	require.NoError(t, err, "the message reached the subscriber that never answers")

	err = awaitAcks(context.WithoutCancel(context.Background()), []jetstream.PubAckFuture{ack}, 200*time.Millisecond)
	assert.ErrorIs(t, err, domain.ErrUnavailable)
}
