package inbox_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/projections/feeds"
	"github.com/feedproject/feed/projections/feeds/inbox"
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

// big is post p with an id far above every sequence, as real ids are.
func big(p domain.PostID) domain.PostID { return bigIDs + p }

func materialise(seq uint64, floor int64, posts ...domain.PostID) inbox.Item {
	return inbox.Item{Recipient: alice, Seq: seq, Op: inbox.OpMaterialise, Posts: posts, Floor: floor}
}

func push(seq uint64, post domain.PostID) inbox.Item {
	return inbox.Item{Recipient: alice, Seq: seq, Op: inbox.OpPush, Posts: ids(post)}
}

func remove(seq uint64, post domain.PostID) inbox.Item {
	return inbox.Item{Recipient: alice, Seq: seq, Op: inbox.OpRemove, Posts: ids(post)}
}

func merge(seq uint64, floor int64, posts ...domain.PostID) inbox.Item {
	return inbox.Item{Recipient: alice, Seq: seq, Op: inbox.OpMerge, Posts: posts, Floor: floor}
}

func unmerge(seq uint64, floor int64, posts ...domain.PostID) inbox.Item {
	return inbox.Item{Recipient: alice, Seq: seq, Op: inbox.OpUnmerge, Posts: posts, Floor: floor}
}

// inboxState is what inbox.ReadAll reports.
type inboxState struct {
	posts []domain.PostID
	floor int64
	seq   uint64
	ok    bool
}

func readInbox(t *testing.T, s *feeds.Store, user domain.UserID) inboxState {
	t.Helper()
	posts, floor, seq, ok, err := inbox.ReadAll(t.Context(), s, user)
	require.NoError(t, err)
	return inboxState{posts, floor, seq, ok}
}

// checkSegments checks the layout of user's inbox behind the store's back
// (see apply.lua): every segment compact and of at most most posts, each
// newer than the ones below it, the head's bound between them, the count of
// the posts below the head, and every segment outliving the meta; the posts
// in the meta only if they are the one segment 0, at most S of them.
func checkSegments(t *testing.T, rdb *redis.Client, user domain.UserID, size, limit int, msgAndArgs ...any) {
	t.Helper()
	size = min(size, limit)
	most := min(2*size, limit)
	ctx := t.Context()
	meta := "feed:v1:{" + strconv.Itoa(int(user)) + "}:iy"
	sc, err := rdb.ZMScore(ctx, meta, "f", "b").Result()
	require.NoError(t, err)
	special := func(v float64) int64 { return -int64(v) - 1 }
	lay, err := rdb.ZRangeArgs(ctx, redis.ZRangeArgs{Key: meta, Start: "0", Stop: "0", ByScore: true}).Result()
	require.NoError(t, err)
	if len(lay) == 0 {
		n, err := rdb.Exists(ctx, meta).Result()
		require.NoError(t, err)
		require.Zero(t, n, "a meta without a layout: %v", msgAndArgs)
		return // no inbox
	}
	require.Len(t, lay, 1, msgAndArgs...)
	gen, head, tail, below, ok := inbox.Layout(lay[0])
	require.True(t, ok, "layout %q: %v", lay[0], msgAndArgs)
	n, err := rdb.ZCard(ctx, meta).Result()
	require.NoError(t, err)
	inMeta, err := rdb.ZCount(ctx, meta, "(0", "+inf").Result()
	require.NoError(t, err)
	marked, err := rdb.ZScore(ctx, meta, "m").Result()
	if errors.Is(err, redis.Nil) {
		require.Positive(t, head, "a small inbox without its mark: %v", msgAndArgs)
		require.Equal(t, n-4, inMeta, "the meta holds f, s, b, the layout and its posts: %v", msgAndArgs)
	} else {
		require.NoError(t, err)
		require.Equal(t, int64(-(1<<53 + 2)), int64(marked), "the mark's score: %v", msgAndArgs)
		require.Zero(t, head, "a segmented inbox with the mark: %v", msgAndArgs)
		require.Equal(t, n-5, inMeta, "the meta holds m, f, s, b, the layout and its posts: %v", msgAndArgs)
	}
	if head == 0 {
		require.Zero(t, tail, "a small inbox has the one segment 0: %v", msgAndArgs)
		require.Equal(t, special(sc[0]), special(sc[1]), "a small inbox's bound is its floor: %v", msgAndArgs)
		require.LessOrEqual(t, inMeta, int64(size), "a small inbox holds at most S posts: %v", msgAndArgs)
	} else {
		require.Zero(t, inMeta, "a segmented inbox's meta holds no posts: %v", msgAndArgs)
		require.Positive(t, tail, "segment 0 is a small inbox's alone: %v", msgAndArgs)
	}
	floor, bound := special(sc[0]), special(sc[1])
	require.LessOrEqual(t, tail, head, msgAndArgs...)
	require.LessOrEqual(t, floor, bound, msgAndArgs...)
	metaTTL, err := rdb.PTTL(ctx, meta).Result()
	require.NoError(t, err)
	newestBelow, counted, total := int64(0), int64(0), 0
	for k := tail; k <= head; k++ {
		key := fmt.Sprintf("%s:%s:%d", meta, gen, k)
		var ms []string
		if k == 0 {
			key = meta
			ms, err = rdb.ZRangeArgs(ctx, redis.ZRangeArgs{Key: key, Start: "(0", Stop: "+inf", ByScore: true}).Result()
		} else {
			ms, err = rdb.ZRange(ctx, key, 0, -1).Result()
		}
		require.NoError(t, err)
		if len(ms) == 0 {
			require.True(t, k > tail || tail == head, "tail segment %d missing: %v", k, msgAndArgs)
			continue
		}
		require.LessOrEqual(t, len(ms), most, "segment %d: %v", k, msgAndArgs)
		enc, err := rdb.ObjectEncoding(ctx, key).Result()
		require.NoError(t, err)
		require.Equal(t, "listpack", enc, "segment %d: %v", k, msgAndArgs)
		if k > 0 {
			ttl, err := rdb.PTTL(ctx, key).Result()
			require.NoError(t, err)
			require.GreaterOrEqual(t, ttl, metaTTL, "segment %d: %v", k, msgAndArgs)
		}
		newest, _ := strconv.ParseInt(ms[0], 10, 64)
		oldest, _ := strconv.ParseInt(ms[len(ms)-1], 10, 64)
		require.Greater(t, oldest, newestBelow, "segment %d overlaps the ones below: %v", k, msgAndArgs)
		require.GreaterOrEqual(t, oldest, floor, "segment %d: %v", k, msgAndArgs)
		if k == head {
			require.GreaterOrEqual(t, oldest, bound, "head: %v", msgAndArgs)
		} else {
			require.Less(t, newest, bound, "segment %d: %v", k, msgAndArgs)
			counted += int64(len(ms))
		}
		newestBelow = newest
		total += len(ms)
	}
	require.Equal(t, counted, below, "posts below the head: %v", msgAndArgs)
	require.LessOrEqual(t, total, limit+size, "an inbox holds at most its cap and a segment's worth: %v", msgAndArgs)
}

// maxSeq is the highest log sequence an inbox takes (its "s" is scored
// 2seq-2^54, below "m", in apply.lua).
const maxSeq = 1<<52 - 2

// bigIDs is where the post ids of tests that want them above every sequence
// start (real ids are 49-bit and more).
const bigIDs = 1 << 40

// newModelStore is newStore for a test against a model: Redis keeps zsets of
// up to listpack entries compact (as deployed: the cap and a few), and the
// test's random numbers come from a seed it logs.
func newModelStore(t *testing.T, cfg feeds.Config, listpack int) (*feeds.Store, *redis.Client, *rand.Rand) {
	t.Helper()
	s, rdb := newStore(t, cfg)
	require.NoError(t, rdb.ConfigSet(t.Context(), "zset-max-listpack-entries", strconv.Itoa(listpack)).Err())
	return s, rdb, seededRand(t, "")
}

// seededRand is a source of random numbers from a new seed, which it logs
// (after what, if any) so that a failure can be replayed.
func seededRand(t *testing.T, what string) *rand.Rand {
	t.Helper()
	seed := rand.Uint64()
	if what != "" {
		t.Logf("%s: seed %d", what, seed)
	} else {
		t.Logf("seed %d", seed)
	}
	return rand.New(rand.NewPCG(seed, 0))
}
