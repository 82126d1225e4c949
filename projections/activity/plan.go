package activity

import (
	"strings"
	"time"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
)

// Item kinds, as the API names them.
const (
	KindFollow  = "follow"
	KindLike    = "like"
	KindComment = "comment"
)

// pair is one follow (actor follows target) or like (actor likes post
// target): the relations an undo removes and a repeat leaves as they are.
type pair struct {
	like          bool
	actor, target int64
}

// pairOf tells whether rec begins (on) or ends a follow or a like, and which.
func pairOf(rec events.Record) (p pair, on, ok bool) {
	switch e := rec.Event.(type) {
	case events.UserFollowed:
		return pair{false, int64(e.FollowerID), int64(e.FolloweeID)}, true, true
	case events.UserUnfollowed:
		return pair{false, int64(e.FollowerID), int64(e.FolloweeID)}, false, true
	case events.PostLiked:
		return pair{true, int64(e.UserID), int64(e.PostID)}, true, true
	case events.PostUnliked:
		return pair{true, int64(e.UserID), int64(e.PostID)}, false, true
	}
	return pair{}, false, false
}

// run is where a kept follow or like began: the first of the run of follows
// (likes) after the pair's last undo in the batch. Repeating a follow changes
// nothing, so the run's first is the item's: its id and its time.
type run struct {
	seq uint64
	at  time.Time
	// restarted: the batch undid the pair before the run, so an item of the
	// pair from before the batch is replaced.
	restarted bool
}

// merged is a batch with the follow/unfollow and like/unlike events of each
// pair collapsed to the pair's last one, kept at its own position.
type merged struct {
	records []events.Record
	runs    map[uint64]run // by the kept event's sequence
	// collapsed counts the events dropped for a later one of the same pair.
	collapsed int
}

// merge collapses batch as projections.MergeFollows does follows, for likes
// too, and keeps where each kept run began. At its last event's position a
// pair's effect is the same: before it, nothing else in the batch looks at
// the pair, and deleting a post removes the post's likes whether they came
// before the delete or not.
func merge(batch []events.Record) merged {
	last := map[pair]int{}
	for i, rec := range batch {
		if p, _, ok := pairOf(rec); ok {
			last[p] = i
		}
	}
	out := merged{records: make([]events.Record, 0, len(batch)), runs: map[uint64]run{}}
	type state struct {
		run  run
		open bool // in a run of follows (likes)
	}
	states := map[pair]*state{}
	for i, rec := range batch {
		p, on, ok := pairOf(rec)
		if !ok {
			out.records = append(out.records, rec)
			continue
		}
		st := states[p]
		if st == nil {
			st = &state{}
			states[p] = st
		}
		switch {
		case on && !st.open:
			st.run.seq, st.run.at, st.open = rec.Seq, rec.OccurredAt, true
		case !on:
			st.open, st.run.restarted = false, true
		}
		if last[p] != i {
			out.collapsed++
			continue
		}
		if on {
			out.runs[rec.Seq] = st.run
		}
		out.records = append(out.records, rec)
	}
	return out
}

// post is what an item needs of a post: whose it is and its thumbnail.
type post struct {
	owner     domain.UserID
	thumbnail *Thumbnail
}

// Thumbnail is a post's image at position 0.
type Thumbnail struct {
	Key         string
	ContentType string
	Width       int
	Height      int
}

// known is the state a batch is played against: what the store held before
// it, as read for the batch's keys, then as the batch leaves it.
type known struct {
	// posts are the live posts the batch is about (absent: unknown or
	// deleted).
	posts map[domain.PostID]post
	// items holds the item of each pair the batch is about that has one;
	// likers, by post, the actors of the like items among them.
	items  map[pair]itemRef
	likers map[domain.PostID][]int64
}

// itemRef is a stored item: its owner and id.
type itemRef struct {
	owner domain.UserID
	id    uint64
}

func newKnown() *known {
	return &known{posts: map[domain.PostID]post{}, items: map[pair]itemRef{}, likers: map[domain.PostID][]int64{}}
}

// has records that pair p has an item.
func (kn *known) has(p pair, ref itemRef) {
	if _, ok := kn.items[p]; !ok && p.like {
		kn.likers[domain.PostID(p.target)] = append(kn.likers[domain.PostID(p.target)], p.actor)
	}
	kn.items[p] = ref
}

// Item is one entry of a user's activity.
type Item struct {
	// ID is the log position of the action that made it.
	ID    uint64
	Kind  string
	Owner domain.UserID
	Actor domain.UserID
	// Post is the post liked or commented on (0 for a follow); Thumbnail is
	// its image at position 0 (nil for a follow, or a post without images).
	Post      domain.PostID
	Thumbnail *Thumbnail
	// Comment and Text are the comment's (a comment only).
	Comment   domain.CommentID
	Text      string
	CreatedAt time.Time
}

// plan is what a batch changes in the store, against the state before it.
type plan struct {
	posts        []newPost
	deletedPosts []domain.PostID
	// deleted are stored items that leave; added the items the batch makes,
	// by id, in log order of their ids.
	deleted []itemRef
	added   map[uint64]*Item
	order   []uint64
	byPost  map[domain.PostID][]uint64 // ids of added items, by post
	// noops counts follow and like events that changed nothing: the pair was
	// already in the state they ask for.
	noops int
}

type newPost struct {
	id domain.PostID
	post
}

// planOf plays the merged batch against kn, which it updates.
func planOf(m merged, kn *known) *plan {
	pl := &plan{added: map[uint64]*Item{}, byPost: map[domain.PostID][]uint64{}}
	created := map[domain.PostID]int{} // index in pl.posts
	add := func(it *Item) {
		pl.added[it.ID] = it
		pl.order = append(pl.order, it.ID)
		if it.Post != 0 {
			pl.byPost[it.Post] = append(pl.byPost[it.Post], it.ID)
		}
	}
	// remove takes the pair's item away, whether stored or added by this batch.
	remove := func(p pair) {
		ref, ok := kn.items[p]
		if !ok {
			return
		}
		delete(kn.items, p)
		if _, added := pl.added[ref.id]; added {
			delete(pl.added, ref.id)
			return
		}
		pl.deleted = append(pl.deleted, ref)
	}
	for _, rec := range m.records {
		switch e := rec.Event.(type) {
		case events.PostCreated:
			if _, ok := kn.posts[e.PostID]; ok {
				continue
			}
			p := post{owner: e.UserID}
			if len(e.Media) > 0 {
				m := e.Media[0]
				p.thumbnail = &Thumbnail{Key: m.Key, ContentType: m.ContentType, Width: m.Width, Height: m.Height}
			}
			kn.posts[e.PostID] = p
			created[e.PostID] = len(pl.posts)
			pl.posts = append(pl.posts, newPost{e.PostID, p})
		case events.PostDeleted:
			if _, ok := kn.posts[e.PostID]; !ok {
				continue
			}
			delete(kn.posts, e.PostID)
			if i, ok := created[e.PostID]; ok {
				pl.posts[i].owner = 0 // never stored
			} else {
				pl.deletedPosts = append(pl.deletedPosts, e.PostID)
			}
			// The post's items leave with it: those stored by the statement
			// that deletes by post, those of this batch here.
			for _, actor := range kn.likers[e.PostID] {
				delete(kn.items, pair{true, actor, int64(e.PostID)})
			}
			delete(kn.likers, e.PostID)
			for _, id := range pl.byPost[e.PostID] {
				delete(pl.added, id)
			}
			delete(pl.byPost, e.PostID)
		case events.CommentAdded:
			p, ok := kn.posts[e.PostID]
			if !ok || p.owner == e.UserID {
				continue
			}
			add(&Item{ID: rec.Seq, Kind: KindComment, Owner: p.owner, Actor: e.UserID, Post: e.PostID, Thumbnail: p.thumbnail,
				Comment: e.CommentID, Text: storable(e.Text), CreatedAt: e.CreatedAt})
		case events.UserFollowed, events.UserUnfollowed, events.PostLiked, events.PostUnliked:
			pl.pair(rec, m.runs[rec.Seq], kn, add, remove)
		}
	}
	return pl
}

// pair plays a follow, unfollow, like or unlike: an undo removes the pair's
// item; a follow or like makes one unless the pair has one already, which a
// run that began after an undo in the batch replaces.
func (pl *plan) pair(rec events.Record, r run, kn *known, add func(*Item), remove func(pair)) {
	p, on, _ := pairOf(rec)
	owner, kind := domain.UserID(p.target), KindFollow
	var target post
	if p.like {
		var ok bool
		if target, ok = kn.posts[domain.PostID(p.target)]; !ok {
			return // unknown or deleted: no item, nothing to undo
		}
		owner, kind = target.owner, KindLike
	}
	if owner == domain.UserID(p.actor) {
		return // one's own: never an item
	}
	_, has := kn.items[p]
	switch {
	case !on && !has, on && has && !r.restarted:
		pl.noops++
		return
	case !on:
		remove(p)
		return
	case has:
		remove(p)
	}
	it := &Item{ID: r.seq, Kind: kind, Owner: owner, Actor: domain.UserID(p.actor), CreatedAt: r.at}
	if p.like {
		it.Post, it.Thumbnail = domain.PostID(p.target), target.thumbnail
	}
	kn.has(p, itemRef{owner: owner, id: it.ID})
	add(it)
}

// items are the items the plan adds.
func (pl *plan) items() []*Item {
	out := make([]*Item, 0, len(pl.added))
	for _, id := range pl.order {
		if it, ok := pl.added[id]; ok {
			out = append(out, it)
		}
	}
	return out
}

// storable is text as Postgres can store it: without NUL characters.
func storable(s string) string {
	if strings.IndexByte(s, 0) < 0 {
		return s
	}
	return strings.ReplaceAll(s, "\x00", "")
}
