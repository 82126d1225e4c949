package readmodel_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/migrations"
	"github.com/feedproject/feed/projections/readmodel"
)

// openPool starts a Postgres for tb, applies the migrations and connects to it.
func openPool(tb testing.TB, cfg func(*pgxpool.Config)) *pgxpool.Pool {
	tb.Helper()
	ctx := context.Background()
	pg := localstacktest.PostgresForTest(tb)
	require.NoError(tb, migrations.Up(ctx, pg.URL(), migrations.Schema))
	pc, err := readmodel.PoolConfig(pg.URL(), migrations.Schema)
	require.NoError(tb, err)
	if cfg != nil {
		cfg(pc)
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	require.NoError(tb, err)
	tb.Cleanup(pool.Close)
	return pool
}

// seeder writes read-model rows as the projector would, with time-ordered ids
// whose times are the rows' created_at.
type seeder struct {
	tb   testing.TB
	pool *pgxpool.Pool
	ids  *domain.IDGenerator
	now  time.Time
}

func newSeeder(tb testing.TB, pool *pgxpool.Pool) *seeder {
	tb.Helper()
	ids, err := domain.NewIDGenerator(3)
	require.NoError(tb, err)
	return &seeder{tb: tb, pool: pool, ids: ids, now: time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)}
}

func (s *seeder) exec(sql string, args ...any) {
	s.tb.Helper()
	_, err := s.pool.Exec(context.Background(), sql, args...)
	require.NoError(s.tb, err, sql)
}

// nextID returns a new id a second after the previous one.
func (s *seeder) nextID() (int64, time.Time) {
	s.now = s.now.Add(time.Second)
	return s.ids.Next(s.now)
}

// post inserts a live post of user with images images, stored in reverse
// position order so that reading them in order is the store's doing.
func (s *seeder) post(user domain.UserID, images int) readmodel.Post {
	s.tb.Helper()
	id, at := s.nextID()
	p := readmodel.Post{ID: domain.PostID(id), UserID: user, Caption: fmt.Sprintf("caption of %d", id), CreatedAt: at, Media: []readmodel.Media{}}
	s.exec(`INSERT INTO posts (id, user_id, caption, created_at) VALUES ($1, $2, $3, $4)`, id, int64(user), p.Caption, at)
	for pos := range images {
		p.Media = append(p.Media, readmodel.Media{
			Key: fmt.Sprintf("%064x.jpg", id*10+int64(pos)), ContentType: "image/jpeg",
			Width: 1080 + pos, Height: 1350 + pos, Position: pos,
		})
	}
	for _, m := range slices.Backward(p.Media) {
		s.exec(`INSERT INTO post_media (post_id, position, media_key, content_type, width, height, size)
			VALUES ($1, $2, $3, $4, $5, $6, 1000)`, id, m.Position, m.Key, m.ContentType, m.Width, m.Height)
	}
	return p
}

func (s *seeder) deletePost(id domain.PostID) {
	s.tb.Helper()
	s.exec(`UPDATE posts SET deleted_at = now() WHERE id = $1`, int64(id))
}

func (s *seeder) like(post domain.PostID, user domain.UserID) {
	s.tb.Helper()
	s.exec(`INSERT INTO likes (post_id, user_id) VALUES ($1, $2)`, int64(post), int64(user))
	s.exec(`UPDATE posts SET like_count = like_count + 1 WHERE id = $1`, int64(post))
}

func (s *seeder) comment(post domain.PostID, user domain.UserID) readmodel.Comment {
	s.tb.Helper()
	id, at := s.nextID()
	c := readmodel.Comment{ID: domain.CommentID(id), UserID: user, Text: fmt.Sprintf("comment %d", id), CreatedAt: at}
	s.exec(`INSERT INTO comments (id, post_id, user_id, text, created_at) VALUES ($1, $2, $3, $4, $5)`,
		id, int64(post), int64(user), c.Text, at)
	s.exec(`UPDATE posts SET comment_count = comment_count + 1 WHERE id = $1`, int64(post))
	return c
}

func (s *seeder) follow(follower, followee domain.UserID, at time.Time) {
	s.tb.Helper()
	s.exec(`INSERT INTO follows (follower_id, followee_id, created_at) VALUES ($1, $2, $3)`,
		int64(follower), int64(followee), at.Truncate(time.Second))
}

// pageAll reads a list from the start until has_more is false, checking the
// page invariants on the way, and returns every item in order.
func pageAll[T any](t *testing.T, read func(after *domain.Cursor) (readmodel.Page[T], error)) ([]T, []readmodel.Page[T]) {
	t.Helper()
	var (
		all   []T
		pages []readmodel.Page[T]
		after *domain.Cursor
	)
	for range 100 {
		p, err := read(after)
		require.NoError(t, err)
		require.NotNil(t, p.Items, "a page's items are never nil")
		require.LessOrEqual(t, len(p.Items), domain.PageSize)
		pages = append(pages, p)
		all = append(all, p.Items...)
		if !p.HasMore {
			assert.Nil(t, p.Next, "the last page has no next cursor")
			return all, pages
		}
		require.NotNil(t, p.Next, "a page with more after it has a next cursor")
		require.Len(t, p.Items, domain.PageSize, "only the last page is short")
		after = p.Next
	}
	t.Fatal("paging did not end")
	return nil, nil
}

func TestPost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := openPool(t, nil)
	store := readmodel.NewStore(pool)
	seed := newSeeder(t, pool)
	const author, fan, stranger = domain.UserID(501), domain.UserID(502), domain.UserID(503)

	// Given a post with three images, edited, liked by a fan and someone else.
	want := seed.post(author, 3)
	edited := want.CreatedAt.Add(time.Minute)
	seed.exec(`UPDATE posts SET caption = 'edited caption', edited_at = $2 WHERE id = $1`, int64(want.ID), edited)
	want.Caption, want.EditedAt = "edited caption", &edited
	seed.like(want.ID, fan)
	seed.like(want.ID, 504)
	want.LikeCount = 2
	seed.comment(want.ID, stranger)
	want.CommentCount = 1
	// And a deleted post.
	gone := seed.post(author, 1)
	seed.deletePost(gone.ID)

	tests := []struct {
		name    string
		id      domain.PostID
		viewer  domain.UserID
		liked   bool
		missing bool
	}{
		{"the fan sees has_liked", want.ID, fan, true, false},
		{"someone who does not like it", want.ID, stranger, false, false},
		{"an anonymous viewer", want.ID, 0, false, false},
		{"a deleted post is not found", gone.ID, fan, false, true},
		{"an unknown post is not found", want.ID + 1, 0, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// When it is read.
			got, err := store.Post(ctx, tt.id, tt.viewer)

			// Then.
			if tt.missing {
				require.ErrorIs(t, err, domain.ErrNotFound)
				return
			}
			require.NoError(t, err)
			expect := want
			expect.HasLiked = tt.liked
			assert.True(t, expect.CreatedAt.Equal(got.CreatedAt))
			require.NotNil(t, got.EditedAt)
			assert.True(t, expect.EditedAt.Equal(*got.EditedAt))
			got.CreatedAt, got.EditedAt = expect.CreatedAt, expect.EditedAt
			assert.Equal(t, expect, got)
		})
	}

	t.Run("a post never edited has no edit time", func(t *testing.T) {
		p := seed.post(author, 1)
		got, err := store.Post(ctx, p.ID, 0)
		require.NoError(t, err)
		assert.Nil(t, got.EditedAt)
		assert.Equal(t, []readmodel.Media{p.Media[0]}, got.Media)
	})
}

func TestPostsHydratesAPage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := openPool(t, nil)
	store := readmodel.NewStore(pool)
	seed := newSeeder(t, pool)
	const viewer = domain.UserID(9)

	// Given live posts of two authors, one liked by the viewer, and a deleted one.
	a := seed.post(1, 2)
	b := seed.post(2, 10)
	c := seed.post(1, 1)
	seed.like(b.ID, viewer)
	gone := seed.post(2, 1)
	seed.deletePost(gone.ID)

	// When a page of ids including the deleted post and an unknown id is hydrated.
	got, err := store.Posts(ctx, []domain.PostID{c.ID, gone.ID, b.ID, 424242, a.ID}, viewer)

	// Then only the live posts come back, complete, with the viewer's likes.
	require.NoError(t, err)
	require.Len(t, got, 3)
	for _, want := range []readmodel.Post{a, b, c} {
		p, ok := got[want.ID]
		require.True(t, ok, "post %d missing", want.ID)
		assert.Equal(t, want.UserID, p.UserID)
		assert.Equal(t, want.Media, p.Media, "media of %d in position order", want.ID)
		assert.Equal(t, want.ID == b.ID, p.HasLiked, "has_liked of %d", want.ID)
	}
	assert.Equal(t, 1, got[b.ID].LikeCount)

	t.Run("no ids", func(t *testing.T) {
		got, err := store.Posts(ctx, nil, viewer)
		require.NoError(t, err)
		assert.Empty(t, got)
	})
}

func TestProfileGrid(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := openPool(t, nil)
	store := readmodel.NewStore(pool)
	seed := newSeeder(t, pool)
	const author, other = domain.UserID(7), domain.UserID(8)

	// Given 25 live posts of the author among posts of someone else and two of
	// the author's own deleted posts.
	var want []readmodel.GridItem
	for i := range 27 {
		p := seed.post(author, 1+i%3)
		seed.post(other, 1)
		if i == 4 || i == 20 {
			seed.deletePost(p.ID)
			continue
		}
		want = append(want, readmodel.GridItem{ID: p.ID, CreatedAt: p.CreatedAt, Thumbnail: p.Media[0]})
	}
	slices.Reverse(want)
	seed.like(want[3].ID, other)
	want[3].LikeCount = 1

	// When the grid is paged from the start.
	got, pages := pageAll(t, func(after *domain.Cursor) (readmodel.Page[readmodel.GridItem], error) {
		return store.ProfileGrid(ctx, author, after)
	})

	// Then every live post comes once, newest first, with its first image, in
	// pages of 10, 10 and 5 whose cursors name their last post.
	require.Len(t, got, 25)
	assert.Equal(t, []int{10, 10, 5}, []int{len(pages[0].Items), len(pages[1].Items), len(pages[2].Items)})
	for i := range got {
		assert.True(t, want[i].CreatedAt.Equal(got[i].CreatedAt))
		got[i].CreatedAt = want[i].CreatedAt
		assert.Equal(t, 0, got[i].Thumbnail.Position)
	}
	assert.Equal(t, want, got)
	assert.Equal(t, domain.Cursor{ID: int64(want[9].ID), Unix: want[9].CreatedAt.Unix()}, *pages[0].Next)

	t.Run("a cursor at a post deleted since continues after it", func(t *testing.T) {
		first, err := store.ProfileGrid(ctx, author, nil)
		require.NoError(t, err)
		seed.deletePost(first.Items[9].ID)
		second, err := store.ProfileGrid(ctx, author, first.Next)
		require.NoError(t, err)
		require.NotEmpty(t, second.Items)
		assert.Equal(t, want[10].ID, second.Items[0].ID)
	})

	t.Run("a user without posts has an empty grid", func(t *testing.T) {
		p, err := store.ProfileGrid(ctx, 999, nil)
		require.NoError(t, err)
		assert.Equal(t, readmodel.Page[readmodel.GridItem]{Items: []readmodel.GridItem{}}, p)
	})
}

func TestComments(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := openPool(t, nil)
	store := readmodel.NewStore(pool)
	seed := newSeeder(t, pool)

	// Given a post with 13 comments, interleaved with comments on another post.
	post, elsewhere := seed.post(1, 1), seed.post(1, 1)
	var want []readmodel.Comment
	for i := range 13 {
		want = append(want, seed.comment(post.ID, domain.UserID(100+i)))
		seed.comment(elsewhere.ID, 5)
	}
	quiet, gone := seed.post(2, 1), seed.post(2, 1)
	seed.comment(gone.ID, 5)
	seed.deletePost(gone.ID)

	// When they are paged.
	got, pages := pageAll(t, func(after *domain.Cursor) (readmodel.Page[readmodel.Comment], error) {
		return store.Comments(ctx, post.ID, after)
	})

	// Then they come oldest first, each once.
	require.Len(t, pages, 2)
	require.Len(t, got, len(want))
	for i := range got {
		assert.True(t, want[i].CreatedAt.Equal(got[i].CreatedAt))
		got[i].CreatedAt = want[i].CreatedAt
	}
	assert.Equal(t, want, got)
	assert.Equal(t, domain.Cursor{ID: int64(want[9].ID), Unix: want[9].CreatedAt.Unix()}, *pages[0].Next)

	t.Run("a post without comments has an empty page", func(t *testing.T) {
		p, err := store.Comments(ctx, quiet.ID, nil)
		require.NoError(t, err)
		assert.Equal(t, readmodel.Page[readmodel.Comment]{Items: []readmodel.Comment{}}, p)
	})
	t.Run("past the last comment", func(t *testing.T) {
		p, err := store.Comments(ctx, post.ID, &domain.Cursor{ID: int64(want[12].ID), Unix: 1})
		require.NoError(t, err)
		assert.Empty(t, p.Items)
		assert.False(t, p.HasMore)
	})
	t.Run("a deleted post is not found", func(t *testing.T) {
		_, err := store.Comments(ctx, gone.ID, nil)
		require.ErrorIs(t, err, domain.ErrNotFound)
	})
	t.Run("an unknown post is not found", func(t *testing.T) {
		_, err := store.Comments(ctx, 31337, nil)
		require.ErrorIs(t, err, domain.ErrNotFound)
	})
}

func TestFollowerLists(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := openPool(t, nil)
	store := readmodel.NewStore(pool)
	seed := newSeeder(t, pool)
	const star = domain.UserID(1000)
	base := time.Date(2025, 5, 1, 10, 0, 0, 0, time.UTC)

	// Given 23 followers of the star, most of them in bursts within the same
	// second (so a page boundary falls inside a tie), and the star following 12
	// users, all in one second.
	type follow struct {
		user domain.UserID
		at   time.Time
	}
	var followers, following []follow
	for i := range 23 {
		f := follow{domain.UserID(2000 + (i*7)%23), base.Add(time.Duration(i/4) * time.Second)}
		seed.follow(f.user, star, f.at.Add(300*time.Millisecond))
		followers = append(followers, f)
	}
	for i := range 12 {
		f := follow{domain.UserID(3000 + i), base}
		seed.follow(star, f.user, f.at)
		following = append(following, f)
	}
	seed.follow(2000, 2001, base) // noise
	newestFirst := func(fs []follow) []domain.UserID {
		sort.Slice(fs, func(i, j int) bool {
			if !fs[i].at.Equal(fs[j].at) {
				return fs[i].at.After(fs[j].at)
			}
			return fs[i].user > fs[j].user
		})
		out := make([]domain.UserID, len(fs))
		for i, f := range fs {
			out[i] = f.user
		}
		return out
	}

	t.Run("followers", func(t *testing.T) {
		got, pages := pageAll(t, func(after *domain.Cursor) (readmodel.Page[domain.UserID], error) {
			return store.Followers(ctx, star, after)
		})
		assert.Equal(t, newestFirst(followers), got)
		assert.Len(t, pages, 3)
		// The cursor is the last follower and the follow's second.
		last := followers[9]
		assert.Equal(t, domain.Cursor{ID: int64(last.user), Unix: last.at.Unix()}, *pages[0].Next)
	})
	t.Run("following", func(t *testing.T) {
		got, pages := pageAll(t, func(after *domain.Cursor) (readmodel.Page[domain.UserID], error) {
			return store.Following(ctx, star, after)
		})
		assert.Equal(t, newestFirst(following), got)
		assert.Len(t, pages, 2)
	})
	t.Run("nobody", func(t *testing.T) {
		p, err := store.Followers(ctx, 1, nil)
		require.NoError(t, err)
		assert.Equal(t, readmodel.Page[domain.UserID]{Items: []domain.UserID{}}, p)
	})
}

func TestFeed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := openPool(t, nil)
	store := readmodel.NewStore(pool)
	seed := newSeeder(t, pool)
	const viewer, alice, bob, carol, dave = domain.UserID(1), domain.UserID(2), domain.UserID(3), domain.UserID(4), domain.UserID(5)

	// Given the viewer follows alice and bob but not carol; dave follows the
	// viewer; everyone posts, and some of alice's posts are deleted.
	seed.follow(viewer, alice, seed.now)
	seed.follow(viewer, bob, seed.now)
	seed.follow(dave, viewer, seed.now)
	seed.follow(carol, alice, seed.now)
	var want []readmodel.FeedEntry
	for i := range 30 {
		author := []domain.UserID{alice, bob, carol, viewer, alice}[i%5]
		p := seed.post(author, 1)
		switch {
		case author == alice && i%3 == 0:
			seed.deletePost(p.ID)
		case author == alice || author == bob:
			want = append(want, readmodel.FeedEntry{PostID: p.ID, AuthorID: author, CreatedAt: p.CreatedAt})
		}
	}
	slices.Reverse(want)
	require.Greater(t, len(want), 12)
	normalise := func(es []readmodel.FeedEntry) []readmodel.FeedEntry {
		for i := range es {
			es[i].CreatedAt = es[i].CreatedAt.UTC()
		}
		return es
	}
	for i := range want {
		want[i].CreatedAt = want[i].CreatedAt.UTC()
	}

	t.Run("one page holds everything", func(t *testing.T) {
		got, err := store.Feed(ctx, viewer, nil, 100)
		require.NoError(t, err)
		assert.Equal(t, want, normalise(got))
	})
	t.Run("paging by cursor yields each post once, newest first", func(t *testing.T) {
		var got []readmodel.FeedEntry
		var after *domain.Cursor
		for range 20 {
			page, err := store.Feed(ctx, viewer, after, 4)
			require.NoError(t, err)
			require.LessOrEqual(t, len(page), 4)
			if len(page) == 0 {
				break
			}
			got = append(got, page...)
			last := page[len(page)-1]
			after = &domain.Cursor{ID: int64(last.PostID), Unix: last.CreatedAt.Unix()}
		}
		assert.Equal(t, want, normalise(got))
	})
	t.Run("a cursor at a deleted post continues after it", func(t *testing.T) {
		deleted := seed.post(alice, 1)
		newer := seed.post(bob, 1)
		seed.deletePost(deleted.ID)
		got, err := store.Feed(ctx, viewer, &domain.Cursor{ID: int64(deleted.ID), Unix: deleted.CreatedAt.Unix()}, 3)
		require.NoError(t, err)
		assert.Equal(t, want[:3], normalise(got))
		top, err := store.Feed(ctx, viewer, nil, 1)
		require.NoError(t, err)
		assert.Equal(t, newer.ID, top[0].PostID)
	})
	t.Run("after unfollowing, an author's posts are gone", func(t *testing.T) {
		seed.exec(`DELETE FROM follows WHERE follower_id = $1 AND followee_id = $2`, int64(viewer), int64(bob))
		got, err := store.Feed(ctx, viewer, nil, 100)
		require.NoError(t, err)
		for _, e := range got {
			assert.Equal(t, alice, e.AuthorID)
		}
		assert.NotEmpty(t, got)
	})
	t.Run("a user who follows nobody has an empty feed", func(t *testing.T) {
		got, err := store.Feed(ctx, carol+100, nil, 10)
		require.NoError(t, err)
		assert.Empty(t, got)
	})
	t.Run("the viewer's followers' posts are not in it", func(t *testing.T) {
		seed.post(dave, 1)
		got, err := store.Feed(ctx, viewer, nil, 100)
		require.NoError(t, err)
		for _, e := range got {
			assert.NotEqual(t, dave, e.AuthorID)
			assert.NotEqual(t, viewer, e.AuthorID)
		}
	})
}

func TestPosition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := openPool(t, nil)
	store := readmodel.NewStore(pool)
	seed := newSeeder(t, pool)

	// Given no checkpoint yet, the read model is at 0.
	pos, err := store.Position(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(0), pos)

	// Given checkpoints of the read model projector and of another projector,
	// the read model's counts.
	seed.exec(`INSERT INTO projector_checkpoints (projector, position) VALUES ($1, 42), ('feeds', 99)`, readmodel.ProjectorName)
	pos, err = store.Position(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(42), pos)
}

func TestUnreachablePostgresIsUnavailable(t *testing.T) {
	t.Parallel()
	// Given a pool of a Postgres that is not there (port 1 refuses at once).
	pool, err := pgxpool.New(context.Background(), "postgres://feed@127.0.0.1:1/feed?connect_timeout=2")
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store := readmodel.NewStore(pool)
	ctx := context.Background()

	// When any query runs, then it is a dependency failure, not an internal one.
	_, err = store.Post(ctx, 1, 0)
	require.ErrorIs(t, err, domain.ErrUnavailable)
	_, err = store.Position(ctx)
	require.ErrorIs(t, err, domain.ErrUnavailable)
	_, err = store.Feed(ctx, 1, nil, 10)
	require.ErrorIs(t, err, domain.ErrUnavailable)
	_, err = store.Followers(ctx, 1, nil)
	require.ErrorIs(t, err, domain.ErrUnavailable)
}

// TestBusyPostgresRefusesReadsAtOnce: with every connection of the pool
// held by a query that waits (on a table lock), a further read is refused
// as unavailable within the store's wait for a turn, long before its own
// deadline, and touches nothing; those under way finish once the lock goes.
func TestBusyPostgresRefusesReadsAtOnce(t *testing.T) {
	t.Parallel()
	pool := openPool(t, func(c *pgxpool.Config) { c.MaxConns = 3 })
	store := readmodel.NewStore(pool)
	seed := newSeeder(t, pool)
	post := seed.post(601, 1)
	ctx := context.Background()

	// A connection of its own (not the pool's) holds the posts table.
	conn, err := pgx.Connect(ctx, pool.Config().ConnString())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(ctx) })
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "LOCK TABLE "+migrations.Schema+".posts IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)

	// Three reads take the pool's three connections and wait on the lock.
	done := make(chan error, 3)
	for range 3 {
		go func() {
			_, err := store.Post(ctx, post.ID, 0)
			done <- err
		}()
	}
	require.Eventually(t, func() bool { return pool.Stat().AcquiredConns() == 3 }, 10*time.Second, 5*time.Millisecond)

	// A fourth, with a deadline far off, is refused without waiting for it.
	deadline, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	_, err = store.ProfileGrid(deadline, 601, nil)
	require.ErrorIs(t, err, domain.ErrUnavailable)
	require.NoError(t, deadline.Err(), "refused before its deadline")
	assert.Equal(t, int32(3), pool.Stat().AcquiredConns(), "the refused read took no connection")

	require.NoError(t, tx.Rollback(ctx))
	for range 3 {
		require.NoError(t, <-done, "a read under way finishes once the lock goes")
	}
}

// queryLog records the statements a pool runs, so a test can EXPLAIN exactly
// what the store sent.
type queryLog struct {
	mu      sync.Mutex
	queries []pgx.TraceQueryStartData
}

func (q *queryLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.queries = append(q.queries, data)
	return ctx
}

func (q *queryLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (q *queryLog) last() pgx.TraceQueryStartData {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.queries[len(q.queries)-1]
}

// seedFeedGraph makes viewer follow followees accounts with posts posts each
// (ids time-ordered, interleaved across authors), plus as many accounts the
// viewer does not follow, and a tenth of every author's posts deleted.
func seedFeedGraph(tb testing.TB, pool *pgxpool.Pool, viewer domain.UserID, followees, posts int) {
	tb.Helper()
	ctx := context.Background()
	for _, st := range []struct {
		sql  string
		args []any
	}{
		// Authors 10001.. are followed, 20001.. are not.
		{`INSERT INTO follows (follower_id, followee_id, created_at)
		  SELECT $1, 10000 + a, date_trunc('second', now()) FROM generate_series(1, $2::int) a`,
			[]any{int64(viewer), followees}},
		// Post n of the a-th followed author is made at millisecond
		// (n*followees*2 + a)*2 after the id epoch and the one of the a-th
		// unfollowed author a millisecond later, so authors' posts interleave;
		// the id is that millisecond shifted as in domain.IDGenerator (node 0,
		// sequence 0), so ids and created_at agree.
		{`INSERT INTO posts (id, user_id, caption, created_at, deleted_at)
		  SELECT x.ms << 12, x.author, 'caption', $3::timestamptz + x.ms * interval '1 millisecond',
		         CASE WHEN n % 10 = 7 THEN now() END
		  FROM generate_series(1, $1::int) a, generate_series(1, $2::int) n,
		       LATERAL (SELECT 10000 + a AS author, (n::bigint * $1 * 2 + a) * 2 AS ms
		                UNION ALL
		                SELECT 20000 + a, (n::bigint * $1 * 2 + a) * 2 + 1) x`,
			[]any{followees, posts, domain.IDEpoch}},
		// Keep the pages as written (see settle) for as long as the caller wants.
		{`ALTER TABLE posts SET (autovacuum_enabled = false)`, nil},
		{`ANALYZE`, nil},
	} {
		_, err := pool.Exec(ctx, st.sql, st.args...)
		require.NoError(tb, err, st.sql)
	}
}

// settle brings the posts table to the state autovacuum keeps older pages in:
// every page marked all-visible, so that index-only scans skip the heap. Only
// WAL that is flushed lets VACUUM set a tuple's commit hint and so its page's
// visibility bit, and test clusters commit asynchronously: hence the
// CHECKPOINT first.
func settle(tb testing.TB, pool *pgxpool.Pool) {
	tb.Helper()
	for _, sql := range []string{`CHECKPOINT`, `VACUUM ANALYZE posts`} {
		_, err := pool.Exec(context.Background(), sql)
		require.NoError(tb, err, sql)
	}
}

// TestFeedReadsEachFolloweesNewestPostsByIndex checks the plan of the pull feed
// on a graph large enough for the planner to care: each followee's posts are
// read from posts_by_author, newest first and only as many as a page, never by
// scanning every post.
func TestFeedReadsEachFolloweesNewestPostsByIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	trace := &queryLog{}
	pool := openPool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = trace })
	store := readmodel.NewStore(pool)
	const viewer = domain.UserID(1)
	seedFeedGraph(t, pool, viewer, 200, 50)

	for _, state := range []string{"fresh", "settled"} {
		if state == "settled" {
			settle(t, pool)
		}
		// The first page, and one from the middle of the feed.
		for _, after := range []*domain.Cursor{nil, {ID: 20000 << 12, Unix: 0}} {
			got, err := store.Feed(ctx, viewer, after, 11)
			require.NoError(t, err)
			require.Len(t, got, 11)
			plan := explain(t, pool, trace.last())
			assert.Contains(t, plan, "Scan using posts_by_author on posts", "%s pages:\n%s", state, plan)
			assert.NotContains(t, plan, "Seq Scan on posts", "%s pages:\n%s", state, plan)
			assert.NotContains(t, plan, "Bitmap Heap Scan on posts", "%s pages:\n%s", state, plan)
			if state == "settled" {
				assert.Contains(t, plan, "Index Only Scan using posts_by_author", plan)
			}
		}
	}
}

// explain runs EXPLAIN ANALYZE of a traced query with its arguments.
func explain(tb testing.TB, pool *pgxpool.Pool, q pgx.TraceQueryStartData) string {
	tb.Helper()
	rows, err := pool.Query(context.Background(), "EXPLAIN (ANALYZE, BUFFERS) "+q.SQL, q.Args...)
	require.NoError(tb, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(tb, err)
	return strings.Join(lines, "\n")
}

// BenchmarkPullFeed measures the pull feed of a user following 500 accounts
// with 100 posts each (and 500 unfollowed accounts with as many posts), for the
// first page and for a page from the middle of the feed, and reports latency
// percentiles. "fresh" is the table as written, where every candidate post costs
// a heap visit (the newest posts of a live table are like that until autovacuum
// passes); "settled" is after VACUUM, where the per-author scans are index only.
//
//	go test -run '^$' -bench BenchmarkPullFeed -benchtime 2000x ./projections/readmodel/
func BenchmarkPullFeed(b *testing.B) {
	ctx := context.Background()
	trace := &queryLog{}
	pool := openPool(b, func(c *pgxpool.Config) { c.ConnConfig.Tracer = trace })
	store := readmodel.NewStore(pool)
	const viewer, followees, posts = domain.UserID(1), 500, 100
	start := time.Now()
	seedFeedGraph(b, pool, viewer, followees, posts)
	b.Logf("seeded %d followees × %d posts (and as many unfollowed) in %v", followees, posts, time.Since(start).Round(time.Millisecond))

	// The deep cursor is the followed post in the middle of the feed.
	var middle int64
	require.NoError(b, pool.QueryRow(ctx, `SELECT id FROM posts
		WHERE user_id BETWEEN 10001 AND 10000 + $1 AND deleted_at IS NULL
		ORDER BY id DESC OFFSET $2 LIMIT 1`, followees, followees*posts*9/10/2).Scan(&middle))
	deep := &domain.Cursor{ID: middle, Unix: domain.IDTime(middle).Unix()}

	for _, state := range []string{"fresh", "settled"} {
		if state == "settled" {
			settle(b, pool)
		}
		for _, bc := range []struct {
			name  string
			after *domain.Cursor
		}{{"first_page", nil}, {"deep_page", deep}} {
			b.Run(state+"/"+bc.name, func(b *testing.B) {
				var lat []time.Duration
				for b.Loop() {
					t0 := time.Now()
					got, err := store.Feed(ctx, viewer, bc.after, domain.PageSize+1)
					lat = append(lat, time.Since(t0))
					if err != nil || len(got) != domain.PageSize+1 {
						b.Fatalf("feed: %d entries, %v", len(got), err)
					}
				}
				slices.Sort(lat)
				p50, p99 := lat[len(lat)/2], lat[len(lat)*99/100]
				b.ReportMetric(float64(p50.Microseconds()), "p50-µs")
				b.ReportMetric(float64(p99.Microseconds()), "p99-µs")
				b.Logf("%s/%s: %d runs, p50 %v, p99 %v", state, bc.name, len(lat), p50, p99)
				if len(lat) >= 100 && testing.Verbose() {
					b.Logf("plan:\n%s", explain(b, pool, trace.last()))
				}
			})
		}
	}
}
