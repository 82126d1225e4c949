package presence_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/projections/feeds"
	"github.com/feedproject/feed/projections/feeds/presence"
)

// TestRegistry admits, renews and releases streams on one Redis and on a
// Redis Cluster, where each call touches one slot: the limit is counted
// atomically, expired entries stop counting, and the online users are those
// holding an entry.
func TestRegistry(t *testing.T) {
	for name, client := range map[string]func(t *testing.T) redis.UniversalClient{
		"redis": func(t *testing.T) redis.UniversalClient {
			c := redis.NewClient(&redis.Options{Addr: localstacktest.RedisForTest(t).Addr()})
			t.Cleanup(func() { _ = c.Close() })
			return c
		},
		"cluster": func(t *testing.T) redis.UniversalClient {
			return localstacktest.RedisClusterForTest(t).Client(t)
		},
	} {
		t.Run(name, func(t *testing.T) {
			rdb := client(t)
			ctx := t.Context()
			const expiry = 600 * time.Millisecond
			reg := presence.New(rdb, presence.Config{Expiry: expiry})
			alice, bob := domain.UserID(11), domain.UserID(12)

			// Given alice holds three streams, when she asks for a fourth with a
			// limit of three, then it is refused; bob's are his own.
			var held []presence.Stream
			for i := range 3 {
				s, n, ok, err := reg.Admit(ctx, alice, 3)
				require.NoError(t, err)
				require.True(t, ok)
				assert.Equal(t, i+1, n)
				held = append(held, s)
			}
			_, n, ok, err := reg.Admit(ctx, alice, 3)
			require.NoError(t, err)
			assert.False(t, ok)
			assert.Equal(t, 3, n)
			bobs, _, ok, err := reg.Admit(ctx, bob, 3)
			require.NoError(t, err)
			require.True(t, ok)
			online, err := reg.Online(ctx, time.Now())
			require.NoError(t, err)
			assert.Equal(t, map[domain.UserID]struct{}{alice: {}, bob: {}}, online)

			// A released stream frees its place; bob, releasing his only one,
			// goes offline.
			require.NoError(t, reg.Release(ctx, held[0]))
			require.NoError(t, reg.Release(ctx, bobs))
			s, _, ok, err := reg.Admit(ctx, alice, 3)
			require.NoError(t, err)
			require.True(t, ok)
			held[0] = s
			online, err = reg.Online(ctx, time.Now())
			require.NoError(t, err)
			assert.Equal(t, map[domain.UserID]struct{}{alice: {}}, online)

			// Renewed entries outlive the expiry; the ones not renewed (a
			// process that died) stop counting after it.
			deadline := time.Now().Add(2 * expiry)
			for time.Now().Before(deadline) {
				require.NoError(t, reg.Renew(ctx, held[:1]))
				time.Sleep(expiry / 4)
			}
			_, n, ok, err = reg.Admit(ctx, alice, 3)
			require.NoError(t, err)
			assert.True(t, ok, "two of three expired")
			assert.Equal(t, 2, n, "the renewed one and the new one")

			// Redis losing the record: a renewal puts the entry back.
			require.NoError(t, rdb.Del(ctx, feeds.StreamsKey(alice)).Err())
			require.NoError(t, reg.Renew(ctx, held[:1]))
			assert.Equal(t, int64(1), rdb.ZCard(ctx, feeds.StreamsKey(alice)).Val())
			ttl := rdb.PTTL(ctx, feeds.StreamsKey(alice)).Val()
			assert.True(t, ttl > 0 && ttl <= expiry, "the key expires with its entries: %s", ttl)

			// Everything expires once nothing is renewed.
			time.Sleep(expiry + 100*time.Millisecond)
			online, err = reg.Online(ctx, time.Now())
			require.NoError(t, err)
			assert.Empty(t, online)
		})
	}
}

// TestWatcherCopiesTheOnlineUsers: the fan-out's copy follows the record.
func TestWatcherCopiesTheOnlineUsers(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: localstacktest.RedisForTest(t).Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	reg := presence.New(rdb, presence.Config{})
	w := reg.Watch(20 * time.Millisecond)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = w.Run(t.Context())
	}()
	t.Cleanup(func() { <-done })
	s, _, ok, err := reg.Admit(t.Context(), 7, 5)
	require.NoError(t, err)
	require.True(t, ok)
	require.Eventually(t, func() bool { _, on := w.Online()[7]; return on }, 2*time.Second, 10*time.Millisecond)
	require.NoError(t, reg.Release(t.Context(), s))
	require.Eventually(t, func() bool { return len(w.Online()) == 0 }, 2*time.Second, 10*time.Millisecond)
}
