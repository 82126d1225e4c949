package http

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/projections/feeds/inbox"
	"github.com/feedproject/feed/projections/readmodel"
)

// HomeFeedCache is the Redis side of the home feed.
type HomeFeedCache interface {
	// Page is a page of user's inbox; minPos is the reader's X-Min-Position
	// (0: none), which a cache kept in memory must honour.
	Page(ctx context.Context, user domain.UserID, before int64, n int, minPos uint64) (inbox.Page, error)
	RequestMaterialise(ctx context.Context, user domain.UserID) error
	Position(ctx context.Context) (uint64, error)
}

// HomeFeedModel is what the home feed needs of the read model: the pull feed
// (the truth, and the fallback) and hydration.
type HomeFeedModel interface {
	Feed(ctx context.Context, user domain.UserID, after *domain.Cursor, limit int) ([]readmodel.FeedEntry, error)
	Posts(ctx context.Context, ids []domain.PostID, viewer domain.UserID) (map[domain.PostID]readmodel.Post, error)
	Position(ctx context.Context) (uint64, error)
}

// FeedPosts hydrates the pages of the home feed (readmodel.Cache keeps them
// in memory between reads): the posts of ids in their order, less those that
// are gone. minPos is the reader's X-Min-Position (0: none).
type FeedPosts interface {
	Posts(ctx context.Context, ids []domain.PostID, viewer domain.UserID, minPos uint64) ([]readmodel.Post, error)
}

// modelPosts hydrates from the read model on every read.
type modelPosts struct{ model HomeFeedModel }

func (m modelPosts) Posts(ctx context.Context, ids []domain.PostID, viewer domain.UserID, _ uint64) ([]readmodel.Post, error) {
	byID, err := m.model.Posts(ctx, ids, viewer)
	if err != nil {
		return nil, err
	}
	posts := make([]readmodel.Post, 0, len(byID))
	for _, id := range ids {
		if p, ok := byID[id]; ok {
			posts = append(posts, p)
		}
	}
	return posts, nil
}

type homeFeed struct {
	cache     HomeFeedCache
	model     HomeFeedModel
	posts     FeedPosts
	log       *slog.Logger
	pages     *prometheus.CounterVec
	shed      prometheus.Counter
	waitFor   func(*fiber.Ctx) error
	wait      time.Duration
	positions *sharedPosition
	// fallbacks holds a token for each read of the pull feed under way.
	fallbacks chan struct{}
	// Failures every read meets while Redis is down, logged a line a second.
	cacheDown, positionUnknown, requestFailed *sampledLog
}

func registerHomeFeed(app *fiber.App, deps Deps, cfg Config, reg prometheus.Registerer) {
	h := &homeFeed{
		cache:           deps.FeedCache,
		model:           deps.FeedModel,
		log:             deps.Logger,
		wait:            cfg.ConsistencyWait,
		cacheDown:       newSampledLog(),
		positionUnknown: newSampledLog(),
		requestFailed:   newSampledLog(),
		pages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "feed_home_pages_total",
			Help: "Home feed pages served, by source: cache, postgres (cold inbox, Redis down) or mixed (the cache ran out).",
		}, []string{"source"}),
	}
	h.shed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "feed_home_shed_total",
		Help: "Home feed reads answered 503 because as many of its reads of Postgres as it makes at once were under way.",
	})
	h.fallbacks = make(chan struct{}, cfg.FeedFallbacks)
	reg.MustRegister(h.pages, h.shed)
	h.posts = deps.FeedPosts
	if h.posts == nil {
		h.posts = modelPosts{model: deps.FeedModel}
	}
	h.positions = &sharedPosition{lookup: func(ctx context.Context) (uint64, error) { return h.cache.Position(ctx) }, ttl: positionReuse}
	h.waitFor = func(c *fiber.Ctx) error {
		if h.cache == nil || h.model == nil {
			return fmt.Errorf("no home feed is configured: %w", domain.ErrUnavailable)
		}
		want, err := minPositionHeader(c)
		if err != nil {
			return err
		}
		// A position known already answers at once, without awaitPosition's
		// deadline for a lookup: a timer on every read.
		if pos, ok := h.positions.known(c.UserContext(), want); ok {
			c.Set(headerPosition, events.Position(pos))
			return nil
		}
		return awaitPosition(c, func(ctx context.Context) (uint64, error) { return h.position(ctx, want) }, cfg.ConsistencyWait)
	}
	app.Get("/feed", deps.Auth.requireAuth, h.feed)
}

// position is the feeds' position (at least min if it can be); with Redis down
// the page comes from the read model, whose writes the feeds position cannot
// vouch for, so it is reported as 0 rather than failing the read.
func (h *homeFeed) position(ctx context.Context, min uint64) (uint64, error) {
	pos, err := h.positions.get(ctx, min)
	if err != nil {
		h.positionUnknown.log(ctx, h.log, slog.LevelWarn, "home feed position unknown", "err", err)
		return 0, nil
	}
	return pos, nil
}

// positionReuse is how long one lookup of the feeds' position answers the
// reads that follow it.
const positionReuse = 10 * time.Millisecond

// sharedPosition shares lookups of the feeds' position among concurrent reads.
// Every read answers X-Position, and a lookup is a Redis read and one or two
// JetStream requests: at thousands of reads a second it cost more than the
// page itself. A position looked up before a read began is a lower bound of
// what the read sees, so it is still a true X-Position; a read that needs a
// higher one (X-Min-Position) does not take it and looks again.
type sharedPosition struct {
	lookup func(context.Context) (uint64, error)
	ttl    time.Duration

	mu     sync.Mutex
	pos    uint64
	at     time.Time       // when the lookup of pos began; zero: none yet
	flight *positionFlight // the lookup under way, if any
}

// positionFlight is one lookup; its result is set before done is closed.
type positionFlight struct {
	done chan struct{}
	pos  uint64
	err  error
}

// get returns a position of at least min looked up at most ttl ago, or the
// result of a lookup, joining the one under way rather than starting another.
// A read that asks for no position (min 0) never waits once a position is
// known: any position looked up before it began is a true answer, so it gets
// the last one, and an older one than ttl is looked up again in the
// background. Under load a lookup (JetStream requests to a busy server) can
// take far longer than the page itself.
func (s *sharedPosition) get(ctx context.Context, min uint64) (uint64, error) {
	for {
		if pos, ok := s.known(ctx, min); ok {
			return pos, nil
		}
		s.mu.Lock()
		f := s.flight
		if f == nil {
			f = &positionFlight{done: make(chan struct{})}
			s.flight = f
			s.mu.Unlock()
			s.fly(ctx, f)
			return f.pos, f.err
		}
		s.mu.Unlock()
		select {
		case <-f.done:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		if f.err != nil || f.pos >= min {
			return f.pos, f.err
		}
		// It began before the position this read waits for: look again.
	}
}

// known is get's answer when it needs no lookup: a position of at least min
// looked up at most ttl ago, or for min 0 the last one (starting a lookup in
// the background if it is older than ttl); ok is false if there is none.
func (s *sharedPosition) known(ctx context.Context, min uint64) (pos uint64, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	looked := !s.at.IsZero()
	fresh := looked && time.Since(s.at) < s.ttl
	if !looked || s.pos < min || (!fresh && min > 0) {
		return 0, false
	}
	if !fresh && s.flight == nil {
		f := &positionFlight{done: make(chan struct{})}
		s.flight = f
		go func() {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), readTimeout)
			defer cancel()
			s.fly(ctx, f)
		}()
	}
	return s.pos, true
}

func (s *sharedPosition) fly(ctx context.Context, f *positionFlight) {
	began := time.Now()
	f.pos, f.err = s.lookup(ctx)
	s.mu.Lock()
	if f.err == nil {
		s.pos, s.at = f.pos, began
	}
	s.flight = nil
	s.mu.Unlock()
	close(f.done)
}

// minPosition is the request's X-Min-Position, 0 when absent (awaitPosition
// refuses a bad one).
func minPosition(c *fiber.Ctx) uint64 {
	var want uint64
	if v := c.Get(headerMinPosition); v != "" {
		want, _ = events.ParsePosition(v)
	}
	return want
}

// feed serves the home feed: the ids of a page from the inbox above its floor
// (with big accounts' posts merged in), continued from the read model's pull
// feed below it, or from the pull feed alone when the inbox is cold or Redis is
// down; then the page is hydrated in one query.
func (h *homeFeed) feed(c *fiber.Ctx) error {
	p, _ := principal(c)
	cursor, err := cursorParam(c)
	if err != nil {
		return err
	}
	if err := h.waitFor(c); err != nil {
		return err
	}
	ctx, cancel := queryContext(c)
	defer cancel()
	ids, err := h.ids(ctx, p.UserID, cursor, minPosition(c))
	if err != nil {
		return err
	}
	hasMore := len(ids) > domain.PageSize
	if hasMore {
		ids = ids[:domain.PageSize]
	}
	posts, err := h.hydrate(ctx, ids, p.UserID, minPosition(c))
	if err != nil {
		return err
	}
	var next *domain.Cursor
	if hasMore {
		// From the id page, not the hydrated one: a post deleted meanwhile must
		// not move the cursor back.
		last := ids[len(ids)-1]
		next = &domain.Cursor{ID: int64(last), Unix: domain.IDTime(int64(last)).Unix()}
	}
	return sendFeedPage(c, posts, next)
}

// hydrate reads the page's posts from the read model in one query. The feeds
// may be ahead of the read model: a post just pushed may not be there yet, and
// leaving it out would let the cursor pass it for good; so when posts are
// missing and the read model is behind the feeds, it waits (up to the
// consistency bound) for it and reads once more. Posts still missing were
// deleted. A read model still behind the feeds after the wait answers
// unavailable: a page without a post it has not reached would let the
// cursor pass it for good.
func (h *homeFeed) hydrate(ctx context.Context, ids []domain.PostID, viewer domain.UserID, minPos uint64) ([]readmodel.Post, error) {
	posts, err := h.posts.Posts(ctx, ids, viewer, minPos)
	if err != nil || len(posts) == len(ids) {
		return posts, err
	}
	target, err := h.cache.Position(ctx)
	if err != nil {
		return posts, nil //nolint:nilerr // without the feeds' position, serve what is known
	}
	deadline := time.Now().Add(h.wait)
	for backoff := firstPoll; ; backoff = min(2*backoff, maxPoll) {
		pos, err := h.model.Position(ctx)
		if err != nil {
			return nil, err
		}
		if pos >= target {
			return h.posts.Posts(ctx, ids, viewer, minPos)
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("hydrate a page: the read model is at %d, behind the feeds at %d: %w", pos, target, domain.ErrUnavailable)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(backoff):
		}
	}
}

// awaitModel waits, up to the consistency bound, until the read model has
// applied minPos; past the bound the page is read from what it has.
func (h *homeFeed) awaitModel(ctx context.Context, minPos uint64) error {
	if minPos == 0 {
		return nil
	}
	deadline := time.Now().Add(h.wait)
	for backoff := firstPoll; ; backoff = min(2*backoff, maxPoll) {
		pos, err := h.model.Position(ctx)
		if err != nil || pos >= minPos || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
	}
}

// ids is one more than a page of post ids below the cursor.
func (h *homeFeed) ids(ctx context.Context, user domain.UserID, cursor *domain.Cursor, minPos uint64) ([]domain.PostID, error) {
	const want = domain.PageSize + 1
	var before int64
	if cursor != nil {
		before = cursor.ID
	}
	page, err := h.cache.Page(ctx, user, before, want, minPos)
	if err != nil || !page.Materialised || (len(page.Posts) < want && page.Floor != 0) {
		// Read from the read model: it must have what the reader wrote, as
		// the feeds have (a follow just made), though it may be behind them.
		if err := h.awaitModel(ctx, minPos); err != nil {
			return nil, err
		}
	}
	switch {
	case err != nil:
		h.cacheDown.log(ctx, h.log, slog.LevelError, "home feed cache unavailable; serving from postgres", "user", user, "err", err)
		h.pages.WithLabelValues("postgres").Inc()
		return h.pull(ctx, user, cursor, want)
	case !page.Materialised:
		if err := h.cache.RequestMaterialise(ctx, user); err != nil {
			h.requestFailed.log(ctx, h.log, slog.LevelWarn, "request inbox", "user", user, "err", err)
		}
		h.pages.WithLabelValues("postgres").Inc()
		return h.pull(ctx, user, cursor, want)
	case len(page.Posts) == want, page.Floor == 0:
		// A full page, or the feed's end: at floor 0 the inbox and the big
		// followees' outboxes hold every post of the feed, so a short page
		// is its last. (A feed of a few posts would otherwise be read from
		// Postgres on every page: at a service's start, all of them.)
		h.pages.WithLabelValues("cache").Inc()
		return page.Posts, nil
	}
	// The cache holds every post above its floor, and this page reaches below
	// it: the rest comes from the read model, after the last cached post.
	h.pages.WithLabelValues("mixed").Inc()
	from := cursor
	if n := len(page.Posts); n > 0 {
		from = &domain.Cursor{ID: int64(page.Posts[n-1])}
	}
	rest, err := h.pull(ctx, user, from, want-len(page.Posts))
	if err != nil {
		return nil, err
	}
	return append(page.Posts, rest...), nil
}

// fallbackWait is how long a read of the pull feed waits for one of the
// others under way to end before it is refused: long enough for a burst of
// cold inboxes (every user's first read after Redis lost its data, hundreds
// at once) to be served, short enough that a read refused is told so within
// a second.
const fallbackWait = time.Second

// pull reads the pull feed, at most Config.FeedFallbacks of them at once. A
// cache that fails, or is only slow, sends every read here, each a query
// costlier than the page from Redis; unbounded, they would queue for
// Postgres's connections until they timed out (decision 43). A read that finds
// every slot taken waits fallbackWait for one and is then answered 503 with
// Retry-After, so Postgres serves what it can at full speed and the rest are
// told to come back, rather than every read waiting and most failing.
func (h *homeFeed) pull(ctx context.Context, user domain.UserID, after *domain.Cursor, n int) ([]domain.PostID, error) {
	select {
	case h.fallbacks <- struct{}{}:
	default:
		t := time.NewTimer(fallbackWait)
		select {
		case h.fallbacks <- struct{}{}:
			t.Stop()
		case <-t.C:
			h.shed.Inc()
			return nil, fmt.Errorf("home feed of %d: %d reads of postgres under way: %w", user, cap(h.fallbacks), domain.ErrUnavailable)
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("home feed of %d: wait to read postgres: %w: %w", user, domain.ErrUnavailable, ctx.Err())
		}
	}
	defer func() { <-h.fallbacks }()
	entries, err := h.model.Feed(ctx, user, after, n)
	if err != nil {
		return nil, err
	}
	ids := make([]domain.PostID, len(entries))
	for i, e := range entries {
		ids[i] = e.PostID
	}
	return ids, nil
}
