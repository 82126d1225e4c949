package activity_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack"
	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/migrations"
	"github.com/feedproject/feed/projections/activity"
	"github.com/feedproject/feed/projections/activity/activitytest"
	"github.com/feedproject/feed/projections/readmodel"
)

var t0 = activitytest.T0

// activityDB is a new database with the activity's schema, as the service's.
func activityDB(t *testing.T, pg *localstack.Postgres, name string) *pgxpool.Pool {
	t.Helper()
	pool, err := readmodel.OpenPool(context.Background(), localstacktest.DatabaseCopyForTest(t, pg, name), migrations.ActivitySchema, 0)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// records numbers events from sequence 1 on, one a second from t0.
func records(evs ...events.Event) []events.Record {
	out := make([]events.Record, len(evs))
	for i, ev := range evs {
		at := t0.Add(time.Duration(i+1) * time.Second)
		env, err := events.NewEnvelope(fmt.Sprint("e", i+1), at, ev)
		if err != nil {
			panic(err)
		}
		out[i] = events.Record{Envelope: env, Seq: uint64(i + 1), Subject: ev.Subject(), Event: ev}
	}
	return out
}

// all pages through user's activity to the end, checking the pages.
func all(t *testing.T, store *activity.Store, user domain.UserID) []activity.Item {
	t.Helper()
	var items []activity.Item
	var after *domain.Cursor
	for range 10_000 {
		page, err := store.Page(context.Background(), user, after)
		require.NoError(t, err)
		require.LessOrEqual(t, len(page.Items), domain.PageSize)
		items = append(items, page.Items...)
		if !page.HasMore {
			require.Nil(t, page.Next)
			return items
		}
		require.Len(t, page.Items, domain.PageSize, "a page before the last is full")
		after = page.Next
	}
	t.Fatal("paging does not end")
	return nil
}

const (
	alice, bob, carol = domain.UserID(1), domain.UserID(2), domain.UserID(3)
	p1, p2            = domain.PostID(1 << 30), domain.PostID(1<<30 + 1)
)

func post(id domain.PostID, owner domain.UserID) events.PostCreated {
	return events.PostCreated{PostID: id, UserID: owner, Caption: "c", CreatedAt: t0,
		Media: []events.Media{{Key: fmt.Sprint(id, "-0.jpg"), ContentType: "image/jpeg", Width: 10, Height: 20, Size: 1},
			{Key: fmt.Sprint(id, "-1.jpg"), ContentType: "image/jpeg", Width: 30, Height: 40, Size: 1}}}
}
func follow(a, b domain.UserID) events.Event {
	return events.UserFollowed{FollowerID: a, FolloweeID: b}
}
func unfollow(a, b domain.UserID) events.Event {
	return events.UserUnfollowed{FollowerID: a, FolloweeID: b}
}
func like(u domain.UserID, p domain.PostID) events.Event {
	return events.PostLiked{UserID: u, PostID: p}
}
func unlike(u domain.UserID, p domain.PostID) events.Event {
	return events.PostUnliked{UserID: u, PostID: p}
}
func deletePost(p domain.PostID, owner domain.UserID) events.Event {
	return events.PostDeleted{PostID: p, UserID: owner, DeletedAt: t0}
}
func comment(c int64, u domain.UserID, p domain.PostID) events.Event {
	return events.CommentAdded{CommentID: domain.CommentID(c), PostID: p, UserID: u, Text: fmt.Sprint("text ", c), CreatedAt: t0.Add(time.Duration(c) * time.Millisecond)}
}

// at is the time records gives sequence seq.
func at(seq int) string { return t0.Add(time.Duration(seq) * time.Second).Format(time.RFC3339Nano) }

func TestProjectorGivenWhenThen(t *testing.T) {
	pg := localstacktest.PostgresForTest(t)
	thumb := fmt.Sprint(" post ", p1, " thumb ", p1, "-0.jpg")
	tests := []struct {
		name string
		// given is the log; when splits it into batches at these sequences
		// (each batch ends after one); then is alice's activity.
		given []events.Event
		when  []int
		then  []string
	}{
		{
			name:  "a follow is an item",
			given: []events.Event{follow(bob, alice)},
			then:  []string{"#1 follow by 2 at " + at(1)},
		},
		{
			name:  "an unfollow takes it away",
			given: []events.Event{follow(bob, alice), unfollow(bob, alice)},
			when:  []int{1},
		},
		{
			name:  "follow, unfollow and follow in one batch: one item, the last follow's",
			given: []events.Event{follow(bob, alice), unfollow(bob, alice), follow(bob, alice)},
			then:  []string{"#3 follow by 2 at " + at(3)},
		},
		{
			name:  "follow, unfollow and follow across batches: the same",
			given: []events.Event{follow(bob, alice), unfollow(bob, alice), follow(bob, alice)},
			when:  []int{1, 2},
			then:  []string{"#3 follow by 2 at " + at(3)},
		},
		{
			name:  "follow, then unfollow and follow in the next batch",
			given: []events.Event{follow(bob, alice), unfollow(bob, alice), follow(bob, alice)},
			when:  []int{1},
			then:  []string{"#3 follow by 2 at " + at(3)},
		},
		{
			name:  "a repeated follow changes nothing, in one batch",
			given: []events.Event{follow(bob, alice), follow(bob, alice)},
			then:  []string{"#1 follow by 2 at " + at(1)},
		},
		{
			name:  "a repeated follow changes nothing, across batches",
			given: []events.Event{follow(bob, alice), follow(bob, alice)},
			when:  []int{1},
			then:  []string{"#1 follow by 2 at " + at(1)},
		},
		{
			name:  "an unfollow of a follow never seen",
			given: []events.Event{unfollow(bob, alice), follow(carol, alice)},
			then:  []string{"#2 follow by 3 at " + at(2)},
		},
		{
			name:  "a like is an item with the post's thumbnail",
			given: []events.Event{post(p1, alice), like(bob, p1)},
			when:  []int{1},
			then:  []string{"#2 like by 2 at " + at(2) + thumb},
		},
		{
			name:  "a like of a post of the same batch",
			given: []events.Event{post(p1, alice), like(bob, p1)},
			then:  []string{"#2 like by 2 at " + at(2) + thumb},
		},
		{
			name:  "like then delete of the post, in one batch",
			given: []events.Event{post(p1, alice), follow(bob, alice), like(bob, p1), deletePost(p1, alice)},
			then:  []string{"#2 follow by 2 at " + at(2)},
		},
		{
			name:  "like then delete of the post, across batches",
			given: []events.Event{post(p1, alice), follow(bob, alice), like(bob, p1), comment(7, carol, p1), deletePost(p1, alice)},
			when:  []int{1, 3, 4},
			then:  []string{"#2 follow by 2 at " + at(2)},
		},
		{
			name:  "a deleted post takes only its own items",
			given: []events.Event{post(p1, alice), post(p2, alice), like(bob, p1), like(bob, p2), deletePost(p1, alice)},
			when:  []int{4},
			then:  []string{fmt.Sprint("#4 like by 2 at ", at(4), " post ", p2, " thumb ", p2, "-0.jpg")},
		},
		{
			name:  "an unlike of a like never seen",
			given: []events.Event{post(p1, alice), unlike(bob, p1), like(carol, p1)},
			when:  []int{2},
			then:  []string{"#3 like by 3 at " + at(3) + thumb},
		},
		{
			name:  "like, unlike and like in one batch: the last like's",
			given: []events.Event{post(p1, alice), like(bob, p1), unlike(bob, p1), like(bob, p1)},
			when:  []int{1},
			then:  []string{"#4 like by 2 at " + at(4) + thumb},
		},
		{
			name:  "like, unlike and like across batches",
			given: []events.Event{post(p1, alice), like(bob, p1), unlike(bob, p1), like(bob, p1)},
			when:  []int{2, 3},
			then:  []string{"#4 like by 2 at " + at(4) + thumb},
		},
		{
			name:  "a repeated like changes nothing",
			given: []events.Event{post(p1, alice), like(bob, p1), like(bob, p1)},
			when:  []int{2},
			then:  []string{"#2 like by 2 at " + at(2) + thumb},
		},
		{
			name:  "a like after the post's delete",
			given: []events.Event{post(p1, alice), deletePost(p1, alice), like(bob, p1)},
			when:  []int{2},
		},
		{
			name:  "a comment is an item with its text",
			given: []events.Event{post(p1, alice), comment(7, bob, p1)},
			when:  []int{1},
			then:  []string{"#2 comment by 2 at " + t0.Add(7*time.Millisecond).Format(time.RFC3339Nano) + thumb + ` comment 7 "text 7"`},
		},
		{
			name:  "a comment on a deleted post",
			given: []events.Event{post(p1, alice), deletePost(p1, alice), comment(7, bob, p1)},
			when:  []int{2},
		},
		{
			name:  "a comment on an unknown post",
			given: []events.Event{comment(7, bob, p1)},
		},
		{
			name:  "one's own like and comment",
			given: []events.Event{post(p1, alice), like(alice, p1), comment(7, alice, p1), unlike(alice, p1)},
			when:  []int{2},
		},
		{
			name: "newest first",
			given: []events.Event{post(p1, alice), follow(bob, alice), like(carol, p1), comment(9, bob, p1),
				follow(carol, alice), unfollow(bob, alice)},
			when: []int{3},
			then: []string{"#5 follow by 3 at " + at(5), "#4 comment by 2 at " + t0.Add(9*time.Millisecond).Format(time.RFC3339Nano) + thumb + ` comment 9 "text 9"`,
				"#3 like by 3 at " + at(3) + thumb},
		},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pool := activityDB(t, pg, fmt.Sprint("gwt", i))
			p := activity.NewProjector(pool, nil, activity.Config{})
			recs := records(tt.given...)
			from := 0
			for _, cut := range append(tt.when, len(recs)) {
				require.NoError(t, p.Apply(context.Background(), recs[from:cut]))
				// Delivered again, a batch changes nothing.
				require.NoError(t, p.Apply(context.Background(), recs[from:cut]))
				from = cut
			}
			store := activity.NewStore(pool)
			got := activitytest.Describe(all(t, store, alice))
			assert.Equal(t, strings.Join(tt.then, "\n"), strings.Join(got, "\n"))
			// The model says the same.
			m := activitytest.NewModel()
			for _, rec := range recs {
				m.Apply(rec)
			}
			assert.Equal(t, strings.Join(tt.then, "\n"), strings.Join(activitytest.Describe(m.Activity(alice)), "\n"), "the model")
			pos, err := store.Position(context.Background())
			require.NoError(t, err)
			assert.Equal(t, uint64(len(recs)), pos)
		})
	}
}

// TestActivityKeepsTheNewest gives alice many more items than she keeps:
// paging shows at least the newest Keep and ends cleanly; a follow or like
// beyond them is remembered, so repeating it makes no item, while undoing
// and doing it again does.
func TestActivityKeepsTheNewest(t *testing.T) {
	pg := localstacktest.PostgresForTest(t)
	pool := activityDB(t, pg, "keep")
	const keep = 10
	p := activity.NewProjector(pool, nil, activity.Config{Keep: keep})
	evs := []events.Event{post(p1, alice), follow(bob, alice), like(bob, p1)}
	for i := range 40 {
		evs = append(evs, comment(int64(100+i), carol, p1))
	}
	recs := records(evs...)
	for i := 0; i < len(recs); i += 7 {
		require.NoError(t, p.Apply(context.Background(), recs[i:min(i+7, len(recs))]))
	}
	store := activity.NewStore(pool)
	items := all(t, store, alice)
	require.GreaterOrEqual(t, len(items), keep)
	require.Less(t, len(items), 40)
	for i, it := range items {
		assert.Equal(t, uint64(len(recs)-i), it.ID, "the newest, in order")
	}
	var stored int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM items`).Scan(&stored))
	assert.Equal(t, len(items)+2, stored, "comments beyond are gone; the follow and the like stay, unseen")

	// Repeats of what is beyond make nothing; undone and done again, they are new.
	more := append(evs, follow(bob, alice), like(bob, p1), unfollow(bob, alice), follow(bob, alice))
	recs = records(more...)
	require.NoError(t, p.Apply(context.Background(), recs[len(evs):len(evs)+2]))
	assert.Equal(t, items, all(t, store, alice))
	require.NoError(t, p.Apply(context.Background(), recs[len(evs)+2:]))
	top := all(t, store, alice)[0]
	assert.Equal(t, activity.KindFollow, top.Kind)
	assert.Equal(t, uint64(len(recs)), top.ID)
}
