package http

import (
	"time"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
)

// The event types of GET /stream. Clients depend on them: never rename one.
const (
	kindPost     = "post"
	kindDelete   = "delete"
	kindFollow   = "follow"
	kindUnfollow = "unfollow"
	kindActivity = "activity"
)

// streamEvent is one event for one viewer, before it is written.
type streamEvent struct {
	seq  uint64
	kind string
	// post is a post's or a deleted post's id; created, the post's event.
	post    domain.PostID
	created events.PostCreated
	// body is a live post's data, shared by every viewer it is dispatched to.
	body []byte
	// occurred is when the post was accepted.
	occurred time.Time
	// user is the account followed or unfollowed.
	user     domain.UserID
	activity []byte
	// pending, for an activity event without its item, is the event that
	// may make it: the item is found as the event is written.
	pending *events.Record
	// live is true for an event the dispatcher queued, false for one replayed.
	live bool
}

// viewer is one open stream: its user, the user's followees as of pos, and
// the events queued for it.
type viewer struct {
	user domain.UserID
	// pos is the last event the viewer's followees reflect and its events
	// were taken from.
	pos     uint64
	follows map[domain.UserID]struct{}
	queue   chan streamEvent
	// slow is closed when the dispatcher drops the viewer for a full queue.
	slow chan struct{}
	// hangUp closes the viewer's connection.
	hangUp   func()
	attached bool
}

// events are the viewer's events of rec, whose activity items are items, in
// the order they are written; it keeps the followees current. Replay and
// dispatch both go through it, so a stream resumed gets what it would have.
func (v *viewer) events(rec events.Record, items []ActivityItem) []streamEvent {
	var out []streamEvent
	switch e := rec.Event.(type) {
	case events.PostCreated:
		if _, ok := v.follows[e.UserID]; ok {
			out = append(out, streamEvent{seq: rec.Seq, kind: kindPost, post: e.PostID, created: e, occurred: rec.OccurredAt})
		}
	case events.PostDeleted:
		if _, ok := v.follows[e.UserID]; ok {
			out = append(out, streamEvent{seq: rec.Seq, kind: kindDelete, post: e.PostID})
		}
	case events.UserFollowed:
		if _, ok := v.follows[e.FolloweeID]; e.FollowerID == v.user && !ok {
			v.follows[e.FolloweeID] = struct{}{}
			out = append(out, streamEvent{seq: rec.Seq, kind: kindFollow, user: e.FolloweeID})
		}
	case events.UserUnfollowed:
		if _, ok := v.follows[e.FolloweeID]; e.FollowerID == v.user && ok {
			delete(v.follows, e.FolloweeID)
			out = append(out, streamEvent{seq: rec.Seq, kind: kindUnfollow, user: e.FolloweeID})
		}
	}
	for _, it := range items {
		if it.User == v.user {
			ev := streamEvent{seq: rec.Seq, kind: kindActivity, activity: it.JSON}
			if it.JSON == nil {
				ev.pending = &rec
			}
			out = append(out, ev)
		}
	}
	return out
}
