package homefeed_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/projections/feeds"
	"github.com/feedproject/feed/projections/feeds/homefeed"
	"github.com/feedproject/feed/projections/feeds/inbox"
)

// newPageCache returns a store over a Redis of its own, a page cache of it
// that follows the invalidations (entries never expire by age, so only
// invalidations can make it see a change), and a raw client.
func newPageCache(t *testing.T, cfg feeds.Config) (*feeds.Store, *homefeed.PageCache, *redis.Client) {
	t.Helper()
	s, rdb := newStore(t, cfg)
	c := homefeed.NewPageCache(homefeed.NewReader(s, nil), &redis.Options{Addr: rdb.Options().Addr}, homefeed.PageCacheConfig{MaxAge: time.Hour}, nil, slog.New(slog.DiscardHandler))
	follow(t, c)
	return s, c, rdb
}

// follow runs c until the test ends, and waits until it follows the
// invalidations.
func follow(t *testing.T, c *homefeed.PageCache) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	require.Eventually(t, c.Following, 5*time.Second, time.Millisecond, "the cache never followed the invalidations")
}

// cachedPage is alice's first page through the cache.
func cachedPage(t *testing.T, c *homefeed.PageCache) inbox.Page {
	t.Helper()
	page, err := c.Page(t.Context(), alice, 0, 10, 0)
	require.NoError(t, err)
	return page
}

// TestPageCacheSeesEveryChange: a page read again comes from memory, and a
// change to any key it was made of (the inbox, the user's followees, the big
// set, a big followee's outbox; a flush of all) is seen by the next reads.
func TestPageCacheSeesEveryChange(t *testing.T) {
	t.Parallel()
	s, c, rdb := newPageCache(t, feeds.Config{InboxCap: 5, TTL: time.Hour})
	ctx := t.Context()
	const carol domain.UserID = 3
	_, err := inbox.Apply(ctx, s, []inbox.Item{materialise(1, 0, 10, 20)})
	require.NoError(t, err)
	require.NoError(t, s.AddToOutbox(ctx, carol, 25))
	require.NoError(t, rdb.PExpire(ctx, "feed:v1:{1}:iy", 5*time.Second).Err())

	want := inbox.Page{Materialised: true, Posts: ids(20, 10)}
	assert.Equal(t, want, cachedPage(t, c))
	assert.Equal(t, want, cachedPage(t, c))
	assert.Equal(t, 1, c.Lookups("miss"))
	assert.Equal(t, 1, c.Lookups("hit"))
	ttl, err := rdb.PTTL(ctx, "feed:v1:{1}:iy").Result()
	require.NoError(t, err)
	assert.InDelta(t, time.Hour, ttl, float64(time.Minute), "a read refreshes the inbox's TTL")

	// seen checks that once the cache is in sync it serves want, and then
	// from memory.
	seen := func(what string, want inbox.Page) {
		t.Helper()
		require.NoError(t, c.Sync(ctx))
		require.Equal(t, want, cachedPage(t, c), "after %s", what)
		hits := c.Lookups("hit")
		assert.Equal(t, want, cachedPage(t, c))
		assert.Equal(t, hits+1, c.Lookups("hit"), "after %s the page is kept again", what)
	}
	_, err = inbox.Apply(ctx, s, []inbox.Item{push(2, 30)})
	require.NoError(t, err)
	seen("a push into the inbox", inbox.Page{Materialised: true, Posts: ids(30, 20, 10)})

	require.NoError(t, s.SetBig(ctx, carol, true))
	seen("a new big account alice does not follow", inbox.Page{Materialised: true, Posts: ids(30, 20, 10)})
	require.NoError(t, s.Follow(ctx, alice, carol))
	seen("alice following a big account", inbox.Page{Materialised: true, Posts: ids(30, 25, 20, 10)})
	require.NoError(t, s.AddToOutbox(ctx, carol, 40))
	seen("a post of the big account", inbox.Page{Materialised: true, Posts: ids(40, 30, 25, 20, 10)})

	// A read that must see a log position is always made in Redis.
	misses := c.Lookups("miss")
	page, err := c.Page(ctx, alice, 0, 10, 7)
	require.NoError(t, err)
	assert.Equal(t, ids(40, 30, 25, 20, 10), page.Posts)
	assert.Equal(t, 1, c.Lookups("fresh"))
	assert.Equal(t, misses, c.Lookups("miss"))

	// A flush leaves no inbox, and a page without one is not kept.
	require.NoError(t, rdb.FlushAll(ctx).Err())
	require.NoError(t, c.Sync(ctx))
	assert.Equal(t, inbox.Page{}, cachedPage(t, c))
}

// newSegmentedPageCache is a page cache over alice's inbox of segments
// {10 .. 50} and {60}: the head has room for three.
func newSegmentedPageCache(t *testing.T) (*feeds.Store, *homefeed.PageCache, *redis.Client) {
	t.Helper()
	s, c, rdb := newPageCache(t, feeds.Config{InboxCap: 8, SegmentSize: 5, TTL: time.Hour})
	_, err := inbox.Apply(t.Context(), s, []inbox.Item{materialise(1, 0, 10, 20, 30, 40, 50, 60)})
	require.NoError(t, err)
	return s, c, rdb
}

// TestPageCacheSeesPushesIntoSegments: a push into the head segment of an
// inbox, on its own or in a run, changes the head alone (apply.lua leaves the
// meta as it is); a page kept from before it must not be served after it.
// Redis 7.0 tracks the keys a call declares, not those its function reads, so
// a page is kept only once its read declared the head (learnt from the read
// before), and a read that finds another head is not kept.
func TestPageCacheSeesPushesIntoSegments(t *testing.T) {
	t.Parallel()
	s, c, rdb := newSegmentedPageCache(t)
	ctx := t.Context()
	keys, err := inbox.Keys(ctx, s, alice)
	require.NoError(t, err)
	require.Len(t, keys, 3, "a meta and two segments")
	heads, err := rdb.ZCard(ctx, keys[1]).Result()
	require.NoError(t, err)
	require.Equal(t, int64(1), heads)

	// kept reads the page until it comes from memory, and checks it.
	kept := func(what string, want []domain.PostID) {
		t.Helper()
		require.NoError(t, c.Sync(ctx))
		hits := c.Lookups("hit")
		for range 3 {
			require.Equal(t, want, cachedPage(t, c).Posts, what)
		}
		assert.Greater(t, c.Lookups("hit"), hits, "%s: the page is kept", what)
	}
	kept("materialised", ids(60, 50, 40, 30, 20, 10))
	_, err = inbox.Apply(ctx, s, []inbox.Item{push(2, 70)})
	require.NoError(t, err)
	kept("after a lone push into the head", ids(70, 60, 50, 40, 30, 20, 10))

	_, err = inbox.Apply(ctx, s, []inbox.Item{push(3, 80), push(4, 90)})
	require.NoError(t, err)
	kept("after a run into the head", ids(90, 80, 70, 60, 50, 40, 30, 20, 10))
	keys, err = inbox.Keys(ctx, s, alice)
	require.NoError(t, err)
	assert.Len(t, keys, 3, "both went into the head")

	// A new head: the page read with the old one declared is not kept.
	_, err = inbox.Apply(ctx, s, []inbox.Item{push(5, 100), push(6, 110)})
	require.NoError(t, err)
	keys, err = inbox.Keys(ctx, s, alice)
	require.NoError(t, err)
	require.Len(t, keys, 4, "a new head")
	kept("after a push into a new head", ids(110, 100, 90, 80, 70, 60, 50, 40, 30, 20))
	_, err = inbox.Apply(ctx, s, []inbox.Item{push(7, 120)})
	require.NoError(t, err)
	kept("after a push into that head", ids(120, 110, 100, 90, 80, 70, 60, 50, 40, 30))
}

// overtakeOnce makes the cache's next fill of a page wait until item has
// been applied and its invalidation heard: a change overtaking a read. The
// result reports whether it happened.
func overtakeOnce(t *testing.T, s *feeds.Store, c *homefeed.PageCache, item inbox.Item) *bool {
	t.Helper()
	overtaken := new(bool)
	c.SetBeforeFill(func() {
		if *overtaken {
			return
		}
		*overtaken = true
		heard := c.Invalidations()
		_, err := inbox.Apply(context.Background(), s, []inbox.Item{item})
		require.NoError(t, err)
		require.Eventually(t, func() bool { return c.Invalidations() > heard }, 2*time.Second, time.Millisecond,
			"the change is heard by the read it overtook")
	})
	return overtaken
}

// TestPageCacheDoesNotKeepAReadOvertakenByAChange: a page whose key changes
// after it was read from Redis, and before it enters the cache, is not kept:
// the invalidation that came meanwhile must not be lost.
func TestPageCacheDoesNotKeepAReadOvertakenByAChange(t *testing.T) {
	t.Parallel()
	s, c, _ := newPageCache(t, feeds.Config{InboxCap: 5, TTL: time.Hour})
	ctx := t.Context()
	_, err := inbox.Apply(ctx, s, []inbox.Item{materialise(1, 0, 10, 20)})
	require.NoError(t, err)

	overtakeOnce(t, s, c, push(2, 30))
	assert.Equal(t, ids(20, 10), cachedPage(t, c).Posts, "the read before the push")
	assert.Equal(t, ids(30, 20, 10), cachedPage(t, c).Posts, "the read after it")
	assert.Zero(t, c.Lookups("hit"))
}

// TestPageCacheDoesNotKeepAReadOvertakenByAPushIntoTheHead: the same race
// where the change is a push into a segmented inbox's head, which leaves the
// meta as it is: the read that declared the head hears of it, and the page is
// not kept.
func TestPageCacheDoesNotKeepAReadOvertakenByAPushIntoTheHead(t *testing.T) {
	t.Parallel()
	s, c, _ := newSegmentedPageCache(t)
	// The first read learns the head (and is not kept: it did not declare it).
	assert.Equal(t, ids(60, 50, 40, 30, 20, 10), cachedPage(t, c).Posts)

	overtaken := overtakeOnce(t, s, c, push(2, 70))
	assert.Equal(t, ids(60, 50, 40, 30, 20, 10), cachedPage(t, c).Posts, "the read before the push")
	require.True(t, *overtaken, "the second read declared the head and was about to be kept")
	assert.Equal(t, ids(70, 60, 50, 40, 30, 20, 10), cachedPage(t, c).Posts, "the read after it")
	assert.Zero(t, c.Lookups("hit"))
}

// TestPageCacheAfterItsSubscriberIsKilled: when the connection that hears
// the invalidations is lost, nothing cached before is served, and the pages
// cached after its reconnection are invalidated through the new connection.
func TestPageCacheAfterItsSubscriberIsKilled(t *testing.T) {
	t.Parallel()
	s, c, rdb := newPageCache(t, feeds.Config{InboxCap: 5, TTL: time.Hour})
	ctx := t.Context()
	_, err := inbox.Apply(ctx, s, []inbox.Item{materialise(1, 0, 10)})
	require.NoError(t, err)
	kill := func() {
		t.Helper()
		require.NoError(t, rdb.ClientKillByFilter(ctx, "TYPE", "pubsub").Err())
		require.Eventually(t, func() bool { return !c.Following() }, 2*time.Second, time.Millisecond)
		require.Eventually(t, c.Following, 5*time.Second, time.Millisecond)
	}

	assert.Equal(t, ids(10), cachedPage(t, c).Posts)
	kill()
	_, err = inbox.Apply(ctx, s, []inbox.Item{push(2, 20)})
	require.NoError(t, err)
	assert.Equal(t, ids(20, 10), cachedPage(t, c).Posts, "a page cached before the loss")

	// Kept anew, and invalidated through the new subscriber.
	assert.Equal(t, ids(20, 10), cachedPage(t, c).Posts)
	hits := c.Lookups("hit")
	assert.Equal(t, ids(20, 10), cachedPage(t, c).Posts)
	require.Equal(t, hits+1, c.Lookups("hit"))
	_, err = inbox.Apply(ctx, s, []inbox.Item{push(3, 30)})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		return assert.ObjectsAreEqual(ids(30, 20, 10), cachedPage(t, c).Posts)
	}, 2*time.Second, time.Millisecond, "a change after the reconnection")
}

// TestPageCacheOverARingReadsThroughTheReader: a page's transaction spans
// hash slots, so over a Ring (or a Cluster) the cache keeps nothing, even
// while it follows the invalidations, and every page is the Reader's.
func TestPageCacheOverARingReadsThroughTheReader(t *testing.T) {
	t.Parallel()
	_, rdb := newStore(t, feeds.Config{})
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"one": rdb.Options().Addr}})
	t.Cleanup(func() { _ = ring.Close() })
	s := feeds.NewStore(ring, feeds.Config{InboxCap: 5, TTL: time.Hour})
	ctx := t.Context()
	_, err := inbox.Apply(ctx, s, []inbox.Item{materialise(1, 0, 10, 20)})
	require.NoError(t, err)
	c := homefeed.NewPageCache(homefeed.NewReader(s, nil), &redis.Options{Addr: rdb.Options().Addr}, homefeed.PageCacheConfig{}, nil, slog.New(slog.DiscardHandler))
	follow(t, c)

	for range 2 {
		page, err := c.Page(ctx, alice, 0, 10, 0)
		require.NoError(t, err)
		assert.Equal(t, inbox.Page{Materialised: true, Posts: ids(20, 10)}, page)
	}
	assert.Zero(t, c.Lookups("hit")+c.Lookups("miss"), "nothing is looked up in memory")
}

// TestPageCacheDropsExpiredPages: pages past MaxAge, never served again, leave
// the cache as new ones come in rather than fill it.
func TestPageCacheDropsExpiredPages(t *testing.T) {
	t.Parallel()
	s, rdb := newStore(t, feeds.Config{InboxCap: 50, TTL: time.Hour})
	const maxAge = 200 * time.Millisecond
	c := homefeed.NewPageCache(homefeed.NewReader(s, nil), &redis.Options{Addr: rdb.Options().Addr}, homefeed.PageCacheConfig{MaxAge: maxAge}, nil, slog.New(slog.DiscardHandler))
	follow(t, c)
	ctx := t.Context()
	_, err := inbox.Apply(ctx, s, []inbox.Item{materialise(1, 0, 10, 20, 30, 40, 50, 60)})
	require.NoError(t, err)
	page := func(before int64) {
		t.Helper()
		_, err := c.Page(ctx, alice, before, 2, 0)
		require.NoError(t, err)
	}
	for _, before := range []int64{0, 60, 50, 40, 30} {
		page(before)
	}
	require.Equal(t, 5, c.Pages())
	time.Sleep(maxAge + maxAge/2)
	page(20)
	page(10)
	page(0)
	assert.Equal(t, 3, c.Pages(), "the five expired pages made way for three new ones")
}
