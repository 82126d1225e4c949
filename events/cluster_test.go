package events_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack/natscluster"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
)

// clusterLogs opens the log on an R3 stream of a three-node cluster through n
// connections, each to a different node first, as API replicas would.
func clusterLogs(t *testing.T, c *natscluster.Cluster, n int, cfg events.Config) []*events.Log {
	t.Helper()
	cfg.Replicas = 3
	logs := make([]*events.Log, n)
	for i := range logs {
		url := c.URL(i % c.Size())
		for j := 1; j < c.Size(); j++ {
			url += "," + c.URL((i+j)%c.Size())
		}
		nc, err := nats.Connect(url, nats.DontRandomize(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.ReconnectBufSize(-1))
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		logs[i], err = events.OpenLog(context.Background(), js, cfg, nil)
		require.NoError(t, err)
		t.Cleanup(logs[i].Close)
	}
	return logs
}

// TestCommandsDuringALeaderLossAreAnsweredAsTheLogHasThem appends from 16
// clients while the stream's leader is killed and restarted, each append
// bounded as a command's is: every append answered with a position is in the
// log there, and none answered unavailable (a 503) is in the log at all.
func TestCommandsDuringALeaderLossAreAnsweredAsTheLogHasThem(t *testing.T) {
	c := natscluster.Start(t, natscluster.Config{SyncAlways: true})
	logs := clusterLogs(t, c, 16, events.Config{})
	ctx, stop := context.WithCancel(context.Background())
	type outcome struct {
		seq uint64
		err error
	}
	var (
		mu       sync.Mutex
		outcomes = map[string]outcome{}
		wg       sync.WaitGroup
	)
	for w, log := range logs {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				id := fmt.Sprintf("w%d-%d", w, i)
				actx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				res, err := log.AppendEvent(actx, id, at, events.UserFollowed{FollowerID: domain.UserID(w + 1), FolloweeID: domain.UserID(i + 100)})
				cancel()
				mu.Lock()
				outcomes[id] = outcome{res.Seq, err}
				mu.Unlock()
				if err != nil {
					time.Sleep(20 * time.Millisecond)
				}
			}
		})
	}
	for kill := range 3 {
		time.Sleep(700 * time.Millisecond)
		leader := c.WaitForStreamLeader("FEED_EVENTS", 20*time.Second)
		t.Logf("kill %d: the stream leader, node %d", kill+1, leader)
		c.Kill(leader)
		time.Sleep(time.Second)
		c.Restart(leader)
		c.WaitForReady(20 * time.Second)
		c.WaitForStreamCurrent(leader, "FEED_EVENTS", 20*time.Second)
	}
	time.Sleep(500 * time.Millisecond)
	stop()
	wg.Wait()

	stored := map[string]uint64{}
	require.NoError(t, logs[0].Read(context.Background(), events.ReadOptions{StopAtEnd: true}, func(r events.Record) error {
		if _, twice := stored[r.ID]; twice {
			t.Errorf("event %s is in the log twice", r.ID)
		}
		stored[r.ID] = r.Seq
		return nil
	}))
	var ok, unavailable, unknown, other int
	for id, o := range outcomes {
		seq, in := stored[id]
		switch {
		case o.err == nil:
			ok++
			assert.Equal(t, o.seq, seq, "event %s was answered at %d; the log has it at %d (0: absent)", id, o.seq, seq)
		case errors.Is(o.err, domain.ErrOutcomeUnknown):
			unknown++
		case errors.Is(o.err, domain.ErrUnavailable):
			unavailable++
			assert.False(t, in, "event %s was answered unavailable (503) but is in the log at %d: %v", id, seq, o.err)
		default:
			other++
			t.Errorf("event %s: unexpected failure %v", id, o.err)
		}
	}
	t.Logf("%d appends: %d stored, %d unavailable, %d unknown, %d other", len(outcomes), ok, unavailable, unknown, other)
	assert.Positive(t, ok)
}

// TestImmediateRetriesGetTheFirstAnswerOnReplicas retries each append at
// once, from 16 clients spread over the nodes, and reads the first answer as a
// retried command does: never "not found" for an event the log has, though a
// replica may not have stored it yet.
func TestImmediateRetriesGetTheFirstAnswerOnReplicas(t *testing.T) {
	c := natscluster.Start(t, natscluster.Config{SyncAlways: true})
	logs := clusterLogs(t, c, 16, events.Config{})
	var wg sync.WaitGroup
	for w, log := range logs {
		wg.Go(func() {
			ctx := context.Background()
			for i := range 200 {
				id := fmt.Sprintf("w%d-%d", w, i)
				ev := events.UserFollowed{FollowerID: domain.UserID(w + 1), FolloweeID: domain.UserID(i + 100)}
				first, err := log.AppendEvent(ctx, id, at, ev)
				if !assert.NoError(t, err) {
					return
				}
				retry, err := log.AppendEvent(ctx, id, at, ev)
				if !assert.NoError(t, err) || !assert.True(t, retry.Duplicate) {
					return
				}
				rec, err := log.Get(ctx, retry.Seq)
				if !assert.NoError(t, err, "the first answer of retry %s at %d", id, retry.Seq) {
					return
				}
				assert.Equal(t, first.Seq, rec.Seq)
				assert.Equal(t, id, rec.ID)
			}
		})
	}
	wg.Wait()
}
