package inbox_test

import (
	"context"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/projections/feeds"
	"github.com/feedproject/feed/projections/feeds/inbox"
)

// TestFunctionsAfterFlush: a Redis restarted without persistence has none of
// the Lua functions; each way of calling them loads them and the calls apply
// once each.
func TestFunctionsAfterFlush(t *testing.T) {
	t.Parallel()
	s, rdb := newStore(t, feeds.Config{OutboxCap: 3})
	ctx := t.Context()
	_, err := inbox.Apply(ctx, s, []inbox.Item{materialise(1, 0, 10)})
	require.NoError(t, err)
	require.NoError(t, s.AddToOutbox(ctx, bob, 5))

	// The apply function, pipelined.
	require.NoError(t, rdb.FunctionFlush(ctx).Err())
	applied, err := inbox.Apply(ctx, s, []inbox.Item{push(2, 20), remove(3, 10)})
	require.NoError(t, err)
	assert.Equal(t, 2, applied)

	// The page function, in a transaction.
	require.NoError(t, rdb.FunctionFlush(ctx).Err())
	page, err := inbox.ReadPage(ctx, s, alice, nil, 0, 10)
	require.NoError(t, err)
	assert.Equal(t, ids(20), page.Posts)

	// The page function, alone.
	require.NoError(t, rdb.FunctionFlush(ctx).Err())
	assert.Equal(t, inboxState{ids(20), 0, 3, true}, readInbox(t, s, alice))

	// The outbox function, alone.
	require.NoError(t, rdb.FunctionFlush(ctx).Err())
	require.NoError(t, s.AddToOutbox(ctx, bob, 6))
	got, err := s.Outboxes(ctx, []domain.UserID{bob})
	require.NoError(t, err)
	assert.Equal(t, ids(6, 5), got[bob].Posts)

	// All three at once, as serve does at its start, each a library of its own.
	require.NoError(t, rdb.FunctionFlush(ctx).Err())
	require.NoError(t, inbox.LoadFunctions(ctx, s))
	libs, err := rdb.FunctionList(ctx, redis.FunctionListQuery{}).Result()
	require.NoError(t, err)
	var names []string
	for _, l := range libs {
		require.Len(t, l.Functions, 1, l.Name)
		assert.Equal(t, l.Name, l.Functions[0].Name)
		names = append(names, strings.SplitN(l.Name, "_", 3)[1])
	}
	assert.ElementsMatch(t, []string{"apply", "page", "outbox"}, names)
}

func TestPage(t *testing.T) {
	t.Parallel()
	s, rdb := newStore(t, feeds.Config{InboxCap: 4, OutboxCap: 3})
	ctx := t.Context()
	const big1, big2 domain.UserID = 100, 200

	// Given alice's inbox 90..60 (floor 55) and two big authors' outboxes: big1
	// lists 95, 70 (duplicated in the inbox), 58 (floor 58); big2 lists 80 (floor 0).
	_, err := inbox.Apply(ctx, s, []inbox.Item{materialise(1, 55, 60, 70, 80, 90)})
	require.NoError(t, err)
	for _, p := range ids(40, 58, 70, 95) {
		require.NoError(t, s.AddToOutbox(ctx, big1, p))
	}
	require.NoError(t, s.AddToOutbox(ctx, big2, 80))

	cases := []struct {
		name   string
		big    []domain.UserID
		before int64
		n      int
		want   inbox.Page
	}{
		{"the inbox alone", nil, 0, 10, inbox.Page{Materialised: true, Posts: ids(90, 80, 70, 60), Floor: 55}},
		{"merged and deduplicated; the floor is the highest", []domain.UserID{big1, big2}, 0, 10,
			inbox.Page{Materialised: true, Posts: ids(95, 90, 80, 70, 60, 58), Floor: 58}},
		{"at most n", []domain.UserID{big1, big2}, 0, 3, inbox.Page{Materialised: true, Posts: ids(95, 90, 80), Floor: 58}},
		{"strictly below before", []domain.UserID{big1, big2}, 80, 2, inbox.Page{Materialised: true, Posts: ids(70, 60), Floor: 58}},
		{"down to the floor", []domain.UserID{big1}, 60, 5, inbox.Page{Materialised: true, Posts: ids(58), Floor: 58}},
		{"nothing below the floor", []domain.UserID{big1}, 58, 5, inbox.Page{Materialised: true, Posts: ids(), Floor: 58}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := inbox.ReadPage(ctx, s, alice, tc.big, tc.before, tc.n)
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
		})
	}

	t.Run("a user without an inbox is not materialised", func(t *testing.T) {
		got, err := inbox.ReadPage(ctx, s, bob, []domain.UserID{big1}, 0, 10)
		require.NoError(t, err)
		assert.False(t, got.Materialised)
		assert.Empty(t, got.Posts)
		n, err := rdb.Exists(ctx, "feed:v1:{2}:iy").Result()
		require.NoError(t, err)
		assert.Zero(t, n, "reading must not create an inbox")
	})

	t.Run("invalid arguments", func(t *testing.T) {
		_, err := inbox.ReadPage(ctx, s, alice, nil, 0, 0)
		require.ErrorIs(t, err, domain.ErrInvalid)
		_, err = inbox.ReadPage(ctx, s, alice, nil, -1, 10)
		require.ErrorIs(t, err, domain.ErrInvalid)
	})
}

// TestPageRefreshesTTL: an inbox that is read stays; the TTL is reset to the
// configured one.
func TestPageRefreshesTTL(t *testing.T) {
	t.Parallel()
	s, rdb := newStore(t, feeds.Config{TTL: time.Hour})
	ctx := t.Context()
	_, err := inbox.Apply(ctx, s, []inbox.Item{materialise(1, 0, 10)})
	require.NoError(t, err)
	ttl, err := rdb.PTTL(ctx, "feed:v1:{1}:iy").Result()
	require.NoError(t, err)
	assert.InDelta(t, time.Hour, ttl, float64(time.Minute), "materialise sets the TTL")

	// Given an inbox about to expire
	require.NoError(t, rdb.PExpire(ctx, "feed:v1:{1}:iy", 5*time.Second).Err())
	// When it is read
	_, err = inbox.ReadPage(ctx, s, alice, nil, 0, 10)
	require.NoError(t, err)
	// Then it lives for the TTL again
	ttl, err = rdb.PTTL(ctx, "feed:v1:{1}:iy").Result()
	require.NoError(t, err)
	assert.InDelta(t, time.Hour, ttl, float64(time.Minute))

	// And pushes do not refresh it
	require.NoError(t, rdb.PExpire(ctx, "feed:v1:{1}:iy", 5*time.Second).Err())
	_, err = inbox.Apply(ctx, s, []inbox.Item{push(2, 20)})
	require.NoError(t, err)
	ttl, err = rdb.PTTL(ctx, "feed:v1:{1}:iy").Result()
	require.NoError(t, err)
	assert.LessOrEqual(t, ttl, 5*time.Second)
}

// TestSpecialsStayHidden: the floor and seq members (negative scores, the
// lowest possible when both are 0) never show as posts.
func TestSpecialsStayHidden(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, feeds.Config{})
	ctx := t.Context()
	_, err := inbox.Apply(ctx, s, []inbox.Item{materialise(0, 0)})
	require.NoError(t, err)
	assert.Equal(t, inboxState{ids(), 0, 0, true}, readInbox(t, s, alice))
	page, err := inbox.ReadPage(ctx, s, alice, nil, 0, 10)
	require.NoError(t, err)
	assert.Equal(t, inbox.Page{Materialised: true, Posts: ids(), Floor: 0}, page)

	_, err = inbox.Apply(ctx, s, []inbox.Item{push(1, 1)})
	require.NoError(t, err)
	page, err = inbox.ReadPage(ctx, s, alice, nil, 0, 10)
	require.NoError(t, err)
	assert.Equal(t, ids(1), page.Posts)
}

// TestUnavailable: when Redis cannot be reached the errors say so, so that
// readers fall back to Postgres.
func TestUnavailable(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close()) // nothing listens there any more
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second, DialerRetries: 1})
	t.Cleanup(func() { _ = rdb.Close() })
	s := feeds.NewStore(rdb, feeds.Config{})
	ctx := t.Context()

	_, err = inbox.Apply(ctx, s, []inbox.Item{push(1, 1)})
	require.ErrorIs(t, err, domain.ErrUnavailable)
	_, err = inbox.ReadPage(ctx, s, alice, []domain.UserID{bob}, 0, 10)
	require.ErrorIs(t, err, domain.ErrUnavailable)

	deadline, cancel := context.WithTimeout(ctx, time.Nanosecond)
	defer cancel()
	<-deadline.Done()
	_, _, _, _, err = inbox.ReadAll(deadline, s, alice)
	require.ErrorIs(t, err, domain.ErrUnavailable)
}

func TestOpNames(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "materialise", inbox.OpMaterialise.String())
	assert.Equal(t, "op("+strconv.Itoa(9)+")", inbox.Op(9).String())
}
