package stack

import (
	"context"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// ReplicaAcks makes a client's writes return only once replicas of the node
// that took them have them too: Redis replicates asynchronously, and a master
// that dies takes the writes it acknowledged and had not yet sent with it,
// leaving its promoted replica with inboxes and a follow graph that miss
// them. After the commands of a pipeline that writes, the hook sends WAIT on
// the same connection (WAIT counts the replicas that have that connection's
// writes), so a failover loses nothing a projector has acknowledged.
//
// Transactions (MULTI … EXEC) are passed through unchanged: the service's
// only transactions read.
type ReplicaAcks struct {
	// Replicas is how many replicas each write waits for; 0 installs nothing.
	Replicas int
	// Timeout bounds a write's wait. A node whose replicas do not all answer
	// in time is short: its writes stop waiting for shortBackoff, so a
	// replica that is down does not slow every write by Timeout, and Short
	// is called.
	Timeout time.Duration
	// Short, if set, is told the node's address each time it falls short.
	Short func(addr string)
}

// shortBackoff is how long a node that fell short of replicas is written to
// without waiting before it is asked again.
const shortBackoff = 5 * time.Second

// Install adds the hook to rdb: to the client of one server, or to each
// node client of a cluster as the cluster client makes them.
func (a ReplicaAcks) Install(rdb redis.UniversalClient) {
	if a.Replicas <= 0 {
		return
	}
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		c.OnNewNode(func(node *redis.Client) { node.AddHook(&replicaHook{acks: a, node: node}) })
	case *redis.Client:
		c.AddHook(&replicaHook{acks: a, node: c})
	}
}

type replicaHook struct {
	acks ReplicaAcks
	node *redis.Client
	// shortUntil is when a node that fell short is next asked to wait, in
	// Unix nanoseconds.
	shortUntil atomic.Int64
}

func (h *replicaHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

// ProcessHook sends a single write as a pipeline of one, so that the
// pipeline hook puts WAIT on its connection after it.
func (h *replicaHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !writes(cmd) || h.short() {
			return next(ctx, cmd)
		}
		_, err := h.node.Pipelined(ctx, func(p redis.Pipeliner) error { return p.Process(ctx, cmd) })
		return err
	}
}

func (h *replicaHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if len(cmds) == 0 || cmds[0].Name() == "multi" || !slices.ContainsFunc(cmds, writes) || h.short() {
			return next(ctx, cmds)
		}
		wait := redis.NewIntCmd(ctx, "wait", h.acks.Replicas, h.acks.Timeout.Milliseconds())
		// Clipped, so that the caller's slice is not written past its end.
		err := next(ctx, append(slices.Clip(cmds), wait))
		if wait.Err() == nil && wait.Val() < int64(h.acks.Replicas) {
			h.shortUntil.Store(time.Now().Add(shortBackoff).UnixNano())
			if h.acks.Short != nil {
				h.acks.Short(h.node.Options().Addr)
			}
		}
		return err
	}
}

func (h *replicaHook) short() bool { return time.Now().UnixNano() < h.shortUntil.Load() }

// writes reports whether cmd may change data. Anything not known to only
// read counts as a write: a WAIT too many costs a round trip's wait, one too
// few a write lost in a failover.
func writes(cmd redis.Cmder) bool {
	_, ok := reads[strings.ToLower(cmd.Name())]
	return !ok
}

// reads are the commands that change no data (or are not replicated).
var reads = map[string]struct{}{}

func init() {
	for _, name := range strings.Fields(`
		get mget strlen getrange exists type ttl pttl expiretime scan keys dbsize randomkey
		zrange zrangebyscore zrevrange zrevrangebyscore zrangebylex zrevrangebylex zcard zcount
		zlexcount zscore zmscore zrank zrevrank zscan zrandmember
		smembers sismember smismember scard srandmember sscan
		hget hmget hgetall hlen hexists hkeys hvals hstrlen hscan
		lrange llen lindex xrange xrevrange xlen
		fcall_ro evalsha_ro eval_ro
		ping echo info time wait waitaof cluster command client hello auth select readonly readwrite
		config memory object slowlog latency role lastsave script
		multi exec discard watch unwatch`) {
		reads[name] = struct{}{}
	}
}

// replicaAckTimeout bounds how long a write waits for its replicas.
const replicaAckTimeout = time.Second

// RedisReplicaAcksFor is the replicas a projector's write waits for on
// target: FEED_REDIS_REPLICA_ACKS, or by default 1 on a cluster, whose
// masters have replicas to fail over to, and 0 on one server.
func (c Config) RedisReplicaAcksFor(t RedisTarget) int {
	if c.RedisReplicaAcks >= 0 {
		return c.RedisReplicaAcks
	}
	if t.IsCluster() {
		return 1
	}
	return 0
}

// ProjectorClient is a client of target for the projectors, whose writes
// wait for replicas (see ReplicaAcks); short is told of a node whose
// replicas did not answer in time.
func (t RedisTarget) ProjectorClient(cfg Config, tune RedisTuning, short func(addr string)) redis.UniversalClient {
	rdb := t.Client(tune)
	ReplicaAcks{Replicas: cfg.RedisReplicaAcksFor(t), Timeout: replicaAckTimeout, Short: short}.Install(rdb)
	return rdb
}
