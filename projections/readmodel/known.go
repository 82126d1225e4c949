package readmodel

import (
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/projections"
)

// While it catches up (a replay, a backlog), the projector remembers the rows
// its batches read and wrote, so that a later batch about the same rows need
// not read them again: known. In a replay from the first event it knows
// every row, and a batch reads nothing at all.
//
// Knowledge is as of a checkpoint, and the lock a batch takes on the
// checkpoint row checks it: the same checkpoint means that nothing but this
// projector wrote since (every batch moves the checkpoint, a switch to a
// rebuilt read model replaces it). Anything else, and every failure, forgets
// it all, and the batch reads as if there were none.
//
// Knowledge lives as long as the batches are large. A projector that is
// caught up gets small batches, whose reads are cheap, and keeps nothing: a
// live service's memory does not grow with the read model.

// catchUpBatch is the smallest batch that is remembered: a runner hands over
// a batch as large as the backlog, so one this large means it is behind.
const catchUpBatch = 1000

// maxKnown bounds the rows remembered (some 40 bytes each): past it, the
// knowledge is forgotten and gathered again.
const maxKnown = 2_000_000

// postRow is what is known of a post.
type postRow uint8

const (
	noPost postRow = iota
	livePost
	deletedPost
)

// known is the state of the rows the projector's recent batches were about.
type known struct {
	// at is the checkpoint the knowledge is as of; on: there is some.
	at uint64
	on bool
	// complete: every row of the read model is here, so a row that is not
	// has never existed. It holds from a read model found empty onwards.
	complete bool
	// The rows; in a complete knowledge, those that exist only.
	posts   map[domain.PostID]postRow
	likes   map[likeKey]bool
	follows map[projections.FollowPair]bool
}

// forget drops all knowledge, and its memory.
func (k *known) forget() { *k = known{} }

// start begins knowing, as of checkpoint at, nothing yet.
func (k *known) start(at uint64) {
	*k = known{
		at:      at,
		on:      true,
		posts:   map[domain.PostID]postRow{},
		likes:   map[likeKey]bool{},
		follows: map[projections.FollowPair]bool{},
	}
}

func (k *known) size() int { return len(k.posts) + len(k.likes) + len(k.follows) }

// post tells what is known of post id: its row, and whether it is known.
func (k *known) post(id domain.PostID) (postRow, bool) {
	if !k.on {
		return noPost, false
	}
	r, ok := k.posts[id]
	return r, ok || k.complete
}

func (k *known) like(l likeKey) (liked, ok bool) {
	if !k.on {
		return false, false
	}
	liked, ok = k.likes[l]
	return liked, ok || k.complete
}

func (k *known) follow(f projections.FollowPair) (following, ok bool) {
	if !k.on {
		return false, false
	}
	following, ok = k.follows[f]
	return following, ok || k.complete
}

func (k *known) setPost(id domain.PostID, r postRow) {
	if r == noPost && k.complete {
		delete(k.posts, id)
		return
	}
	k.posts[id] = r
}

func (k *known) setLike(l likeKey, liked bool) {
	if !liked && k.complete {
		delete(k.likes, l)
		return
	}
	k.likes[l] = liked
}

func (k *known) setFollow(f projections.FollowPair, following bool) {
	if !following && k.complete {
		delete(k.follows, f)
		return
	}
	k.follows[f] = following
}

// learn records, after a batch committed at checkpoint at, the rows it read
// (keys, as found in st) and what it left them as: the planner's outcome
// and the follow events it wrote (records, net of no-ops).
func (k *known) learn(at uint64, keys keys, st *state, pr *planner, records []events.Record) {
	for _, id := range keys.posts {
		r := noPost
		if deleted, ok := st.posts[domain.PostID(id)]; ok {
			r = livePost
			if deleted {
				r = deletedPost
			}
		}
		k.setPost(domain.PostID(id), r)
	}
	for i, post := range keys.likePosts {
		l := likeKey{domain.PostID(post), domain.UserID(keys.likeUsers[i])}
		k.setLike(l, st.likes.has(l))
	}
	for i, follower := range keys.followers {
		f := projections.FollowPair{Follower: domain.UserID(follower), Followee: domain.UserID(keys.followees[i])}
		k.setFollow(f, st.follows.has(f))
	}
	for _, p := range pr.after {
		k.setPost(p.id, p.row)
	}
	for _, l := range pr.likes {
		k.setLike(l.key, l.now)
	}
	for _, rec := range records {
		switch e := rec.Event.(type) {
		case events.UserFollowed:
			k.setFollow(projections.FollowPair{Follower: e.FollowerID, Followee: e.FolloweeID}, true)
		case events.UserUnfollowed:
			k.setFollow(projections.FollowPair{Follower: e.FollowerID, Followee: e.FolloweeID}, false)
		}
	}
	k.at = at
	if k.size() > maxKnown {
		k.start(at) // incomplete from now on
	}
}
