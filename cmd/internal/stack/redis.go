package stack

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisTarget is REDIS_URL parsed: one Redis server, or the seed nodes of a
// Redis Cluster. A URL with one or more addr query parameters names a
// cluster, in go-redis's own form (redis.ParseClusterURL):
// redis://host1:port1?addr=host2:port2&addr=host3:port3; the seeds are the
// URL's host and every addr, and the client learns the other nodes from them.
type RedisTarget struct {
	// Node is the one server's options; nil for a cluster.
	Node *redis.Options
	// Cluster is the cluster's options; nil for one server.
	Cluster *redis.ClusterOptions
}

// ParseRedisURL parses REDIS_URL (see RedisTarget).
func ParseRedisURL(s string) (RedisTarget, error) {
	u, err := url.Parse(s)
	if err != nil {
		return RedisTarget{}, fmt.Errorf("REDIS_URL is not a URL: %w", err)
	}
	if !u.Query().Has("addr") {
		opts, err := redis.ParseURL(s)
		if err != nil {
			return RedisTarget{}, fmt.Errorf("REDIS_URL: %w", err)
		}
		return RedisTarget{Node: opts}, nil
	}
	if u.Scheme != "redis" && u.Scheme != "rediss" {
		return RedisTarget{}, fmt.Errorf("REDIS_URL: a Redis Cluster is named by a redis:// or rediss:// URL, not %s://", u.Scheme)
	}
	if u.Host == "" || u.Port() == "" {
		return RedisTarget{}, fmt.Errorf("REDIS_URL: a Redis Cluster's URL names a seed node as host:port before its addr parameters")
	}
	if db := strings.Trim(u.Path, "/"); db != "" && db != "0" {
		return RedisTarget{}, fmt.Errorf("REDIS_URL: a Redis Cluster has only database 0, not %q", db)
	}
	opts, err := redis.ParseClusterURL(s)
	if err != nil {
		return RedisTarget{}, fmt.Errorf("REDIS_URL (a Redis Cluster, for its addr parameters): %w", err)
	}
	return RedisTarget{Cluster: opts}, nil
}

// IsCluster reports whether the target is a Redis Cluster.
func (t RedisTarget) IsCluster() bool { return t.Cluster != nil }

// String names the target for logs and errors, without credentials.
func (t RedisTarget) String() string {
	if t.Cluster != nil {
		return "cluster " + strings.Join(t.Cluster.Addrs, ",")
	}
	return t.Node.Addr
}

// RedisTuning is how a client times out and retries, the same for one
// server and for every node of a cluster; a zero field keeps the URL's (or
// go-redis's default).
type RedisTuning struct {
	DialTimeout, ReadTimeout, WriteTimeout time.Duration
	// MaxRetries: -1 none.
	MaxRetries int
	// MinRetryBackoff: -1 none.
	MinRetryBackoff time.Duration
	DialerRetries   int
}

// NodeOptions are the one server's options tuned; nil for a cluster.
func (t RedisTarget) NodeOptions(tune RedisTuning) *redis.Options {
	if t.Node == nil {
		return nil
	}
	o := *t.Node
	setNonZero(&o.DialTimeout, tune.DialTimeout)
	setNonZero(&o.ReadTimeout, tune.ReadTimeout)
	setNonZero(&o.WriteTimeout, tune.WriteTimeout)
	setNonZero(&o.MaxRetries, tune.MaxRetries)
	setNonZero(&o.MinRetryBackoff, tune.MinRetryBackoff)
	setNonZero(&o.DialerRetries, tune.DialerRetries)
	return &o
}

// Client returns a new client of the target tuned: a *redis.Client for one
// server, a *redis.ClusterClient for a cluster. A cluster client follows
// MOVED and ASK redirections (a failover, a resharding) on its own; its reads
// go to masters, so that a read sees every write acknowledged before it.
func (t RedisTarget) Client(tune RedisTuning) redis.UniversalClient {
	if t.Cluster == nil {
		return redis.NewClient(t.NodeOptions(tune))
	}
	o := *t.Cluster
	setNonZero(&o.DialTimeout, tune.DialTimeout)
	setNonZero(&o.ReadTimeout, tune.ReadTimeout)
	setNonZero(&o.WriteTimeout, tune.WriteTimeout)
	setNonZero(&o.MaxRetries, tune.MaxRetries)
	setNonZero(&o.MinRetryBackoff, tune.MinRetryBackoff)
	setNonZero(&o.DialerRetries, tune.DialerRetries)
	// A dead master answers no MOVED, the one thing that makes go-redis
	// reload the slots at once: it would be asked again until the next
	// reload.
	o.ClusterStateReloadInterval = clusterStateReload
	return redis.NewClusterClient(&o)
}

// clusterStateReload bounds how long a cluster client keeps sending a slot's
// commands to a master that failed over: one CLUSTER SLOTS a second at most,
// and only while commands are sent.
const clusterStateReload = time.Second

func setNonZero[T comparable](field *T, v T) {
	var zero T
	if v != zero {
		*field = v
	}
}

// ErrClusterNode is a REDIS_URL naming one server that is a node of a Redis
// Cluster: a single-node client would get MOVED for most keys.
var ErrClusterNode = errors.New("REDIS_URL names one node of a Redis Cluster; name the cluster with its nodes as addr parameters: redis://host1:port1?addr=host2:port2&addr=host3:port3")

// CheckRedisMode fails with ErrClusterNode if a client of one server talks to
// a Redis Cluster's node.
func CheckRedisMode(ctx context.Context, t RedisTarget, rdb redis.UniversalClient) error {
	if t.IsCluster() {
		return nil
	}
	info, err := rdb.Info(ctx, "cluster").Result()
	if err != nil {
		return fmt.Errorf("redis %s: info cluster: %w", t, err)
	}
	if strings.Contains(info, "cluster_enabled:1") {
		return fmt.Errorf("%w (%s)", ErrClusterNode, t)
	}
	return nil
}

// ForEachMaster runs fn on the one server, or on every master of a cluster.
func ForEachMaster(ctx context.Context, rdb redis.UniversalClient, fn func(context.Context, *redis.Client) error) error {
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, fn)
	case *redis.Client:
		return fn(ctx, c)
	default:
		return fmt.Errorf("redis client %T: neither one server's nor a cluster's", rdb)
	}
}
