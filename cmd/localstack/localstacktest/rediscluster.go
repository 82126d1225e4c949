package localstacktest

import (
	"context"
	"errors"
	"path/filepath"
	"strconv"
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
	if err := localstack.FormRedisCluster(ctx, c.addrs()); err != nil {
		tb.Fatalf("localstack: create redis cluster: %v", err)
	}
	return c
}

// URL is the cluster's REDIS_URL: its first node, the others as seeds.
func (c *RedisCluster) URL() string { return localstack.RedisClusterURL(c.addrs()) }

func (c *RedisCluster) addrs() []string {
	addrs := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// Client returns a client of the cluster; Cleanup closes it.
func (c *RedisCluster) Client(tb testing.TB) *redis.ClusterClient {
	tb.Helper()
	addrs := c.addrs()
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
	var dead []string
	for i := range c.killed {
		dead = append(dead, c.Nodes[i].Addr())
	}
	c.mu.Unlock()
	return localstack.WaitRedisClusterHealthy(ctx, c.addrs(), dead)
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
