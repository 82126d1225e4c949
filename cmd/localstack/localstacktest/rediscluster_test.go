package localstacktest_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
)

// TestRedisClusterServesEverySlotAndFailsOver: the harness's cluster takes
// keys of every slot, and when a master is killed its replica takes over
// within seconds with the keys written before. Restarted, the old master
// rejoins as the replica of the one that took its slots, and syncs them.
func TestRedisClusterServesEverySlotAndFailsOver(t *testing.T) {
	c := localstacktest.RedisClusterForTest(t)
	rdb := c.Client(t)
	ctx := t.Context()

	const keys = 300
	for i := range keys {
		require.NoError(t, rdb.Set(ctx, "k"+strconv.Itoa(i), i, 0).Err())
	}
	var mu sync.Mutex
	masters := map[string]int64{}
	require.NoError(t, rdb.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		n, err := m.DBSize(ctx).Result()
		if err != nil {
			return err
		}
		// Each write is on the replica before the master dies.
		if err := m.Wait(ctx, 1, 5*time.Second).Err(); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		masters[m.Options().Addr] = n
		return nil
	}))
	for addr, n := range masters {
		assert.Positive(t, n, "keys on master %s", addr)
	}
	require.Len(t, masters, 3)
	require.Contains(t, masters, c.Nodes[0].Addr(), "node 0 is a master")

	c.Kill(0)
	wait, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	require.NoError(t, c.WaitHealthy(wait))
	require.Eventually(t, func() bool {
		replica := redis.NewClient(&redis.Options{Addr: c.Nodes[3].Addr()})
		defer replica.Close()
		role, err := replica.Do(ctx, "ROLE").Slice()
		return err == nil && role[0] == "master"
	}, 20*time.Second, 100*time.Millisecond, "node 0's replica took over")
	// The client finds the new master by its next reload of the slots.
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		for i := range keys {
			v, err := rdb.Get(ctx, "k"+strconv.Itoa(i)).Int()
			if !assert.NoError(c, err, "key %d after the failover", i) {
				return
			}
			require.Equal(t, i, v, "key %d after the failover", i)
		}
	}, 10*time.Second, 100*time.Millisecond)

	c.Restart(0)
	old := redis.NewClient(&redis.Options{Addr: c.Nodes[0].Addr()})
	defer old.Close()
	require.Eventually(t, func() bool {
		info, err := old.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "role:slave") && strings.Contains(info, "master_link_status:up")
	}, 30*time.Second, 100*time.Millisecond, "the old master rejoined as a replica")
	require.NoError(t, old.Do(ctx, "READONLY").Err())
	n, err := old.DBSize(ctx).Result()
	require.NoError(t, err)
	assert.Equal(t, masters[c.Nodes[0].Addr()], n, "the rejoined node holds its old slots' keys again")
	require.NoError(t, c.WaitHealthy(wait))
}
