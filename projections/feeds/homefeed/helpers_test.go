package homefeed_test

import (
	"testing"

	"github.com/redis/go-redis/v9"

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

// materialise makes alice's inbox the posts at or above floor.
func materialise(seq uint64, floor int64, posts ...domain.PostID) inbox.Item {
	return inbox.Item{Recipient: alice, Seq: seq, Op: inbox.OpMaterialise, Posts: posts, Floor: floor}
}

// push adds post to alice's inbox.
func push(seq uint64, post domain.PostID) inbox.Item {
	return inbox.Item{Recipient: alice, Seq: seq, Op: inbox.OpPush, Posts: ids(post)}
}
