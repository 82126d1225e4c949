package roundqueue

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Defaults for the zero fields of Config.
const (
	DefaultDequeuePeriod = time.Minute
	DefaultTTL           = 24 * time.Hour
	DefaultCleanInterval = time.Minute
)

// Config holds a Queue's optional knobs; its zero value works, and any field
// that is zero or negative takes its default.
type Config struct {
	// DequeuePeriod is the least time between two dequeues of the same item.
	// Default DefaultDequeuePeriod (1 minute).
	DequeuePeriod time.Duration
	// TTL is how long an item lives after its first Enqueue; Clean removes
	// items created more than TTL ago. Default DefaultTTL (24 hours).
	TTL time.Duration
	// CleanInterval is how often RunCleaner calls Clean. Default
	// DefaultCleanInterval (1 minute).
	CleanInterval time.Duration
	// Now is the clock, read once per operation and stored at millisecond
	// precision; tests pass a fake one. Default time.Now.
	Now func() time.Time
}

func (c Config) withDefaults() Config {
	if c.DequeuePeriod <= 0 {
		c.DequeuePeriod = DefaultDequeuePeriod
	}
	if c.TTL <= 0 {
		c.TTL = DefaultTTL
	}
	if c.CleanInterval <= 0 {
		c.CleanInterval = DefaultCleanInterval
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Queue is a timestamp round queue stored in Redis. It is safe for concurrent
// use, also by Queues with the same name in other processes.
type Queue struct {
	rdb  redis.UniversalClient
	name string
	cfg  Config
	// keys is data, last, created: the order every script expects.
	keys []string
}

// New returns the queue called name over rdb. The name must be non-empty and
// free of '{' and '}', which would break the hash tag that keeps the queue's
// keys in one cluster slot; New panics otherwise, as that is a programming
// error. Nothing is written to Redis until the first Enqueue.
func New(rdb redis.UniversalClient, name string, cfg Config) *Queue {
	if name == "" || strings.ContainsAny(name, "{}") {
		panic(fmt.Sprintf("roundqueue: invalid queue name %q: must be non-empty without '{' or '}'", name))
	}
	prefix := "rq:{" + name + "}:"
	return &Queue{
		rdb:  rdb,
		name: name,
		cfg:  cfg.withDefaults(),
		keys: []string{prefix + "data", prefix + "last", prefix + "created"},
	}
}

func (q *Queue) nowMs() int64 { return q.cfg.Now().UnixMilli() }

// The scripts take KEYS data, last, created.
var (
	// enqueueScript adds a new item with last-dequeue score 0, so it comes
	// out before everything dequeued before, and creation time now. An
	// existing id keeps its payload and both scores; the ZADD NX calls run
	// anyway so an item is always in all three structures.
	// ARGV: id, payload, now ms. Returns 1 if added, 0 if it existed.
	enqueueScript = redis.NewScript(`
local added = redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], 'NX', 0, ARGV[1])
redis.call('ZADD', KEYS[3], 'NX', ARGV[3], ARGV[1])
return added
`)

	// dequeueScript hands out the item dequeued longest ago if that was at
	// or before the cutoff, moving it to the back. An id without a payload
	// (which only a hand-edited queue can have) is dropped and the next
	// one tried.
	// ARGV: now ms, cutoff ms (now - period). Returns {id, payload} or nil.
	dequeueScript = redis.NewScript(`
local cutoff = tonumber(ARGV[2])
while true do
  local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
  if #first == 0 or tonumber(first[2]) > cutoff then
    return false
  end
  local id = first[1]
  local payload = redis.call('HGET', KEYS[1], id)
  if payload then
    redis.call('ZADD', KEYS[2], ARGV[1], id)
    return {id, payload}
  end
  redis.call('ZREM', KEYS[2], id)
  redis.call('ZREM', KEYS[3], id)
end
`)

	// removeScript deletes one id from all three structures.
	// ARGV: id. Returns how many of them held it.
	removeScript = redis.NewScript(`
return redis.call('HDEL', KEYS[1], ARGV[1])
  + redis.call('ZREM', KEYS[2], ARGV[1])
  + redis.call('ZREM', KEYS[3], ARGV[1])
`)

	// cleanScript deletes every item created strictly before the cutoff,
	// in chunks because unpack has a bounded stack.
	// ARGV: cutoff ms (now - TTL). Returns the number of items removed.
	cleanScript = redis.NewScript(`
local ids = redis.call('ZRANGE', KEYS[3], '-inf', '(' .. ARGV[1], 'BYSCORE')
for i = 1, #ids, 1000 do
  local j = math.min(i + 999, #ids)
  redis.call('HDEL', KEYS[1], unpack(ids, i, j))
  redis.call('ZREM', KEYS[2], unpack(ids, i, j))
  redis.call('ZREM', KEYS[3], unpack(ids, i, j))
end
return #ids
`)
)

// Enqueue adds the item id with payload at the front of the queue, created
// now. If id is already queued nothing changes: its payload, its place and
// its creation time (hence its expiry) are kept, so re-enqueueing cannot
// extend an item's life or let it skip its period; added reports whether the
// item was new.
func (q *Queue) Enqueue(ctx context.Context, id string, payload []byte) (added bool, err error) {
	n, err := enqueueScript.Run(ctx, q.rdb, q.keys, id, payload, q.nowMs()).Int()
	if err != nil {
		return false, fmt.Errorf("roundqueue %s: enqueue %q: %w", q.name, id, err)
	}
	return n == 1, nil
}

// Dequeue hands out the item whose last dequeue is the oldest (new items
// first) and moves it to the back, stamped now. If even that item was
// dequeued less than DequeuePeriod ago, or the queue is empty, ok is false.
// The choice and the move are one script, so concurrent dequeuers never get
// the same item within a period.
func (q *Queue) Dequeue(ctx context.Context) (id string, payload []byte, ok bool, err error) {
	now := q.nowMs()
	cutoff := now - q.cfg.DequeuePeriod.Milliseconds()
	res, err := dequeueScript.Run(ctx, q.rdb, q.keys, now, cutoff).StringSlice()
	if errors.Is(err, redis.Nil) {
		return "", nil, false, nil
	}
	if err != nil {
		return "", nil, false, fmt.Errorf("roundqueue %s: dequeue: %w", q.name, err)
	}
	if len(res) != 2 {
		return "", nil, false, fmt.Errorf("roundqueue %s: dequeue: unexpected reply %q", q.name, res)
	}
	return res[0], []byte(res[1]), true, nil
}

// Remove deletes the item id and reports whether it was queued.
func (q *Queue) Remove(ctx context.Context, id string) (bool, error) {
	n, err := removeScript.Run(ctx, q.rdb, q.keys, id).Int()
	if err != nil {
		return false, fmt.Errorf("roundqueue %s: remove %q: %w", q.name, id, err)
	}
	return n > 0, nil
}

// Exists reports whether the item id is queued.
func (q *Queue) Exists(ctx context.Context, id string) (bool, error) {
	ok, err := q.rdb.HExists(ctx, q.keys[0], id).Result()
	if err != nil {
		return false, fmt.Errorf("roundqueue %s: exists %q: %w", q.name, id, err)
	}
	return ok, nil
}

// Count returns the number of queued items, whether due or not.
func (q *Queue) Count(ctx context.Context) (int64, error) {
	n, err := q.rdb.HLen(ctx, q.keys[0]).Result()
	if err != nil {
		return 0, fmt.Errorf("roundqueue %s: count: %w", q.name, err)
	}
	return n, nil
}

// Clean removes every item created more than TTL ago from all three
// structures in one script and returns how many it removed. An empty or
// missing queue gives 0 and no error.
func (q *Queue) Clean(ctx context.Context) (removed int, err error) {
	cutoff := q.nowMs() - q.cfg.TTL.Milliseconds()
	n, err := cleanScript.Run(ctx, q.rdb, q.keys, strconv.FormatInt(cutoff, 10)).Int()
	if err != nil {
		return 0, fmt.Errorf("roundqueue %s: clean: %w", q.name, err)
	}
	return n, nil
}

// RunCleaner calls Clean at once and then every CleanInterval until ctx ends,
// when it returns nil. A Clean that fails for another reason ends it with
// that error, so its owner (typically an errgroup) decides whether to retry.
func (q *Queue) RunCleaner(ctx context.Context) error {
	t := time.NewTicker(q.cfg.CleanInterval)
	defer t.Stop()
	for {
		if _, err := q.Clean(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
