package fanout_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/projections"
	"github.com/feedproject/feed/projections/feeds"
	"github.com/feedproject/feed/projections/feeds/fanout"
)

// TestStalePlannerIsFenced: a planner whose process lost its lease (epoch
// 10) to another (epoch 20) publishes no work and moves no position once
// the new holder has moved it: not a batch under way when the new holder
// wrote, nor the next. Without the fence the stale planner would plan the
// events after the position as a second planner, in step with the first.
func TestStalePlannerIsFenced(t *testing.T) {
	t.Parallel()
	rig := newPlannerRig(t, feeds.Config{})
	ctx := t.Context()
	stale, fresh := rig.planner(t), rig.planner(t)
	stale.Fence(10)
	fresh.Fence(20)
	follow := func(seq uint64, follower, followee domain.UserID) []events.Record {
		return []events.Record{{Seq: seq, Event: events.UserFollowed{FollowerID: follower, FolloweeID: followee}}}
	}
	require.NoError(t, stale.Apply(ctx, follow(1, 1, 100)), "the holder of epoch 10 plans while it holds the lease")
	stream, err := rig.js.Stream(ctx, fanout.FanoutStream)
	require.NoError(t, err)
	published := func() uint64 {
		info, err := stream.Info(ctx)
		require.NoError(t, err)
		return info.State.LastSeq
	}

	// Paused inside a batch, after its first read, while the new holder
	// plans the next event: the stale batch publishes nothing.
	var before uint64
	stale.SetBeforePlan(func() {
		_, err := fresh.Checkpoint(ctx)
		require.NoError(t, err)
		require.NoError(t, fresh.Apply(ctx, follow(2, 2, 100)), "the new holder plans")
		before = published()
	})
	err = stale.Apply(ctx, follow(2, 2, 100))
	require.ErrorIs(t, err, projections.ErrFenced)
	assert.Equal(t, "fenced", projections.RewindCause(err))
	assert.Equal(t, before, published(), "the stale planner published work")
	stale.SetBeforePlan(nil)

	// Its next batch, from the position the new holder left: refused before
	// anything is written.
	_, err = stale.Checkpoint(ctx)
	require.NoError(t, err)
	err = stale.Apply(ctx, follow(3, 3, 100))
	require.ErrorIs(t, err, projections.ErrFenced)
	following, err := rig.store.Following(ctx, 3)
	require.NoError(t, err)
	assert.Empty(t, following, "the stale planner changed the graph")
	assert.Equal(t, before, published(), "the stale planner published work")
	pos, err := fanout.PlannerPosition(ctx, rig.store)
	require.NoError(t, err)
	assert.Equal(t, uint64(2), pos, "the stale planner moved the position")

	require.NoError(t, fresh.Apply(ctx, follow(3, 3, 100)), "the holder goes on")
	fenced, err := rig.raw.Get(ctx, rig.store.Keys().PlannerEpoch()).Uint64()
	require.NoError(t, err)
	assert.Equal(t, uint64(20), fenced)
}
