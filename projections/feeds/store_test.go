package feeds_test

import (
	"cmp"
	"errors"
	"maps"
	"math/rand/v2"
	"net"
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
)

// newStore starts a Redis of its own for the test and returns a store over it
// and a raw client to look behind the store's back.
func newStore(t *testing.T, cfg feeds.Config) (*feeds.Store, *redis.Client) {
	t.Helper()
	rdb := localstacktest.RedisClientForTest(t)
	return feeds.NewStore(rdb, cfg), rdb
}

const alice, bob domain.UserID = 1, 2

func ids(ps ...domain.PostID) []domain.PostID { return append([]domain.PostID{}, ps...) }

func TestOutbox(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, feeds.Config{OutboxCap: 3})
	ctx := t.Context()

	// Given an outbox at its cap
	for _, p := range ids(10, 20, 30) {
		require.NoError(t, s.AddToOutbox(ctx, alice, p))
	}
	// When two more posts and a replay of a trimmed one arrive, and one is deleted
	require.NoError(t, s.AddToOutbox(ctx, alice, 40))
	require.NoError(t, s.AddToOutbox(ctx, alice, 50))
	require.NoError(t, s.AddToOutbox(ctx, alice, 10))
	require.NoError(t, s.RemoveFromOutbox(ctx, alice, 40))
	require.NoError(t, s.RemoveFromOutbox(ctx, alice, 40))

	// Then it keeps the newest, the floor rose to the oldest kept, and the
	// deletion left the floor alone; a missing outbox is empty from 0.
	got, err := s.Outboxes(ctx, []domain.UserID{alice, bob})
	require.NoError(t, err)
	assert.Equal(t, map[domain.UserID]feeds.Outbox{
		alice: {Posts: ids(50, 30), Floor: 30},
		bob:   {Posts: []domain.PostID{}, Floor: 0},
	}, got)
}

// TestOutboxAgainstModel adds and removes random posts and compares the
// outbox with "add if not below the floor, then trim to the cap".
func TestOutboxAgainstModel(t *testing.T) {
	t.Parallel()
	const limit = 5
	s, rdb := newStore(t, feeds.Config{OutboxCap: limit})
	ctx := t.Context()
	require.NoError(t, rdb.ConfigSet(ctx, "zset-max-listpack-entries", strconv.Itoa(limit+1)).Err())
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	model := outboxModel{posts: map[domain.PostID]bool{}}
	for step := range 400 {
		p := domain.PostID(1 + rng.IntN(40))
		if rng.IntN(4) == 0 {
			require.NoError(t, s.RemoveFromOutbox(ctx, bob, p))
			delete(model.posts, p)
		} else {
			require.NoError(t, s.AddToOutbox(ctx, bob, p))
			model.add(p, limit)
		}
		got, err := s.Outboxes(ctx, []domain.UserID{bob})
		require.NoError(t, err)
		require.Equal(t, model.outbox(), got[bob], "step %d", step)
		enc, err := rdb.ObjectEncoding(ctx, "feed:v1:{2}:out").Result()
		if errors.Is(err, redis.Nil) {
			continue // removes before the first add
		}
		require.NoError(t, err)
		require.Equal(t, "listpack", enc, "step %d", step)
	}
}

// outboxModel is the reference for an outbox: a post is added if it is not
// below the floor, then the outbox is trimmed to its cap, the floor rising
// to the oldest post kept.
type outboxModel struct {
	posts map[domain.PostID]bool
	floor int64
}

func (m *outboxModel) add(p domain.PostID, limit int) {
	if int64(p) < m.floor {
		return
	}
	m.posts[p] = true
	if all := m.outbox().Posts; len(all) > limit {
		for _, q := range all[limit:] {
			delete(m.posts, q)
		}
		m.floor = int64(all[limit-1])
	}
}

func (m *outboxModel) outbox() feeds.Outbox {
	posts := slices.SortedFunc(maps.Keys(m.posts), func(a, b domain.PostID) int { return cmp.Compare(b, a) })
	if posts == nil {
		posts = []domain.PostID{}
	}
	return feeds.Outbox{Posts: posts, Floor: m.floor}
}

func TestRequestMaterialise(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, feeds.Config{})
	ctx := t.Context()
	for _, u := range []domain.UserID{alice, bob, alice, bob, alice} {
		require.NoError(t, s.RequestMaterialise(ctx, u))
	}
	got, err := s.PopMaterialiseRequests(ctx, 10)
	require.NoError(t, err)
	assert.Equal(t, []domain.UserID{alice, bob}, got, "once each, oldest first")
	got, err = s.PopMaterialiseRequests(ctx, 10)
	require.NoError(t, err)
	assert.Empty(t, got)
	// The marker still holds within its 30 seconds.
	require.NoError(t, s.RequestMaterialise(ctx, alice))
	got, err = s.PopMaterialiseRequests(ctx, 10)
	require.NoError(t, err)
	assert.Empty(t, got)
}

func TestFollowsAndBigAccounts(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t, feeds.Config{})
	ctx := t.Context()
	const carol domain.UserID = 3
	require.NoError(t, s.Follow(ctx, alice, carol))
	require.NoError(t, s.Follow(ctx, bob, carol))
	require.NoError(t, s.Follow(ctx, bob, carol))
	require.NoError(t, s.Follow(ctx, alice, bob))
	require.NoError(t, s.Unfollow(ctx, alice, bob))
	require.NoError(t, s.Unfollow(ctx, alice, bob))

	followers, err := s.Followers(ctx, carol)
	require.NoError(t, err)
	assert.ElementsMatch(t, []domain.UserID{alice, bob}, followers)
	n, err := s.FollowerCount(ctx, carol)
	require.NoError(t, err)
	assert.Equal(t, int64(2), n)
	following, err := s.Following(ctx, alice)
	require.NoError(t, err)
	assert.Equal(t, []domain.UserID{carol}, following)
	followers, err = s.Followers(ctx, bob)
	require.NoError(t, err)
	assert.Empty(t, followers)

	require.NoError(t, s.SetBig(ctx, carol, true))
	require.NoError(t, s.SetBig(ctx, bob, true))
	require.NoError(t, s.SetBig(ctx, bob, false))
	big, err := s.BigAccounts(ctx)
	require.NoError(t, err)
	assert.Equal(t, []domain.UserID{carol}, big)

	bigFollowees, err := s.BigFollowees(ctx, bob, []domain.UserID{alice, carol, bob})
	require.NoError(t, err)
	assert.Equal(t, []domain.UserID{carol}, bigFollowees)
}

func TestCheckEviction(t *testing.T) {
	t.Parallel()
	s, rdb := newStore(t, feeds.Config{})
	ctx := t.Context()
	for _, tc := range []struct {
		maxmemory, policy string
		evicts            bool
	}{
		{"0", "allkeys-lru", false},
		{"1gb", "allkeys-lru", true},
		{"1gb", "volatile-ttl", true},
		{"1gb", "noeviction", false},
	} {
		require.NoError(t, rdb.ConfigSet(ctx, "maxmemory", tc.maxmemory).Err())
		require.NoError(t, rdb.ConfigSet(ctx, "maxmemory-policy", tc.policy).Err())
		evicts, policy, err := s.CheckEviction(ctx)
		require.NoError(t, err)
		assert.Equal(t, tc.evicts, evicts, "%s, %s", tc.maxmemory, tc.policy)
		assert.Equal(t, tc.policy, policy)
	}
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

	require.ErrorIs(t, s.AddToOutbox(ctx, alice, 1), domain.ErrUnavailable)
	_, err = s.Followers(ctx, alice)
	require.ErrorIs(t, err, domain.ErrUnavailable)

	closedClient := redis.NewClient(&redis.Options{Addr: addr, DialerRetries: 1})
	require.NoError(t, closedClient.Close())
	_, err = feeds.NewStore(closedClient, feeds.Config{}).ActiveVersion(ctx)
	require.ErrorIs(t, err, domain.ErrUnavailable)

}

func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	s := feeds.NewStore(nil, feeds.Config{InboxCap: 7})
	assert.Equal(t, feeds.Config{InboxCap: 7, SegmentSize: 100, OutboxCap: 500, TTL: 7 * 24 * time.Hour, BigThreshold: 10000, BigMargin: 1000}, s.Config())
	// A margin of its own, none, or one past the threshold.
	for give, want := range map[int]int{7: 7, -1: 0, 20000: 10000} {
		assert.Equal(t, want, feeds.NewStore(nil, feeds.Config{BigMargin: give}).Config().BigMargin, "BigMargin %d", give)
	}
}
