package activity

import (
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/projections/pgschema"
)

// keys are the rows a batch is about that it does not create itself: the
// posts liked, commented on or deleted, and the follow and like pairs.
type keys struct {
	posts []int64
	// follows are (followee, follower), likes (post, user).
	followOwners, followActors []int64
	likePosts, likeActors      []int64
}

func keysOf(batch []events.Record) *keys {
	k := &keys{}
	created := map[domain.PostID]bool{}
	seen := map[domain.PostID]bool{}
	post := func(id domain.PostID) {
		if !created[id] && !seen[id] {
			seen[id] = true
			k.posts = append(k.posts, int64(id))
		}
	}
	pairs := map[pair]bool{}
	for _, rec := range batch {
		switch e := rec.Event.(type) {
		case events.PostCreated:
			created[e.PostID] = true
		case events.PostDeleted:
			post(e.PostID)
		case events.CommentAdded:
			post(e.PostID)
		case events.PostLiked, events.PostUnliked:
			p, _, _ := pairOf(rec)
			post(domain.PostID(p.target))
			if !pairs[p] && !created[domain.PostID(p.target)] {
				pairs[p] = true
				k.likePosts, k.likeActors = append(k.likePosts, p.target), append(k.likeActors, p.actor)
			}
		case events.UserFollowed, events.UserUnfollowed:
			p, _, _ := pairOf(rec)
			if !pairs[p] {
				pairs[p] = true
				k.followOwners, k.followActors = append(k.followOwners, p.target), append(k.followActors, p.actor)
			}
		}
	}
	return k
}

// The reads of a batch's state.
const (
	readPosts = `SELECT id, user_id, media_key, content_type, width, height FROM posts WHERE id = ANY($1)`
	// The partial indexes' conditions are spelled out so that they are used.
	readFollows = `SELECT i.owner_id, i.actor_id, i.id FROM items i
		JOIN unnest($1::bigint[], $2::bigint[]) AS k (owner_id, actor_id)
		ON i.owner_id = k.owner_id AND i.actor_id = k.actor_id WHERE i.post_id IS NULL`
	readLikes = `SELECT i.post_id, i.actor_id, i.owner_id, i.id FROM items i
		JOIN unnest($1::bigint[], $2::bigint[]) AS k (post_id, actor_id)
		ON i.post_id = k.post_id AND i.actor_id = k.actor_id
		WHERE i.post_id IS NOT NULL AND i.comment_id IS NULL`
)

// queueReads adds the reads of the state to b.
func (k *keys) queueReads(b *pgx.Batch) {
	b.Queue(readPosts, k.posts)
	b.Queue(readFollows, k.followOwners, k.followActors)
	b.Queue(readLikes, k.likePosts, k.likeActors)
}

// read takes the results of queueReads into kn.
func (k *keys) read(results pgx.BatchResults, kn *known) error {
	rows, err := results.Query()
	if err != nil {
		return fmt.Errorf("read posts: %w", pgschema.Failure(err))
	}
	var (
		id, owner, actor, item int64
		key, ctype             *string
		width, height          *int32
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &owner, &key, &ctype, &width, &height}, func() error {
		p := post{owner: domain.UserID(owner)}
		if key != nil {
			p.thumbnail = &Thumbnail{Key: *key, ContentType: deref(ctype), Width: int(deref(width)), Height: int(deref(height))}
		}
		kn.posts[domain.PostID(id)] = p
		return nil
	})
	if err != nil {
		return fmt.Errorf("read posts: %w", pgschema.Failure(err))
	}
	if rows, err = results.Query(); err != nil {
		return fmt.Errorf("read follows: %w", pgschema.Failure(err))
	}
	_, err = pgx.ForEachRow(rows, []any{&owner, &actor, &item}, func() error {
		kn.has(pair{false, actor, owner}, itemRef{domain.UserID(owner), uint64(item)})
		return nil
	})
	if err != nil {
		return fmt.Errorf("read follows: %w", pgschema.Failure(err))
	}
	if rows, err = results.Query(); err != nil {
		return fmt.Errorf("read likes: %w", pgschema.Failure(err))
	}
	_, err = pgx.ForEachRow(rows, []any{&id, &actor, &owner, &item}, func() error {
		kn.has(pair{true, actor, id}, itemRef{domain.UserID(owner), uint64(item)})
		return nil
	})
	if err != nil {
		return fmt.Errorf("read likes: %w", pgschema.Failure(err))
	}
	return nil
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// The writes of a batch: deletes before inserts, which never meet the rows
// deleted (every new item's id is new).
const (
	insertPosts = `INSERT INTO posts (id, user_id, media_key, content_type, width, height)
		SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[], $4::text[], $5::int[], $6::int[])
		ON CONFLICT (id) DO NOTHING`
	deletePosts     = `DELETE FROM posts WHERE id = ANY($1)`
	deletePostItems = `DELETE FROM items WHERE post_id = ANY($1) AND post_id IS NOT NULL`
	deleteItems     = `DELETE FROM items i USING unnest($1::bigint[], $2::bigint[]) AS d (owner_id, id)
		WHERE i.owner_id = d.owner_id AND i.id = d.id`
	insertItems = `INSERT INTO items (owner_id, id, actor_id, post_id, comment_id, text, created_at)
		SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[], $6::text[], $7::timestamptz[])`
)

// queueWrites adds the plan's statements to b.
func (pl *plan) queueWrites(b *pgx.Batch) {
	if len(pl.deletedPosts) > 0 {
		ids := make([]int64, len(pl.deletedPosts))
		for i, id := range pl.deletedPosts {
			ids[i] = int64(id)
		}
		b.Queue(deletePostItems, ids)
		b.Queue(deletePosts, ids)
	}
	if len(pl.deleted) > 0 {
		owners, ids := make([]int64, len(pl.deleted)), make([]int64, len(pl.deleted))
		for i, ref := range pl.deleted {
			owners[i], ids[i] = int64(ref.owner), int64(ref.id)
		}
		b.Queue(deleteItems, owners, ids)
	}
	if posts := slices.DeleteFunc(pl.posts, func(p newPost) bool { return p.owner == 0 }); len(posts) > 0 {
		n := len(posts)
		ids, owners := make([]int64, n), make([]int64, n)
		keys, types := make([]*string, n), make([]*string, n)
		widths, heights := make([]*int32, n), make([]*int32, n)
		for i, p := range posts {
			ids[i], owners[i] = int64(p.id), int64(p.owner)
			if t := p.thumbnail; t != nil {
				w, h := int32(t.Width), int32(t.Height)
				keys[i], types[i], widths[i], heights[i] = &t.Key, &t.ContentType, &w, &h
			}
		}
		b.Queue(insertPosts, ids, owners, keys, types, widths, heights)
	}
	if items := pl.items(); len(items) > 0 {
		n := len(items)
		owners, ids, actors := make([]int64, n), make([]int64, n), make([]int64, n)
		posts, comments := make([]*int64, n), make([]*int64, n)
		texts, times := make([]*string, n), make([]time.Time, n)
		for i, it := range items {
			owners[i], ids[i], actors[i], times[i] = int64(it.Owner), int64(it.ID), int64(it.Actor), it.CreatedAt
			if it.Post != 0 {
				p := int64(it.Post)
				posts[i] = &p
			}
			if it.Kind == KindComment {
				c := int64(it.Comment)
				comments[i], texts[i] = &c, &it.Text
			}
		}
		b.Queue(insertItems, owners, ids, actors, posts, comments, texts, times)
	}
}
