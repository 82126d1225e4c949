package events_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack"
	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
)

var at = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

// testNATS is an embedded server with a client connected the way the service
// connects (no publishes buffered while disconnected).
type testNATS struct {
	server *localstack.NATS
	js     jetstream.JetStream
}

func natsForTest(t *testing.T) testNATS {
	t.Helper()
	ns := localstacktest.NATSForTest(t)
	nc, err := nats.Connect(ns.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectBufSize(-1))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return testNATS{server: ns, js: js}
}

func openLog(t *testing.T, cfg events.Config) (*events.Log, jetstream.JetStream, *events.Metrics) {
	t.Helper()
	ns := natsForTest(t)
	metrics := events.NewMetrics(prometheus.NewRegistry())
	log, err := events.OpenLog(context.Background(), ns.js, cfg, metrics)
	require.NoError(t, err)
	t.Cleanup(log.Close)
	return log, ns.js, metrics
}

func TestOpenLogCreatesStreamIdempotently(t *testing.T) {
	ctx := context.Background()
	log, js, _ := openLog(t, events.Config{DedupWindow: 5 * time.Minute})

	s, err := js.Stream(ctx, "FEED_EVENTS")
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	assert.Equal(t, []string{"ev.>"}, info.Config.Subjects)
	assert.Equal(t, 5*time.Minute, info.Config.Duplicates)
	assert.Equal(t, jetstream.FileStorage, info.Config.Storage)
	assert.True(t, info.Config.AllowAtomicPublish)

	// A second start with a new window updates the stream and keeps its events.
	_, err = log.AppendEvent(ctx, "e1", at, events.UserFollowed{FollowerID: 1, FolloweeID: 2})
	require.NoError(t, err)
	_, err = events.OpenLog(ctx, js, events.Config{DedupWindow: time.Hour}, nil)
	require.NoError(t, err)
	info, err = s.Info(ctx)
	require.NoError(t, err)
	assert.Equal(t, time.Hour, info.Config.Duplicates)
	assert.EqualValues(t, 1, info.State.Msgs)
}

func TestAppendSameIDIsStoredOnce(t *testing.T) {
	ctx := context.Background()
	log, _, _ := openLog(t, events.Config{})
	ev := events.PostLiked{UserID: 7, PostID: 42}

	first, err := log.AppendEvent(ctx, "like-7-42", at, ev)
	require.NoError(t, err)
	second, err := log.AppendEvent(ctx, "like-7-42", at.Add(time.Second), ev)
	require.NoError(t, err)
	assert.False(t, first.Duplicate)
	assert.True(t, second.Duplicate)
	assert.Equal(t, first.Seq, second.Seq)

	head, err := log.Head(ctx)
	require.NoError(t, err)
	assert.Equal(t, first.Seq, head)

	var got []events.Record
	require.NoError(t, log.Read(ctx, events.ReadOptions{StopAtEnd: true}, func(r events.Record) error {
		got = append(got, r)
		return nil
	}))
	require.Len(t, got, 1)
	assert.Equal(t, "ev.7.like.42", got[0].Subject)
	assert.Equal(t, events.TypePostLiked, got[0].Type)
	assert.Equal(t, domain.UserID(7), got[0].Actor)
	assert.Equal(t, ev, got[0].Event)
}

func TestReaderSkipsAndCountsUnknownTypes(t *testing.T) {
	ctx := context.Background()
	log, js, metrics := openLog(t, events.Config{})

	_, err := log.AppendEvent(ctx, "a", at, events.UserFollowed{FollowerID: 1, FolloweeID: 2})
	require.NoError(t, err)
	// An event from a newer writer this build does not know.
	future, err := json.Marshal(map[string]any{
		"id": "b", "type": "post.teleported.v9", "occurred_at": at, "actor": "1",
		"payload": map[string]any{"post_id": "5", "to": "mars"},
	})
	require.NoError(t, err)
	_, err = js.Publish(ctx, "ev.1.post.5", future, jetstream.WithMsgID("b"))
	require.NoError(t, err)
	_, err = log.AppendEvent(ctx, "c", at, events.UserUnfollowed{FollowerID: 1, FolloweeID: 2})
	require.NoError(t, err)

	var types []string
	require.NoError(t, log.Read(ctx, events.ReadOptions{StopAtEnd: true}, func(r events.Record) error {
		types = append(types, r.Type)
		return nil
	}))
	assert.Equal(t, []string{events.TypeUserFollowed, events.TypeUserUnfollowed}, types)
	assert.InDelta(t, 1, metrics.UnknownTypes(), 0)

	// Tools that show everything (tail) can ask for unknown records too.
	var raw []string
	require.NoError(t, log.Read(ctx, events.ReadOptions{StopAtEnd: true, IncludeUnknown: true}, func(r events.Record) error {
		raw = append(raw, r.Type)
		return nil
	}))
	assert.Equal(t, []string{events.TypeUserFollowed, "post.teleported.v9", events.TypeUserUnfollowed}, raw)
}

func TestReadFiltersAndStopsAtEnd(t *testing.T) {
	ctx := context.Background()
	log, _, _ := openLog(t, events.Config{})

	// An empty log ends at once.
	require.NoError(t, log.Read(ctx, events.ReadOptions{StopAtEnd: true}, func(events.Record) error {
		t.Fatal("no record expected")
		return nil
	}))
	for i, ev := range []events.Event{
		events.UserFollowed{FollowerID: 1, FolloweeID: 2},
		events.PostLiked{UserID: 2, PostID: 9},
		events.UserFollowed{FollowerID: 3, FolloweeID: 1},
		events.PostLiked{UserID: 1, PostID: 9},
	} {
		_, err := log.AppendEvent(ctx, string(rune('a'+i)), at, ev)
		require.NoError(t, err)
	}
	collect := func(opts events.ReadOptions) []uint64 {
		opts.StopAtEnd = true
		var seqs []uint64
		require.NoError(t, log.Read(ctx, opts, func(r events.Record) error {
			seqs = append(seqs, r.Seq)
			return nil
		}))
		return seqs
	}
	assert.Equal(t, []uint64{1, 2, 3, 4}, collect(events.ReadOptions{}))
	assert.Equal(t, []uint64{1, 4}, collect(events.ReadOptions{Filters: []string{"ev.1.>"}}))
	assert.Equal(t, []uint64{1, 3}, collect(events.ReadOptions{Filters: []string{"ev.*.follow.>"}}))
	assert.Equal(t, []uint64{3, 4}, collect(events.ReadOptions{FromSeq: 3}))
	assert.Empty(t, collect(events.ReadOptions{Filters: []string{"ev.99.>"}}))
}

// TestReadsLeaveNoConsumerBehind: a stream holds at most 1 000 consumers
// by default, and readers that come and go (each resumed live stream is one)
// must not fill them: a read's consumer goes when the read ends, however it
// ends.
func TestReadsLeaveNoConsumerBehind(t *testing.T) {
	ctx := context.Background()
	log, js, _ := openLog(t, events.Config{})
	for i := range 3 {
		_, err := log.AppendEvent(ctx, fmt.Sprint("r", i), at, events.UserFollowed{FollowerID: 1, FolloweeID: domain.UserID(i + 2)})
		require.NoError(t, err)
	}
	stream, err := js.Stream(ctx, "FEED_EVENTS")
	require.NoError(t, err)
	consumers := func() int {
		info, err := stream.Info(ctx)
		require.NoError(t, err)
		return info.State.Consumers
	}
	before := consumers()
	stop := errors.New("stop")
	for range 20 {
		require.NoError(t, log.Read(ctx, events.ReadOptions{StopAtEnd: true}, func(events.Record) error { return nil }))
		require.ErrorIs(t, log.Read(ctx, events.ReadOptions{}, func(events.Record) error { return stop }), stop)
		cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		require.NoError(t, log.Read(cctx, events.ReadOptions{New: true}, func(events.Record) error { return nil }))
		cancel()
	}
	assert.Equal(t, before, consumers(), "consumers left by 60 reads")
}

func TestConditionalAppendAndLast(t *testing.T) {
	ctx := context.Background()
	log, _, _ := openLog(t, events.Config{})

	created := events.PostCreated{PostID: 10, UserID: 5, Caption: "hi", CreatedAt: at,
		Media: []events.Media{{Key: "k", ContentType: "image/png", Width: 1, Height: 1, Size: 67}}}
	first, err := log.AppendEvent(ctx, "p10", at, created, events.ExpectSubjectSeq(0))
	require.NoError(t, err)

	// The owner is found from the post's own events whoever asks.
	last, err := log.Last(ctx, events.PostSubjectAnyOwner(10))
	require.NoError(t, err)
	assert.Equal(t, first.Seq, last.Seq)
	assert.Equal(t, created, last.Event)
	_, err = log.Last(ctx, events.PostSubjectAnyOwner(11))
	assert.ErrorIs(t, err, domain.ErrNotFound)

	// Two writers that both saw the created event: one wins, the other conflicts.
	del := events.PostDeleted{PostID: 10, UserID: 5, DeletedAt: at}
	_, err = log.AppendEvent(ctx, "d1", at, del, events.ExpectSubjectSeq(first.Seq))
	require.NoError(t, err)
	_, err = log.AppendEvent(ctx, "d2", at, del, events.ExpectSubjectSeq(first.Seq))
	assert.ErrorIs(t, err, domain.ErrConflict)
}

func TestAppendWhenLogUnavailable(t *testing.T) {
	ctx := context.Background()
	ns := natsForTest(t)
	log, err := events.OpenLog(ctx, ns.js, events.Config{}, nil)
	require.NoError(t, err)
	t.Cleanup(log.Close)

	ns.server.Shutdown()
	// Once the client knows the server is gone, an append is never sent: a
	// prompt 503. (One sent before it knew has an unknown outcome: see
	// TestResolveGivesUpAsUnknown.)
	require.Eventually(t, func() bool { return !ns.js.Conn().IsConnected() }, 5*time.Second, 10*time.Millisecond)
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, err = log.AppendEvent(ctx, "x", at, events.UserFollowed{FollowerID: 1, FolloweeID: 2})
	assert.ErrorIs(t, err, domain.ErrUnavailable, "got %v", err)
	_, err = log.AppendEvent(ctx, "y", at, events.PostDeleted{PostID: 1, UserID: 2}, events.ExpectSubjectSeq(0))
	assert.ErrorIs(t, err, domain.ErrUnavailable, "got %v", err)
}

// TestCatalogueListsEveryType keeps docs/events.md true: every registered type is
// documented, and nothing documented is unknown.
func TestCatalogueListsEveryType(t *testing.T) {
	doc, err := os.ReadFile("../docs/events.md")
	require.NoError(t, err)
	reg := events.NewRegistry()
	for _, typ := range reg.Types() {
		assert.Contains(t, string(doc), "`"+typ+"`", "docs/events.md must document %s", typ)
	}
	for _, line := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(line, "### `") {
			typ := strings.Trim(strings.TrimPrefix(line, "### "), "`")
			assert.True(t, reg.Known(typ), "docs/events.md documents unknown type %s", typ)
		}
	}
}

func TestRegistryRoundTripsEveryType(t *testing.T) {
	reg := events.NewRegistry()
	all := []events.Event{
		events.PostCreated{PostID: 1, UserID: 2, Caption: "c", CreatedAt: at, Media: []events.Media{{Key: "k"}}},
		events.PostEdited{PostID: 1, UserID: 2, Caption: "d", EditedAt: at},
		events.PostDeleted{PostID: 1, UserID: 2, DeletedAt: at},
		events.UserFollowed{FollowerID: 2, FolloweeID: 3},
		events.UserUnfollowed{FollowerID: 2, FolloweeID: 3},
		events.PostLiked{UserID: 2, PostID: 1},
		events.PostUnliked{UserID: 2, PostID: 1},
		events.CommentAdded{CommentID: 9, PostID: 1, UserID: 2, Text: "t", CreatedAt: at},
	}
	require.Len(t, reg.Types(), len(all), "a type is missing from this test")
	for _, ev := range all {
		env, err := events.NewEnvelope("id", at, ev)
		require.NoError(t, err)
		data, err := json.Marshal(env)
		require.NoError(t, err)
		gotEnv, got, err := reg.Decode(data)
		require.NoError(t, err, ev.Type())
		assert.Equal(t, ev, got)
		assert.Equal(t, ev.Actor(), gotEnv.Actor)
		// Ids travel as JSON strings, as in the HTTP contract.
		assert.NotContains(t, string(env.Payload), `_id":2`, ev.Type())
	}
	_, _, err := reg.Decode([]byte(`{"id":"x","type":"nope.v1","payload":{}}`))
	assert.ErrorIs(t, err, events.ErrUnknownType)
	_, _, err = reg.Decode([]byte(`not json`))
	assert.Error(t, err)
}
