package readmodel_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/projections"
	"github.com/feedproject/feed/projections/readmodel"
)

// TestStaleLeaseHolderCannotMoveTheCheckpoint: a projector whose process
// lost its lease (epoch 10) to another (epoch 20) while it was paused
// cannot write its next batch once the new holder has written: the batch
// is refused whole, checkpoint and rows. Without the fence the stale batch
// would commit, as two instances' batches do.
func TestStaleLeaseHolderCannotMoveTheCheckpoint(t *testing.T) {
	ctx := context.Background()
	pool := pjDatabase(t, localstacktest.PostgresForTest(t), "fence")
	recs := records(created(1, 1), created(2, 1), created(3, 2), created(4, 2), created(5, 3), created(6, 3))
	stale, fresh := readmodel.NewProjector(pool, nil), readmodel.NewProjector(pool, nil)
	stale.Fence(10)
	fresh.Fence(20)

	_, err := stale.Checkpoint(ctx)
	require.NoError(t, err)
	require.NoError(t, stale.Apply(ctx, recs[:2]), "the holder of epoch 10 writes while it holds the lease")
	_, err = fresh.Checkpoint(ctx)
	require.NoError(t, err)
	require.NoError(t, fresh.Apply(ctx, recs[2:4]), "the new holder writes")

	err = stale.Apply(ctx, recs[4:])
	require.ErrorIs(t, err, projections.ErrFenced)
	assert.Equal(t, "fenced", projections.RewindCause(err))
	cp, err := fresh.Checkpoint(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(4), cp, "the stale batch did not move the checkpoint")
	ids, err := readmodel.AllPostIDs(ctx, readmodel.NewStore(pool))
	require.NoError(t, err)
	assert.Equal(t, []domain.PostID{1, 2, 3, 4}, ids, "nor wrote its rows")

	require.NoError(t, fresh.Apply(ctx, recs[4:]), "the holder goes on")
	cp, err = fresh.Checkpoint(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(6), cp)
}
