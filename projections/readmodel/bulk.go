package readmodel

import (
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/projections"
)

// plan is a batch reduced to its net effect on the read model, to be applied
// as a few set-based statements instead of one statement per event. Applied in
// the order posts, edits, likes, comments, deletes, follows, it leaves the same
// rows as applying the events one by one, because the reduction drops what the
// one-by-one statements would have found to be no-ops by then:
//   - events about a post that come before its creation in the batch (the post
//     did not exist yet), and those after its first deletion (it is gone);
//   - all but the last edit of a post, and all but the first deletion;
//   - all but the last like or unlike of each (user, post).
//
// What depends on the state before the batch (is the post live, is it liked)
// is left to the statements, which check it.
type plan struct {
	posts struct {
		ids, users []int64
		captions   []string
		created    []time.Time
	}
	media struct {
		posts           []int64
		positions       []int16
		keys, types     []string
		widths, heights []int32
		sizes           []int64
	}
	edits struct {
		ids      []int64
		captions []string
		at       []time.Time
	}
	deletes struct {
		ids []int64
		at  []time.Time
	}
	likes, unlikes struct{ posts, users []int64 }
	comments       struct {
		ids, posts, users []int64
		texts             []string
		at                []time.Time
	}
	follows, refollows struct {
		followers, followees []int64
		since                []time.Time
	}
	unfollows struct{ followers, followees []int64 }
}

type likeKey struct {
	post domain.PostID
	user domain.UserID
}

func reduce(records []events.Record, merged projections.Merged) *plan {
	p := &plan{}
	createdAt := map[domain.PostID]int{} // index of a post's creation in the batch
	deletedAt := map[domain.PostID]int{} // index of its first deletion
	for i, rec := range records {
		switch e := rec.Event.(type) {
		case events.PostCreated:
			if _, ok := createdAt[e.PostID]; !ok {
				createdAt[e.PostID] = i
			}
		case events.PostDeleted:
			if _, ok := deletedAt[e.PostID]; !ok {
				deletedAt[e.PostID] = i
			}
		}
	}
	// live tells whether an event at index i about post can have an effect.
	live := func(post domain.PostID, i int) bool {
		if c, ok := createdAt[post]; ok && i < c {
			return false
		}
		if d, ok := deletedAt[post]; ok && i > d {
			return false
		}
		return true
	}
	lastEdit := map[domain.PostID]events.PostEdited{}
	var editOrder []domain.PostID
	lastLike := map[likeKey]bool{}
	var likeOrder []likeKey
	for i, rec := range records {
		switch e := rec.Event.(type) {
		case events.PostCreated:
			if createdAt[e.PostID] != i {
				continue
			}
			p.posts.ids = append(p.posts.ids, int64(e.PostID))
			p.posts.users = append(p.posts.users, int64(e.UserID))
			p.posts.captions = append(p.posts.captions, e.Caption)
			p.posts.created = append(p.posts.created, e.CreatedAt)
			for pos, m := range e.Media {
				p.media.posts = append(p.media.posts, int64(e.PostID))
				p.media.positions = append(p.media.positions, int16(pos))
				p.media.keys = append(p.media.keys, m.Key)
				p.media.types = append(p.media.types, m.ContentType)
				p.media.widths = append(p.media.widths, int32(m.Width))
				p.media.heights = append(p.media.heights, int32(m.Height))
				p.media.sizes = append(p.media.sizes, m.Size)
			}
		case events.PostEdited:
			if !live(e.PostID, i) {
				continue
			}
			if _, ok := lastEdit[e.PostID]; !ok {
				editOrder = append(editOrder, e.PostID)
			}
			lastEdit[e.PostID] = e
		case events.PostDeleted:
			if deletedAt[e.PostID] != i || !live(e.PostID, i) {
				continue
			}
			p.deletes.ids = append(p.deletes.ids, int64(e.PostID))
			p.deletes.at = append(p.deletes.at, e.DeletedAt)
		case events.PostLiked, events.PostUnliked:
			k, liked := likeOf(e)
			if !live(k.post, i) {
				continue
			}
			if _, ok := lastLike[k]; !ok {
				likeOrder = append(likeOrder, k)
			}
			lastLike[k] = liked
		case events.CommentAdded:
			if !live(e.PostID, i) {
				continue
			}
			p.comments.ids = append(p.comments.ids, int64(e.CommentID))
			p.comments.posts = append(p.comments.posts, int64(e.PostID))
			p.comments.users = append(p.comments.users, int64(e.UserID))
			p.comments.texts = append(p.comments.texts, e.Text)
			p.comments.at = append(p.comments.at, e.CreatedAt)
		case events.UserFollowed:
			f := &p.follows
			if merged.Restarted[rec.Seq] {
				f = &p.refollows
			}
			f.followers = append(f.followers, int64(e.FollowerID))
			f.followees = append(f.followees, int64(e.FolloweeID))
			f.since = append(f.since, merged.Since[rec.Seq].Truncate(time.Second))
		case events.UserUnfollowed:
			p.unfollows.followers = append(p.unfollows.followers, int64(e.FollowerID))
			p.unfollows.followees = append(p.unfollows.followees, int64(e.FolloweeID))
		}
	}
	for _, id := range editOrder {
		e := lastEdit[id]
		p.edits.ids = append(p.edits.ids, int64(id))
		p.edits.captions = append(p.edits.captions, e.Caption)
		p.edits.at = append(p.edits.at, e.EditedAt)
	}
	for _, k := range likeOrder {
		l := &p.unlikes
		if lastLike[k] {
			l = &p.likes
		}
		l.posts = append(l.posts, int64(k.post))
		l.users = append(l.users, int64(k.user))
	}
	return p
}

func likeOf(ev events.Event) (likeKey, bool) {
	switch e := ev.(type) {
	case events.PostLiked:
		return likeKey{e.PostID, e.UserID}, true
	case events.PostUnliked:
		return likeKey{e.PostID, e.UserID}, false
	}
	return likeKey{}, false
}

// The set-based statements. Each takes parallel arrays; "live" is checked
// against the rows as they are when the statement runs.
const (
	bulkPosts = `INSERT INTO posts (id, user_id, caption, created_at)
		SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::timestamptz[])
		ON CONFLICT (id) DO NOTHING`
	bulkMedia = `INSERT INTO post_media (post_id, position, media_key, content_type, width, height, size)
		SELECT * FROM unnest($1::bigint[], $2::smallint[], $3::text[], $4::text[], $5::int[], $6::int[], $7::bigint[])
		ON CONFLICT DO NOTHING`
	bulkEdits = `UPDATE posts p SET caption = u.caption, edited_at = u.at
		FROM unnest($1::bigint[], $2::text[], $3::timestamptz[]) AS u(id, caption, at)
		WHERE p.id = u.id AND p.deleted_at IS NULL`
	bulkLikes = `WITH ins AS (
			INSERT INTO likes (post_id, user_id)
			SELECT u.post_id, u.user_id FROM unnest($1::bigint[], $2::bigint[]) AS u(post_id, user_id)
			WHERE EXISTS (SELECT 1 FROM posts WHERE id = u.post_id AND deleted_at IS NULL)
			ON CONFLICT DO NOTHING RETURNING post_id),
		del AS (
			DELETE FROM likes l USING unnest($3::bigint[], $4::bigint[]) AS d(post_id, user_id)
			WHERE l.post_id = d.post_id AND l.user_id = d.user_id
				AND EXISTS (SELECT 1 FROM posts WHERE id = d.post_id AND deleted_at IS NULL)
			RETURNING l.post_id),
		delta AS (
			SELECT post_id, sum(n) AS n FROM (
				SELECT post_id, 1 AS n FROM ins UNION ALL SELECT post_id, -1 FROM del) c
			GROUP BY post_id)
		UPDATE posts p SET like_count = p.like_count + delta.n FROM delta WHERE p.id = delta.post_id`
	bulkComments = `WITH ins AS (
			INSERT INTO comments (id, post_id, user_id, text, created_at)
			SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::text[], $5::timestamptz[]) AS c(id, post_id, user_id, text, created_at)
			WHERE EXISTS (SELECT 1 FROM posts WHERE id = c.post_id AND deleted_at IS NULL)
			ON CONFLICT (id) DO NOTHING RETURNING post_id),
		delta AS (SELECT post_id, count(*) AS n FROM ins GROUP BY post_id)
		UPDATE posts p SET comment_count = p.comment_count + delta.n FROM delta WHERE p.id = delta.post_id`
	bulkDeletes = `UPDATE posts p SET deleted_at = u.at
		FROM unnest($1::bigint[], $2::timestamptz[]) AS u(id, at)
		WHERE p.id = u.id AND p.deleted_at IS NULL`
	bulkFollows = `INSERT INTO follows (follower_id, followee_id, created_at)
		SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::timestamptz[]) ON CONFLICT DO NOTHING`
	bulkRefollows = `INSERT INTO follows (follower_id, followee_id, created_at)
		SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::timestamptz[])
		ON CONFLICT (follower_id, followee_id) DO UPDATE SET created_at = EXCLUDED.created_at`
	bulkUnfollows = `DELETE FROM follows f USING unnest($1::bigint[], $2::bigint[]) AS u(follower_id, followee_id)
		WHERE f.follower_id = u.follower_id AND f.followee_id = u.followee_id`
)

// queueBulk adds the plan's statements to b, skipping empty ones.
func (p *plan) queueBulk(b *pgx.Batch) {
	if len(p.posts.ids) > 0 {
		b.Queue(bulkPosts, p.posts.ids, p.posts.users, p.posts.captions, p.posts.created)
	}
	if len(p.media.posts) > 0 {
		m := p.media
		b.Queue(bulkMedia, m.posts, m.positions, m.keys, m.types, m.widths, m.heights, m.sizes)
	}
	if len(p.edits.ids) > 0 {
		b.Queue(bulkEdits, p.edits.ids, p.edits.captions, p.edits.at)
	}
	if len(p.likes.posts)+len(p.unlikes.posts) > 0 {
		b.Queue(bulkLikes, p.likes.posts, p.likes.users, p.unlikes.posts, p.unlikes.users)
	}
	if len(p.comments.ids) > 0 {
		c := p.comments
		b.Queue(bulkComments, c.ids, c.posts, c.users, c.texts, c.at)
	}
	if len(p.deletes.ids) > 0 {
		b.Queue(bulkDeletes, p.deletes.ids, p.deletes.at)
	}
	if len(p.follows.followers) > 0 {
		b.Queue(bulkFollows, p.follows.followers, p.follows.followees, p.follows.since)
	}
	if len(p.refollows.followers) > 0 {
		b.Queue(bulkRefollows, p.refollows.followers, p.refollows.followees, p.refollows.since)
	}
	if len(p.unfollows.followers) > 0 {
		b.Queue(bulkUnfollows, p.unfollows.followers, p.unfollows.followees)
	}
}
