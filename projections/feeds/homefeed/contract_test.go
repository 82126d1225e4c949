package homefeed_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/projections/feeds"
	"github.com/feedproject/feed/projections/feeds/fanout"
	"github.com/feedproject/feed/projections/feeds/homefeed"
	"github.com/feedproject/feed/projections/feeds/inbox"
)

// homeFeedCache is what the API asks of the home feed's Redis side
// (http.HomeFeedCache); Reader and PageCache both provide it.
type homeFeedCache interface {
	Page(ctx context.Context, user domain.UserID, before int64, n int, minPos uint64) (inbox.Page, error)
	RequestMaterialise(ctx context.Context, user domain.UserID) error
	Position(ctx context.Context) (uint64, error)
}

// cacheRig is one implementation over a Redis and a JetStream of its own.
type cacheRig struct {
	cache homeFeedCache
	store *feeds.Store
	js    jetstream.JetStream
}

// TestHomeFeedCacheContract runs the same contract over every implementation
// of the home feed's Redis side: what one serves, the other serves too.
func TestHomeFeedCacheContract(t *testing.T) {
	t.Parallel()
	impls := map[string]func(t *testing.T) cacheRig{
		"Reader": func(t *testing.T) cacheRig {
			s, _ := newStore(t, feeds.Config{InboxCap: 5, TTL: time.Hour})
			js := localstacktest.JetStreamForTest(t)
			return cacheRig{homefeed.NewReader(s, js), s, js}
		},
		"PageCache": func(t *testing.T) cacheRig {
			s, rdb := newStore(t, feeds.Config{InboxCap: 5, TTL: time.Hour})
			js := localstacktest.JetStreamForTest(t)
			c := homefeed.NewPageCache(homefeed.NewReader(s, js), &redis.Options{Addr: rdb.Options().Addr}, homefeed.PageCacheConfig{MaxAge: time.Hour}, nil, slog.New(slog.DiscardHandler))
			follow(t, c)
			return cacheRig{c, s, js}
		},
	}
	for name, newRig := range impls {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testHomeFeedCache(t, newRig(t))
		})
	}
}

func testHomeFeedCache(t *testing.T, rig cacheRig) {
	ctx := t.Context()
	c, s := rig.cache, rig.store
	const carol domain.UserID = 3

	// Given no inbox, when a page is read, then it is not materialised, and a
	// request to build one reaches the planner once.
	page, err := c.Page(ctx, alice, 0, 10, 0)
	require.NoError(t, err)
	assert.False(t, page.Materialised)
	require.NoError(t, c.RequestMaterialise(ctx, alice))
	require.NoError(t, c.RequestMaterialise(ctx, alice))
	asked, err := s.PopMaterialiseRequests(ctx, 10)
	require.NoError(t, err)
	assert.Equal(t, []domain.UserID{alice}, asked)

	// Given an inbox, pages are newest first, at most n, below the cursor.
	_, err = inbox.Apply(ctx, s, []inbox.Item{materialise(1, 5, 10, 20, 30)})
	require.NoError(t, err)
	page, err = c.Page(ctx, alice, 0, 2, 0)
	require.NoError(t, err)
	assert.Equal(t, inbox.Page{Materialised: true, Posts: ids(30, 20), Floor: 5}, page)
	page, err = c.Page(ctx, alice, 20, 2, 0)
	require.NoError(t, err)
	assert.Equal(t, inbox.Page{Materialised: true, Posts: ids(10), Floor: 5}, page)
	_, err = c.Page(ctx, alice, 0, 0, 0)
	require.ErrorIs(t, err, domain.ErrInvalid)

	// A change is seen at once by a read that must see a log position, and
	// soon by any read.
	_, err = inbox.Apply(ctx, s, []inbox.Item{push(2, 40)})
	require.NoError(t, err)
	page, err = c.Page(ctx, alice, 0, 2, 1)
	require.NoError(t, err)
	assert.Equal(t, ids(40, 30), page.Posts)
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		page, err := c.Page(ctx, alice, 0, 2, 0)
		require.NoError(ct, err)
		assert.Equal(ct, ids(40, 30), page.Posts)
	}, 5*time.Second, 5*time.Millisecond)

	// A big account alice follows is merged in, and its outbox's floor
	// bounds the page's.
	require.NoError(t, s.Follow(ctx, alice, carol))
	require.NoError(t, s.SetBig(ctx, carol, true))
	for _, p := range ids(7, 25, 50) {
		require.NoError(t, s.AddToOutbox(ctx, carol, p))
	}
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		page, err := c.Page(ctx, alice, 0, 10, 0)
		require.NoError(ct, err)
		assert.Equal(ct, inbox.Page{Materialised: true, Posts: ids(50, 40, 30, 25, 20, 10, 7), Floor: 5}, page)
	}, 5*time.Second, 5*time.Millisecond)

	// The position is the planner's while no work waits, and just below the
	// oldest work waiting.
	_, err = rig.js.CreateStream(ctx, jetstream.StreamConfig{Name: fanout.FanoutStream, Subjects: []string{"fanout.>"}})
	require.NoError(t, err)
	require.NoError(t, fanout.SetPlannerPosition(ctx, s, 9))
	pos, err := c.Position(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(9), pos)
	msg := nats.NewMsg("fanout.0")
	msg.Header.Set("Feed-From-Seq", "4")
	_, err = rig.js.PublishMsg(ctx, msg)
	require.NoError(t, err)
	pos, err = c.Position(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(3), pos)
}
