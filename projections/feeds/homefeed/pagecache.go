package homefeed

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/projections/feeds"
	"github.com/feedproject/feed/projections/feeds/inbox"
)

// PageCache keeps home feed pages in the API process, so that a page read
// again costs no round trip to Redis, and stays true by Redis's
// server-assisted client-side caching: the pages are read on connections
// with CLIENT TRACKING on, and Redis sends the name of every key they read
// (of a function call, every key it declares) to one subscriber connection
// when the key next changes.
//
// A page depends on the keys its read named: the inbox (its meta, and its
// head segment, which a push into the head changes alone: a change to a
// segment is heard as the inbox's), the user's followees and the big set,
// and the outboxes it merged. It is served only while none of them has been
// heard of as changed since its read began, so a read that an invalidation
// overtook is never kept. An invalidation in flight is the one window where
// a page may be older than Redis: a read that must see a log position
// (X-Min-Position) therefore goes to Redis.
//
// While the subscriber is not connected nothing is served from memory, and
// every (re)connection starts from an empty cache with new tracked
// connections, since Redis tracked the old ones for the old subscriber.
// Entries also expire after MaxAge. Redis's own commands (FLUSHALL, a key
// expiring or evicted) invalidate like any change.
//
// A single Redis only: a Redis Cluster or Ring serves through the Reader.
type PageCache struct {
	reader *Reader
	opts   redis.Options
	cfg    PageCacheConfig
	log    *slog.Logger

	lookups *prometheus.CounterVec
	// The lookups' counters by result, resolved once: every read counts one.
	hit, miss, fresh, off prometheus.Counter

	mu sync.Mutex
	// tracked reads the pages: its connections redirect their invalidations
	// to the subscriber of epoch; nil while there is none.
	tracked *redis.Client
	epoch   uint64
	// heard counts the keys invalidated so far; changed is when each key was
	// last invalidated (by heard), and a key not in it counts as changed at
	// forgotten (when changed was last cleared).
	heard     uint64
	changed   map[string]uint64
	forgotten uint64
	// The LRUs are golang-lru's simplelru under mu, so that a lookup, its
	// check and a fill are each one step.
	pages *simplelru.LRU[pageKey, *cachedPage]
	// refreshed is when this process last refreshed an inbox's TTL.
	refreshed *simplelru.LRU[string, time.Time]
	// heads is the key of each inbox's head as last read, by the inbox's
	// meta key: a page read declares it (see page.lua), and is kept only if
	// it was the head indeed.
	heads *simplelru.LRU[string, string]

	// syncs are the Sync calls waiting for their marker to come back.
	syncs  map[string]chan struct{}
	synced atomic.Uint64

	// beforeFill, when set (by tests), runs between a page's read from Redis
	// and its entry into the cache.
	beforeFill func()
	// invalidations counts the invalidation messages handled (for tests).
	invalidations atomic.Uint64
}

// PageCacheConfig sizes a PageCache; the zero value works.
type PageCacheConfig struct {
	// Pages is the most pages kept; default 50 000 (a page is about 400 bytes).
	Pages int
	// MaxAge bounds how long a page is served without being read again;
	// default 1 minute.
	MaxAge time.Duration
}

func (c PageCacheConfig) withDefaults() PageCacheConfig {
	if c.Pages <= 0 {
		c.Pages = 50_000
	}
	if c.MaxAge <= 0 {
		c.MaxAge = time.Minute
	}
	return c
}

// pageKey names one cached page: the keyspace version, the user and the
// page's range.
type pageKey struct {
	prefix string
	user   domain.UserID
	before int64
	n      int
}

type cachedPage struct {
	page  inbox.Page
	keys  []string
	epoch uint64
	// since is heard when the read began: a key changed after it makes the
	// page stale.
	since uint64
	at    time.Time
}

// subscriberPing is how often the subscriber checks its connection.
const subscriberPing = 2 * time.Second

// invalidateChannel is where Redis publishes invalidations to a redirect
// target (RESP2).
const invalidateChannel = "__redis__:invalidate"

// NewPageCache returns a cache of reader's pages whose own connections to
// Redis are made with opts (a copy is taken: not a live client's Options,
// which go-redis changes as it connects). Run must be running for it to serve
// from memory; until then every page is read through reader.
func NewPageCache(reader *Reader, opts *redis.Options, cfg PageCacheConfig, reg prometheus.Registerer, logger *slog.Logger) *PageCache {
	cfg = cfg.withDefaults()
	pages, _ := simplelru.NewLRU[pageKey, *cachedPage](cfg.Pages, nil)
	refreshed, _ := simplelru.NewLRU[string, time.Time](cfg.Pages, nil)
	heads, _ := simplelru.NewLRU[string, string](cfg.Pages, nil)
	own := *opts
	// Its connections speak RESP2, where maintenance notifications do not
	// exist; the config is a pointer that go-redis updates in place.
	own.MaintNotificationsConfig = nil
	c := &PageCache{
		reader:    reader,
		opts:      own,
		cfg:       cfg,
		log:       logger.With("component", "page-cache"),
		changed:   map[string]uint64{},
		syncs:     map[string]chan struct{}{},
		pages:     pages,
		refreshed: refreshed,
		heads:     heads,
		lookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "feed_page_cache_lookups_total",
			Help: "Home feed pages looked up in the API process's page cache, by result: hit, miss (read from Redis), fresh (a read with X-Min-Position, always from Redis) or off (invalidations not followed).",
		}, []string{"result"}),
	}
	c.hit, c.miss = c.lookups.WithLabelValues("hit"), c.lookups.WithLabelValues("miss")
	c.fresh, c.off = c.lookups.WithLabelValues("fresh"), c.lookups.WithLabelValues("off")
	if reg != nil {
		reg.MustRegister(c.lookups)
	}
	return c
}

// Page is Reader.Page, from memory when it can be. A read that must see the
// log position minPos (0: none) is always made in Redis.
func (c *PageCache) Page(ctx context.Context, user domain.UserID, before int64, n int, minPos uint64) (inbox.Page, error) {
	s := c.reader.store(ctx)
	if !s.SingleRedis() {
		// A page reads keys of several hash slots in one transaction.
		return c.reader.Page(ctx, user, before, n, minPos)
	}
	key := pageKey{s.Keys().Prefix(), user, before, n}
	c.mu.Lock()
	tracked, epoch, since := c.tracked, c.epoch, c.heard
	if e, ok := c.pages.Get(key); ok && minPos == 0 {
		if c.valid(e) {
			page := e.page
			c.mu.Unlock()
			c.hit.Inc()
			// Callers may append to the posts: not into the cache's array.
			page.Posts = slices.Clip(page.Posts)
			return page, nil
		}
		c.pages.Remove(key)
	}
	meta := s.Keys().Inbox(user)
	refresh := c.refreshDue(meta)
	head, _ := c.heads.Get(meta)
	c.mu.Unlock()

	switch {
	case tracked == nil:
		c.off.Inc()
		return c.reader.Page(ctx, user, before, n, minPos)
	case minPos > 0:
		c.fresh.Inc()
	default:
		c.miss.Inc()
	}
	page, read, err := inbox.ReadPageTracked(ctx, s.WithClient(tracked), user, before, n, refresh, head)
	if err != nil || !page.Materialised {
		// An error, or the first read of a user who has no inbox yet: not
		// worth keeping.
		return page, err
	}
	if read.Head != head {
		// The next read declares the head as read.
		c.mu.Lock()
		c.heads.Add(meta, read.Head)
		c.mu.Unlock()
		if read.Head != meta {
			// Read without its head declared (the first read of the inbox,
			// or its head moved since the last one): Redis will not say when
			// a push changes the head, so the page is not kept. (A small
			// inbox's head is its meta, which every read declares.)
			page.Posts = slices.Clip(page.Posts)
			return page, nil
		}
	}
	if c.beforeFill != nil {
		c.beforeFill()
	}
	// The head's changes are heard as the inbox's (see invalidate).
	keys := make([]string, 0, 3+len(read.Followed))
	keys = append(keys, meta, s.Keys().Following(user), s.Keys().Big())
	for _, a := range read.Followed {
		keys = append(keys, s.Keys().Outbox(a))
	}
	e := &cachedPage{page: page, keys: keys, epoch: epoch, since: since, at: time.Now()}
	c.mu.Lock()
	if c.valid(e) {
		c.pages.Add(key, e)
	}
	// Pages past MaxAge are never served again: each page added takes up to
	// two of them from the least recently used end, so they do not fill the
	// cache (the pages of later cursors, read once, filled it in minutes).
	for range 2 {
		_, old, ok := c.pages.GetOldest()
		if !ok || time.Since(old.at) <= c.cfg.MaxAge {
			break
		}
		c.pages.RemoveOldest()
	}
	c.mu.Unlock()
	page.Posts = slices.Clip(page.Posts)
	return page, nil
}

// valid reports whether e may be served: read on this subscription, not too
// old, and none of its keys changed since its read began. c.mu is held.
func (c *PageCache) valid(e *cachedPage) bool {
	if e.epoch != c.epoch || c.tracked == nil || time.Since(e.at) > c.cfg.MaxAge {
		return false
	}
	for _, k := range e.keys {
		at, ok := c.changed[k]
		if !ok {
			at = c.forgotten
		}
		if at > e.since {
			return false
		}
	}
	return true
}

// refreshDue reports whether an inbox's TTL is due for a refresh by this
// process, and counts it done. A refresh is a change to the key, which
// invalidates the pages cached from it, so it is made at most once per a
// hundredth of the TTL (and at least hourly), not on every read. c.mu is
// held.
func (c *PageCache) refreshDue(inbox string) bool {
	every := min(c.reader.base.Config().TTL/100, time.Hour)
	now := time.Now()
	if last, ok := c.refreshed.Get(inbox); ok && now.Sub(last) < every {
		return false
	}
	c.refreshed.Add(inbox, now)
	return true
}

// RequestMaterialise is Reader.RequestMaterialise.
func (c *PageCache) RequestMaterialise(ctx context.Context, user domain.UserID) error {
	return c.reader.RequestMaterialise(ctx, user)
}

// Position is Reader.Position.
func (c *PageCache) Position(ctx context.Context) (uint64, error) {
	return c.reader.Position(ctx)
}

// Run follows Redis's invalidations until ctx ends, reconnecting after
// failures; the cache serves from memory only while it runs.
func (c *PageCache) Run(ctx context.Context) error {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		started := time.Now()
		err := c.follow(ctx)
		c.reset(nil)
		if ctx.Err() != nil {
			return nil //nolint:nilerr // the subscription ends with the context
		}
		if time.Since(started) > time.Minute {
			backoff = 100 * time.Millisecond
		}
		c.log.Warn("redis invalidations lost; home feed pages are read from redis until they are back", "err", err, "retry_in", backoff)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return nil
		}
		backoff = min(2*backoff, 5*time.Second)
	}
	return nil
}

// follow subscribes to the invalidations and handles them until ctx ends
// or the subscription fails.
func (c *PageCache) follow(ctx context.Context) error {
	var id atomic.Int64
	subOpts := c.opts
	subOpts.Protocol = 2 // invalidations as pub/sub messages
	subOpts.OnConnect = func(ctx context.Context, cn *redis.Conn) error {
		v, err := cn.ClientID(ctx).Result()
		id.Store(v)
		return err
	}
	sub := redis.NewClient(&subOpts)
	defer func() { _ = sub.Close() }()
	ps := sub.Subscribe(ctx, invalidateChannel)
	defer func() { _ = ps.Close() }()
	// A connection that died without a word would leave the cache serving
	// pages whose invalidations nobody hears: the subscriber pings, and a
	// silence longer than a few pings ends it.
	pinging, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		t := time.NewTicker(subscriberPing)
		defer t.Stop()
		for {
			select {
			case <-pinging.Done():
				return
			case <-t.C:
				_ = ps.Ping(pinging)
			}
		}
	}()
	for {
		msg, err := ps.ReceiveTimeout(ctx, 3*subscriberPing)
		if err != nil {
			return fmt.Errorf("receive invalidations: %w", err)
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind != "subscribe" {
				continue
			}
			// A new connection (the first, or go-redis's reconnection): Redis
			// sends invalidations to it only from connections that name it.
			c.reset(c.trackedClient(id.Load()))
		case *redis.Message:
			if m.Payload != "" {
				c.markerBack(m.Payload)
				continue
			}
			c.invalidate(m.PayloadSlice)
		}
	}
}

// trackedClient returns a client whose connections have their reads
// tracked, with invalidations sent to the connection subscriber.
func (c *PageCache) trackedClient(subscriber int64) *redis.Client {
	opts := c.opts
	// RESP2, as the subscriber's: RESP3's push notifications are not used.
	opts.Protocol = 2
	opts.OnConnect = func(ctx context.Context, cn *redis.Conn) error {
		return cn.Do(ctx, "CLIENT", "TRACKING", "ON", "REDIRECT", subscriber).Err()
	}
	return redis.NewClient(&opts)
}

// reset forgets every page and makes tracked the client reads go through
// (nil: none, every page is read through the Reader).
func (c *PageCache) reset(tracked *redis.Client) {
	c.mu.Lock()
	old := c.tracked
	c.tracked = tracked
	c.epoch++
	c.pages.Purge()
	clear(c.changed)
	c.forgotten = c.heard
	// Nothing kept is served any more: the syncs have what they wait for.
	for marker, back := range c.syncs {
		close(back)
		delete(c.syncs, marker)
	}
	c.mu.Unlock()
	if old != nil {
		// Reads still in flight on it finish (or fall back) first.
		time.AfterFunc(5*time.Second, func() { _ = old.Close() })
	}
}

// Sync returns once the cache has heard the invalidations of every change
// Redis made before the call: a page it serves afterwards reflects them all.
// It sends a marker down the invalidations' channel, behind them (Redis
// queues a change's invalidations before it runs the next command), and waits
// for it. Not following the invalidations, the cache serves nothing from
// memory, and Sync returns at once.
func (c *PageCache) Sync(ctx context.Context) error {
	marker := fmt.Sprintf("sync %p %d", c, c.synced.Add(1))
	back := make(chan struct{})
	c.mu.Lock()
	following := c.tracked != nil
	if following {
		c.syncs[marker] = back
	}
	c.mu.Unlock()
	if !following {
		return nil
	}
	defer func() {
		c.mu.Lock()
		delete(c.syncs, marker)
		c.mu.Unlock()
	}()
	if err := c.reader.base.Client().Publish(ctx, invalidateChannel, marker).Err(); err != nil {
		return feeds.Fail("sync the page cache", err)
	}
	select {
	case <-back:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// markerBack ends the Sync that sent marker (another process's marker is
// not for this cache).
func (c *PageCache) markerBack(marker string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if back, ok := c.syncs[marker]; ok {
		close(back)
		delete(c.syncs, marker)
	}
}

// invalidate records that keys changed; no keys is Redis's way of saying
// that every key did (FLUSHALL, FLUSHDB).
func (c *PageCache) invalidate(keys []string) {
	defer c.invalidations.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.heard++
	if len(keys) == 0 {
		c.pages.Purge()
		clear(c.changed)
		c.forgotten = c.heard
		return
	}
	if len(c.changed)+len(keys) > 4*c.cfg.Pages {
		// Bounded memory: forgetting the keys makes every page stale.
		clear(c.changed)
		c.forgotten = c.heard
	}
	for _, k := range keys {
		c.changed[feeds.InboxOf(k)] = c.heard
	}
}
