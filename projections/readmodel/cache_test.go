package readmodel_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/projections/readmodel"
)

// cacheWorld is a log, a read model kept up with it by the live projector, and
// a post cache following the log.
type cacheWorld struct {
	log   *events.Log
	pool  *pgxpool.Pool
	store *readmodel.Store
	cache *readmodel.Cache
	n     int
}

func newCacheWorld(t *testing.T, cfg readmodel.CacheConfig, reg prometheus.Registerer, beforeFill func()) *cacheWorld {
	t.Helper()
	return newCacheWorldWith(t, cfg, reg, func(c *readmodel.Cache) {
		if beforeFill != nil {
			readmodel.SetBeforeFill(c, beforeFill)
		}
	})
}

// newCacheWorldWith is newCacheWorld with set run on the cache before it runs.
func newCacheWorldWith(t *testing.T, cfg readmodel.CacheConfig, reg prometheus.Registerer, set func(*readmodel.Cache)) *cacheWorld {
	t.Helper()
	log := pjLog(t)
	pool := openPool(t, nil)
	w := &cacheWorld{log: log, pool: pool, store: readmodel.NewStore(pool)}
	liveRunner(t, log, readmodel.NewProjector(pool, nil))
	w.cache = readmodel.NewCache(w.store, log, cfg, reg, slog.New(slog.DiscardHandler))
	set(w.cache)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.cache.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	// An event first, so that hearing it tells the cache follows the log: the
	// events a test appends after are heard of (a post's creation puts it in).
	w.append(t, events.UserFollowed{FollowerID: 9998, FolloweeID: 9999})
	head := w.head(t)
	require.Eventually(t, func() bool { return w.cache.Heard() >= head }, 10*time.Second, 5*time.Millisecond)
	return w
}

func (w *cacheWorld) head(t *testing.T) uint64 {
	t.Helper()
	head, err := w.log.Head(context.Background())
	require.NoError(t, err)
	return head
}

func (w *cacheWorld) append(t *testing.T, ev events.Event) {
	t.Helper()
	w.n++
	_, err := w.log.AppendEvent(context.Background(), fmt.Sprintf("c%d", w.n), time.Now(), ev)
	require.NoError(t, err)
}

// settled waits until the read model has applied the whole log and the cache
// has heard of all of it.
func (w *cacheWorld) settled(t *testing.T) {
	t.Helper()
	head := w.head(t)
	require.Eventually(t, func() bool {
		pos, err := w.store.Position(context.Background())
		return err == nil && pos >= head && w.cache.Heard() >= head
	}, 30*time.Second, 5*time.Millisecond, "read model and cache did not reach %d", head)
}

// same checks that the cache hydrates ids for viewer exactly as Postgres does,
// in the order of ids.
func (w *cacheWorld) same(t *testing.T, ids []domain.PostID, viewer domain.UserID) {
	t.Helper()
	byID, err := w.store.Posts(context.Background(), ids, viewer)
	require.NoError(t, err)
	want := []readmodel.Post{}
	for _, id := range ids {
		if p, ok := byID[id]; ok {
			want = append(want, p)
		}
	}
	got, err := w.cache.Posts(context.Background(), ids, viewer, 0)
	require.NoError(t, err)
	assert.Equal(t, want, got, "viewer %d", viewer)
}

// TestCacheDoesNotKeepAReadOvertakenByAnEvent is the cache's known race: a read
// from Postgres begins, an edit and a like are appended, applied and heard of,
// and only then does the read fill the cache. Kept, it would serve the old
// caption and like state until the post changed again.
func TestCacheDoesNotKeepAReadOvertakenByAnEvent(t *testing.T) {
	for _, late := range []struct {
		name string
		// meanwhile runs while the read is held, after the events are heard of.
		meanwhile func(t *testing.T, w *cacheWorld, other domain.PostID)
	}{
		{name: "dirty mark", meanwhile: func(*testing.T, *cacheWorld, domain.PostID) {}},
		{name: "after the mark is pruned", meanwhile: func(t *testing.T, w *cacheWorld, other domain.PostID) {
			// Reads of another post show the read model past the edit; two
			// prunes later the edit's mark is forgotten, and only the floor
			// stops the held read.
			for range 3 {
				_, err := w.cache.Posts(context.Background(), []domain.PostID{other}, 0, 0)
				require.NoError(t, err)
				time.Sleep(1100 * time.Millisecond)
				w.append(t, events.UserFollowed{FollowerID: 8, FolloweeID: 9})
				w.settled(t)
			}
		}},
	} {
		t.Run(late.name, func(t *testing.T) {
			var (
				hold    atomic.Bool
				held    = make(chan struct{})
				release = make(chan struct{})
			)
			w := newCacheWorld(t, readmodel.CacheConfig{}, nil, func() {
				if hold.CompareAndSwap(true, false) {
					close(held)
					<-release
				}
			})
			const post, other domain.PostID = 1_000_001, 1_000_002
			const viewer domain.UserID = 5
			w.append(t, created(post, 1))
			w.append(t, created(other, 2))
			// Edits (to the same captions) drop what the creations put in, so
			// that the reads below go to Postgres.
			w.append(t, events.PostEdited{PostID: post, UserID: 1, Caption: "post 1000001", EditedAt: time.Now()})
			w.append(t, events.PostEdited{PostID: other, UserID: 2, Caption: "post 1000002", EditedAt: time.Now()})
			w.settled(t)

			hold.Store(true)
			read := make(chan []readmodel.Post, 1)
			go func() {
				got, err := w.cache.Posts(context.Background(), []domain.PostID{post}, viewer, 0)
				assert.NoError(t, err)
				read <- got
			}()
			<-held
			w.append(t, events.PostEdited{PostID: post, UserID: 1, Caption: "edited", EditedAt: time.Now()})
			w.append(t, events.PostLiked{UserID: viewer, PostID: post})
			w.settled(t)
			late.meanwhile(t, w, other)
			close(release)
			heldRead := <-read
			require.Len(t, heldRead, 1)
			assert.Equal(t, "post 1000001", heldRead[0].Caption, "the held read began before the edit")

			// Anonymous first: the viewer's like state, missing, would send
			// the whole post to Postgres and hide a stale caption.
			anon, err := w.cache.Posts(context.Background(), []domain.PostID{post}, 0, 0)
			require.NoError(t, err)
			require.Len(t, anon, 1)
			assert.Equal(t, "edited", anon[0].Caption)
			assert.Equal(t, 1, anon[0].LikeCount)
			got, err := w.cache.Posts(context.Background(), []domain.PostID{post}, viewer, 0)
			require.NoError(t, err)
			require.Len(t, got, 1)
			assert.Equal(t, "edited", got[0].Caption)
			assert.True(t, got[0].HasLiked)
			assert.Equal(t, 1, got[0].LikeCount)
			w.same(t, []domain.PostID{post, other}, viewer)
		})
	}
}

// TestCacheEqualsTheReadModelUnderLiveTraffic hammers the cache with reads of
// random posts for random viewers while a workload of posts, edits, deletes,
// likes, unlikes and comments is appended; once the read model has applied it
// and the cache heard of it, every post reads the same from the cache as from
// Postgres, for every viewer, and most reads were served from memory.
func TestCacheEqualsTheReadModelUnderLiveTraffic(t *testing.T) {
	reg := prometheus.NewRegistry()
	w := newCacheWorld(t, readmodel.CacheConfig{Posts: 200, Likes: 1000}, reg, nil)
	ctx, cancel := context.WithCancel(context.Background())
	var (
		wg    sync.WaitGroup
		reads atomic.Int64
	)
	known := func() []domain.PostID {
		posts, err := postIDs(w)
		require.NoError(t, err)
		return posts
	}
	for r := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(r), 7))
			for ctx.Err() == nil {
				all, err := postIDs(w)
				if err != nil || len(all) == 0 {
					time.Sleep(time.Millisecond)
					continue
				}
				page := make([]domain.PostID, 0, 10)
				for range 10 {
					page = append(page, all[rng.IntN(len(all))])
				}
				if _, err := w.cache.Posts(ctx, page, domain.UserID(rng.IntN(13)), 0); err == nil {
					reads.Add(1)
				}
			}
		})
	}
	require.NoError(t, appendWorkload(context.Background(), w.log, 3000, 11, 0))
	w.settled(t)
	cancel()
	wg.Wait()
	require.Positive(t, reads.Load())
	hits := cacheLookups(t, reg, "hit")
	misses := cacheLookups(t, reg, "miss")
	t.Logf("%d reads of 10 posts: %.0f posts from memory, %.0f from postgres", reads.Load(), hits, misses)
	require.Positive(t, hits, "the cache served nothing: the comparison below would prove nothing")

	all := known()
	require.NotEmpty(t, all)
	for viewer := range domain.UserID(13) {
		for i := 0; i < len(all); i += 10 {
			w.same(t, all[i:min(i+10, len(all))], viewer)
		}
	}
}

// cacheLookups is the cache's count of posts looked up with the given result.
func cacheLookups(t *testing.T, reg *prometheus.Registry, result string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != "feed_post_cache_lookups_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			if m.GetLabel()[0].GetValue() == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no lookups counted as %s", result)
	return 0
}

// postIDs lists every post of the read model, deleted or not.
func postIDs(w *cacheWorld) ([]domain.PostID, error) {
	return readmodel.AllPostIDs(context.Background(), w.store)
}

// TestCacheDropsWhatAnEventTouches reads a post into the cache, then lets a
// like, an edit, a comment and a delete each change it: after each, the post
// reads as Postgres has it, whoever reads it first.
func TestCacheDropsWhatAnEventTouches(t *testing.T) {
	reg := prometheus.NewRegistry()
	w := newCacheWorld(t, readmodel.CacheConfig{}, reg, nil)
	const post domain.PostID = 1_000_001
	const viewer, other domain.UserID = 5, 6
	w.append(t, created(post, 1))
	w.settled(t)
	ids := []domain.PostID{post}
	w.same(t, ids, viewer)
	w.same(t, ids, viewer)
	require.Positive(t, cacheLookups(t, reg, "hit"), "the second read came from memory")

	for _, ev := range []events.Event{
		events.PostLiked{UserID: viewer, PostID: post},
		events.PostEdited{PostID: post, UserID: 1, Caption: "edited", EditedAt: time.Now()},
		events.CommentAdded{CommentID: 1_000_003, PostID: post, UserID: other, Text: "hi", CreatedAt: time.Now()},
		events.PostUnliked{UserID: viewer, PostID: post},
		events.PostDeleted{PostID: post, UserID: 1, DeletedAt: time.Now()},
	} {
		w.append(t, ev)
		w.settled(t)
		// Another viewer first, so that the post's content is in memory again
		// and only the viewer's own like state can be out of date.
		w.same(t, ids, other)
		w.same(t, ids, viewer)
	}
}

// TestCacheReadsAgainWhatIsInUse reads a post more often than half its MaxAge
// for more than two MaxAges: it never expires, so no read after the first goes
// to Postgres, and yet a change made behind the log's back (as a partial
// rebuild could make) is served within MaxAge.
func TestCacheReadsAgainWhatIsInUse(t *testing.T) {
	const maxAge = time.Second
	reg := prometheus.NewRegistry()
	w := newCacheWorld(t, readmodel.CacheConfig{MaxAge: maxAge}, reg, nil)
	const post domain.PostID = 1_000_001
	const viewer domain.UserID = 5
	w.append(t, created(post, 1))
	w.settled(t)
	ids := []domain.PostID{post}
	ctx := context.Background()
	caption := func() string {
		t.Helper()
		got, err := w.cache.Posts(ctx, ids, viewer, 0)
		require.NoError(t, err)
		require.Len(t, got, 1)
		return got[0].Caption
	}
	require.Equal(t, "post 1000001", caption())
	require.Zero(t, cacheLookups(t, reg, "miss"), "the post is in memory from its creation")

	_, err := w.pool.Exec(ctx, `UPDATE posts SET caption = 'rebuilt' WHERE id = $1`, int64(post))
	require.NoError(t, err)
	changed := time.Now()
	var seen time.Duration
	for time.Since(changed) < 5*maxAge/2 {
		if caption() == "rebuilt" && seen == 0 {
			seen = time.Since(changed)
		}
		time.Sleep(maxAge / 20)
	}
	assert.Zero(t, cacheLookups(t, reg, "miss"), "a post in use expired")
	require.NotZero(t, seen, "the change was never served")
	assert.LessOrEqual(t, seen, maxAge+maxAge/4, "the change was served %v after it was made", seen)
}

// TestCacheHoldsNewPostsFromTheirCreation: posts are in memory from the event
// that creates them, exactly as Postgres reads them once it is applied
// (microsecond times, images in order, no likes, for any viewer), so reading
// them takes no query. Likes (repeated, undone, of one not liked), and
// comments change the entries as the projector changes the rows; past
// MaxLikers likers a like drops the post, and the like states of its viewers
// (but the likers heard of) are read from Postgres.
func TestCacheHoldsNewPostsFromTheirCreation(t *testing.T) {
	reg := prometheus.NewRegistry()
	w := newCacheWorld(t, readmodel.CacheConfig{}, reg, nil)
	var ids []domain.PostID
	for i := range 5 {
		id := domain.PostID(2_000_001 + i)
		ev := events.PostCreated{PostID: id, UserID: domain.UserID(i + 1), Caption: fmt.Sprintf("nouveau né %d ✓", i),
			CreatedAt: time.Now().Add(time.Duration(i) * 1234567 * time.Nanosecond)}
		for j := range 1 + 2*i { // 1 to 9 images
			ev.Media = append(ev.Media, events.Media{Key: fmt.Sprintf("%063d%d.png", id, j), ContentType: "image/png", Width: 10 + j, Height: 20 + i, Size: 100})
		}
		w.append(t, ev)
		ids = append(ids, id)
	}
	w.settled(t)
	viewers := []domain.UserID{0, 5, 6, 7}
	for _, viewer := range viewers {
		w.same(t, ids, viewer)
	}
	require.Zero(t, cacheLookups(t, reg, "miss"), "a new post was read from Postgres")
	require.Equal(t, len(viewers)*len(ids), int(cacheLookups(t, reg, "hit")))

	for _, ev := range []events.Event{
		events.PostLiked{UserID: 5, PostID: ids[2]},
		events.PostLiked{UserID: 5, PostID: ids[2]}, // counts once
		events.PostLiked{UserID: 6, PostID: ids[2]},
		events.PostUnliked{UserID: 6, PostID: ids[2]},
		events.PostUnliked{UserID: 7, PostID: ids[2]}, // never liked it
		events.PostLiked{UserID: 7, PostID: ids[3]},
		events.CommentAdded{CommentID: 3_000_001, PostID: ids[1], UserID: 6, Text: "bravo", CreatedAt: time.Now()},
		events.CommentAdded{CommentID: 3_000_002, PostID: ids[1], UserID: 7, Text: "encore", CreatedAt: time.Now()},
	} {
		w.append(t, ev)
	}
	w.settled(t)
	for _, viewer := range viewers {
		w.same(t, ids, viewer)
	}
	require.Zero(t, cacheLookups(t, reg, "miss"), "a like or a comment sent a post to Postgres")

	for u := range domain.UserID(readmodel.MaxLikers + 1) {
		w.append(t, events.PostLiked{UserID: 100 + u, PostID: ids[4]})
	}
	w.settled(t)
	for _, viewer := range []domain.UserID{5, 6, 100} {
		w.same(t, ids, viewer)
	}
	// A liker's own like state is known from its like.
	assert.Equal(t, 2, int(cacheLookups(t, reg, "miss")), "the post past MaxLikers, once per viewer but its liker")
}

// TestCacheForgetsMarksWithoutReadsFromPostgres: a cache that serves every
// post from memory (each went in at its creation) still forgets the marks of
// events the read model has applied. It used to learn the read model's
// position only from reads from Postgres, so here it kept every creation's
// mark until MaxDirty and started over, dropping every post it held: at 500
// posts/s that was every 400 s, each time sending every page's posts to
// Postgres at once.
func TestCacheForgetsMarksWithoutReadsFromPostgres(t *testing.T) {
	reg := prometheus.NewRegistry()
	const prune = 50 * time.Millisecond
	w := newCacheWorldWith(t, readmodel.CacheConfig{MaxDirty: 20}, reg, func(c *readmodel.Cache) {
		readmodel.SetPruneEvery(c, prune)
	})
	var ids []domain.PostID
	for round := range 4 {
		for i := range 10 {
			id := domain.PostID(4_000_001 + 10*round + i)
			w.append(t, events.PostCreated{PostID: id, UserID: domain.UserID(i + 1), Caption: "x", CreatedAt: time.Now(),
				Media: []events.Media{{Key: fmt.Sprintf("%064d.png", id), ContentType: "image/png", Width: 1, Height: 1, Size: 1}}})
			ids = append(ids, id)
		}
		w.settled(t)
		// Marks are forgotten at the second prune after the read model is seen
		// past them; prunes happen as events are heard of.
		for j := range 3 {
			time.Sleep(3 * prune)
			w.append(t, events.UserFollowed{FollowerID: domain.UserID(9000 + 10*round + j), FolloweeID: 9999})
			w.settled(t)
		}
	}
	w.same(t, ids, 0)
	assert.Zero(t, cacheLookups(t, reg, "miss"), "posts went to Postgres: the cache started over")
	assert.Equal(t, len(ids), int(cacheLookups(t, reg, "hit")))
}

// TestCacheDropsWhatExpired: posts and like states past MaxAge, never served
// again, leave the cache rather than wait for its bound to push them out.
func TestCacheDropsWhatExpired(t *testing.T) {
	const maxAge = 300 * time.Millisecond
	w := newCacheWorldWith(t, readmodel.CacheConfig{MaxAge: maxAge}, nil, func(c *readmodel.Cache) {
		readmodel.SetPruneEvery(c, maxAge/10)
	})
	const post domain.PostID = 3_000_001
	const viewer domain.UserID = 5
	for i := range 20 {
		w.append(t, created(post+domain.PostID(i), 1))
	}
	// A like and an edit: the post is then read from Postgres with a like
	// count, which leaves its viewers' like states to be kept apart.
	w.append(t, events.PostLiked{UserID: 7, PostID: post})
	w.append(t, events.PostEdited{PostID: post, UserID: 1, Caption: "edited", EditedAt: time.Now()})
	w.settled(t)
	_, err := w.cache.Posts(context.Background(), []domain.PostID{post}, viewer, 0)
	require.NoError(t, err)
	posts, likes := readmodel.CacheSizes(w.cache)
	require.Equal(t, 20, posts)
	require.Positive(t, likes, "the viewer's and the liker's like states")

	time.Sleep(maxAge)
	// Events keep the cache's clock going, as a live log does.
	for i := 0; ; i++ {
		w.append(t, events.UserFollowed{FollowerID: domain.UserID(100 + i), FolloweeID: 9999})
		posts, likes = readmodel.CacheSizes(w.cache)
		if posts == 0 && likes == 0 {
			break
		}
		require.Less(t, i, 100, "%d posts and %d like states past their age are still held", posts, likes)
		time.Sleep(maxAge / 10)
	}
}
