package stack_test

import (
	"context"
	"slices"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/internal/stack"
	"github.com/feedproject/feed/cmd/localstack"
	"github.com/feedproject/feed/cmd/localstack/localstacktest"
)

// TestProjectorWritesWaitForTheReplica: on a Redis Cluster, a projector's
// write, alone or in a pipeline, returns only once the replica of the master
// that took it has it. With the replica stopped (SIGSTOP) a write of a plain
// client returns at once, which a failover then would lose; the projector's
// waits until the replica runs again, or, after the timeout, reports the
// node short and stops waiting for a while. Reads never wait.
func TestProjectorWritesWaitForTheReplica(t *testing.T) {
	cluster := localstacktest.RedisClusterForTest(t)
	target, err := stack.ParseRedisURL(cluster.URL())
	require.NoError(t, err)
	cfg := stack.Config{RedisReplicaAcks: -1}
	require.Equal(t, 1, cfg.RedisReplicaAcksFor(target), "a cluster's writes wait for one replica by default")

	var shorts atomic.Int32
	var shortAddr atomic.Value
	rdb := target.ProjectorClient(cfg, stack.RedisTuning{}, func(addr string) {
		shorts.Add(1)
		shortAddr.Store(addr)
	})
	t.Cleanup(func() { _ = rdb.Close() })
	plain := target.Client(stack.RedisTuning{})
	t.Cleanup(func() { _ = plain.Close() })
	ctx := t.Context()
	const key = "{replica-acks}k"
	// Both clients learn the slots first: a stopped node asked for them
	// would not answer.
	require.NoError(t, rdb.Set(ctx, key, "0", 0).Err())
	require.NoError(t, plain.Set(ctx, key, "0", 0).Err())
	master, replica := shardOf(t, cluster, key)

	stop := func() { require.NoError(t, syscall.Kill(replica.PID(), syscall.SIGSTOP)) }
	cont := func() { require.NoError(t, syscall.Kill(replica.PID(), syscall.SIGCONT)) }
	t.Cleanup(func() { _ = syscall.Kill(replica.PID(), syscall.SIGCONT) })

	// A plain client's write returns while the replica cannot have it.
	stop()
	start := time.Now()
	require.NoError(t, plain.Set(ctx, key, "plain", 0).Err())
	assert.Less(t, time.Since(start), 200*time.Millisecond, "a plain write does not wait")
	// Reads do not wait either.
	start = time.Now()
	require.NoError(t, rdb.Get(ctx, key).Err())
	assert.Less(t, time.Since(start), 200*time.Millisecond, "a read does not wait")

	// The projector's writes return only after the replica runs again.
	const paused = 400 * time.Millisecond
	writes := []struct {
		name  string
		write func(context.Context) error
	}{
		{"single", func(ctx context.Context) error { return rdb.Set(ctx, key, "single", 0).Err() }},
		{"pipeline", func(ctx context.Context) error {
			_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				p.Get(ctx, key)
				p.Incr(ctx, key+"n")
				return nil
			})
			return err
		}},
		{"script", func(ctx context.Context) error {
			return rdb.Eval(ctx, "return redis.call('SET', KEYS[1], ARGV[1])", []string{key}, "script").Err()
		}},
	}
	for _, w := range writes {
		name, write := w.name, w.write
		stop()
		start := time.Now()
		time.AfterFunc(paused, cont)
		require.NoError(t, write(ctx), name)
		assert.GreaterOrEqual(t, time.Since(start), paused, "%s: the write waited for the replica", name)
		assert.Zero(t, shorts.Load(), name)
	}
	onReplica := redis.NewClient(&redis.Options{Addr: replica.Addr()})
	t.Cleanup(func() { _ = onReplica.Close() })
	require.NoError(t, onReplica.Do(ctx, "READONLY").Err())
	assert.Equal(t, "script", onReplica.Get(ctx, key).Val(), "the replica has the last write")

	// A replica that does not answer within the timeout makes its master
	// short: the write returns, and the next ones do not wait.
	stop()
	start = time.Now()
	require.NoError(t, rdb.Set(ctx, key, "short", 0).Err())
	waited := time.Since(start)
	assert.GreaterOrEqual(t, waited, 900*time.Millisecond)
	assert.Less(t, waited, 5*time.Second)
	assert.Equal(t, int32(1), shorts.Load())
	assert.Equal(t, master.Addr(), shortAddr.Load())
	start = time.Now()
	require.NoError(t, rdb.Set(ctx, key, "unwaited", 0).Err())
	assert.Less(t, time.Since(start), 200*time.Millisecond, "a short node's writes do not wait")
	cont()
}

// TestReplicaAcksDefaultToNoneOnOneServer: one server has no replica to
// wait for, unless told.
func TestReplicaAcksDefaultToNoneOnOneServer(t *testing.T) {
	target, err := stack.ParseRedisURL("redis://127.0.0.1:6379/0")
	require.NoError(t, err)
	assert.Equal(t, 0, stack.Config{RedisReplicaAcks: -1}.RedisReplicaAcksFor(target))
	assert.Equal(t, 2, stack.Config{RedisReplicaAcks: 2}.RedisReplicaAcksFor(target))
	cfg, err := stack.Parse(func(name string) string {
		if name == "FEED_REDIS_REPLICA_ACKS" {
			return "9"
		}
		return ""
	})
	_ = cfg
	require.ErrorContains(t, err, "FEED_REDIS_REPLICA_ACKS")
}

// shardOf is the master that holds key and its replica.
func shardOf(t *testing.T, cluster *localstacktest.RedisCluster, key string) (master, replica *localstack.Redis) {
	t.Helper()
	c := cluster.Client(t)
	slot, err := c.ClusterKeySlot(t.Context(), key).Result()
	require.NoError(t, err)
	shards, err := c.ClusterShards(t.Context()).Result()
	require.NoError(t, err)
	byPort := func(port int64) *localstack.Redis {
		i := slices.IndexFunc(cluster.Nodes, func(n *localstack.Redis) bool { return int64(n.Port()) == port })
		require.GreaterOrEqual(t, i, 0, "no node on port %d", port)
		return cluster.Nodes[i]
	}
	for _, shard := range shards {
		if !slices.ContainsFunc(shard.Slots, func(r redis.SlotRange) bool { return r.Start <= slot && slot <= r.End }) {
			continue
		}
		for _, n := range shard.Nodes {
			if n.Role == "master" {
				master = byPort(n.Port)
			} else {
				replica = byPort(n.Port)
			}
		}
	}
	require.NotNil(t, master, "no master of slot %d", slot)
	require.NotNil(t, replica, "no replica of slot %d", slot)
	return master, replica
}
