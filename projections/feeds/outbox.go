package feeds

import (
	"context"
	_ "embed" // the outbox's Lua library
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/feedproject/feed/domain"
)

// outboxAddLua adds a post to an outbox and keeps its cap, atomically.
//
//go:embed lua/outbox_add.lua
var outboxAddLua string

// outboxAdd is outboxAddLua as Redis runs it, made once: its name is a hash
// of its code.
var outboxAdd = NewFunction("feed_outbox_add", outboxAddLua)

// OutboxFunction is the Lua library that adds posts to outboxes.
func OutboxFunction() *Function { return outboxAdd }

// AddToOutbox adds post to author's outbox, trimming it to OutboxCap and
// raising its floor. A post below the floor is ignored, so a replay is harmless.
func (s *Store) AddToOutbox(ctx context.Context, author domain.UserID, post domain.PostID) error {
	key := s.keys.Outbox(author)
	err := outboxAdd.Run(ctx, s.rdb, []string{key}, strconv.FormatInt(int64(post), 10), strconv.Itoa(s.cfg.OutboxCap)).Err()
	if err != nil {
		return Fail(fmt.Sprintf("add post %d to outbox of user %d", post, author), err)
	}
	return nil
}

// OutboxChange adds a new post to its author's outbox or removes a deleted one.
type OutboxChange struct {
	Author domain.UserID
	Post   domain.PostID
	Remove bool
}

// RemoveFromOutbox removes post from author's outbox (its floor stays).
func (s *Store) RemoveFromOutbox(ctx context.Context, author domain.UserID, post domain.PostID) error {
	if err := s.rdb.ZRem(ctx, s.keys.Outbox(author), strconv.FormatInt(int64(post), 10)).Err(); err != nil {
		return Fail(fmt.Sprintf("remove post %d from outbox of user %d", post, author), err)
	}
	return nil
}

// Outbox is an author's recent posts.
type Outbox struct {
	// Posts are newest first.
	Posts []domain.PostID
	// Floor: Posts are exactly the author's live posts with id >= Floor.
	Floor int64
}

// Outboxes returns the outboxes of authors; an author without one gets an empty
// outbox with floor 0 (no posts at all).
func (s *Store) Outboxes(ctx context.Context, authors []domain.UserID) (map[domain.UserID]Outbox, error) {
	out := make(map[domain.UserID]Outbox, len(authors))
	if len(authors) == 0 {
		return out, nil
	}
	pipe := s.rdb.Pipeline()
	reads := make([]OutboxRead, len(authors))
	for i, a := range authors {
		reads[i] = s.QueueWholeOutbox(ctx, pipe, a)
	}
	_, _ = pipe.Exec(ctx) // each command's error is looked at below
	for i, r := range reads {
		ob, err := r.Outbox()
		if err != nil {
			return nil, err
		}
		out[authors[i]] = ob
	}
	return out, nil
}

// OutboxRead is a queued read of an author's whole outbox: its floor, and
// its posts without their scores. With scores (WITHSCORES) Redis formats
// each as a double: 245 µs of Redis an outbox of 500 posts against 20 µs
// without (redis-benchmark, one client's loopback), and 3.6 % of Redis's
// time in the bench's mixed phase, where every reconcile and
// materialisation reads the outboxes of all the user's followees. Two
// commands, not one atomic read: only the planner writes outboxes, and it
// reads them itself, between its writes.
type OutboxRead struct {
	author domain.UserID
	floor  *redis.FloatCmd
	posts  *redis.StringSliceCmd
}

// QueueWholeOutbox queues the read of author's whole outbox on pipe: the
// read of a page's outbox (QueueOutbox) with every post.
func (s *Store) QueueWholeOutbox(ctx context.Context, pipe redis.Pipeliner, author domain.UserID) OutboxRead {
	return s.QueueOutbox(ctx, pipe, author, &redis.ZRangeBy{Min: "(0", Max: "+inf"})
}

// QueueOutbox queues the read of author's outbox floor and of its posts in
// by, newest first.
func (s *Store) QueueOutbox(ctx context.Context, pipe redis.Pipeliner, author domain.UserID, by *redis.ZRangeBy) OutboxRead {
	k := s.keys.Outbox(author)
	return OutboxRead{author: author, floor: pipe.ZScore(ctx, k, "f"), posts: pipe.ZRevRangeByScore(ctx, k, by)}
}

// Outbox is what the read found: an author without an outbox has none, at
// floor 0.
func (r OutboxRead) Outbox() (Outbox, error) {
	what := fmt.Sprintf("read outbox of user %d", r.author)
	f, err := r.floor.Result()
	switch {
	case errors.Is(err, redis.Nil):
		f = -1 // floor 0
	case err != nil:
		return Outbox{}, Fail(what, err)
	}
	ms, err := r.posts.Result()
	if err != nil {
		return Outbox{}, Fail(what, err)
	}
	ob := Outbox{Posts: make([]domain.PostID, 0, len(ms)), Floor: Special(f)}
	for _, m := range ms {
		p, err := ParsePost(m)
		if err != nil {
			return Outbox{}, fmt.Errorf("%s: %w", what, err)
		}
		ob.Posts = append(ob.Posts, p)
	}
	return ob, nil
}

// Read is what a page's read of the outbox found, its posts at or above its
// floor or not: ok is false if the author has no outbox. what names the read
// in errors.
func (r OutboxRead) Read(what string) (posts []domain.PostID, floor int64, ok bool, err error) {
	f, err := r.floor.Result()
	if errors.Is(err, redis.Nil) {
		return nil, 0, false, nil
	}
	if err != nil {
		return nil, 0, false, Fail(what, err)
	}
	ms, err := r.posts.Result()
	if err != nil {
		return nil, 0, false, Fail(what, err)
	}
	posts = make([]domain.PostID, 0, len(ms))
	for _, m := range ms {
		p, err := ParsePost(m)
		if err != nil {
			return nil, 0, false, fmt.Errorf("%s: %w", what, err)
		}
		posts = append(posts, p)
	}
	return posts, Special(f), true, nil
}

// QueueAddToOutbox queues on pipe the addition of a post to its author's
// outbox (see AddToOutbox).
func (s *Store) QueueAddToOutbox(ctx context.Context, pipe redis.Pipeliner, author domain.UserID, post domain.PostID) *redis.Cmd {
	return outboxAdd.FCall(ctx, pipe, []string{s.keys.Outbox(author)}, strconv.FormatInt(int64(post), 10), strconv.Itoa(s.cfg.OutboxCap))
}

// Special decodes a special member's score -(v+1).
func Special(score float64) int64 { return -int64(score) - 1 }

// ParsePost decodes a post id member.
func ParsePost(m string) (domain.PostID, error) {
	p, err := strconv.ParseInt(m, 10, 64)
	if err != nil || p <= 0 {
		return 0, fmt.Errorf("member %q is not a post id", m)
	}
	return domain.PostID(p), nil
}
