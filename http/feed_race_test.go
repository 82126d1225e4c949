package http

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/migrations"
	"github.com/feedproject/feed/projections/feeds"
	"github.com/feedproject/feed/projections/feeds/fanout"
	"github.com/feedproject/feed/projections/feeds/inbox"
)

func (w *feedWorld) emit(t *testing.T, evs ...events.Event) {
	t.Helper()
	for _, ev := range evs {
		w.n++
		_, err := w.log.AppendEvent(context.Background(), fmt.Sprintf("r%d", w.n), time.Now(), ev)
		require.NoError(t, err)
	}
}

func (w *feedWorld) post(t *testing.T, author domain.UserID) domain.PostID {
	t.Helper()
	id, at := w.ids.Next(time.Now())
	w.emit(t, events.PostCreated{PostID: domain.PostID(id), UserID: author, CreatedAt: at,
		Media: []events.Media{{Key: fmt.Sprintf("%064d.png", id), ContentType: "image/png", Width: 1, Height: 1, Size: 1}}})
	return domain.PostID(id)
}

func follow(a, b domain.UserID) events.Event {
	return events.UserFollowed{FollowerID: a, FolloweeID: b}
}
func unfollow(a, b domain.UserID) events.Event {
	return events.UserUnfollowed{FollowerID: a, FolloweeID: b}
}

// materialise reads user's feed and waits for the planner to build the inbox.
func (w *feedWorld) materialise(t *testing.T, user domain.UserID) {
	t.Helper()
	w.page(t, user, "")
	require.Eventually(t, func() bool {
		_, _, _, ok, err := inbox.ReadAll(context.Background(), w.active(t), user)
		return err == nil && ok
	}, 30*time.Second, 5*time.Millisecond, "inbox of %d not materialised", user)
}

// plannerReplayed waits until the planner's stored position reaches the head
// (after Redis lost it: the planner replays the log).
func (w *feedWorld) plannerReplayed(t *testing.T) {
	t.Helper()
	head, err := w.log.Head(context.Background())
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		pos, err := fanout.PlannerPosition(context.Background(), w.store)
		return err == nil && pos >= head
	}, 60*time.Second, 10*time.Millisecond, "the planner did not replay")
}

// active is the store of the keyspace version in use.
func (w *feedWorld) active(t *testing.T) *feeds.Store {
	t.Helper()
	s, err := w.store.Active(context.Background())
	require.NoError(t, err)
	return s
}

// exact checks, once settled, that user's paged feed is the pull feed and
// that the inbox, if any, holds exactly the feed's posts above its floor but
// those of big accounts, which reads merge from their outboxes (an inbox may
// hold those pushed before their authors grew big); it returns the inbox's
// posts.
func (w *feedWorld) exact(t *testing.T, user domain.UserID) []domain.PostID {
	t.Helper()
	w.settle(t)
	ctx := context.Background()
	truth := w.truth(t, user)
	require.Equal(t, truth, w.pageAll(t, user), "user %d: paging must yield the pull feed", user)
	store := w.active(t)
	held, floor, _, ok, err := inbox.ReadAll(ctx, store, user)
	require.NoError(t, err)
	if !ok {
		return nil
	}
	entries, err := w.read.Feed(ctx, user, nil, 1_000_000)
	require.NoError(t, err)
	big, err := store.BigAccounts(ctx)
	require.NoError(t, err)
	fromBig := map[domain.PostID]bool{}
	want := []string{}
	for _, e := range entries {
		switch {
		case slices.Contains(big, e.AuthorID):
			fromBig[e.PostID] = true
		case int64(e.PostID) >= floor:
			want = append(want, e.PostID.String())
		}
	}
	have := []string{}
	for _, p := range held {
		if !fromBig[p] {
			have = append(have, p.String())
		}
	}
	require.Equal(t, want, have, "user %d: inbox above floor %d, big accounts %v", user, floor, big)
	return held
}

// TestPushRacingUnfollow: the author's posts and the reader's unfollow of
// that author come in one burst; the unfollow must not be overtaken by a push
// of a post made before it, nor a post made after it be pushed.
func TestPushRacingUnfollow(t *testing.T) {
	w := newFeedWorld(t, feeds.Config{})
	const a, b = domain.UserID(1), domain.UserID(2)
	w.emit(t, follow(a, b))
	w.post(t, b)
	w.materialise(t, a)
	for round := range 20 {
		// Other recipients keep the partitions busy so work interleaves.
		for r := domain.UserID(10); r < 20; r++ {
			w.emit(t, follow(r, b))
		}
		w.post(t, b)
		w.emit(t, unfollow(a, b))
		w.post(t, b)
		w.emit(t, follow(a, b), unfollow(a, b))
		if round%2 == 1 {
			w.emit(t, follow(a, b))
		}
		w.post(t, b)
		inbox := w.exact(t, a)
		if round%2 == 0 {
			assert.Empty(t, inbox, "round %d: nothing of an unfollowed author", round)
		}
	}
}

// TestPushIntoExpiredInbox: a push must not create an inbox that was
// expired; it would look warm with one post. The next read rebuilds it whole.
func TestPushIntoExpiredInbox(t *testing.T) {
	w := newFeedWorld(t, feeds.Config{})
	const a, b = domain.UserID(1), domain.UserID(2)
	w.emit(t, follow(a, b))
	older := []domain.PostID{w.post(t, b), w.post(t, b)}
	w.materialise(t, a)
	require.NoError(t, w.rdb.Del(context.Background(), fmt.Sprintf("feed:v1:{%d}:iy", a)).Err()) // expired
	w.post(t, b)
	w.settle(t)
	_, _, _, ok, err := inbox.ReadAll(context.Background(), w.store, a)
	require.NoError(t, err)
	assert.False(t, ok, "a push into an expired inbox created one")
	w.materialise(t, a)
	inbox := w.exact(t, a)
	assert.Len(t, inbox, 3)
	assert.Subset(t, inbox, older)
}

// TestWarmUpRacingPushes: inboxes are built while their followees post,
// delete and are unfollowed; whatever the interleaving, each ends exact.
func TestWarmUpRacingPushes(t *testing.T) {
	w := newFeedWorld(t, feeds.Config{})
	authors := []domain.UserID{2, 3, 4}
	readers := []domain.UserID{10, 11, 12, 13, 14, 15}
	for _, r := range readers {
		for _, a := range authors {
			w.emit(t, follow(r, a))
		}
	}
	for range 5 {
		for _, a := range authors {
			w.post(t, a)
		}
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := range 60 {
			p := w.post(t, authors[i%len(authors)])
			if i%7 == 0 {
				w.emit(t, events.PostDeleted{PostID: p, UserID: authors[i%len(authors)], DeletedAt: time.Now()})
			}
			if i%11 == 0 {
				w.emit(t, unfollow(readers[i%len(readers)], authors[0]))
			}
		}
	})
	for _, r := range readers {
		wg.Go(func() { w.materialise(t, r) })
	}
	wg.Wait()
	for _, r := range readers {
		w.exact(t, r)
	}
}

// TestFollowMergeBelowTheFloor: following someone whose posts are all older
// than the inbox's trimmed tail must not put them in the inbox (a gap above
// them); they come from Postgres when paging reaches them.
func TestFollowMergeBelowTheFloor(t *testing.T) {
	w := newFeedWorld(t, feeds.Config{InboxCap: 3})
	const a, x, y = domain.UserID(1), domain.UserID(2), domain.UserID(3)
	old := []domain.PostID{w.post(t, y), w.post(t, y)}
	w.emit(t, follow(a, x))
	for range 5 {
		w.post(t, x)
	}
	w.materialise(t, a)
	w.emit(t, follow(a, y))
	inbox := w.exact(t, a)
	assert.Len(t, inbox, 3)
	for _, p := range old {
		assert.NotContains(t, inbox, p, "a post older than the floor was merged")
	}
	assert.Len(t, w.pageAll(t, a), 7, "paging still reaches the old posts, from Postgres")
}

// followingOne has user 1 follow user 2, who then posts n times, builds user
// 1's inbox and returns it once settled.
func (w *feedWorld) followingOne(t *testing.T, n int) []domain.PostID {
	t.Helper()
	const a, b = domain.UserID(1), domain.UserID(2)
	w.emit(t, follow(a, b))
	for range n {
		w.post(t, b)
	}
	w.materialise(t, a)
	return w.exact(t, a)
}

// TestFeedWhenRedisIsDown: every page comes from Postgres, complete.
func TestFeedWhenRedisIsDown(t *testing.T) {
	w := newFeedWorld(t, feeds.Config{InboxCap: 5})
	a := domain.UserID(1)
	require.NotEmpty(t, w.followingOne(t, 23))
	truth := w.truth(t, a)
	require.NoError(t, w.redis.Stop())
	assert.Equal(t, truth, w.pageAll(t, a), "pages from Postgres alone")
}

// TestFeedOfAFewPostsIsReadFromRedisAlone: an inbox that holds the whole
// feed (its floor 0) answers its short last page without Postgres, whose
// pull feed is locked meanwhile; a read of it would wait out its deadline
// and answer 503.
func TestFeedOfAFewPostsIsReadFromRedisAlone(t *testing.T) {
	w := newFeedWorld(t, feeds.Config{})
	a := domain.UserID(1)
	require.Len(t, w.followingOne(t, 3), 3)
	truth := w.truth(t, a)
	defer w.lockFollows(t)()
	assert.Equal(t, truth, w.pageAll(t, a))
}

// lockFollows holds the read model's follows table until release (or the
// test's end), so that every read of the pull feed waits.
func (w *feedWorld) lockFollows(t *testing.T) (release func()) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, w.pgURL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(ctx) })
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "LOCK TABLE "+migrations.Schema+".follows IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)
	return func() { require.NoError(t, tx.Rollback(ctx)) }
}

// TestFeedShedsFallbacksPastItsBound: a page past the inbox is a read of
// Postgres, as every page is with Redis down. Past Config.FeedFallbacks of
// them at once, a read is answered 503 with Retry-After while the others are
// still under way, rather than queued behind them until its query times out,
// and those under way are served whole.
func TestFeedShedsFallbacksPastItsBound(t *testing.T) {
	w := newFeedWorld(t, feeds.Config{InboxCap: 3})
	a := domain.UserID(1)
	require.Len(t, w.followingOne(t, 8), 3)
	truth := w.truth(t, a)
	below, err := domain.ParsePostID(truth[3])
	require.NoError(t, err)
	cursor := domain.Cursor{ID: int64(below), Unix: domain.IDTime(int64(below)).Unix()}.String()
	const bound, over = 2, 3
	reg := prometheus.NewRegistry()
	srv := w.server(Config{ConsistencyWait: 5 * time.Second, FeedFallbacks: bound}, reg)

	release := w.lockFollows(t)

	tok, err := w.auth.Mint(a, false, time.Now(), time.Hour)
	require.NoError(t, err)
	type answer struct {
		status     int
		retryAfter string
		body       []byte
	}
	answers := make(chan answer, bound+over)
	for range bound + over {
		go func() {
			req := httptest.NewRequest(http.MethodGet, "/feed?cursor="+cursor, nil)
			req.Header.Set("Authorization", "Bearer "+tok)
			resp, err := srv.App().Test(req, -1)
			if err != nil {
				answers <- answer{body: []byte(err.Error())}
				return
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			answers <- answer{resp.StatusCode, resp.Header.Get("Retry-After"), body}
		}()
	}
	// Well before a query's own timeout (readTimeout), which would answer
	// 503 too, and with the lock still held.
	for range over {
		select {
		case ans := <-answers:
			require.Equal(t, http.StatusServiceUnavailable, ans.status, "%s", ans.body)
			assert.Equal(t, "2", ans.retryAfter)
			var body errorBody
			require.NoError(t, json.Unmarshal(ans.body, &body))
			assert.Equal(t, "unavailable", body.Error.Code)
		case <-time.After(3 * time.Second):
			t.Fatal("reads past the bound were not refused while the others waited for Postgres")
		}
	}
	select {
	case ans := <-answers:
		t.Fatalf("a read within the bound answered %d while the follows were locked", ans.status)
	case <-time.After(200 * time.Millisecond):
	}
	assert.InDelta(t, over, counterValue(t, reg, "feed_home_shed_total"), 0, "reads shed")
	release()
	for range bound {
		ans := <-answers
		require.Equal(t, http.StatusOK, ans.status, "%s", ans.body)
		var v feedPageView
		require.NoError(t, json.Unmarshal(ans.body, &v))
		ids := []string{}
		for _, p := range v.Posts {
			ids = append(ids, p.ID)
		}
		assert.Equal(t, truth[4:], ids, "a read within the bound is served whole")
	}
}

// counterValue is the value of the counter name (without labels) in reg.
func counterValue(t *testing.T, reg prometheus.Gatherer, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() == name {
			require.Len(t, f.GetMetric(), 1, name)
			return f.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("no counter %s", name)
	return 0
}

// TestFeedReplayEquivalence: with Redis flushed, the planner replays the log
// from sequence 1, and every user's pages are identical to before.
func TestFeedReplayEquivalence(t *testing.T) {
	w := newFeedWorld(t, feeds.Config{InboxCap: 15, OutboxCap: 15, BigThreshold: 6})
	users := 12
	for i := range 400 {
		a, b := domain.UserID(i%users+1), domain.UserID((i*7)%users+1)
		if i%4 == 3 {
			b = 1 // one account gathers followers and turns big
		}
		switch i % 5 {
		case 0, 1:
			w.post(t, a)
		case 2, 3:
			if a != b {
				w.emit(t, follow(a, b))
			}
		default:
			if a != b && i%3 == 0 {
				w.emit(t, unfollow(a, b))
			}
		}
		if i%40 == 0 {
			w.materialise(t, a)
		}
	}
	w.settle(t)
	bigBefore, err := w.store.BigAccounts(context.Background())
	require.NoError(t, err)
	before := map[domain.UserID][]string{}
	for u := 1; u <= users; u++ {
		before[domain.UserID(u)] = w.pageAll(t, domain.UserID(u))
	}
	require.NoError(t, w.flushAll(context.Background()))
	w.plannerReplayed(t)
	for u := 1; u <= users; u++ {
		w.materialise(t, domain.UserID(u))
	}
	w.settle(t)
	big, err := w.store.BigAccounts(context.Background())
	require.NoError(t, err)
	assert.ElementsMatch(t, bigBefore, big, "the replay rebuilt the big accounts")
	for u := 1; u <= users; u++ {
		user := domain.UserID(u)
		assert.Equal(t, before[user], w.pageAll(t, user), "user %d", u)
		w.exact(t, user)
	}
}

// TestMaterialiseRacingRedisLoss: Redis loses everything after the planner
// checked its state and while it reads the user's follows to build an inbox.
// Built from that half-lost state at the planner's position, the inbox would be
// empty and stay so: the replay's work for it is at or below that position.
func TestMaterialiseRacingRedisLoss(t *testing.T) {
	w := newFeedWorld(t, feeds.Config{})
	const a, b = domain.UserID(1), domain.UserID(2)
	w.emit(t, follow(a, b))
	for range 3 {
		w.post(t, b)
	}
	w.settle(t)
	following := fmt.Sprintf("feed:v1:{%d}:fng", a)
	w.beforeCmd.Store(&redisFault{
		match: func(cmd redis.Cmder) bool {
			args := cmd.Args()
			return cmd.Name() == "smembers" && len(args) == 2 && args[1] == following
		},
		inject: func() { require.NoError(t, w.flushAll(context.Background())) },
	})
	w.page(t, a, "")
	require.Eventually(t, func() bool { return w.beforeCmd.Load() == nil }, 30*time.Second, 5*time.Millisecond,
		"the planner never read the follows")
	w.plannerReplayed(t)
	w.materialise(t, a)
	assert.Len(t, w.exact(t, a), 3, "the inbox holds the followed account's posts")
}

// TestFeedWaitsForTheReadModelToHydrate: the feeds are ahead of the read
// model; a pushed post the read model does not have yet must not be dropped
// from the page (the cursor would pass it for good).
func TestFeedWaitsForTheReadModelToHydrate(t *testing.T) {
	start := make(chan struct{})
	w := newFeedWorldWith(t, feeds.Config{}, start)
	const a, b = domain.UserID(1), domain.UserID(2)
	w.emit(t, follow(a, b))
	w.page(t, a, "") // asks for the inbox
	require.Eventually(t, func() bool {
		_, _, _, ok, err := inbox.ReadAll(context.Background(), w.store, a)
		return err == nil && ok
	}, 30*time.Second, 5*time.Millisecond)
	p := w.post(t, b)
	require.Eventually(t, func() bool {
		held, _, _, _, err := inbox.ReadAll(context.Background(), w.store, a)
		return err == nil && len(held) == 1
	}, 30*time.Second, 5*time.Millisecond, "the push reached the inbox")
	time.AfterFunc(300*time.Millisecond, func() { close(start) })
	v := w.page(t, a, "")
	require.Len(t, v.Posts, 1, "the post is on the page")
	assert.Equal(t, p.String(), v.Posts[0].ID)
}

// TestFeedIsUnavailableRatherThanShortWhileTheReadModelLags: a read model
// behind the feeds for longer than the consistency bound makes a page that
// would miss a pushed post answer 503, never the page without it.
func TestFeedIsUnavailableRatherThanShortWhileTheReadModelLags(t *testing.T) {
	start := make(chan struct{})
	w := newFeedWorldWith(t, feeds.Config{}, start)
	defer close(start)
	const a, b = domain.UserID(1), domain.UserID(2)
	w.emit(t, follow(a, b))
	// Posts hydrated from the read model alone: a cache that follows the
	// log would know the post already.
	deps := w.deps
	deps.FeedPosts = nil
	reg := prometheus.NewRegistry()
	deps.Registerer, deps.Gatherer = reg, reg
	srv := NewServer(deps, Config{ConsistencyWait: 200 * time.Millisecond})
	get := func() *http.Response {
		req := httptest.NewRequest(http.MethodGet, "/feed", nil)
		tok, err := w.auth.Mint(a, false, time.Now(), time.Hour)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := srv.App().Test(req, 30_000)
		require.NoError(t, err)
		return resp
	}
	_ = get().Body.Close() // asks for the inbox
	require.Eventually(t, func() bool {
		_, _, _, ok, err := inbox.ReadAll(context.Background(), w.store, a)
		return err == nil && ok
	}, 30*time.Second, 5*time.Millisecond)
	w.post(t, b)
	require.Eventually(t, func() bool {
		held, _, _, _, err := inbox.ReadAll(context.Background(), w.store, a)
		return err == nil && len(held) == 1
	}, 30*time.Second, 5*time.Millisecond, "the push reached the inbox")
	resp := get()
	defer resp.Body.Close()
	assert.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	assert.NotEmpty(t, resp.Header.Get("Retry-After"))
}

// TestFeedFromTheReadModelWaitsForTheReadersWrites: the feeds are ahead of
// the read model; a reader who has just followed an author and reads the
// feed at the follow's position, before its inbox exists, is served from the
// read model, which must first have applied the follow.
func TestFeedFromTheReadModelWaitsForTheReadersWrites(t *testing.T) {
	start := make(chan struct{})
	w := newFeedWorldWith(t, feeds.Config{}, start)
	const a, b = domain.UserID(1), domain.UserID(2)
	p := w.post(t, b)
	w.emit(t, follow(a, b))
	head, err := w.log.Head(context.Background())
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		pos, err := w.reader.Position(context.Background())
		return err == nil && pos >= head
	}, 30*time.Second, 5*time.Millisecond, "the feeds applied the follow")
	time.AfterFunc(300*time.Millisecond, func() { close(start) })
	req := httptest.NewRequest(http.MethodGet, "/feed", nil)
	tok, err := w.auth.Mint(a, false, time.Now(), time.Hour)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set(headerMinPosition, events.Position(head))
	resp, err := w.srv.App().Test(req, 30_000)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var v feedPageView
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&v))
	require.Len(t, v.Posts, 1, "the followed author's post is on the page read at the follow's position")
	assert.Equal(t, p.String(), v.Posts[0].ID)
}

// TestMaintenanceRepairsCorruptedInboxes corrupts inboxes behind the
// projector's back — a ghost of a deleted post, a ghost of an author not
// followed, a missing post, an over-long inbox — and a maintenance pass repairs
// them all and counts each repair.
func TestMaintenanceRepairsCorruptedInboxes(t *testing.T) {
	ctx := context.Background()
	// Segments of 2: an inbox holds at most 10 posts, and is then trimmed
	// to its 8 newest.
	w := newFeedWorld(t, feeds.Config{InboxCap: 8, SegmentSize: 2})
	const a, b, c, d = domain.UserID(1), domain.UserID(2), domain.UserID(3), domain.UserID(4)
	w.emit(t, follow(a, b), follow(a, c))
	var bPosts []domain.PostID
	for range 3 {
		bPosts = append(bPosts, w.post(t, b))
		w.post(t, c)
	}
	deleted := w.post(t, b)
	w.emit(t, events.PostDeleted{PostID: deleted, UserID: b, DeletedAt: time.Now()})
	stranger := w.post(t, d)
	w.materialise(t, a)
	before := w.exact(t, a)
	require.Len(t, before, 6)

	// Inboxes score posts newest first (2^53 - id); a small one keeps them
	// in its meta, a larger one in segments: the corruption goes where the
	// newest are, behind the store's back.
	entry := func(p domain.PostID) redis.Z {
		return redis.Z{Score: float64(domain.MaxID - int64(p)), Member: int64(p)}
	}
	segments := func() []string {
		keys, err := inbox.Keys(ctx, w.store, a)
		require.NoError(t, err)
		require.NotEmpty(t, keys)
		if len(keys) == 1 {
			return keys // a small inbox: its posts are in the meta
		}
		return keys[1:]
	}
	key := segments()[0]
	require.NoError(t, w.rdb.ZAdd(ctx, key, entry(deleted)).Err())  // ghost: deleted
	require.NoError(t, w.rdb.ZAdd(ctx, key, entry(stranger)).Err()) // ghost: not followed
	for _, k := range segments() {
		require.NoError(t, w.rdb.ZRem(ctx, k, int64(bPosts[1])).Err()) // missing
	}
	_, err := w.maint.Pass(ctx)
	require.NoError(t, err)
	w.settle(t)
	assert.Equal(t, before, w.exact(t, a))
	assert.EqualValues(t, 3, w.store.Repairs())

	// Entries of posts that do not exist are ghosts too.
	key = segments()[0]
	for i := range 5 {
		require.NoError(t, w.rdb.ZAdd(ctx, key, entry(domain.PostID(10+i))).Err())
	}
	time.Sleep(2 * time.Millisecond) // the period of the test's round
	_, err = w.maint.Pass(ctx)
	require.NoError(t, err)
	w.settle(t)
	assert.Equal(t, before, w.exact(t, a))
	assert.EqualValues(t, 3+5, w.store.Repairs())

	// Over-long: more real posts than it may hold, the older ones put back
	// after the inbox was trimmed (6 + 5 posts: trimmed to 8).
	var more []domain.PostID
	for range 5 {
		more = append(more, w.post(t, c))
	}
	trimmed := w.exact(t, a)
	require.Len(t, trimmed, 8)
	key = segments()[0]
	for _, p := range before[len(before)-4:] {
		require.NoError(t, w.rdb.ZAdd(ctx, key, entry(p)).Err())
	}
	time.Sleep(2 * time.Millisecond)
	_, err = w.maint.Pass(ctx)
	require.NoError(t, err)
	w.settle(t)
	assert.Equal(t, trimmed, w.exact(t, a))
	assert.EqualValues(t, 3+5+2, w.store.Repairs(), "12 entries where 10 at most may be: 2 over")
	assert.Subset(t, trimmed, more)
}
