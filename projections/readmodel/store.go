package readmodel

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/projections/pgschema"
)

// checkpointName is the projector_checkpoints row whose position Position
// reports: the read model projector's (ProjectorName). Spelled out here so that
// the read side states which projection it waits for; the store tests seed the
// row under ProjectorName, so the two cannot drift apart unnoticed.
const checkpointName = "readmodel"

// Store answers queries from the read model.
type Store struct {
	pool *pgxpool.Pool
	// turns holds a token for each query under way: at most the pool's
	// connections, so none queues inside the pool (see turn).
	turns chan struct{}
}

// NewStore returns a store reading from pool.
func NewStore(pool *pgxpool.Pool) *Store {
	return &Store{pool: pool, turns: make(chan struct{}, max(1, pool.Config().MaxConns))}
}

// turnWait is how long a query waits for one of those under way to end
// before it is refused.
const turnWait = time.Second

// turn waits for a query's turn: a connection of the pool, free now or
// within turnWait; beyond that the query fails at once as unavailable
// (503 with Retry-After at the API). When Postgres slows, the reads that
// come meanwhile would otherwise queue for its connections until each one's
// own deadline and fail only then (decision 45). release ends the turn.
func (s *Store) turn(ctx context.Context, what string) (release func(), err error) {
	select {
	case s.turns <- struct{}{}:
		return s.leave, nil
	default:
	}
	t := time.NewTimer(turnWait)
	defer t.Stop()
	select {
	case s.turns <- struct{}{}:
		return s.leave, nil
	case <-t.C:
		return nil, fmt.Errorf("%s: all %d connections to postgres busy for %s: %w", what, cap(s.turns), turnWait, domain.ErrUnavailable)
	case <-ctx.Done():
		return nil, fmt.Errorf("%s: waiting for postgres: %w: %w", what, domain.ErrUnavailable, ctx.Err())
	}
}

func (s *Store) leave() { <-s.turns }

// Media is one image of a post.
type Media struct {
	Key, ContentType string
	Width, Height    int
	// Position is the image's place in the post; 0 is the thumbnail.
	Position int
}

// Post is a live post as readers see it.
type Post struct {
	ID                      domain.PostID
	UserID                  domain.UserID
	Caption                 string
	CreatedAt               time.Time
	EditedAt                *time.Time
	LikeCount, CommentCount int
	// HasLiked is whether the viewer the post was read for likes it; always
	// false for an anonymous viewer.
	HasLiked bool
	// Media are the post's images by position.
	Media []Media
}

// CreatedPost is the post e creates exactly as the read model reads it once
// e is applied: not edited, no likes or comments, its images in their order,
// and its time as Postgres keeps it and pgx returns it (whole microseconds, in
// the local zone).
func CreatedPost(e events.PostCreated) Post {
	media := make([]Media, len(e.Media))
	for i, m := range e.Media {
		media[i] = Media{Key: m.Key, ContentType: m.ContentType, Width: m.Width, Height: m.Height, Position: i}
	}
	t := e.CreatedAt
	return Post{
		ID: e.PostID, UserID: e.UserID, Caption: e.Caption,
		CreatedAt: time.Unix(t.Unix(), int64(t.Nanosecond()/1000*1000)),
		Media:     media,
	}
}

// GridItem is a post in a profile grid.
type GridItem struct {
	ID                      domain.PostID
	CreatedAt               time.Time
	LikeCount, CommentCount int
	Thumbnail               Media
}

// Comment is a comment on a post.
type Comment struct {
	ID        domain.CommentID
	UserID    domain.UserID
	Text      string
	CreatedAt time.Time
}

// Page is one page of a list: at most domain.PageSize items, and the cursor of
// the next page (nil when HasMore is false).
type Page[T any] struct {
	Items   []T
	Next    *domain.Cursor
	HasMore bool
}

// FeedEntry is a post of the pull feed, before hydration.
type FeedEntry struct {
	PostID    domain.PostID
	AuthorID  domain.UserID
	CreatedAt time.Time
}

// queryError marks a missing row as domain.ErrNotFound and a failure to reach
// Postgres as domain.ErrUnavailable, so the API answers 404 and 503 for them,
// keeping the cause in the chain.
func queryError(what string, err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%s: %w", what, domain.ErrNotFound)
	}
	if unreachable(err) {
		return fmt.Errorf("%s: %w: %w", what, domain.ErrUnavailable, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// unreachable tells a failure to reach Postgres from a failure of the query
// itself.
func unreachable(err error) bool { return pgschema.Unreachable(err) }

// fetchSize is how many rows a page query asks for: one more than a page, so
// that the extra row tells whether another page follows without a count.
const fetchSize = domain.PageSize + 1

// before is the exclusive upper bound of a newest-first keyset on ids: the
// cursor's id, or above every id for the first page. A bound rather than an
// optional condition keeps the query one plan that seeks the index.
func before(after *domain.Cursor) int64 {
	if after == nil {
		return math.MaxInt64
	}
	return after.ID
}

// paginate turns up to fetchSize rows into a page, taking each item and the
// cursor of the last one from its row.
func paginate[R, T any](rows []R, item func(R) T, cursor func(R) domain.Cursor) Page[T] {
	var p Page[T]
	if len(rows) > domain.PageSize {
		rows, p.HasMore = rows[:domain.PageSize], true
	}
	p.Items = make([]T, len(rows))
	for i, r := range rows {
		p.Items[i] = item(r)
	}
	if p.HasMore {
		c := cursor(rows[len(rows)-1])
		p.Next = &c
	}
	return p
}

// selectPosts hydrates live posts with their media, one row per image (ordered
// by post and position, so a post's rows are adjacent). The like check runs once
// per post, not per image, and is skipped for the anonymous viewer 0. Each row
// also carries the projector's checkpoint: one statement sees one snapshot, and
// the projector commits each batch with its checkpoint, so it is exactly the
// log position the rows reflect (what Cache needs to keep them).
const selectPosts = `
SELECT p.id, p.user_id, p.caption, p.created_at, p.edited_at, p.like_count, p.comment_count, p.has_liked,
       m.position, m.media_key, m.content_type, m.width, m.height,
       coalesce((SELECT c.position FROM projector_checkpoints c WHERE c.projector = $3), 0)
FROM (
    SELECT p.*, ($2::bigint <> 0 AND EXISTS (
        SELECT 1 FROM likes l WHERE l.post_id = p.id AND l.user_id = $2)) AS has_liked
    FROM posts p
    WHERE p.id = ANY($1::bigint[]) AND p.deleted_at IS NULL
) p
LEFT JOIN post_media m ON m.post_id = p.id
ORDER BY p.id, m.position`

// Post reads a live post for viewer (0: anonymous). An unknown or deleted post
// is domain.ErrNotFound.
func (s *Store) Post(ctx context.Context, id domain.PostID, viewer domain.UserID) (Post, error) {
	posts, err := s.Posts(ctx, []domain.PostID{id}, viewer)
	if err != nil {
		return Post{}, err
	}
	p, ok := posts[id]
	if !ok {
		return Post{}, fmt.Errorf("post %d: %w", id, domain.ErrNotFound)
	}
	return p, nil
}

// Posts hydrates a page of post ids for viewer (0: anonymous) in one query.
// Unknown and deleted posts are absent from the map.
func (s *Store) Posts(ctx context.Context, ids []domain.PostID, viewer domain.UserID) (map[domain.PostID]Post, error) {
	posts, _, err := s.PostsAt(ctx, ids, viewer)
	return posts, err
}

// PostsAt is Posts, with the log position the posts reflect: the read model's
// checkpoint in the same snapshot (0 when no post was found).
func (s *Store) PostsAt(ctx context.Context, ids []domain.PostID, viewer domain.UserID) (map[domain.PostID]Post, uint64, error) {
	out := make(map[domain.PostID]Post, len(ids))
	if len(ids) == 0 {
		return out, 0, nil
	}
	raw := make([]int64, len(ids))
	for i, id := range ids {
		raw[i] = int64(id)
	}
	release, err := s.turn(ctx, "read posts")
	if err != nil {
		return nil, 0, err
	}
	defer release()
	rows, err := s.pool.Query(ctx, selectPosts, raw, int64(viewer), checkpointName)
	if err != nil {
		return nil, 0, queryError("read posts", err)
	}
	defer rows.Close()
	var (
		cur  *Post
		asOf int64
	)
	for rows.Next() {
		var (
			p                  Post
			pos, width, height *int
			key, contentType   *string
		)
		if err := rows.Scan(&p.ID, &p.UserID, &p.Caption, &p.CreatedAt, &p.EditedAt, &p.LikeCount, &p.CommentCount,
			&p.HasLiked, &pos, &key, &contentType, &width, &height, &asOf); err != nil {
			return nil, 0, queryError("read posts", err)
		}
		if cur == nil || cur.ID != p.ID {
			if cur != nil {
				out[cur.ID] = *cur
			}
			p.Media = []Media{}
			cur = &p
		}
		// A post always has images; the outer join only keeps a post whose
		// media rows are missing from vanishing.
		if pos != nil {
			cur.Media = append(cur.Media, Media{Key: *key, ContentType: *contentType, Width: *width, Height: *height, Position: *pos})
		}
	}
	if err := rows.Err(); err != nil {
		return nil, 0, queryError("read posts", err)
	}
	if cur != nil {
		out[cur.ID] = *cur
	}
	return out, uint64(asOf), nil
}

// ProfileGrid reads a page of user's live posts, newest first, each with its
// thumbnail (the image at position 0). An unknown user has an empty grid.
func (s *Store) ProfileGrid(ctx context.Context, user domain.UserID, after *domain.Cursor) (Page[GridItem], error) {
	// The join keeps the scan on posts_by_author in id order and fetches one
	// media row per post by its primary key.
	release, err := s.turn(ctx, fmt.Sprintf("profile grid of user %d", user))
	if err != nil {
		return Page[GridItem]{}, err
	}
	defer release()
	rows, err := s.pool.Query(ctx, `
		SELECT p.id, p.created_at, p.like_count, p.comment_count,
		       m.media_key, m.content_type, m.width, m.height, m.position
		FROM posts p
		JOIN post_media m ON m.post_id = p.id AND m.position = 0
		WHERE p.user_id = $1 AND p.deleted_at IS NULL AND p.id < $2
		ORDER BY p.id DESC
		LIMIT $3`, int64(user), before(after), fetchSize)
	if err != nil {
		return Page[GridItem]{}, queryError(fmt.Sprintf("profile grid of user %d", user), err)
	}
	items, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (GridItem, error) {
		var g GridItem
		err := row.Scan(&g.ID, &g.CreatedAt, &g.LikeCount, &g.CommentCount,
			&g.Thumbnail.Key, &g.Thumbnail.ContentType, &g.Thumbnail.Width, &g.Thumbnail.Height, &g.Thumbnail.Position)
		return g, err
	})
	if err != nil {
		return Page[GridItem]{}, queryError(fmt.Sprintf("profile grid of user %d", user), err)
	}
	return paginate(items, func(g GridItem) GridItem { return g }, func(g GridItem) domain.Cursor {
		return domain.Cursor{ID: int64(g.ID), Unix: g.CreatedAt.Unix()}
	}), nil
}

// Comments reads a page of a live post's comments, oldest first. An unknown or
// deleted post is domain.ErrNotFound.
func (s *Store) Comments(ctx context.Context, post domain.PostID, after *domain.Cursor) (Page[Comment], error) {
	// One query answers both whether the post is live (no row: it is not) and
	// its page (a single all-NULL row: it has no comments after the cursor), from
	// one snapshot.
	var from int64
	if after != nil {
		from = after.ID
	}
	release, err := s.turn(ctx, fmt.Sprintf("comments of post %d", post))
	if err != nil {
		return Page[Comment]{}, err
	}
	defer release()
	rows, err := s.pool.Query(ctx, `
		SELECT c.id, c.user_id, c.text, c.created_at
		FROM posts p
		LEFT JOIN LATERAL (
		    SELECT id, user_id, text, created_at FROM comments
		    WHERE post_id = p.id AND id > $2
		    ORDER BY id
		    LIMIT $3
		) c ON true
		WHERE p.id = $1 AND p.deleted_at IS NULL
		ORDER BY c.id`, int64(post), from, fetchSize)
	if err != nil {
		return Page[Comment]{}, queryError(fmt.Sprintf("comments of post %d", post), err)
	}
	defer rows.Close()
	found := false
	comments := []Comment{}
	for rows.Next() {
		found = true
		var (
			id, user  *int64
			text      *string
			createdAt *time.Time
		)
		if err := rows.Scan(&id, &user, &text, &createdAt); err != nil {
			return Page[Comment]{}, queryError(fmt.Sprintf("comments of post %d", post), err)
		}
		if id != nil {
			comments = append(comments, Comment{ID: domain.CommentID(*id), UserID: domain.UserID(*user), Text: *text, CreatedAt: *createdAt})
		}
	}
	if err := rows.Err(); err != nil {
		return Page[Comment]{}, queryError(fmt.Sprintf("comments of post %d", post), err)
	}
	if !found {
		return Page[Comment]{}, fmt.Errorf("comments of post %d: post %d: %w", post, post, domain.ErrNotFound)
	}
	return paginate(comments, func(c Comment) Comment { return c }, func(c Comment) domain.Cursor {
		return domain.Cursor{ID: int64(c.ID), Unix: c.CreatedAt.Unix()}
	}), nil
}

// followRow is one entry of a follower list: the other user and when the follow
// happened (whole seconds).
type followRow struct {
	user domain.UserID
	at   time.Time
}

// Followers reads a page of the users who follow user, newest follow first.
func (s *Store) Followers(ctx context.Context, user domain.UserID, after *domain.Cursor) (Page[domain.UserID], error) {
	return s.follows(ctx, fmt.Sprintf("followers of user %d", user), `
		SELECT follower_id, created_at FROM follows
		WHERE followee_id = $1 AND (created_at, follower_id) < ($2, $3)
		ORDER BY created_at DESC, follower_id DESC
		LIMIT $4`, user, after)
}

// Following reads a page of the users user follows, newest follow first.
func (s *Store) Following(ctx context.Context, user domain.UserID, after *domain.Cursor) (Page[domain.UserID], error) {
	return s.follows(ctx, fmt.Sprintf("users followed by user %d", user), `
		SELECT followee_id, created_at FROM follows
		WHERE follower_id = $1 AND (created_at, followee_id) < ($2, $3)
		ORDER BY created_at DESC, followee_id DESC
		LIMIT $4`, user, after)
}

// follows runs a follower-list query: a keyset on (created_at, user id), both
// descending, which is exact because follow times are stored in whole seconds,
// the cursor's unit.
func (s *Store) follows(ctx context.Context, what, query string, user domain.UserID, after *domain.Cursor) (Page[domain.UserID], error) {
	at := pgtype.Timestamptz{InfinityModifier: pgtype.Infinity, Valid: true}
	id := int64(math.MaxInt64)
	if after != nil {
		at = pgtype.Timestamptz{Time: time.Unix(after.Unix, 0), Valid: true}
		id = after.ID
	}
	release, err := s.turn(ctx, what)
	if err != nil {
		return Page[domain.UserID]{}, err
	}
	defer release()
	rows, err := s.pool.Query(ctx, query, int64(user), at, id, fetchSize)
	if err != nil {
		return Page[domain.UserID]{}, queryError(what, err)
	}
	list, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (followRow, error) {
		var r followRow
		err := row.Scan(&r.user, &r.at)
		return r, err
	})
	if err != nil {
		return Page[domain.UserID]{}, queryError(what, err)
	}
	return paginate(list, func(r followRow) domain.UserID { return r.user }, func(r followRow) domain.Cursor {
		return domain.Cursor{ID: int64(r.user), Unix: r.at.Unix()}
	}), nil
}

// selectFeed is the pull feed. Each followee contributes at most $3 posts from
// its own newest-first index scan on posts_by_author (index only: it needs just
// the id), the candidates are merged and cut to $3, and only those few are
// fetched from the table. Its cost grows with followees × limit, not with how
// many posts they have or how deep the cursor is.
const selectFeed = `
SELECT p.id, p.user_id, p.created_at
FROM (
    SELECT top.id
    FROM follows f
    CROSS JOIN LATERAL (
        SELECT id FROM posts
        WHERE user_id = f.followee_id AND deleted_at IS NULL AND id < $2
        ORDER BY id DESC
        LIMIT $3
    ) top
    WHERE f.follower_id = $1 AND f.followee_id <> $1
    ORDER BY top.id DESC
    LIMIT $3
) feed
JOIN posts p ON p.id = feed.id
ORDER BY p.id DESC`

// Feed reads the pull feed of user: live posts of the accounts user follows,
// newest first, never user's own, strictly older than after's post when after
// is set, at most limit of them.
func (s *Store) Feed(ctx context.Context, user domain.UserID, after *domain.Cursor, limit int) ([]FeedEntry, error) {
	if limit <= 0 {
		return []FeedEntry{}, nil
	}
	release, err := s.turn(ctx, fmt.Sprintf("pull feed of user %d", user))
	if err != nil {
		return nil, err
	}
	defer release()
	rows, err := s.pool.Query(ctx, selectFeed, int64(user), before(after), limit)
	if err != nil {
		return nil, queryError(fmt.Sprintf("pull feed of user %d", user), err)
	}
	entries, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (FeedEntry, error) {
		var e FeedEntry
		err := row.Scan(&e.PostID, &e.AuthorID, &e.CreatedAt)
		return e, err
	})
	if err != nil {
		return nil, queryError(fmt.Sprintf("pull feed of user %d", user), err)
	}
	return entries, nil
}

// Position is the log position the read model has applied: the read model
// projector's checkpoint, 0 before its first batch.
func (s *Store) Position(ctx context.Context) (uint64, error) {
	release, err := s.turn(ctx, "read model position")
	if err != nil {
		return 0, err
	}
	defer release()
	var pos int64
	err = s.pool.QueryRow(ctx, `SELECT position FROM projector_checkpoints WHERE projector = $1`, checkpointName).Scan(&pos)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, queryError("read model position", err)
	}
	return uint64(pos), nil
}

// MediaReferenced returns those of keys that a live post references, or a
// post deleted at or after deletedSince. It reads every post's media once
// (post_media is not indexed by key, which would cost every post's insert).
func (s *Store) MediaReferenced(ctx context.Context, keys []string, deletedSince time.Time) (map[string]bool, error) {
	release, err := s.turn(ctx, "media references")
	if err != nil {
		return nil, err
	}
	defer release()
	rows, err := s.pool.Query(ctx, `
		SELECT DISTINCT m.media_key
		FROM post_media m JOIN posts p ON p.id = m.post_id
		WHERE m.media_key = ANY($1::text[]) AND (p.deleted_at IS NULL OR p.deleted_at >= $2)`, keys, deletedSince)
	if err != nil {
		return nil, queryError("media references", err)
	}
	keysFound, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, queryError("media references", err)
	}
	out := make(map[string]bool, len(keysFound))
	for _, k := range keysFound {
		out[k] = true
	}
	return out, nil
}
