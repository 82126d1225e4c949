package activity_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/projections"
	"github.com/feedproject/feed/projections/activity"
)

// TestStaleLeaseHolderCannotMoveTheCheckpoint: an activity projector whose
// process lost its lease (epoch 10) to another (epoch 20) cannot write its
// next batch once the new holder has written; without the fence it would
// commit, as two instances' batches do.
func TestStaleLeaseHolderCannotMoveTheCheckpoint(t *testing.T) {
	ctx := context.Background()
	pool := activityDB(t, localstacktest.PostgresForTest(t), "fence")
	recs := records(post(p1, alice), follow(bob, alice), like(bob, p1), follow(carol, alice))
	stale := activity.NewProjector(pool, nil, activity.Config{})
	fresh := activity.NewProjector(pool, nil, activity.Config{})
	stale.Fence(10)
	fresh.Fence(20)
	require.NoError(t, stale.Apply(ctx, recs[:2]))
	_, err := fresh.Checkpoint(ctx)
	require.NoError(t, err)
	require.NoError(t, fresh.Apply(ctx, recs[2:3]))

	_, err = stale.Checkpoint(ctx)
	require.NoError(t, err)
	err = stale.Apply(ctx, recs[3:])
	require.ErrorIs(t, err, projections.ErrFenced)
	cp, err := fresh.Checkpoint(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(3), cp, "the stale batch did not move the checkpoint")
	require.NoError(t, fresh.Apply(ctx, recs[3:]), "the holder goes on")
}
