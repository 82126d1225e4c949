package localstacktest

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/feedproject/feed/cmd/localstack"
)

// RedisCluster is a Redis Cluster on loopback: three masters, each with a
// replica, every node a non-persistent redis-server in the test's directory.
type RedisCluster struct {
	// Nodes are the servers: the masters as created (0–2), then their
	// replicas (3–5, replica i+3 of master i).
	Nodes []*localstack.Redis

	tb     testing.TB
	h      *harness
	mu     sync.Mutex
	killed map[int]bool
	// dead are the processes killed, whose stop reports the kill.
	dead map[*localstack.Redis]bool
}

// clusterNodeTimeout is how long the nodes take to hold one failed: a
// killed master's replica takes over a little after it. Short enough for a
// test, long enough that a busy shared machine does not fail nodes over.
const clusterNodeTimeout = 2 * time.Second

// clusterSlots splits the 16384 hash slots among the three masters.
var clusterSlots = [3][2]int{{0, 5460}, {5461, 10922}, {10923, 16383}}

// RedisClusterForTest starts a Redis Cluster of three masters and three
// replicas on random loopback ports and waits until it serves every slot
// and every replica is in sync; Cleanup stops it and removes its
// directories.
func RedisClusterForTest(tb testing.TB) *RedisCluster {
	tb.Helper()
	h := newHarness(tb)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := &RedisCluster{Nodes: make([]*localstack.Redis, 6), tb: tb, h: h, killed: map[int]bool{}, dead: map[*localstack.Redis]bool{}}
	errs := make([]error, len(c.Nodes))
	var wg sync.WaitGroup
	for i := range c.Nodes {
		wg.Go(func() { c.Nodes[i], errs[i] = c.startNode(ctx, i, 0) })
	}
	wg.Wait()
	for _, n := range c.Nodes {
		if n != nil {
			c.stopOnCleanup(n)
		}
	}
	if err := errors.Join(errs...); err != nil {
		tb.Fatalf("localstack: redis cluster: %v", err)
	}
	if err := c.create(ctx); err != nil {
		tb.Fatalf("localstack: create redis cluster: %v", err)
	}
	return c
}

// URL is the cluster's REDIS_URL: its first node, the others as seeds.
func (c *RedisCluster) URL() string {
	var b strings.Builder
	b.WriteString("redis://" + c.Nodes[0].Addr())
	for i, n := range c.Nodes[1:] {
		if i == 0 {
			b.WriteString("?")
		} else {
			b.WriteString("&")
		}
		b.WriteString("addr=" + n.Addr())
	}
	return b.String()
}

// Client returns a client of the cluster; Cleanup closes it.
func (c *RedisCluster) Client(tb testing.TB) *redis.ClusterClient {
	tb.Helper()
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		addrs[i] = n.Addr()
	}
	// Slots reloaded every second, as the service's client does: a dead
	// master answers no MOVED.
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ClusterStateReloadInterval: time.Second})
	tb.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

func (c *RedisCluster) startNode(ctx context.Context, i, port int) (*localstack.Redis, error) {
	return localstack.StartRedis(ctx, localstack.RedisConfig{
		Dir:                 filepath.Join(c.h.dir, "redis-"+strconv.Itoa(i)),
		Port:                port,
		ZSetListpackEntries: 1024,
		ClusterNodeTimeout:  clusterNodeTimeout,
	}, c.h.log)
}

func (c *RedisCluster) stopOnCleanup(n *localstack.Redis) {
	c.tb.Cleanup(func() {
		c.mu.Lock()
		killed := c.dead[n]
		c.mu.Unlock()
		if err := n.Stop(); !killed {
			c.h.logStopErr("redis cluster node", err)
		}
	})
}

// Restart starts killed node i again on its port with its cluster
// configuration: empty, as its data was not persisted, it rejoins the
// cluster, as a replica of the node that took its slots if it was a master.
// Call it from the test's goroutine.
func (c *RedisCluster) Restart(i int) {
	c.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	n, err := c.startNode(ctx, i, c.Nodes[i].Port())
	if err != nil {
		c.tb.Fatalf("localstack: restart redis cluster node %d: %v", i, err)
	}
	c.mu.Lock()
	c.Nodes[i] = n
	delete(c.killed, i)
	c.mu.Unlock()
	c.stopOnCleanup(n)
}

// Kill ends node i at once (SIGKILL).
func (c *RedisCluster) Kill(i int) {
	c.mu.Lock()
	c.killed[i] = true
	c.dead[c.Nodes[i]] = true
	c.mu.Unlock()
	c.Nodes[i].Kill()
}

// WaitHealthy waits until every live node holds the cluster ok: every
// slot served by a master it can reach, and none by a killed node (until
// the cluster's node timeout has passed, a node just killed still serves
// its slots as far as the others know).
func (c *RedisCluster) WaitHealthy(ctx context.Context) error {
	c.mu.Lock()
	dead := map[string]bool{}
	for i := range c.killed {
		dead[c.Nodes[i].Addr()] = true
	}
	c.mu.Unlock()
	return c.each(ctx, func(ctx context.Context, i int, rdb *redis.Client) error {
		return poll(ctx, "node "+strconv.Itoa(i)+" to hold the cluster ok", func() (bool, error) {
			info, err := rdb.ClusterInfo(ctx).Result()
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				return false, err
			}
			nodes, err := rdb.ClusterNodes(ctx).Result()
			if err != nil {
				return false, err
			}
			for line := range strings.Lines(nodes) {
				// <id> <ip:port@cport> <flags> <master> <ping> <pong> <epoch> <link> <slot>...
				f := strings.Fields(line)
				if len(f) > 8 && dead[strings.SplitN(f[1], "@", 2)[0]] {
					return false, nil
				}
			}
			return true, nil
		})
	})
}

// create assigns the slots, joins the nodes and makes the replicas, as
// `redis-cli --cluster create --cluster-replicas 1` does, and waits until
// the cluster is whole.
func (c *RedisCluster) create(ctx context.Context) error {
	ids := make([]string, len(c.Nodes))
	err := c.each(ctx, func(ctx context.Context, i int, rdb *redis.Client) error {
		var err error
		if ids[i], err = rdb.ClusterMyID(ctx).Result(); err != nil {
			return err
		}
		// Distinct epochs, so that no collision has to be resolved first.
		if err := rdb.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
			return err
		}
		if i < len(clusterSlots) {
			return rdb.ClusterAddSlotsRange(ctx, clusterSlots[i][0], clusterSlots[i][1]).Err()
		}
		return nil
	})
	if err != nil {
		return err
	}
	first := c.Nodes[0]
	err = c.each(ctx, func(ctx context.Context, i int, rdb *redis.Client) error {
		if i > 0 {
			if err := rdb.ClusterMeet(ctx, "127.0.0.1", strconv.Itoa(first.Port())).Err(); err != nil {
				return err
			}
		}
		return poll(ctx, "node "+strconv.Itoa(i)+" to know every node", func() (bool, error) {
			nodes, err := rdb.ClusterNodes(ctx).Result()
			return strings.Count(nodes, "\n") == len(c.Nodes) && !strings.Contains(nodes, "handshake"), err
		})
	})
	if err != nil {
		return err
	}
	err = c.each(ctx, func(ctx context.Context, i int, rdb *redis.Client) error {
		if i < len(clusterSlots) {
			return nil
		}
		if err := rdb.ClusterReplicate(ctx, ids[i-len(clusterSlots)]).Err(); err != nil {
			return err
		}
		return poll(ctx, "replica "+strconv.Itoa(i)+" to be in sync", func() (bool, error) {
			info, err := rdb.Info(ctx, "replication").Result()
			return strings.Contains(info, "master_link_status:up"), err
		})
	})
	if err != nil {
		return err
	}
	return c.WaitHealthy(ctx)
}

// each runs fn on a client of every live node at once.
func (c *RedisCluster) each(ctx context.Context, fn func(context.Context, int, *redis.Client) error) error {
	errs := make([]error, len(c.Nodes))
	var wg sync.WaitGroup
	for i, n := range c.Nodes {
		c.mu.Lock()
		killed := c.killed[i]
		c.mu.Unlock()
		if killed {
			continue
		}
		wg.Go(func() {
			rdb := redis.NewClient(&redis.Options{Addr: n.Addr()})
			defer rdb.Close()
			if err := fn(ctx, i, rdb); err != nil {
				errs[i] = fmt.Errorf("node %d (%s): %w", i, n.Addr(), err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// poll calls done every 50 ms until it reports true, or fails with its last
// error once ctx ends.
func poll(ctx context.Context, what string, done func() (bool, error)) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		ok, err := done()
		if ok && err == nil {
			return nil
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w (last error: %v)", what, ctx.Err(), last)
		case <-tick.C:
		}
	}
}

// RedisClientForTest starts a Redis of its own for the test and returns a
// client of it, closed at cleanup.
func RedisClientForTest(tb testing.TB) *redis.Client {
	tb.Helper()
	r := RedisForTest(tb)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	tb.Cleanup(func() { _ = rdb.Close() })
	return rdb
}
