package localstack

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisSlots is the number of hash slots of a Redis Cluster.
const redisSlots = 16384

// FormRedisCluster makes the Redis servers at addrs (cluster nodes, as
// RedisConfig.ClusterNodeTimeout starts them) one cluster, as `redis-cli
// --cluster create --cluster-replicas 1` does: the first half are masters
// sharing the slots evenly, node i+n/2 the replica of master i. Nodes that
// form that cluster already (restarted with their node tables) are left as
// they are. Either way it waits until every node holds the cluster ok and
// every replica is in sync with its master. It refuses nodes of which some
// are new and some are not: a node that lost its table cannot be told apart
// from a stranger.
func FormRedisCluster(ctx context.Context, addrs []string) error {
	if len(addrs) < 2 || len(addrs)%2 != 0 {
		return fmt.Errorf("redis cluster: %d nodes; want masters and as many replicas", len(addrs))
	}
	infos := make([]string, len(addrs))
	err := eachRedis(ctx, addrs, nil, func(ctx context.Context, i int, rdb *redis.Client) error {
		var err error
		infos[i], err = rdb.ClusterInfo(ctx).Result()
		return err
	})
	if err != nil {
		return fmt.Errorf("redis cluster: %w", err)
	}
	var fresh, formed []string
	for i, info := range infos {
		switch {
		case clusterInfoField(info, "cluster_known_nodes") == "1" && clusterInfoField(info, "cluster_slots_assigned") == "0":
			fresh = append(fresh, addrs[i])
		case clusterInfoField(info, "cluster_known_nodes") == strconv.Itoa(len(addrs)):
			formed = append(formed, addrs[i])
		}
	}
	switch {
	case len(fresh) == len(addrs):
		if err := createRedisCluster(ctx, addrs); err != nil {
			return fmt.Errorf("create redis cluster: %w", err)
		}
	case len(formed) == len(addrs):
	default:
		return fmt.Errorf("redis cluster %s: nodes %s are new and nodes %s are not: remove every node's directory to make a new cluster",
			strings.Join(addrs, ","), strings.Join(fresh, ","), strings.Join(slices.DeleteFunc(slices.Clone(addrs), func(a string) bool { return slices.Contains(fresh, a) }), ","))
	}
	return WaitRedisClusterHealthy(ctx, addrs, nil)
}

// clusterInfoField is the value of one field of CLUSTER INFO's answer.
func clusterInfoField(info, name string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

// createRedisCluster assigns the slots, joins the nodes and makes the
// replicas.
func createRedisCluster(ctx context.Context, addrs []string) error {
	masters := len(addrs) / 2
	ids := make([]string, len(addrs))
	err := eachRedis(ctx, addrs, nil, func(ctx context.Context, i int, rdb *redis.Client) error {
		var err error
		if ids[i], err = rdb.ClusterMyID(ctx).Result(); err != nil {
			return err
		}
		// Distinct epochs, so that no collision has to be resolved first.
		if err := rdb.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
			return err
		}
		if i < masters {
			return rdb.ClusterAddSlotsRange(ctx, i*redisSlots/masters, (i+1)*redisSlots/masters-1).Err()
		}
		return nil
	})
	if err != nil {
		return err
	}
	host, port, err := net.SplitHostPort(addrs[0])
	if err != nil {
		return err
	}
	err = eachRedis(ctx, addrs, nil, func(ctx context.Context, i int, rdb *redis.Client) error {
		if i > 0 {
			if err := rdb.ClusterMeet(ctx, host, port).Err(); err != nil {
				return err
			}
		}
		return pollRedis(ctx, "node "+addrs[i]+" to know every node", func() (bool, error) {
			nodes, err := rdb.ClusterNodes(ctx).Result()
			return strings.Count(nodes, "\n") == len(addrs) && !strings.Contains(nodes, "handshake"), err
		})
	})
	if err != nil {
		return err
	}
	return eachRedis(ctx, addrs, nil, func(ctx context.Context, i int, rdb *redis.Client) error {
		if i < masters {
			return nil
		}
		return rdb.ClusterReplicate(ctx, ids[i-masters]).Err()
	})
}

// WaitRedisClusterHealthy waits until every node at addrs but the dead ones
// holds the cluster ok, with every slot served by a master none of the dead,
// and every live replica in sync with its master. (Until the cluster's node
// timeout has passed, a node just killed still serves its slots as far as
// the others know.)
func WaitRedisClusterHealthy(ctx context.Context, addrs, dead []string) error {
	isDead := map[string]bool{}
	for _, d := range dead {
		isDead[d] = true
	}
	return eachRedis(ctx, addrs, isDead, func(ctx context.Context, i int, rdb *redis.Client) error {
		return pollRedis(ctx, "node "+addrs[i]+" to hold the cluster ok", func() (bool, error) {
			info, err := rdb.ClusterInfo(ctx).Result()
			if err != nil || !strings.Contains(info, "cluster_state:ok") {
				return false, err
			}
			nodes, err := rdb.ClusterNodes(ctx).Result()
			if err != nil {
				return false, err
			}
			for line := range strings.Lines(nodes) {
				// <id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong> <epoch> <link> <slot>...
				f := strings.Fields(line)
				if len(f) > 8 && isDead[strings.SplitN(f[1], "@", 2)[0]] {
					return false, nil
				}
			}
			repl, err := rdb.Info(ctx, "replication").Result()
			if err != nil {
				return false, err
			}
			return strings.Contains(repl, "role:master") || strings.Contains(repl, "master_link_status:up"), nil
		})
	})
}

// RedisClusterURL is REDIS_URL for the cluster of the nodes at addrs: the
// first node, the others as seeds (go-redis's cluster URL).
func RedisClusterURL(addrs []string) string {
	var b strings.Builder
	b.WriteString("redis://" + addrs[0])
	for i, a := range addrs[1:] {
		if i == 0 {
			b.WriteString("?")
		} else {
			b.WriteString("&")
		}
		b.WriteString("addr=" + a)
	}
	return b.String()
}

// eachRedis runs fn on a client of every node at addrs but the skipped, at
// once.
func eachRedis(ctx context.Context, addrs []string, skip map[string]bool, fn func(context.Context, int, *redis.Client) error) error {
	errs := make([]error, len(addrs))
	var wg sync.WaitGroup
	for i, addr := range addrs {
		if skip[addr] {
			continue
		}
		wg.Go(func() {
			rdb := redis.NewClient(&redis.Options{Addr: addr})
			defer rdb.Close()
			if err := fn(ctx, i, rdb); err != nil {
				errs[i] = fmt.Errorf("node %s: %w", addr, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// pollRedis calls done every 50 ms until it reports true, or fails with its
// last error once ctx ends.
func pollRedis(ctx context.Context, what string, done func() (bool, error)) error {
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
