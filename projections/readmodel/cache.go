package readmodel

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
)

// Cache keeps hydrated posts in memory, so that a page of the home feed whose
// ids come from Redis is served without Postgres. It is never staler than the
// read model by more than the time it takes to hear of an event:
//
//   - Each entry is a post (or one viewer's like of it) exactly as the read
//     model held it at a known log position, its asOf: the projector's
//     checkpoint read in the same snapshot as the rows (Store.PostsAt).
//   - Watch follows the log. An event on a post (an edit, a delete, a like
//     the cache cannot apply exactly) drops the entries of that post older
//     than the event and marks the post dirty up to it.
//   - A post's creation puts it in, as the read model holds it once the event
//     is applied (CreatedPost), with its position as asOf: a post is created
//     once, by its first event, so no other event on it can precede it, and
//     every later one drops or changes it. A home feed's first page is mostly
//     posts seconds old, which would otherwise each be read from Postgres.
//   - A post with no likes is liked by no viewer. Its entry, created or read
//     so, keeps its likers from the likes heard of since (up to maxLikers),
//     answers for every viewer without a like state of each, and a like or a
//     comment changes it as the projector changes the row, rather than
//     dropping it: a first page's posts are the ones being liked.
//   - A read that began before the event but fills the cache after it carries
//     an asOf below the mark and is not kept. Marks are forgotten once the read
//     model is seen past them, and fills from before that (below floor) are not
//     kept either.
//
// A read with X-Min-Position above what the cache has heard of skips it, so a
// client reads its own edits and likes; while the log cannot be followed the
// cache serves nothing. Entries also expire after MaxAge, which bounds what an
// operator's partial rebuild (replay --from) could leave behind. An entry read
// when past half its MaxAge is served and read again from Postgres in the
// background (refresh), so the posts in use do not all expire at once, each
// page of them then waiting for Postgres.
type Cache struct {
	store  *Store
	log    *events.Log
	cfg    CacheConfig
	logger *slog.Logger
	// hits and misses count posts looked up, by result; resolved once, not
	// by label on every read.
	hits, misses prometheus.Counter

	mu sync.Mutex
	// live is whether the log is being followed; only then are entries served.
	live bool
	// seen is the position of the last event heard of: every event up to it
	// has dropped what it touched.
	seen uint64
	// floor is the lowest asOf a fill may have to be kept; model is the highest
	// position of the read model seen (a read's asOf, or its checkpoint read
	// on its own: see watchModel), and modelBefore its value at the last prune.
	floor, model, modelBefore uint64
	pruned                    time.Time
	// pruneEvery is how often prune forgets marks, and watchModel reads the
	// read model's position (pruneInterval; tests shorten it).
	pruneEvery time.Duration
	posts      *simplelru.LRU[domain.PostID, cachedPost]
	likes      *simplelru.LRU[viewerLike, cachedLike]
	// dirty marks each post with the last event heard of on it (a like's mark
	// is its post's: a like changes the post's count too).
	dirty map[domain.PostID]uint64

	// pending holds the entries to read again (refresh), a post alone under
	// viewer 0; wake tells the refresher there are some.
	pending map[viewerLike]bool
	wake    chan struct{}

	// beforeFill, if set, runs between a read from Postgres and its fill, for
	// tests of that race.
	beforeFill func()
}

// maxPending bounds the entries waiting to be read again; past it, entries
// expire and are read by the page that needs them.
const maxPending = 10_000

// CacheConfig sizes a Cache; zero fields take the defaults.
type CacheConfig struct {
	// Posts is how many posts are kept (default 100 000, ~1 KiB each).
	Posts int
	// Likes is how many (viewer, post) like states are kept (default 500 000).
	Likes int
	// MaxAge is how long an entry is served (default one minute).
	MaxAge time.Duration
	// MaxDirty is how many dirty marks are kept while the read model lags;
	// beyond it the cache starts over (default 200 000).
	MaxDirty int
}

type cachedPost struct {
	post Post // HasLiked false: likes are per viewer
	asOf uint64
	at   time.Time
	// likers, when likersKnown, are all who like the post as of asOf: none
	// from its creation or a read that found no likes, then the likes heard
	// since, up to maxLikers. They answer has_liked for every viewer, and let
	// a like change the entry rather than drop it.
	likers      []domain.UserID
	likersKnown bool
}

// maxLikers bounds the likers an entry keeps; a post liked more is dropped by
// its next like, and its viewers' like states are read from Postgres.
const maxLikers = 32

type viewerLike struct {
	viewer domain.UserID
	post   domain.PostID
}

type cachedLike struct {
	liked bool
	asOf  uint64
	at    time.Time
}

// pruneInterval is how often dirty marks the read model has passed are
// forgotten.
const pruneInterval = time.Second

// NewCache returns a cache over store, to be kept current by Run; reg (if not
// nil) gets its hit and miss counts.
func NewCache(store *Store, log *events.Log, cfg CacheConfig, reg prometheus.Registerer, logger *slog.Logger) *Cache {
	if cfg.Posts <= 0 {
		cfg.Posts = 100_000
	}
	if cfg.Likes <= 0 {
		cfg.Likes = 500_000
	}
	if cfg.MaxAge <= 0 {
		cfg.MaxAge = time.Minute
	}
	if cfg.MaxDirty <= 0 {
		cfg.MaxDirty = 200_000
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	lookups := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "feed_post_cache_lookups_total",
		Help: "Posts looked up in the in-memory cache of hydrated posts, by result (hit, miss).",
	}, []string{"result"})
	if reg != nil {
		reg.MustRegister(lookups)
	}
	c := &Cache{
		store: store, log: log, cfg: cfg, logger: logger,
		hits: lookups.WithLabelValues("hit"), misses: lookups.WithLabelValues("miss"),
		wake: make(chan struct{}, 1), pruneEvery: pruneInterval,
	}
	c.reset(0)
	return c
}

// reset empties the cache; only reads reflecting at least floor may fill it.
// The caller holds mu (or has the only reference).
func (c *Cache) reset(floor uint64) {
	// NewLRU fails only for a size below 1, which NewCache rules out.
	c.posts, _ = simplelru.NewLRU[domain.PostID, cachedPost](c.cfg.Posts, nil)
	c.likes, _ = simplelru.NewLRU[viewerLike, cachedLike](c.cfg.Likes, nil)
	c.dirty = make(map[domain.PostID]uint64)
	c.pending = make(map[viewerLike]bool)
	c.floor, c.model, c.modelBefore = floor, floor, floor
	c.pruned = time.Now()
}

// Run follows the log and keeps the cache current until ctx ends. When it
// cannot follow the log, the cache serves nothing until it can again.
func (c *Cache) Run(ctx context.Context) error {
	refreshing, watching := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(refreshing)
		c.refresh(ctx)
	}()
	go func() {
		defer close(watching)
		c.watchModel(ctx)
	}()
	defer func() { <-refreshing; <-watching }()
	const firstBackoff = 100 * time.Millisecond
	backoff := firstBackoff
	for {
		began := time.Now()
		head, err := c.log.Head(ctx)
		if err == nil {
			c.mu.Lock()
			c.reset(head)
			c.seen, c.live = head, true
			c.mu.Unlock()
			err = c.log.Watch(ctx, head, c.touched)
		}
		c.mu.Lock()
		c.live = false
		c.reset(0)
		c.mu.Unlock()
		if ctx.Err() != nil {
			return nil // the end of ctx, not a failure to report
		}
		c.logger.Warn("post cache cannot follow the log; reads go to postgres", "err", err)
		if time.Since(began) > time.Minute {
			backoff = firstBackoff // it had been following the log
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 10*time.Second)
	}
}

// touched applies the event at t to what it touches: a post's events, likes
// and comments change how it hydrates; a like also changes its actor's
// has_liked. A creation puts the post in; a comment, and a like of a post
// whose likers are known, change the entry as the read model changes the row;
// anything else drops it.
func (c *Cache) touched(t events.Touch) error {
	actor, kind, target, ok := events.ParseSubject(t.Subject)
	var ev events.Event
	if ok {
		// Undecodable: dropped, and the projector reports it.
		if rec, err := c.log.Decode(t.Data, t.Seq, t.Subject); err == nil {
			ev = rec.Event
		}
	}
	post := domain.PostID(target)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seen = t.Seq
	if ok {
		switch kind {
		case events.KindPost:
			c.dropPost(post, t.Seq)
			if e, ok := ev.(events.PostCreated); ok && e.PostID == post && creates(e) {
				if _, ok := c.posts.Peek(post); !ok { // none read at or after t
					c.posts.Add(post, cachedPost{post: CreatedPost(e), asOf: t.Seq, at: time.Now(), likersKnown: true})
				}
			}
		case events.KindComment:
			e, ok := ev.(events.CommentAdded)
			if !ok || e.PostID != post || domain.ValidateComment(e.Text) != nil ||
				!c.update(post, t.Seq, func(p *cachedPost) bool { p.post.CommentCount++; return true }) {
				c.dropPost(post, t.Seq)
			}
		case events.KindLike:
			var liked bool
			switch e := ev.(type) {
			case events.PostLiked:
				liked, ok = true, e.PostID == post && e.UserID == actor
			case events.PostUnliked:
				liked, ok = false, e.PostID == post && e.UserID == actor
			default:
				ok = false
			}
			k := viewerLike{viewer: actor, post: post}
			if !ok || !c.update(post, t.Seq, func(p *cachedPost) bool { return p.like(actor, liked) }) {
				c.dropPost(post, t.Seq)
			}
			if !ok {
				c.dropLike(k, t.Seq)
			} else if e, found := c.likes.Peek(k); !found || e.asOf < t.Seq {
				c.likes.Add(k, cachedLike{liked: liked, asOf: t.Seq, at: time.Now()})
			}
		}
	}
	c.prune(time.Now())
	return nil
}

// creates reports whether the read model takes e: the API's own checks, which
// the read model's constraints follow.
func creates(e events.PostCreated) bool {
	return domain.ValidateCaption(e.Caption) == nil && domain.ValidateImageCount(len(e.Media)) == nil
}

// update changes post's entry by the event at seq, if it has one older than
// the event, and marks the post dirty up to it; false if change could not
// (the caller then drops the entry).
func (c *Cache) update(post domain.PostID, seq uint64, change func(*cachedPost) bool) bool {
	c.dirty[post] = max(c.dirty[post], seq)
	e, ok := c.posts.Peek(post)
	if !ok || e.asOf >= seq {
		return true // nothing held, or held as of after the event
	}
	if !change(&e) {
		return false
	}
	e.asOf = seq
	c.posts.Add(post, e)
	return true
}

// like records viewer's like (liked) or unlike of the post as the read model
// does: a like counts once, an unlike only undoes one. Without the likers
// known, or past maxLikers of them, it cannot.
func (e *cachedPost) like(viewer domain.UserID, liked bool) bool {
	if !e.likersKnown {
		return false
	}
	i := slices.Index(e.likers, viewer)
	switch {
	case liked && i < 0:
		if len(e.likers) >= maxLikers {
			return false
		}
		e.likers = append(slices.Clip(e.likers), viewer)
		e.post.LikeCount++
	case !liked && i >= 0:
		e.likers = slices.Delete(slices.Clone(e.likers), i, i+1)
		e.post.LikeCount--
	}
	return true
}

func (c *Cache) dropPost(id domain.PostID, seq uint64) {
	if e, ok := c.posts.Peek(id); ok && e.asOf < seq {
		c.posts.Remove(id)
	}
	c.dirty[id] = max(c.dirty[id], seq)
}

func (c *Cache) dropLike(k viewerLike, seq uint64) {
	if e, ok := c.likes.Peek(k); ok && e.asOf < seq {
		c.likes.Remove(k)
	}
}

// prune forgets the dirty marks the read model had passed at the last prune: a
// read begun since reflects them. Reads begun before that are not kept (the
// floor rises). If the read model lags so far that the marks pile up, the cache
// starts over above everything heard of. The caller holds mu.
func (c *Cache) prune(now time.Time) {
	if len(c.dirty) > c.cfg.MaxDirty {
		c.logger.Warn("post cache: the read model lags far behind the log; starting over", "heard", c.seen, "read_model", c.model)
		c.reset(c.seen)
		return
	}
	if now.Sub(c.pruned) < c.pruneEvery {
		return
	}
	passed := c.modelBefore
	for id, seq := range c.dirty {
		if seq <= passed {
			delete(c.dirty, id)
		}
	}
	c.floor = max(c.floor, passed)
	c.modelBefore = c.model
	c.pruned = now
	c.expire(now)
}

// expire removes the entries past MaxAge from the least recently used end, up
// to the first that is not: they are never served again, yet under steady
// load they would fill the cache, the memory rising all the while.
// c.mu is held.
func (c *Cache) expire(now time.Time) {
	for {
		_, e, ok := c.posts.GetOldest()
		if !ok || now.Sub(e.at) < c.cfg.MaxAge {
			break
		}
		c.posts.RemoveOldest()
	}
	for {
		_, e, ok := c.likes.GetOldest()
		if !ok || now.Sub(e.at) < c.cfg.MaxAge {
			break
		}
		c.likes.RemoveOldest()
	}
}

// watchModel reads the read model's position every pruneEvery until ctx
// ends, for prune: a read begun after it reflects every event up to it, as a
// read that reports its asOf does. Without it the marks were only ever
// forgotten past what reads from Postgres reported, and a cache that served
// every page from memory (new posts go in at their creation) kept all its
// marks until MaxDirty, then started over, sending every page's posts to
// Postgres at once.
func (c *Cache) watchModel(ctx context.Context) {
	t := time.NewTicker(c.pruneEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pos, err := c.store.Position(ctx)
		if err != nil {
			continue // reads still report theirs; the next tick tries again
		}
		c.mu.Lock()
		if c.live {
			c.model = max(c.model, pos)
		}
		c.mu.Unlock()
	}
}

// Posts hydrates ids for viewer (0: anonymous) like Store.Posts, but as a
// list in the order of ids (a page needs no map: building one cost a tenth of
// a cached page), leaving out the posts that are gone; from memory where it
// can and from Postgres for the rest, in one query. minPos is the log position
// the reader asked for (X-Min-Position, 0 for none): until the cache has heard
// of every event up to it, it is not used. The posts returned share their
// Media slices with the cache: callers must not modify them.
func (c *Cache) Posts(ctx context.Context, ids []domain.PostID, viewer domain.UserID, minPos uint64) ([]Post, error) {
	out := make([]Post, len(ids))
	missing := c.cached(ids, viewer, minPos, out)
	if len(missing) == 0 {
		return out, nil
	}
	read, asOf, err := c.store.PostsAt(ctx, missing, viewer)
	if err != nil {
		return nil, err
	}
	if c.beforeFill != nil {
		c.beforeFill()
	}
	c.fill(read, asOf, viewer)
	n := 0
	for i, id := range ids {
		p := out[i]
		if p.ID == 0 { // not in memory
			var ok bool
			if p, ok = read[id]; !ok {
				continue
			}
		}
		out[n] = p
		n++
	}
	return out[:n], nil
}

// cached puts into out, at their places in ids, the posts it holds and
// returns the ids it does not.
func (c *Cache) cached(ids []domain.PostID, viewer domain.UserID, minPos uint64, out []Post) []domain.PostID {
	now := time.Now()
	var missing []domain.PostID
	c.mu.Lock()
	if !c.live || c.seen < minPos {
		c.mu.Unlock()
		c.misses.Add(float64(len(ids)))
		return ids
	}
	for i, id := range ids {
		e, ok := c.posts.Get(id)
		if !ok || now.Sub(e.at) >= c.cfg.MaxAge {
			missing = append(missing, id)
			continue
		}
		old := now.Sub(e.at) >= c.cfg.MaxAge/2
		switch {
		case viewer == 0:
		case e.likersKnown:
			e.post.HasLiked = slices.Contains(e.likers, viewer)
		default:
			l, ok := c.likes.Get(viewerLike{viewer: viewer, post: id})
			if !ok || now.Sub(l.at) >= c.cfg.MaxAge {
				missing = append(missing, id)
				continue
			}
			e.post.HasLiked = l.liked
			old = old || now.Sub(l.at) >= c.cfg.MaxAge/2
		}
		if old {
			c.queueRefresh(viewerLike{viewer: viewer, post: id})
		}
		out[i] = e.post
	}
	c.mu.Unlock()
	if hits := len(ids) - len(missing); hits > 0 {
		c.hits.Add(float64(hits))
	}
	if len(missing) > 0 {
		c.misses.Add(float64(len(missing)))
	}
	return missing
}

// queueRefresh asks the refresher to read k's post (and viewer's like of it)
// again. The caller holds mu.
func (c *Cache) queueRefresh(k viewerLike) {
	if c.pending[k] || len(c.pending) >= maxPending {
		return
	}
	c.pending[k] = true
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// refresh reads again, until ctx ends, the entries queued by queueRefresh:
// each viewer's in one query (a post alone is viewer 0's), filled as any read
// is, so an event heard of meanwhile still wins.
func (c *Cache) refresh(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.wake:
		}
		c.mu.Lock()
		pending := c.pending
		c.pending = make(map[viewerLike]bool)
		c.mu.Unlock()
		byViewer := map[domain.UserID][]domain.PostID{}
		for k := range pending {
			byViewer[k.viewer] = append(byViewer[k.viewer], k.post)
		}
		for viewer, ids := range byViewer {
			read, asOf, err := c.store.PostsAt(ctx, ids, viewer)
			if err != nil {
				if ctx.Err() == nil {
					c.logger.Warn("post cache: reading posts again failed; they expire instead", "err", err)
				}
				break
			}
			c.fill(read, asOf, viewer)
		}
	}
}

// fill keeps the posts read at asOf, unless an event heard of since (a dirty
// mark above asOf) or a prune (the floor) says they may be out of date.
func (c *Cache) fill(read map[domain.PostID]Post, asOf uint64, viewer domain.UserID) {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.live || len(read) == 0 {
		return
	}
	c.model = max(c.model, asOf)
	if asOf < c.floor {
		return
	}
	for id, p := range read {
		if asOf < c.dirty[id] {
			continue // and so is the viewer's like state
		}
		if e, ok := c.posts.Peek(id); !ok || e.asOf <= asOf {
			content := p
			content.HasLiked = false
			c.posts.Add(id, cachedPost{post: content, asOf: asOf, at: now, likersKnown: p.LikeCount == 0})
		}
		if viewer == 0 {
			continue
		}
		k := viewerLike{viewer: viewer, post: id}
		if e, ok := c.likes.Peek(k); !ok || e.asOf <= asOf {
			c.likes.Add(k, cachedLike{liked: p.HasLiked, asOf: asOf, at: now})
		}
	}
}

// Heard is the position of the last event the cache has heard of, 0 while it
// is not following the log.
func (c *Cache) Heard() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.live {
		return 0
	}
	return c.seen
}
