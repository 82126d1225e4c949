// Package activitytest holds what the activity's tests share: a reference
// model of the activity, applied an event at a time, and a random workload
// full of the sequences the activity must get right. Only tests import it.
package activitytest

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/projections/activity"
)

// Model is the activity as the contract states it, kept the simplest way:
// every event in log order, one at a time, nothing ever trimmed.
type Model struct {
	posts map[domain.PostID]modelPost
	items map[domain.UserID]map[string]activity.Item
}

type modelPost struct {
	owner     domain.UserID
	thumbnail *activity.Thumbnail
}

// NewModel returns an empty model.
func NewModel() *Model {
	return &Model{posts: map[domain.PostID]modelPost{}, items: map[domain.UserID]map[string]activity.Item{}}
}

// Apply applies one event of the log.
func (m *Model) Apply(rec events.Record) {
	put := func(key string, it activity.Item) {
		if m.items[it.Owner] == nil {
			m.items[it.Owner] = map[string]activity.Item{}
		}
		if _, ok := m.items[it.Owner][key]; !ok { // a repeat changes nothing
			m.items[it.Owner][key] = it
		}
	}
	switch e := rec.Event.(type) {
	case events.PostCreated:
		p := modelPost{owner: e.UserID}
		if len(e.Media) > 0 {
			md := e.Media[0]
			p.thumbnail = &activity.Thumbnail{Key: md.Key, ContentType: md.ContentType, Width: md.Width, Height: md.Height}
		}
		m.posts[e.PostID] = p
	case events.PostDeleted:
		p, ok := m.posts[e.PostID]
		if !ok {
			return
		}
		delete(m.posts, e.PostID)
		maps.DeleteFunc(m.items[p.owner], func(_ string, it activity.Item) bool { return it.Post == e.PostID })
	case events.UserFollowed:
		if e.FollowerID != e.FolloweeID {
			put(followKey(e.FollowerID), activity.Item{ID: rec.Seq, Kind: activity.KindFollow, Owner: e.FolloweeID, Actor: e.FollowerID, CreatedAt: rec.OccurredAt})
		}
	case events.UserUnfollowed:
		delete(m.items[e.FolloweeID], followKey(e.FollowerID))
	case events.PostLiked:
		if p, ok := m.posts[e.PostID]; ok && p.owner != e.UserID {
			put(likeKey(e.UserID, e.PostID), activity.Item{ID: rec.Seq, Kind: activity.KindLike, Owner: p.owner, Actor: e.UserID,
				Post: e.PostID, Thumbnail: p.thumbnail, CreatedAt: rec.OccurredAt})
		}
	case events.PostUnliked:
		if p, ok := m.posts[e.PostID]; ok {
			delete(m.items[p.owner], likeKey(e.UserID, e.PostID))
		}
	case events.CommentAdded:
		if p, ok := m.posts[e.PostID]; ok && p.owner != e.UserID {
			put(fmt.Sprint("c", rec.Seq), activity.Item{ID: rec.Seq, Kind: activity.KindComment, Owner: p.owner, Actor: e.UserID,
				Post: e.PostID, Thumbnail: p.thumbnail, Comment: e.CommentID, Text: e.Text, CreatedAt: e.CreatedAt})
		}
	}
}

func followKey(actor domain.UserID) string { return fmt.Sprint("f", actor) }
func likeKey(actor domain.UserID, post domain.PostID) string {
	return fmt.Sprint("l", actor, ":", post)
}

// Activity is user's activity, newest first.
func (m *Model) Activity(user domain.UserID) []activity.Item {
	items := slices.Collect(maps.Values(m.items[user]))
	slices.SortFunc(items, func(a, b activity.Item) int { return cmp.Compare(b.ID, a.ID) })
	return items
}

// Describe writes items one a line, as tests compare them.
func Describe(items []activity.Item) []string {
	out := make([]string, 0, len(items))
	for _, it := range items {
		s := fmt.Sprintf("#%d %s by %d at %s", it.ID, it.Kind, it.Actor, it.CreatedAt.UTC().Format(time.RFC3339Nano))
		if it.Post != 0 {
			s += fmt.Sprintf(" post %d", it.Post)
		}
		if it.Thumbnail != nil {
			s += " thumb " + it.Thumbnail.Key
		}
		if it.Kind == activity.KindComment {
			s += fmt.Sprintf(" comment %d %q", it.Comment, it.Text)
		}
		out = append(out, s)
	}
	return out
}

// T0 is when workloads begin.
var T0 = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

// Users is how many users a workload has: ids 1 to Users.
const Users = 8

// Workload returns n random events over Users users: posts and their
// deletes, follows and unfollows that flap, likes and unlikes (of deleted,
// unknown and one's own posts too), comments (on deleted and unknown posts
// too), and repeats. Each comes with its time.
func Workload(n int, seed uint64) ([]events.Event, []time.Time) {
	rng := rand.New(rand.NewPCG(seed, seed))
	ids, _ := domain.NewIDGenerator(0)
	clock := T0
	var posts []events.PostCreated
	evs, times := make([]events.Event, 0, n), make([]time.Time, 0, n)
	for i := range n {
		clock = clock.Add(time.Duration(rng.IntN(1500)) * time.Millisecond)
		user := domain.UserID(rng.IntN(Users) + 1)
		other := domain.UserID(rng.IntN(Users) + 1)
		if other == user {
			other = user%Users + 1
		}
		post := func() domain.PostID {
			if len(posts) == 0 || rng.IntN(30) == 0 {
				return 999 // unknown
			}
			return posts[rng.IntN(len(posts))].PostID
		}
		var ev events.Event
		switch k := rng.IntN(100); {
		case k < 15 || len(posts) == 0:
			id, at := ids.Next(clock)
			pc := events.PostCreated{PostID: domain.PostID(id), UserID: user, Caption: fmt.Sprint("post ", i), CreatedAt: at}
			for j := range rng.IntN(3) { // some have no image to show
				pc.Media = append(pc.Media, events.Media{Key: fmt.Sprintf("%d-%d.jpg", id, j), ContentType: "image/jpeg", Width: 10 + j, Height: 20, Size: 100})
			}
			posts = append(posts, pc)
			ev = pc
		case k < 20:
			p := posts[rng.IntN(len(posts))]
			ev = events.PostDeleted{PostID: p.PostID, UserID: p.UserID, DeletedAt: clock}
		case k < 23:
			p := posts[rng.IntN(len(posts))]
			ev = events.PostEdited{PostID: p.PostID, UserID: p.UserID, Caption: fmt.Sprint("edit ", i), EditedAt: clock}
		case k < 48:
			if rng.IntN(3) == 0 {
				ev = events.UserUnfollowed{FollowerID: user, FolloweeID: other}
			} else {
				ev = events.UserFollowed{FollowerID: user, FolloweeID: other}
			}
		case k < 70:
			ev = events.PostLiked{UserID: user, PostID: post()}
		case k < 80:
			ev = events.PostUnliked{UserID: user, PostID: post()}
		default:
			id, at := ids.Next(clock)
			ev = events.CommentAdded{CommentID: domain.CommentID(id), PostID: post(), UserID: user, Text: fmt.Sprint("comment ", i), CreatedAt: at}
		}
		evs, times = append(evs, ev), append(times, clock)
	}
	return evs, times
}

// AppendWorkload appends Workload's events to log, with ids unique to seed.
func AppendWorkload(ctx context.Context, log *events.Log, n int, seed uint64) error {
	evs, times := Workload(n, seed)
	for i, ev := range evs {
		if _, err := log.AppendEvent(ctx, fmt.Sprintf("a%d-%d", seed, i), times[i], ev); err != nil {
			return err
		}
	}
	return nil
}
