package readmodel_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/projections/readmodel"
)

// TestKnowledgeGoesWithTheCheckpoint: a projector that remembers what its
// batches left the rows as must forget it when another instance has written
// since, even when its next batch starts after what the other applied (so
// that nothing in the batch itself was applied twice).
func TestKnowledgeGoesWithTheCheckpoint(t *testing.T) {
	ctx := context.Background()
	pool := pjDatabase(t, localstacktest.PostgresForTest(t), "known_checkpoint")
	const p1 = domain.PostID(1 << 30)
	recs := records(
		created(p1, 5),
		events.PostLiked{UserID: 6, PostID: p1},
		// Applied by the other instance only.
		events.PostDeleted{PostID: p1, UserID: 5, DeletedAt: t0},
		// No-ops on a deleted post.
		events.PostUnliked{UserID: 6, PostID: p1},
		events.PostLiked{UserID: 7, PostID: p1},
		events.CommentAdded{CommentID: 100, PostID: p1, UserID: 7, Text: "late", CreatedAt: t0},
	)
	remembers, other := readmodel.NewProjector(pool, nil), readmodel.NewProjector(pool, nil)
	readmodel.SetCatchUpBatch(remembers, 1)
	require.NoError(t, remembers.Apply(ctx, recs[:2]))
	require.NoError(t, other.Apply(ctx, recs[:3]))
	require.NoError(t, remembers.Apply(ctx, recs[3:]))

	assert.Equal(t, "[true 1 0]", pjQuery(t, pool, `SELECT deleted_at IS NOT NULL, like_count, comment_count FROM posts`))
	assert.Equal(t, "[1073741824 6]", pjQuery(t, pool, `SELECT post_id, user_id FROM likes`))
	assert.Empty(t, pjQuery(t, pool, `SELECT id FROM comments`))
}

// TestKnowledgeIsWholeOnlyFromAnEmptyReadModel: knowledge that starts at
// checkpoint 0 may take a row it does not hold to be absent only if the
// read model was found empty.
func TestKnowledgeIsWholeOnlyFromAnEmptyReadModel(t *testing.T) {
	ctx := context.Background()
	pool := pjDatabase(t, localstacktest.PostgresForTest(t), "known_whole")
	const p1 = domain.PostID(1 << 30)
	// Rows without a checkpoint: restored by hand, say.
	for _, q := range []string{
		`INSERT INTO posts (id, user_id, caption, created_at, like_count) VALUES (1073741824, 5, 'restored', now(), 1)`,
		`INSERT INTO likes (post_id, user_id) VALUES (1073741824, 6)`,
		`INSERT INTO follows (follower_id, followee_id, created_at) VALUES (1, 2, now())`,
	} {
		_, err := pool.Exec(ctx, q)
		require.NoError(t, err)
	}
	recs := records(
		events.UserFollowed{FollowerID: 3, FolloweeID: 4},
		events.PostUnliked{UserID: 6, PostID: p1},
		events.UserUnfollowed{FollowerID: 1, FolloweeID: 2},
	)
	p := readmodel.NewProjector(pool, nil)
	readmodel.SetCatchUpBatch(p, 1)
	require.NoError(t, p.Apply(ctx, recs[:1]))
	require.NoError(t, p.Apply(ctx, recs[1:]))

	assert.Equal(t, "[0]", pjQuery(t, pool, `SELECT like_count FROM posts`))
	assert.Empty(t, pjQuery(t, pool, `SELECT post_id FROM likes`))
	assert.Equal(t, "[3 4]", pjQuery(t, pool, `SELECT follower_id, followee_id FROM follows`))
}

// TestSendVoidsWhatFollowsAFailedBatch: a batch Send planned ahead, as if
// the batch before it would commit, must not take effect when that one
// fails; then both apply once the projector starts again.
func TestSendVoidsWhatFollowsAFailedBatch(t *testing.T) {
	ctx := context.Background()
	pool := pjDatabase(t, localstacktest.PostgresForTest(t), "send_void")
	const p1 = domain.PostID(1 << 30)
	recs := records(
		created(p1, 5),
		events.CommentAdded{CommentID: 100, PostID: p1, UserID: 6, Text: "first", CreatedAt: t0},
		// Batch a fails in bulk: a comment it takes to be new is there.
		events.CommentAdded{CommentID: 100, PostID: p1, UserID: 6, Text: "first", CreatedAt: t0},
		events.PostLiked{UserID: 6, PostID: p1},
		// Batch b is planned ahead of a's outcome.
		events.PostLiked{UserID: 7, PostID: p1},
	)
	p := readmodel.NewProjector(pool, nil)
	readmodel.SetCatchUpBatch(p, 1)
	require.NoError(t, <-p.Send(ctx, recs[:2]))
	a, b := p.Send(ctx, recs[2:4]), p.Send(ctx, recs[4:])
	require.Error(t, <-a)
	require.ErrorIs(t, <-b, readmodel.ErrBatchBefore)
	assert.Equal(t, "[0 1]", pjQuery(t, pool, `SELECT like_count, comment_count FROM posts`))
	assert.Equal(t, "[readmodel 2]", pjQuery(t, pool, `SELECT projector, position FROM projector_checkpoints`))

	// Started again (as the runner does, at its checkpoint), it applies them.
	cp, err := p.Checkpoint(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(2), cp)
	require.NoError(t, <-p.Send(ctx, recs[2:4]))
	require.NoError(t, <-p.Send(ctx, recs[4:]))
	assert.Equal(t, "[2 1]", pjQuery(t, pool, `SELECT like_count, comment_count FROM posts`))
}
