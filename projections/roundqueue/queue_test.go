package roundqueue_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/projections/roundqueue"
)

// The queue's keys, spelled out so a change to them (they are persisted
// names) fails the tests.
const (
	dataKey    = "rq:{jobs}:data"
	lastKey    = "rq:{jobs}:last"
	createdKey = "rq:{jobs}:created"
)

const period = time.Minute

// clock is a fake time source the test moves by hand.
type clock struct{ ms atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.ms.Store(time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC).UnixMilli())
	return c
}

func (c *clock) Now() time.Time          { return time.UnixMilli(c.ms.Load()) }
func (c *clock) Advance(d time.Duration) { c.ms.Add(d.Milliseconds()) }
func (c *clock) Millis() int64           { return c.ms.Load() }
func (c *clock) Set(ms int64)            { c.ms.Store(ms) }

// newQueue starts a Redis of its own for the test and returns the queue
// "jobs" over it on a fake clock (unless cfg has one), and a raw client to
// look behind the queue's back.
func newQueue(t *testing.T, cfg roundqueue.Config) (*roundqueue.Queue, *clock, *redis.Client) {
	t.Helper()
	r := localstacktest.RedisForTest(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	c := newClock()
	if cfg.Now == nil {
		cfg.Now = c.Now
	}
	if cfg.DequeuePeriod == 0 {
		cfg.DequeuePeriod = period
	}
	return roundqueue.New(rdb, "jobs", cfg), c, rdb
}

func enqueue(t *testing.T, q *roundqueue.Queue, ids ...string) {
	t.Helper()
	for _, id := range ids {
		added, err := q.Enqueue(t.Context(), id, []byte("payload of "+id))
		require.NoError(t, err)
		require.True(t, added, "enqueue %s", id)
	}
}

// expect dequeues once and checks that want came out ("" for nothing).
func expect(t *testing.T, q *roundqueue.Queue, want string) {
	t.Helper()
	id, payload, ok, err := q.Dequeue(t.Context())
	require.NoError(t, err)
	if want == "" {
		require.False(t, ok, "dequeued %q, want nothing", id)
		return
	}
	require.True(t, ok, "dequeued nothing, want %q", want)
	require.Equal(t, want, id)
	require.Equal(t, "payload of "+want, string(payload))
}

func TestDequeueEmptyQueue(t *testing.T) {
	q, _, rdb := newQueue(t, roundqueue.Config{})
	expect(t, q, "")
	n, err := rdb.Exists(t.Context(), dataKey, lastKey, createdKey).Result()
	require.NoError(t, err)
	assert.Zero(t, n, "dequeue must not create keys")
}

func TestNewItemsComeOutFirst(t *testing.T) {
	q, c, _ := newQueue(t, roundqueue.Config{})
	enqueue(t, q, "a", "b")
	expect(t, q, "a")
	c.Advance(time.Millisecond)
	expect(t, q, "b")

	c.Advance(2 * period)
	enqueue(t, q, "z") // sorts after a and b, yet comes out first
	expect(t, q, "z")
	expect(t, q, "a")
	expect(t, q, "b")
	expect(t, q, "")
}

func TestRotationOrder(t *testing.T) {
	q, c, _ := newQueue(t, roundqueue.Config{})
	// c is dequeued before a and b exist, so the round order is c, a, b,
	// which is not the ids' lexical order (the tie-break of equal scores).
	enqueue(t, q, "c")
	c.Advance(time.Millisecond)
	expect(t, q, "c")
	enqueue(t, q, "a", "b")
	c.Advance(time.Millisecond)
	expect(t, q, "a")
	c.Advance(time.Millisecond)
	expect(t, q, "b")
	expect(t, q, "")

	for round := range 3 {
		t.Logf("round %d", round)
		c.Advance(period - 2*time.Millisecond)
		expect(t, q, "c")
		expect(t, q, "") // a is due a millisecond later
		c.Advance(time.Millisecond)
		expect(t, q, "a")
		expect(t, q, "")
		c.Advance(time.Millisecond)
		expect(t, q, "b")
		expect(t, q, "")
	}
}

func TestPeriodLimit(t *testing.T) {
	q, c, rdb := newQueue(t, roundqueue.Config{})
	enqueue(t, q, "a")
	start := c.Millis()
	expect(t, q, "a")
	assert.Equal(t, start, zscore(t, rdb, lastKey, "a"), "a dequeue stamps the item with now")

	for _, d := range []time.Duration{0, time.Millisecond, period / 2, period - time.Millisecond} {
		c.Set(start + d.Milliseconds())
		expect(t, q, "")
	}
	c.Set(start + period.Milliseconds())
	expect(t, q, "a") // exactly at the boundary
	expect(t, q, "")
}

func TestEnqueueExistingChangesNothing(t *testing.T) {
	ctx := t.Context()
	q, c, rdb := newQueue(t, roundqueue.Config{})
	enqueue(t, q, "a")
	created := c.Millis()
	c.Advance(time.Second)
	expect(t, q, "a")
	dequeued := c.Millis()
	c.Advance(time.Second)

	added, err := q.Enqueue(ctx, "a", []byte("other payload"))
	require.NoError(t, err)
	assert.False(t, added)

	assert.Equal(t, dequeued, zscore(t, rdb, lastKey, "a"), "last dequeue time")
	assert.Equal(t, created, zscore(t, rdb, createdKey, "a"), "creation time")
	n, err := q.Count(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(1), n)
	payload, err := rdb.HGet(ctx, dataKey, "a").Result()
	require.NoError(t, err)
	assert.Equal(t, "payload of a", payload, "the first payload is kept")
	expect(t, q, "") // not moved to the front
}

// zscore returns member's score in key, a time in Unix milliseconds.
func zscore(t *testing.T, rdb *redis.Client, key, member string) int64 {
	t.Helper()
	score, err := rdb.ZScore(t.Context(), key, member).Result()
	require.NoError(t, err)
	return int64(score)
}

// members lists a key's members: hash fields or sorted-set members.
func members(t *testing.T, rdb *redis.Client, key string) []string {
	t.Helper()
	if key == dataKey {
		ks, err := rdb.HKeys(t.Context(), key).Result()
		require.NoError(t, err)
		return ks
	}
	ms, err := rdb.ZRange(t.Context(), key, 0, -1).Result()
	require.NoError(t, err)
	return ms
}

func TestCleanRemovesExpiredItems(t *testing.T) {
	ctx := t.Context()
	q, c, rdb := newQueue(t, roundqueue.Config{TTL: time.Hour})
	start := c.Millis()
	enqueue(t, q, "old1", "old2")
	expect(t, q, "old1") // in the back of the queue, not only the front
	c.Advance(30 * time.Minute)
	enqueue(t, q, "young")

	c.Set(start + time.Hour.Milliseconds()) // exactly TTL old: kept
	removed, err := q.Clean(ctx)
	require.NoError(t, err)
	assert.Zero(t, removed)

	c.Advance(time.Millisecond)
	removed, err = q.Clean(ctx)
	require.NoError(t, err)
	assert.Equal(t, 2, removed)
	for _, key := range []string{dataKey, lastKey, createdKey} {
		assert.Equal(t, []string{"young"}, members(t, rdb, key), key)
	}

	removed, err = q.Clean(ctx)
	require.NoError(t, err)
	assert.Zero(t, removed, "a second clean finds nothing")

	added, err := q.Enqueue(ctx, "old1", nil)
	require.NoError(t, err)
	assert.True(t, added, "a cleaned id is new again")
}

func TestCleanManyItems(t *testing.T) {
	ctx := t.Context()
	q, c, rdb := newQueue(t, roundqueue.Config{TTL: time.Hour})
	// More than one chunk of the script's unpack.
	const n = 2500
	pipe := rdb.Pipeline()
	for i := range n {
		pipe.HSet(ctx, dataKey, fmt.Sprint(i), "x")
		pipe.ZAdd(ctx, lastKey, redis.Z{Member: fmt.Sprint(i)})
		pipe.ZAdd(ctx, createdKey, redis.Z{Score: float64(c.Millis()), Member: fmt.Sprint(i)})
	}
	_, err := pipe.Exec(ctx)
	require.NoError(t, err)
	c.Advance(2 * time.Hour)
	removed, err := q.Clean(ctx)
	require.NoError(t, err)
	assert.Equal(t, n, removed)
	exists, err := rdb.Exists(ctx, dataKey, lastKey, createdKey).Result()
	require.NoError(t, err)
	assert.Zero(t, exists)
}

func TestCleanEmptyQueue(t *testing.T) {
	ctx := t.Context()
	q, c, rdb := newQueue(t, roundqueue.Config{TTL: time.Hour})
	removed, err := q.Clean(ctx) // the keys do not exist
	require.NoError(t, err)
	assert.Zero(t, removed)

	enqueue(t, q, "a")
	removed, err = q.Clean(ctx) // nothing old enough
	require.NoError(t, err)
	assert.Zero(t, removed)

	ok, err := q.Remove(ctx, "a")
	require.NoError(t, err)
	require.True(t, ok)
	c.Advance(2 * time.Hour)
	removed, err = q.Clean(ctx) // emptied again
	require.NoError(t, err)
	assert.Zero(t, removed)
	exists, err := rdb.Exists(ctx, dataKey, lastKey, createdKey).Result()
	require.NoError(t, err)
	assert.Zero(t, exists)
}

func TestRemoveExistsCount(t *testing.T) {
	ctx := t.Context()
	q, _, rdb := newQueue(t, roundqueue.Config{})
	n, err := q.Count(ctx)
	require.NoError(t, err)
	assert.Zero(t, n)
	ok, err := q.Exists(ctx, "a")
	require.NoError(t, err)
	assert.False(t, ok)

	enqueue(t, q, "a", "b", "c")
	expect(t, q, "a")
	n, err = q.Count(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(3), n, "count includes items not due")
	ok, err = q.Exists(ctx, "a")
	require.NoError(t, err)
	assert.True(t, ok)

	ok, err = q.Remove(ctx, "a")
	require.NoError(t, err)
	assert.True(t, ok)
	ok, err = q.Remove(ctx, "a")
	require.NoError(t, err)
	assert.False(t, ok, "removing twice")
	ok, err = q.Exists(ctx, "a")
	require.NoError(t, err)
	assert.False(t, ok)
	n, err = q.Count(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(2), n)
	for _, key := range []string{dataKey, lastKey, createdKey} {
		assert.ElementsMatch(t, []string{"b", "c"}, members(t, rdb, key), key)
	}
	expect(t, q, "b")
	expect(t, q, "c")
	expect(t, q, "")
}

func TestPayloadRoundTrip(t *testing.T) {
	ctx := t.Context()
	q, _, _ := newQueue(t, roundqueue.Config{})
	payloads := map[string][]byte{"empty": {}, "binary": {0, 0xff, '\n', 0}}
	for id, p := range payloads {
		added, err := q.Enqueue(ctx, id, p)
		require.NoError(t, err)
		require.True(t, added)
	}
	for range payloads {
		id, p, ok, err := q.Dequeue(ctx)
		require.NoError(t, err)
		require.True(t, ok)
		assert.Equal(t, payloads[id], p, id)
	}
}

func TestConcurrentDequeuers(t *testing.T) {
	ctx := t.Context()
	// The real clock: every dequeue of an item is within the minute.
	q, _, _ := newQueue(t, roundqueue.Config{DequeuePeriod: time.Minute, Now: time.Now})
	const items, workers, calls = 50, 16, 20
	for i := range items {
		enqueue(t, q, fmt.Sprintf("item-%02d", i))
	}

	var (
		mu   sync.Mutex
		seen = map[string]int{}
		wg   sync.WaitGroup
	)
	for range workers {
		wg.Go(func() {
			for range calls {
				id, payload, ok, err := q.Dequeue(ctx)
				if !assert.NoError(t, err) {
					return
				}
				if !ok {
					continue
				}
				assert.Equal(t, "payload of "+id, string(payload))
				mu.Lock()
				seen[id]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()

	require.Len(t, seen, items, "every item comes out")
	for id, times := range seen {
		assert.Equal(t, 1, times, "%s came out more than once within the period", id)
	}
}

func TestRunCleaner(t *testing.T) {
	q, c, _ := newQueue(t, roundqueue.Config{TTL: time.Hour, CleanInterval: 10 * time.Millisecond})
	enqueue(t, q, "a", "b")

	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- q.RunCleaner(ctx) }()

	time.Sleep(30 * time.Millisecond) // a few rounds with nothing to clean
	n, err := q.Count(t.Context())
	require.NoError(t, err)
	require.Equal(t, int64(2), n)

	c.Advance(2 * time.Hour)
	require.Eventually(t, func() bool {
		n, err := q.Count(t.Context())
		return err == nil && n == 0
	}, 2*time.Second, 5*time.Millisecond)

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(2 * time.Second):
		t.Fatal("RunCleaner did not return after its context ended")
	}
}

func TestNewRejectsNamesBreakingTheHashTag(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = rdb.Close() })
	for _, name := range []string{"", "a{b", "}x", "x}"} {
		assert.Panics(t, func() { roundqueue.New(rdb, name, roundqueue.Config{}) }, "%q", name)
	}
	assert.NotPanics(t, func() { roundqueue.New(rdb, "jobs:v1", roundqueue.Config{}) })
}
