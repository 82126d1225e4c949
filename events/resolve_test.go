package events_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
)

func envelope(t *testing.T, id string, ev events.Event) events.Envelope {
	t.Helper()
	env, err := events.NewEnvelope(id, at, ev)
	require.NoError(t, err)
	return env
}

// An append whose answer was lost is looked for before the client is answered:
// found, it is the first answer; not stored, it is stored now; a conditional one
// another event overtook is a conflict, never a second copy.
func TestResolveAnAppendWhoseAnswerWasLost(t *testing.T) {
	ctx := context.Background()
	log, _, _ := openLog(t, events.Config{})
	follow := events.UserFollowed{FollowerID: 1, FolloweeID: 2}

	stored, err := log.AppendEvent(ctx, "f1", at, follow)
	require.NoError(t, err)
	got, err := log.Resolve(ctx, envelope(t, "f1", follow), follow.Subject(), nil)
	require.NoError(t, err)
	assert.Equal(t, events.Appended{Seq: stored.Seq, Duplicate: true}, got, "a stored append is found where it is")

	got, err = log.Resolve(ctx, envelope(t, "f2", follow), follow.Subject(), nil)
	require.NoError(t, err)
	assert.Equal(t, stored.Seq+1, got.Seq, "an append that never arrived is stored now")
	head, err := log.Head(ctx)
	require.NoError(t, err)
	assert.Equal(t, stored.Seq+1, head, "and stored once")

	created := events.PostCreated{PostID: 7, UserID: 1, CreatedAt: at, Media: []events.Media{{Key: "k"}}}
	post, err := log.AppendEvent(ctx, "p7", at, created, events.ExpectSubjectSeq(0))
	require.NoError(t, err)
	edit := events.PostEdited{PostID: 7, UserID: 1, Caption: "a", EditedAt: at}
	first, err := log.AppendEvent(ctx, "e1", at, edit, events.ExpectSubjectSeq(post.Seq))
	require.NoError(t, err)
	got, err = log.Resolve(ctx, envelope(t, "e1", edit), edit.Subject(), &post.Seq)
	require.NoError(t, err)
	assert.Equal(t, first.Seq, got.Seq, "a stored conditional append is found as the subject's next event")

	_, err = log.Resolve(ctx, envelope(t, "e2", edit), edit.Subject(), &post.Seq)
	assert.ErrorIs(t, err, domain.ErrConflict, "another event took the expected place: never stored")

	got, err = log.Resolve(ctx, envelope(t, "e3", edit), edit.Subject(), &first.Seq)
	require.NoError(t, err)
	assert.Equal(t, first.Seq+1, got.Seq, "a conditional append that never arrived is stored now")
}

// While the log cannot be reached, an append whose outcome is unknown is
// answered as such once the resolve time has passed, not as unavailable.
func TestResolveGivesUpAsUnknown(t *testing.T) {
	ctx := context.Background()
	ns := natsForTest(t)
	log, err := events.OpenLog(ctx, ns.js, events.Config{ResolveTimeout: 500 * time.Millisecond}, nil)
	require.NoError(t, err)
	t.Cleanup(log.Close)
	ns.server.Shutdown()

	follow := events.UserFollowed{FollowerID: 1, FolloweeID: 2}
	start := time.Now()
	_, err = log.Resolve(ctx, envelope(t, "f1", follow), follow.Subject(), nil)
	assert.ErrorIs(t, err, domain.ErrOutcomeUnknown)
	assert.NotErrorIs(t, err, domain.ErrUnavailable, "a 503 would promise nothing was stored")
	assert.Less(t, time.Since(start), 3*time.Second)

	// A plain append while disconnected is never sent: that is a prompt 503.
	start = time.Now()
	_, err = log.AppendEvent(ctx, "f2", at, follow)
	assert.ErrorIs(t, err, domain.ErrUnavailable)
	assert.Less(t, time.Since(start), time.Second)
}
