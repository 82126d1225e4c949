package activity_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/projections"
	"github.com/feedproject/feed/projections/activity"
	"github.com/feedproject/feed/projections/activity/activitytest"
)

// TestSendVoidsWhatFollowsAFailedBatch: a batch sent while the one before it
// is under way must not take effect when that one fails, though it takes
// the checkpoint's lock the moment that one rolls back; the failed one then
// applies up to the event at fault, and both apply once the projector
// starts again past it.
func TestSendVoidsWhatFollowsAFailedBatch(t *testing.T) {
	ctx := context.Background()
	pool := activityDB(t, localstacktest.PostgresForTest(t), "send_void")
	bad := comment(7, carol, p1).(events.CommentAdded)
	bad.Text = "not UTF-8 \xff" // no Postgres text can hold it
	recs := records(post(p1, alice), follow(bob, alice), like(bob, p1), bad, like(carol, p1))
	p := activity.NewProjector(pool, nil, activity.Config{})
	require.NoError(t, <-p.Send(ctx, recs[:2]))
	a, b := p.Send(ctx, recs[2:4]), p.Send(ctx, recs[4:])
	var ee *projections.EventError
	require.ErrorAs(t, <-a, &ee)
	assert.Equal(t, uint64(4), ee.Seq)
	require.ErrorIs(t, <-b, activity.ErrBatchBefore)
	store := activity.NewStore(pool)
	pos, err := store.Position(ctx)
	require.NoError(t, err)
	assert.Equal(t, uint64(3), pos, "the batch after the failed one did not move the checkpoint")
	thumb := fmt.Sprint(" post ", p1, " thumb ", p1, "-0.jpg")
	assert.Equal(t, []string{"#3 like by 2 at " + at(3) + thumb, "#2 follow by 2 at " + at(2)},
		activitytest.Describe(all(t, store, alice)), "the failed batch applied up to the event at fault, the next none")

	// Started again (as the runner does, at its checkpoint), with the event
	// at fault dead-lettered, it applies the rest.
	cp, err := p.Checkpoint(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(3), cp)
	recs[3].Event = nil
	require.NoError(t, <-p.Send(ctx, recs[3:4]))
	require.NoError(t, <-p.Send(ctx, recs[4:]))
	assert.Equal(t, []string{"#5 like by 3 at " + at(5) + thumb, "#3 like by 2 at " + at(3) + thumb, "#2 follow by 2 at " + at(2)},
		activitytest.Describe(all(t, store, alice)))
}

// TestMemoryGoesWithTheCheckpoint: a batch planned from what the projector
// remembers of every row must be void when another instance has written
// since; started again, the projector reads the rows.
func TestMemoryGoesWithTheCheckpoint(t *testing.T) {
	ctx := context.Background()
	pool := activityDB(t, localstacktest.PostgresForTest(t), "memory_checkpoint")
	recs := records(post(p1, alice), like(bob, p1),
		// Applied by the other instance only.
		deletePost(p1, alice),
		// Nothing on a deleted post.
		like(carol, p1), comment(7, carol, p1))
	remembers, other := activity.NewProjector(pool, nil, activity.Config{}), activity.NewProjector(pool, nil, activity.Config{})
	activity.SetCatchUpBatch(remembers, 1)
	_, err := remembers.Checkpoint(ctx)
	require.NoError(t, err)
	require.NoError(t, <-remembers.Send(ctx, recs[:2]))
	require.NoError(t, other.Apply(ctx, recs[:3]))
	require.ErrorIs(t, <-remembers.Send(ctx, recs[2:]), activity.ErrBatchBefore)

	cp, err := remembers.Checkpoint(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(3), cp)
	require.NoError(t, <-remembers.Send(ctx, recs[3:]))
	assert.Empty(t, all(t, activity.NewStore(pool), alice))
}

// TestMemoryIsWholeOnlyFromAnEmptyActivity: a replay from checkpoint 0 may
// take a row it does not remember to be absent only if the activity was
// found empty.
func TestMemoryIsWholeOnlyFromAnEmptyActivity(t *testing.T) {
	ctx := context.Background()
	pool := activityDB(t, localstacktest.PostgresForTest(t), "memory_whole")
	// Rows without a checkpoint: restored by hand, say.
	for _, q := range []string{
		`INSERT INTO posts (id, user_id) VALUES (1073741824, 1)`,
		`INSERT INTO items (owner_id, id, actor_id, created_at) VALUES (1, 100, 2, now())`,
		`INSERT INTO items (owner_id, id, actor_id, post_id, created_at) VALUES (1, 101, 3, 1073741824, now())`,
	} {
		_, err := pool.Exec(ctx, q)
		require.NoError(t, err)
	}
	recs := records(follow(carol, bob), unfollow(bob, alice), unlike(carol, p1))
	p := activity.NewProjector(pool, nil, activity.Config{})
	activity.SetCatchUpBatch(p, 1)
	_, err := p.Checkpoint(ctx)
	require.NoError(t, err)
	require.NoError(t, <-p.Send(ctx, recs[:1]))
	require.NoError(t, <-p.Send(ctx, recs[1:]))
	assert.Empty(t, all(t, activity.NewStore(pool), alice), "the undos took the restored items away")
}

// TestSendAfterApplyStartsAfresh: a replay applies again with Apply the
// batches Send failed, then sends the next; that one follows what Apply
// applied, not the failed batch.
func TestSendAfterApplyStartsAfresh(t *testing.T) {
	ctx := context.Background()
	pool := activityDB(t, localstacktest.PostgresForTest(t), "send_after_apply")
	bad := comment(7, carol, p1).(events.CommentAdded)
	bad.Text = "not UTF-8 \xff"
	recs := records(post(p1, alice), bad, like(bob, p1), follow(carol, alice))
	p := activity.NewProjector(pool, nil, activity.Config{})
	a, b := p.Send(ctx, recs[:2]), p.Send(ctx, recs[2:3])
	require.Error(t, <-a)
	require.ErrorIs(t, <-b, activity.ErrBatchBefore)
	recs[1].Event = nil // as a replay does with the event at fault
	require.NoError(t, p.Apply(ctx, recs[:2]))
	require.NoError(t, p.Apply(ctx, recs[2:3]))
	require.NoError(t, <-p.Send(ctx, recs[3:]))
	assert.Len(t, all(t, activity.NewStore(pool), alice), 2)
}
