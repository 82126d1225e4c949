package fanout_test

import (
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/projections/feeds"
	"github.com/feedproject/feed/projections/feeds/fanout"
)

func TestPlannerPosition(t *testing.T) {
	t.Parallel()
	rdb := redis.NewClient(&redis.Options{Addr: localstacktest.RedisForTest(t).Addr()})
	t.Cleanup(func() { _ = rdb.Close() })
	s := feeds.NewStore(rdb, feeds.Config{})
	ctx := t.Context()

	pos, err := fanout.PlannerPosition(ctx, s)
	require.NoError(t, err)
	assert.Zero(t, pos)
	require.NoError(t, fanout.SetPlannerPosition(ctx, s, 12345))
	pos, err = fanout.PlannerPosition(ctx, s)
	require.NoError(t, err)
	assert.Equal(t, uint64(12345), pos)
}
