package inbox_test

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/projections/feeds"
	"github.com/feedproject/feed/projections/feeds/inbox"
)

// TestApplyItems checks each work item's effect on alice's inbox (cap 3,
// segments of 3: an inbox is trimmed to its 3 newest posts when it would hold
// more than 6).
func TestApplyItems(t *testing.T) {
	t.Parallel()
	s, rdb := newStore(t, feeds.Config{InboxCap: 3})
	cases := []struct {
		name        string
		given       []inbox.Item
		when        []inbox.Item
		wantApplied int
		then        inboxState
	}{
		{
			name:        "push into a missing inbox creates nothing",
			when:        []inbox.Item{push(5, 100)},
			wantApplied: 0,
			then:        inboxState{},
		},
		{
			name:        "push at or above the floor is added",
			given:       []inbox.Item{materialise(10, 50, 60)},
			when:        []inbox.Item{push(11, 50), push(12, 70)},
			wantApplied: 2,
			then:        inboxState{ids(70, 60, 50), 50, 12, true},
		},
		{
			name:        "push below the floor is ignored but recorded",
			given:       []inbox.Item{materialise(10, 50, 60)},
			when:        []inbox.Item{push(11, 40)},
			wantApplied: 1,
			then:        inboxState{ids(60), 50, 11, true},
		},
		{
			name:        "pushes past the cap are kept up to a segment's worth",
			given:       []inbox.Item{materialise(10, 0, 10, 20, 30)},
			when:        []inbox.Item{push(11, 40), push(12, 25), push(13, 50)},
			wantApplied: 3,
			then:        inboxState{ids(50, 40, 30, 25, 20, 10), 0, 13, true},
		},
		{
			name:        "trim keeps the cap newest and raises the floor to the oldest kept",
			given:       []inbox.Item{materialise(10, 0, 10, 20, 30), push(11, 31), push(12, 32), push(13, 33)},
			when:        []inbox.Item{push(14, 40), push(15, 35)},
			wantApplied: 2,
			then:        inboxState{ids(40, 35, 33), 33, 15, true},
		},
		{
			name:        "a push older than a trimmed-away post stays out",
			given:       []inbox.Item{materialise(10, 0, 10, 20, 30), push(11, 31), push(12, 32), push(13, 33), push(14, 40)},
			when:        []inbox.Item{push(15, 15)},
			wantApplied: 1,
			then:        inboxState{ids(40, 33, 32), 32, 15, true},
		},
		// A call of one push takes the lone push's path, a fan-out's.
		{
			name:        "a lone push into a full inbox is kept",
			given:       []inbox.Item{materialise(10, 0, 10, 20, 30)},
			when:        []inbox.Item{push(11, 40)},
			wantApplied: 1,
			then:        inboxState{ids(40, 30, 20, 10), 0, 11, true},
		},
		{
			name:        "a lone push into an inbox at its most trims it to the cap",
			given:       []inbox.Item{materialise(10, 0, 10, 20, 30), push(11, 31), push(12, 32), push(13, 33)},
			when:        []inbox.Item{push(14, 40)},
			wantApplied: 1,
			then:        inboxState{ids(40, 33, 32), 32, 14, true},
		},
		{
			name:        "a lone push that becomes the oldest kept by a trim is the floor",
			given:       []inbox.Item{materialise(10, 0, 10, 30, 40), push(11, 5), push(12, 6), push(13, 7)},
			when:        []inbox.Item{push(14, 20)},
			wantApplied: 1,
			then:        inboxState{ids(40, 30, 20), 20, 14, true},
		},
		{
			name:        "a lone push older than the oldest kept by a trim stays out and raises the floor to it",
			given:       []inbox.Item{materialise(10, 0, 10, 20, 30), push(11, 31), push(12, 32), push(13, 33)},
			when:        []inbox.Item{push(14, 5)},
			wantApplied: 1,
			then:        inboxState{ids(33, 32, 31), 31, 14, true},
		},
		{
			name:        "a lone push a full inbox holds changes nothing but the seq",
			given:       []inbox.Item{materialise(10, 0, 10, 20, 30)},
			when:        []inbox.Item{push(11, 20)},
			wantApplied: 1,
			then:        inboxState{ids(30, 20, 10), 0, 11, true},
		},
		{
			name:        "a lone push of a full inbox's oldest changes nothing but the seq",
			given:       []inbox.Item{materialise(10, 0, 10, 20, 30)},
			when:        []inbox.Item{push(11, 10)},
			wantApplied: 1,
			then:        inboxState{ids(30, 20, 10), 0, 11, true},
		},
		{
			name:        "a lone push whose seq is above its post id is added, and leaves the seq",
			given:       []inbox.Item{materialise(100, 0, 10)},
			when:        []inbox.Item{push(101, 50)},
			wantApplied: 1,
			then:        inboxState{ids(50, 10), 0, 100, true},
		},
		{
			name:        "a lone push whose seq is above its post id is still kept below the floor",
			given:       []inbox.Item{materialise(100, 60, 70)},
			when:        []inbox.Item{push(101, 50)},
			wantApplied: 1,
			then:        inboxState{ids(70), 60, 101, true},
		},
		{
			name:        "a lone push at the inbox's seq is a no-op",
			given:       []inbox.Item{materialise(10, 0, 10), push(11, 20)},
			when:        []inbox.Item{push(11, 20)},
			wantApplied: 0,
			then:        inboxState{ids(20, 10), 0, 11, true},
		},
		{
			name:        "a lone push into a small inbox with room only adds its post",
			given:       []inbox.Item{materialise(10, 0, big(10))},
			when:        []inbox.Item{push(11, big(20))},
			wantApplied: 1,
			then:        inboxState{ids(big(20), big(10)), 0, 10, true},
		},
		{
			name:        "a lone push redelivered after its post was removed is a no-op",
			given:       []inbox.Item{materialise(10, 0, big(10)), push(11, big(20)), remove(12, big(20))},
			when:        []inbox.Item{push(11, big(20))},
			wantApplied: 0,
			then:        inboxState{ids(big(10)), 0, 12, true},
		},
		{
			name:        "a lone push of a post the inbox has changes nothing",
			given:       []inbox.Item{materialise(10, 0, big(10), big(20))},
			when:        []inbox.Item{push(11, big(20))},
			wantApplied: 0,
			then:        inboxState{ids(big(20), big(10)), 0, 10, true},
		},
		{
			name:        "a lone push below the floor of a small inbox",
			given:       []inbox.Item{materialise(10, int64(big(15)), big(20))},
			when:        []inbox.Item{push(11, big(10))},
			wantApplied: 1,
			then:        inboxState{ids(big(20)), int64(big(15)), 11, true},
		},
		{
			name:        "a re-applied item (same seq) is a no-op",
			given:       []inbox.Item{materialise(10, 0, 10), push(11, 20), remove(12, 20)},
			when:        []inbox.Item{push(11, 20), push(12, 30), push(9, 40)},
			wantApplied: 0,
			then:        inboxState{ids(10), 0, 12, true},
		},
		{
			name:        "remove takes the post out and keeps the floor",
			given:       []inbox.Item{materialise(10, 5, 10, 20)},
			when:        []inbox.Item{remove(11, 20), remove(12, 99)},
			wantApplied: 2,
			then:        inboxState{ids(10), 5, 12, true},
		},
		{
			name:        "remove on a missing inbox creates nothing",
			when:        []inbox.Item{remove(11, 20)},
			wantApplied: 0,
			then:        inboxState{},
		},
		{
			name:        "merge raises the floor to the item's and drops older entries",
			given:       []inbox.Item{materialise(10, 0, 10, 20)},
			when:        []inbox.Item{merge(11, 15, 18, 30)},
			wantApplied: 1,
			then:        inboxState{ids(30, 20, 18), 15, 11, true},
		},
		{
			name:        "merge adds only posts at or above the inbox floor",
			given:       []inbox.Item{materialise(10, 15, 20)},
			when:        []inbox.Item{merge(11, 0, 5, 14, 15, 25)},
			wantApplied: 1,
			then:        inboxState{ids(25, 20, 15), 15, 11, true},
		},
		{
			name:        "merge keeps up to a segment's worth past the cap",
			given:       []inbox.Item{materialise(10, 0, 10, 20)},
			when:        []inbox.Item{merge(11, 0, 15, 25, 35)},
			wantApplied: 1,
			then:        inboxState{ids(35, 25, 20, 15, 10), 0, 11, true},
		},
		{
			name:        "merge trims to the cap past that",
			given:       []inbox.Item{materialise(10, 0, 10, 20)},
			when:        []inbox.Item{merge(11, 0, 15, 25, 35, 45, 55)},
			wantApplied: 1,
			then:        inboxState{ids(55, 45, 35), 35, 11, true},
		},
		{
			name:        "merge on a missing inbox creates nothing",
			when:        []inbox.Item{merge(11, 0, 15)},
			wantApplied: 0,
			then:        inboxState{},
		},
		{
			name:        "unmerge removes the author's posts and raises the floor",
			given:       []inbox.Item{materialise(10, 0, 5, 10, 20)},
			when:        []inbox.Item{unmerge(11, 8, 10, 30)},
			wantApplied: 1,
			then:        inboxState{ids(20), 8, 11, true},
		},
		{
			name:        "unmerge never lowers the floor",
			given:       []inbox.Item{materialise(10, 15, 20, 30)},
			when:        []inbox.Item{unmerge(11, 0, 30)},
			wantApplied: 1,
			then:        inboxState{ids(20), 15, 11, true},
		},
		{
			name:        "materialise creates the inbox with the posts at or above the floor",
			when:        []inbox.Item{materialise(7, 20, 10, 20, 30)},
			wantApplied: 1,
			then:        inboxState{ids(30, 20), 20, 7, true},
		},
		{
			name:        "materialise trims to the cap",
			when:        []inbox.Item{materialise(7, 0, 50, 10, 40, 20, 30)},
			wantApplied: 1,
			then:        inboxState{ids(50, 40, 30), 30, 7, true},
		},
		{
			name:        "materialise on an existing inbox is a no-op",
			given:       []inbox.Item{materialise(7, 0, 10)},
			when:        []inbox.Item{materialise(20, 0, 30, 40)},
			wantApplied: 0,
			then:        inboxState{ids(10), 0, 7, true},
		},
		{
			name:        "items after a materialise in the same batch apply in order",
			when:        []inbox.Item{push(5, 1), materialise(7, 0, 10), push(7, 11), push(8, 12), remove(9, 10)},
			wantApplied: 3,
			then:        inboxState{ids(12), 0, 9, true},
		},
		{
			name:        "53-bit ids and the highest sequences survive exactly",
			given:       []inbox.Item{materialise(maxSeq-10, domain.MaxID-9, domain.MaxID-9, domain.MaxID-8)},
			when:        []inbox.Item{push(maxSeq-1, domain.MaxID-1), push(maxSeq, domain.MaxID-3)},
			wantApplied: 2,
			then:        inboxState{ids(domain.MaxID-1, domain.MaxID-3, domain.MaxID-8, domain.MaxID-9), domain.MaxID - 9, maxSeq, true},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			require.NoError(t, rdb.FlushDB(ctx).Err())
			// Given
			_, err := inbox.Apply(ctx, s, tc.given)
			require.NoError(t, err)
			// When
			applied, err := inbox.Apply(ctx, s, tc.when)
			require.NoError(t, err)
			// Then
			assert.Equal(t, tc.wantApplied, applied, "applied")
			assert.Equal(t, tc.then, readInbox(t, s, alice))
		})
	}
}

// TestApplyItemsKeepsEachRecipientsOrder interleaves two recipients' items in
// one batch: each inbox sees its own items in order, the other's not at all.
// TestApplyItemsAcrossSegments checks the edges of an inbox's segments (see
// apply.lua), with segments of 2 posts and a cap of 6 (8 at most): each call of when is
// one inbox.Apply, so that a single push takes the lone push's path.
func TestApplyItemsAcrossSegments(t *testing.T) {
	t.Parallel()
	s, rdb := newStore(t, feeds.Config{InboxCap: 6, SegmentSize: 2})
	tens := materialise(1, 0, 10, 20, 30, 40, 50, 60) // segments {10 20} {30 40} {50 60}
	cases := []struct {
		name string
		when [][]inbox.Item
		then inboxState
	}{
		{
			name: "an unmerge raises the floor across two segments",
			when: [][]inbox.Item{{unmerge(2, 45, 60)}},
			then: inboxState{ids(50), 45, 2, true},
		},
		{
			name: "a merge goes between segments, and the oldest go",
			when: [][]inbox.Item{{merge(2, 0, 25, 35, 45)}},
			then: inboxState{ids(60, 50, 45, 40, 35, 30), 30, 2, true},
		},
		{
			name: "a lone push below the head's bound goes into place",
			when: [][]inbox.Item{{push(2, 35)}},
			then: inboxState{ids(60, 50, 40, 35, 30, 20, 10), 0, 2, true},
		},
		{
			name: "a lone push into the head sent again after its post was removed stays out",
			when: [][]inbox.Item{{remove(2, 60)}, {push(3, 70)}, {remove(4, 70)}, {push(3, 70)}},
			then: inboxState{ids(50, 40, 30, 20, 10), 0, 4, true},
		},
		{
			name: "lone pushes fill new heads and empty the tail",
			when: [][]inbox.Item{{push(2, 70)}, {push(3, 80)}, {push(4, 90)}},
			then: inboxState{ids(90, 80, 70, 60, 50, 40), 40, 4, true},
		},
		{
			name: "a lone push into an inbox at its most, its head with room, trims it",
			when: [][]inbox.Item{{push(2, 70)}, {push(3, 80)}, {push(4, 90)}, {push(5, 100)}, {push(6, 110)}, {push(7, 120)}},
			then: inboxState{ids(120, 110, 100, 90, 80, 70), 70, 7, true},
		},
		{
			name: "a run of pushes trims across two segments",
			when: [][]inbox.Item{{push(2, 70), push(3, 80), push(4, 90), push(5, 100), push(6, 110)}},
			then: inboxState{ids(110, 100, 90, 80, 70, 60), 60, 6, true},
		},
		{
			name: "a removal that empties a middle segment leaves a gap that is skipped",
			when: [][]inbox.Item{{remove(2, 30)}, {remove(3, 40)}, {push(4, 70)}, {push(5, 80)}, {push(6, 90)}},
			then: inboxState{ids(90, 80, 70, 60, 50, 20, 10), 0, 6, true},
		},
		{
			name: "removals that empty the head and the tail",
			when: [][]inbox.Item{{remove(2, 50), remove(3, 60), remove(4, 10), remove(5, 20)}, {push(6, 55)}, {push(7, 25)}},
			then: inboxState{ids(55, 40, 30, 25), 0, 7, true},
		},
		{
			name: "a reconcile rewrites the segments",
			when: [][]inbox.Item{{{Recipient: alice, Seq: 2, Op: inbox.OpReconcile, Floor: 15, Posts: ids(20, 35, 50, 60, 70)}}},
			then: inboxState{ids(70, 60, 50, 35, 20), 15, 2, true},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			require.NoError(t, rdb.FlushDB(ctx).Err())
			_, err := inbox.Apply(ctx, s, []inbox.Item{tens})
			require.NoError(t, err)
			checkSegments(t, rdb, alice, 2, 6)
			for i, call := range tc.when {
				_, err := inbox.Apply(ctx, s, call)
				require.NoError(t, err)
				checkSegments(t, rdb, alice, 2, 6, "after call %d", i)
			}
			assert.Equal(t, tc.then, readInbox(t, s, alice))
			// Pages of one post read the same, segment by segment.
			var paged []domain.PostID
			for before := int64(0); ; {
				page, err := inbox.ReadPage(ctx, s, alice, nil, before, 1)
				require.NoError(t, err)
				if len(page.Posts) == 0 {
					break
				}
				paged = append(paged, page.Posts...)
				before = int64(page.Posts[0])
			}
			assert.Equal(t, tc.then.posts, append(ids(), paged...))
		})
	}

	t.Run("an expired meta's segments are never read again", func(t *testing.T) {
		ctx := t.Context()
		require.NoError(t, rdb.FlushDB(ctx).Err())
		_, err := inbox.Apply(ctx, s, []inbox.Item{tens})
		require.NoError(t, err)
		old, err := inbox.Keys(ctx, s, alice)
		require.NoError(t, err)
		require.Len(t, old, 4)
		require.NoError(t, rdb.Del(ctx, old[0]).Err()) // the meta expired first
		_, err = inbox.Apply(ctx, s, []inbox.Item{push(2, 70)})
		require.NoError(t, err)
		assert.Equal(t, inboxState{}, readInbox(t, s, alice))
		_, err = inbox.Apply(ctx, s, []inbox.Item{materialise(1, 0, 5)})
		require.NoError(t, err)
		assert.Equal(t, inboxState{ids(5), 0, 1, true}, readInbox(t, s, alice))
		n, err := rdb.Exists(ctx, old[1:]...).Result()
		require.NoError(t, err)
		assert.Equal(t, int64(3), n, "the old segments live on until they expire")
	})

	t.Run("an inbox of the unsegmented layout is made anew", func(t *testing.T) {
		ctx := t.Context()
		require.NoError(t, rdb.FlushDB(ctx).Err())
		key := "feed:v1:{1}:iy"
		require.NoError(t, rdb.ZAdd(ctx, key, redis.Z{Score: -1, Member: "f"}, redis.Z{Score: -3, Member: "s"},
			redis.Z{Score: float64(domain.MaxID - 10), Member: "10"}).Err())
		assert.Equal(t, inboxState{}, readInbox(t, s, alice), "not materialised")
		_, err := inbox.Apply(ctx, s, []inbox.Item{push(3, 70)})
		require.NoError(t, err)
		n, err := rdb.Exists(ctx, key).Result()
		require.NoError(t, err)
		assert.Zero(t, n, "a push deletes it")
		require.NoError(t, rdb.ZAdd(ctx, key, redis.Z{Score: -1, Member: "f"}, redis.Z{Score: -3, Member: "s"}).Err())
		_, err = inbox.Apply(ctx, s, []inbox.Item{materialise(4, 0, 20)})
		require.NoError(t, err)
		assert.Equal(t, inboxState{ids(20), 0, 4, true}, readInbox(t, s, alice))
	})
}

func TestApplyItemsKeepsEachRecipientsOrder(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, feeds.Config{})
	ctx := t.Context()
	forBob := func(it inbox.Item) inbox.Item { it.Recipient = bob; return it }
	applied, err := inbox.Apply(ctx, s, []inbox.Item{
		materialise(1, 0, 10), forBob(materialise(1, 0)),
		push(2, 20), forBob(push(2, 21)),
		unmerge(3, 0, 10, 20), forBob(push(3, 31)),
		push(4, 40), forBob(remove(4, 21)),
	})
	require.NoError(t, err)
	assert.Equal(t, 8, applied)
	assert.Equal(t, inboxState{ids(40), 0, 4, true}, readInbox(t, s, alice))
	assert.Equal(t, inboxState{ids(31), 0, 4, true}, readInbox(t, s, bob))
}

// TestApplyItemsMaterialisesManyPosts gives materialise far more posts than the
// cap (a cold user with many followees): the inbox keeps the newest and its
// floor is the oldest kept.
func TestApplyItemsMaterialisesManyPosts(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, feeds.Config{InboxCap: 100})
	var posts []domain.PostID
	for i := 1; i <= 5000; i++ {
		posts = append(posts, domain.PostID(i*7%5003+1)) // a scramble of distinct ids
	}
	posts = append(posts, posts[:50]...) // the same post from two outboxes
	_, err := inbox.Apply(t.Context(), s, []inbox.Item{materialise(3, 10, posts...)})
	require.NoError(t, err)
	got := readInbox(t, s, alice)
	require.Len(t, got.posts, 100)
	// The 5000 ids are 5000 distinct values of 1..5003; the newest 100 are
	// 5003 down to a floor that is the last of them.
	assert.Equal(t, domain.PostID(5003), got.posts[0])
	assert.Equal(t, int64(got.posts[99]), got.floor)
	for i := 1; i < len(got.posts); i++ {
		assert.Less(t, got.posts[i], got.posts[i-1])
	}
}

func TestApplyItemsRejectsInvalidItemsBeforeWriting(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, feeds.Config{})
	ctx := t.Context()
	for name, bad := range map[string]inbox.Item{
		"push without a post": {Recipient: alice, Seq: 2, Op: inbox.OpPush},
		"unknown op":          {Recipient: alice, Seq: 2, Op: 9},
		"no recipient":        {Seq: 2, Op: inbox.OpPush, Posts: ids(5)},
		"post out of range":   {Recipient: alice, Seq: 2, Op: inbox.OpPush, Posts: ids(domain.MaxID)},
		"negative floor":      {Recipient: alice, Seq: 2, Op: inbox.OpMerge, Floor: -1},
		"seq out of range":    {Recipient: alice, Seq: maxSeq + 1, Op: inbox.OpPush, Posts: ids(5)},
	} {
		applied, err := inbox.Apply(ctx, s, []inbox.Item{materialise(1, 0, 10), bad})
		require.ErrorIs(t, err, domain.ErrInvalid, name)
		assert.Zero(t, applied, name)
		assert.False(t, readInbox(t, s, alice).ok, name)
	}
}

// inboxModel is the reference for an inbox: the work items' semantics as
// stated, with "add, then trim to the cap". seq is the last item applied;
// taken, the last that took anything out or made the inbox anew. An inbox's
// seq lies between them: an item that only adds its posts need not record
// its own (see apply.lua's "s").
type inboxModel struct {
	exists bool
	posts  map[domain.PostID]bool
	floor  int64
	seq    uint64
	taken  uint64
}

// requireInbox fails unless got is the model's inbox, its seq between the
// model's taken and seq.
func requireInbox(t *testing.T, m *inboxModel, got inboxState, msgAndArgs ...any) {
	t.Helper()
	want := m.state()
	if m.exists {
		require.GreaterOrEqual(t, got.seq, m.taken, msgAndArgs...)
		require.LessOrEqual(t, got.seq, m.seq, msgAndArgs...)
		want.seq = got.seq
	}
	require.Equal(t, want, got, msgAndArgs...)
}

func (m *inboxModel) trim(limit int) {
	if len(m.posts) <= limit {
		return
	}
	all := slices.SortedFunc(func(yield func(domain.PostID) bool) {
		for p := range m.posts {
			if !yield(p) {
				return
			}
		}
	}, func(a, b domain.PostID) int { return cmp.Compare(b, a) })
	for _, p := range all[limit:] {
		delete(m.posts, p)
	}
	m.floor = int64(all[limit-1])
}

// trimOver trims the inbox to limit if it holds more than limit + slack, as
// apply.lua trims an inbox (slack is its segment size), and records the seq
// of the item that made it.
func (m *inboxModel) trimOver(limit, slack int) {
	if len(m.posts) > limit+slack {
		m.trim(limit)
		m.taken = m.seq
	}
}

func (m *inboxModel) raise(floor int64) {
	m.floor = max(m.floor, floor)
	for p := range m.posts {
		if int64(p) < m.floor {
			delete(m.posts, p)
		}
	}
}

func (m *inboxModel) add(posts []domain.PostID) {
	for _, p := range posts {
		if int64(p) >= m.floor {
			m.posts[p] = true
		}
	}
}

// applyAll applies one recipient's items of an inbox.Apply call, in order, as
// apply.lua does: a run of pushes at once, then trimmed, and each other item
// on its own. size is the store's segment size.
func (m *inboxModel) applyAll(items []inbox.Item, limit, size int) {
	slack := min(size, limit)
	for i := 0; i < len(items); {
		if items[i].Op != inbox.OpPush || !m.exists {
			m.apply(items[i], limit, slack)
			i++
			continue
		}
		for ; i < len(items) && items[i].Op == inbox.OpPush; i++ {
			if items[i].Seq > m.seq {
				m.seq = items[i].Seq
				m.add(items[i].Posts)
			}
		}
		m.trimOver(limit, slack)
	}
}

// apply applies one item, trimming as apply.lua does (see applyAll).
func (m *inboxModel) apply(it inbox.Item, limit, slack int) {
	if it.Op == inbox.OpMaterialise {
		if !m.exists {
			*m = inboxModel{exists: true, posts: map[domain.PostID]bool{}, floor: it.Floor, seq: it.Seq, taken: it.Seq}
			m.add(it.Posts)
			m.trim(limit)
		}
		return
	}
	if !m.exists || it.Seq <= m.seq {
		return
	}
	m.seq = it.Seq
	if it.Op != inbox.OpPush {
		m.taken = it.Seq
	}
	switch it.Op {
	case inbox.OpPush:
		m.add(it.Posts)
		m.trimOver(limit, slack)
	case inbox.OpRemove:
		delete(m.posts, it.Posts[0])
	case inbox.OpMerge:
		m.raise(it.Floor)
		m.add(it.Posts)
		m.trimOver(limit, slack)
	case inbox.OpUnmerge:
		for _, p := range it.Posts {
			delete(m.posts, p)
		}
		m.raise(it.Floor)
	}
}

func (m *inboxModel) state() inboxState {
	if !m.exists {
		return inboxState{}
	}
	posts := ids()
	for p := range m.posts {
		posts = append(posts, p)
	}
	slices.SortFunc(posts, func(a, b domain.PostID) int { return cmp.Compare(b, a) })
	return inboxState{posts, m.floor, m.seq, true}
}

// TestApplyItemsAgainstModel applies random batches of work items and compares
// the inbox with the reference model after each. The inbox never leaves the
// listpack encoding although zset-max-listpack-entries leaves no room beyond
// the cap and a small inbox's five members more. Post ids are small (below
// the items' sequences, which takes a lone push off the small inbox's path of
// its own) or, as they are, far above them.
func TestApplyItemsAgainstModel(t *testing.T) {
	t.Parallel()
	for _, size := range []int{2, 3, 100} {
		for _, base := range []int64{0, bigIDs} {
			t.Run(fmt.Sprintf("segments of %d, ids from %d", size, base), func(t *testing.T) {
				t.Parallel()
				testApplyItemsAgainstModel(t, size, base)
			})
		}
	}
}

// sentItems makes the items of a random test what the planner can send: a
// recipient gets at most one item a log sequence (the sequence's event's
// effect on its inbox), so an item at a sequence that already has one, a
// redelivery or an older item, is that one again (see apply.lua's lone push).
// The planner sends a recipient its items in log order, and sends an older
// one only again: a test makes an item older than the newest only where has
// says one was sent.
type sentItems map[[2]uint64]inbox.Item

func (s sentItems) has(u domain.UserID, seq uint64) bool {
	_, ok := s[[2]uint64{uint64(u), seq}]
	return ok
}

func (s sentItems) item(it inbox.Item) inbox.Item {
	k := [2]uint64{uint64(it.Recipient), it.Seq}
	if old, ok := s[k]; ok {
		return old
	}
	s[k] = it
	return it
}

func testApplyItemsAgainstModel(t *testing.T, size int, base int64) {
	const limit = 8
	s, rdb, rng := newModelStore(t, feeds.Config{InboxCap: limit, SegmentSize: size}, limit+5)
	ctx := t.Context()
	post := func() domain.PostID { return domain.PostID(base + 1 + rng.Int64N(60)) }
	randPosts := func(k int) []domain.PostID {
		ps := make([]domain.PostID, rng.IntN(k+1))
		for i := range ps {
			ps[i] = post()
		}
		return ps
	}
	var model inboxModel
	var seq uint64
	sent := sentItems{}
	for batch := range 300 {
		if rng.IntN(40) == 0 {
			require.NoError(t, rdb.Del(ctx, "feed:v1:{1}:iy").Err()) // it expired
			model = inboxModel{}
		}
		items := make([]inbox.Item, 1+rng.IntN(6))
		// A third of the calls are a lone push, what a post's fan-out gives
		// each follower, which the script applies on a path of its own.
		lone := rng.IntN(3) == 0
		if lone {
			items = items[:1]
		}
		for i := range items {
			if rng.IntN(5) > 0 {
				seq++ // else a redelivery or an older item
			}
			itSeq := seq
			if itSeq > 0 && rng.IntN(2) == 0 && sent.has(alice, itSeq-1) {
				itSeq--
			}
			floor := base + rng.Int64N(30)
			kind := rng.IntN(9)
			if lone {
				kind = 0
			}
			switch kind {
			case 0, 1, 2:
				items[i] = push(itSeq, post())
			case 3:
				items[i] = remove(itSeq, post())
			case 4, 5:
				items[i] = merge(itSeq, floor, randPosts(12)...)
			case 6:
				items[i] = unmerge(itSeq, floor, randPosts(6)...)
			default:
				items[i] = materialise(itSeq, floor, randPosts(20)...)
			}
			items[i] = sent.item(items[i])
		}
		model.applyAll(items, limit, size)
		_, err := inbox.Apply(ctx, s, items)
		require.NoError(t, err)
		requireInbox(t, &model, readInbox(t, s, alice), "batch %d: %v", batch, items)
		checkSegments(t, rdb, alice, size, limit, "batch %d: %v", batch, items)
	}
}

// TestApplyItemsForManyAgainstModel applies random batches of work items for
// many recipients at once — fan-outs of one push or removal to many of them,
// which share a list in the script's arguments, mixed with each one's own
// items, some too long to share a script run — and compares every inbox with
// its reference model after each. It runs over a single Redis, where a script
// run carries many recipients, and over a Ring, where it carries one.
func TestApplyItemsForManyAgainstModel(t *testing.T) {
	t.Parallel()
	const (
		limit = 8
		users = 40
	)
	r := localstacktest.RedisForTest(t)
	ctx := t.Context()
	single := redis.NewClient(&redis.Options{Addr: r.Addr()})
	t.Cleanup(func() { _ = single.Close() })
	require.NoError(t, single.ConfigSet(ctx, "zset-max-listpack-entries", strconv.Itoa(limit+5)).Err())
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"one": r.Addr()}})
	t.Cleanup(func() { _ = ring.Close() })

	for _, run := range []struct {
		name string
		rdb  redis.UniversalClient
		size int
		base int64
	}{
		{"single", single, 3, 0}, {"single", single, 100, 0}, {"ring", ring, 3, 0},
		{"single", single, 3, bigIDs}, {"single", single, 100, bigIDs}, {"ring", ring, 100, bigIDs},
	} {
		name, rdb := fmt.Sprintf("%s, segments of %d, ids from %d", run.name, run.size, run.base), run.rdb
		s := feeds.NewStore(rdb, feeds.Config{InboxCap: limit, SegmentSize: run.size})
		rng := seededRand(t, name)
		require.NoError(t, single.FlushDB(ctx).Err())
		post := func() domain.PostID { return domain.PostID(run.base + 1 + rng.Int64N(60)) }
		randPosts := func(k int) []domain.PostID {
			ps := make([]domain.PostID, rng.IntN(k+1))
			for i := range ps {
				ps[i] = post()
			}
			return ps
		}
		sent := sentItems{}
		key := func(u domain.UserID) string { return "feed:v1:{" + strconv.Itoa(int(u)) + "}:iy" }
		models := make([]inboxModel, users+1)
		var seq uint64
		for batch := range 150 {
			var items []inbox.Item
			for range 1 + rng.IntN(8) {
				seq++
				if rng.IntN(10) == 0 {
					// Long items for everyone: more than one script run's worth.
					for u := domain.UserID(1); u <= users; u++ {
						items = append(items, inbox.Item{Recipient: u, Seq: seq, Op: inbox.OpMerge, Floor: run.base + rng.Int64N(30), Posts: randPosts(60)})
					}
					continue
				}
				if rng.IntN(2) == 0 {
					// A fan-out: one push or removal to many recipients.
					op := inbox.OpPush
					if rng.IntN(4) == 0 {
						op = inbox.OpRemove
					}
					p := post()
					for u := domain.UserID(1); u <= users; u++ {
						if rng.IntN(3) > 0 {
							items = append(items, inbox.Item{Recipient: u, Seq: seq, Op: op, Posts: ids(p)})
						}
					}
					continue
				}
				u := domain.UserID(1 + rng.IntN(users))
				floor := run.base + rng.Int64N(30)
				it := inbox.Item{Recipient: u, Seq: seq, Floor: floor}
				if rng.IntN(4) == 0 && sent.has(u, seq-1) {
					it.Seq-- // a redelivery or an older item
				}
				switch rng.IntN(6) {
				case 0:
					it.Op, it.Posts = inbox.OpPush, ids(post())
				case 1:
					it.Op, it.Posts = inbox.OpMerge, randPosts(60)
				case 2:
					it.Op, it.Posts = inbox.OpUnmerge, randPosts(6)
				default:
					it.Op, it.Posts = inbox.OpMaterialise, randPosts(20)
				}
				items = append(items, it)
			}
			for u := domain.UserID(1); u <= users; u++ {
				if rng.IntN(60) == 0 {
					require.NoError(t, single.Del(ctx, key(u)).Err()) // it expired
					models[u] = inboxModel{}
				}
			}
			mine := map[domain.UserID][]inbox.Item{}
			for i, it := range items {
				items[i] = sent.item(it)
				mine[it.Recipient] = append(mine[it.Recipient], items[i])
			}
			for u, its := range mine {
				models[u].applyAll(its, limit, run.size)
			}
			_, err := inbox.Apply(ctx, s, items)
			require.NoError(t, err)
			for u := domain.UserID(1); u <= users; u++ {
				requireInbox(t, &models[u], readInbox(t, s, u), "%s: batch %d, user %d", name, batch, u)
				checkSegments(t, single, u, run.size, limit, "%s: batch %d, user %d", name, batch, u)
			}
		}
	}
}

// TestInboxMemory measures a full inbox of realistic ids (today's, 49 bits) in
// the listpack encoding.
func TestInboxMemory(t *testing.T) {
	t.Parallel()
	s, rdb := newStore(t, feeds.Config{})
	ctx := t.Context()
	require.NoError(t, rdb.ConfigSet(ctx, "zset-max-listpack-entries", "1024").Err())
	entries, err := s.CheckListpack(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(1024), entries)

	gen, err := domain.NewIDGenerator(7)
	require.NoError(t, err)
	start := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	posts := make([]domain.PostID, 500)
	for i := range posts {
		id, _ := gen.Next(start.Add(time.Duration(i) * 37 * time.Second))
		posts[i] = domain.PostID(id)
	}
	_, err = inbox.Apply(ctx, s, []inbox.Item{materialise(123456, 0, posts...)})
	require.NoError(t, err)

	checkSegments(t, rdb, alice, 100, 500)
	keys, err := inbox.Keys(ctx, s, alice)
	require.NoError(t, err)
	require.Len(t, keys, 6, "the meta and five segments of 100")
	var bytes int64
	for _, k := range keys {
		n, err := rdb.MemoryUsage(ctx, k).Result()
		require.NoError(t, err)
		bytes += n
	}
	perEntry := float64(bytes) / 500
	t.Logf("inbox of 500 posts: %d bytes in %d keys, %.1f bytes per entry", bytes, len(keys), perEntry)
	assert.LessOrEqual(t, perEntry, 24.0)
}

// callsPerTrip records how many commands each of a client's round trips
// carried.
type callsPerTrip struct{ trips []int }

func (h *callsPerTrip) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *callsPerTrip) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.trips = append(h.trips, 1)
		return next(ctx, cmd)
	}
}

func (h *callsPerTrip) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.trips = append(h.trips, len(cmds))
		return next(ctx, cmds)
	}
}

// runsToInboxes materialises the inboxes of users 1..users, each with post 10,
// and returns a store, a run of n pushes to each of them (posts 20, 21, …,
// sequences from 2) and a hook that counts the calls of each round trip from
// then on.
func runsToInboxes(t *testing.T, users domain.UserID, n int) (*feeds.Store, []inbox.Item, *callsPerTrip) {
	t.Helper()
	s, rdb := newStore(t, feeds.Config{})
	var items []inbox.Item
	for u := domain.UserID(1); u <= users; u++ {
		items = append(items, inbox.Item{Recipient: u, Seq: 1, Op: inbox.OpMaterialise, Posts: ids(10)})
	}
	_, err := inbox.Apply(t.Context(), s, items)
	require.NoError(t, err)
	items = items[:0]
	for u := domain.UserID(1); u <= users; u++ {
		for k := range n {
			items = append(items, inbox.Item{Recipient: u, Seq: uint64(2 + k), Op: inbox.OpPush, Posts: ids(domain.PostID(20 + k))})
		}
	}
	h := &callsPerTrip{}
	rdb.AddHook(h)
	return s, items, h
}

// TestApplyItemsSendsACallATrip: the calls of a large inbox.Apply go one a
// round trip, so that Redis turns to its other clients between them (see
// stCallArgs), and all of them apply.
func TestApplyItemsSendsACallATrip(t *testing.T) {
	t.Parallel()
	const users = 300
	// A run of three pushes each: some 3 300 arguments in all.
	s, items, h := runsToInboxes(t, users, 3)
	ctx := t.Context()
	applied, err := inbox.Apply(ctx, s, items)
	require.NoError(t, err)
	assert.Equal(t, len(items), applied)
	assert.Greater(t, len(h.trips), 4, "round trips")
	for i, n := range h.trips {
		assert.Equal(t, 1, n, "round trip %d", i)
	}
	for u := domain.UserID(1); u <= users; u++ {
		posts, _, seq, ok, err := inbox.ReadAll(ctx, s, u)
		require.NoError(t, err)
		require.True(t, ok)
		assert.Equal(t, ids(22, 21, 20, 10), posts, "user %d", u)
		assert.Equal(t, uint64(4), seq, "user %d", u)
	}
}

// TestApplyItemsOfACatchUpSendsSeveralCallsATrip: a message of 4 000 items or
// more (what the planner's batches make only while the feeds are behind) goes
// in round trips of up to four calls, so that an applier catching up is not
// bound by one call's round trip; one of 3 990 still goes a call a trip.
func TestApplyItemsOfACatchUpSendsSeveralCallsATrip(t *testing.T) {
	t.Parallel()
	for _, users := range []domain.UserID{399, 400} {
		t.Run(fmt.Sprintf("%d items", 10*users), func(t *testing.T) {
			t.Parallel()
			// A run of ten pushes each, the runs of some 14 recipients a call.
			s, items, h := runsToInboxes(t, users, 10)
			ctx := t.Context()
			applied, err := inbox.Apply(ctx, s, items)
			require.NoError(t, err)
			assert.Equal(t, len(items), applied)
			calls := 0
			for _, n := range h.trips {
				calls += n
			}
			require.Greater(t, calls, 20, "calls")
			if len(items) < 4000 {
				assert.Len(t, h.trips, calls, "a call a round trip")
			} else {
				assert.LessOrEqual(t, len(h.trips), calls/3+1, "round trips of %d calls", calls)
				assert.LessOrEqual(t, slices.Max(h.trips), 4, "calls a round trip")
			}
			for _, u := range []domain.UserID{1, users / 2, users} {
				posts, _, seq, ok, err := inbox.ReadAll(ctx, s, u)
				require.NoError(t, err)
				require.True(t, ok)
				assert.Equal(t, ids(29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 10), posts, "user %d", u)
				assert.Equal(t, uint64(11), seq, "user %d", u)
			}
		})
	}
}

// TestApplyItemsRunsAgainstModel: a recipient's run of pushes alone in a call
// (what it gets from a batch of posts under load) takes a path of its own in
// the apply function. Random runs, with rising sequences as the planner sends
// them, into an inbox of every state they meet — small, segmented with room,
// full, its head about to overflow, its tail about to empty — of posts mostly
// newer than the inbox's, now and then older or one it has, with ids below
// the sequences and far above them, calls sent again (the last, or an older
// one after what came since, as a planner's rewind sends them), and now and
// then a removal or a merge between them; after each call the inbox is its
// model's.
func TestApplyItemsRunsAgainstModel(t *testing.T) {
	t.Parallel()
	for _, base := range []int64{0, bigIDs} {
		for _, size := range []int{3, 4, 8, 10} {
			t.Run(fmt.Sprintf("segments of %d, ids from %d", size, base), func(t *testing.T) {
				t.Parallel()
				const limit = 10
				s, rdb, rng := newModelStore(t, feeds.Config{InboxCap: limit, SegmentSize: size}, limit+5)
				ctx := t.Context()
				var model inboxModel
				seq, newest := uint64(0), base+100
				post := func() domain.PostID {
					switch rng.IntN(12) {
					case 0:
						return domain.PostID(base + 1 + rng.Int64N(newest-base)) // older
					case 1:
						return domain.PostID(newest - rng.Int64N(4)) // maybe one it has
					}
					newest += 1 + rng.Int64N(3)
					return domain.PostID(newest)
				}
				var sent [][]inbox.Item
				for round := range 600 {
					var items []inbox.Item
					switch {
					case !model.exists || rng.IntN(60) == 0:
						seq++
						items = []inbox.Item{materialise(seq, base, post(), post(), post())}
					case rng.IntN(8) == 0 && len(sent) > 0:
						items = sent[len(sent)-1] // sent again
					case rng.IntN(6) == 0 && len(sent) > 0:
						items = sent[rng.IntN(len(sent))] // sent again, later
					case rng.IntN(10) == 0:
						seq++
						items = []inbox.Item{remove(seq, domain.PostID(newest-rng.Int64N(12)))} // maybe a recent one
					case rng.IntN(12) == 0:
						seq++
						items = []inbox.Item{merge(seq, base, post(), post())}
					default:
						// Runs of 2 to 8: longer than a segment of 3 or 4
						// (a head of their own, up to twice a segment), and
						// longer than that (the general way).
						for range 2 + rng.IntN(7) {
							seq++
							items = append(items, push(seq, post()))
						}
					}
					if rng.IntN(80) == 0 {
						require.NoError(t, rdb.Del(ctx, "feed:v1:{1}:iy").Err()) // it expired
						model = inboxModel{}
					}
					model.applyAll(items, limit, size)
					_, err := inbox.Apply(ctx, s, items)
					require.NoError(t, err)
					requireInbox(t, &model, readInbox(t, s, alice), "round %d: %v", round, items)
					checkSegments(t, rdb, alice, size, limit, "round %d: %v", round, items)
					sent = append(sent, items)
				}
			})
		}
	}
}

// TestApplyItemsRunSentAgainAfterARemoval: a run of pushes applied, one of
// its posts removed, and the run sent again (as a planner's rewind sends its
// work again): the run was applied before, so nothing comes back. Its path
// (apply.lua's run) must see that from the inbox's sequence, not from its
// posts, which are in the inbox but for the one removed.
func TestApplyItemsRunSentAgainAfterARemoval(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, feeds.Config{InboxCap: 10, SegmentSize: 8})
	ctx := t.Context()
	var old []domain.PostID
	for p := range domain.PostID(10) {
		old = append(old, big(10+p))
	}
	// Segments of 8 and 2, the head the 2 newest: a run of two goes into it
	// (12 posts, within the cap and a segment).
	_, err := inbox.Apply(ctx, s, []inbox.Item{materialise(1, 0, old...)})
	require.NoError(t, err)
	run := []inbox.Item{push(2, big(50)), push(3, big(51))}
	applied, err := inbox.Apply(ctx, s, run)
	require.NoError(t, err)
	require.Equal(t, 2, applied)
	_, err = inbox.Apply(ctx, s, []inbox.Item{remove(4, big(50))})
	require.NoError(t, err)

	applied, err = inbox.Apply(ctx, s, run)
	require.NoError(t, err)
	assert.Zero(t, applied)
	want := ids(big(51))
	for p := domain.PostID(19); p >= 10; p-- {
		want = append(want, big(p))
	}
	assert.Equal(t, inboxState{want, 0, 4, true}, readInbox(t, s, alice))
}
