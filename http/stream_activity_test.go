package http

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/projections/activity"
	"github.com/feedproject/feed/projections/activity/activitytest"
)

// TestStreamAnnouncesActivity: viewers whose streams drop at random and
// resume with Last-Event-ID get, as activity events, the items that others'
// follows, likes and comments make for them, each once and in log order:
// every item a viewer holds at the end that was made after it first
// connected was announced, and every item announced was made, for that
// viewer, by the event whose position is its id.
func TestStreamAnnouncesActivity(t *testing.T) {
	a, store := activityAppAndStore(t)
	reg := prometheus.NewRegistry()
	quiet := slog.New(slog.DiscardHandler)
	streams := NewStreams(StreamDeps{Log: a.log, Activity: NewStreamActivity(store, 10*time.Second, quiet), Registerer: reg, Logger: quiet},
		// The workload's events are dated from activitytest.T0: a window
		// reaching back to it, so that resumptions resume, never reset.
		StreamConfig{Ping: 20 * time.Millisecond, Window: time.Since(activitytest.T0) + time.Hour})
	addr := runStreams(t, NewServer(Deps{Logger: quiet, Registerer: reg, Gatherer: reg, Log: a.log, Auth: a.auth, Activity: store, Streams: streams}, Config{}), streams)

	viewers := make([]*streamViewer, activitytest.Users)
	for i := range viewers {
		u := domain.UserID(i + 1)
		viewers[i] = &streamViewer{user: u, token: a.token(t, u), rng: rand.New(rand.NewPCG(uint64(i), 3)), authors: map[string]string{}}
	}
	ctx := context.Background()
	require.NoError(t, activitytest.AppendWorkload(ctx, a.log, 100, 1)) // history before anyone connects
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, v := range viewers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				v.session(addr, 0)
			}
		})
	}
	time.Sleep(200 * time.Millisecond) // the viewers connect
	require.NoError(t, activitytest.AppendWorkload(ctx, a.log, 700, 2))
	close(stop)
	wg.Wait()
	head, err := a.log.Head(ctx)
	require.NoError(t, err)
	for _, v := range viewers {
		for attempt := 0; v.last != events.Position(head) && !v.session(addr, head); attempt++ {
			require.Less(t, attempt, 5, "viewer %d did not reach the head %d from %s: %v", v.user, head, v.last, v.errs)
		}
	}

	// What the model made for each user, event by event.
	model := activitytest.NewModel()
	made := map[domain.UserID]map[string]bool{}
	for _, rec := range a.records(t) {
		model.Apply(rec)
		for _, v := range viewers {
			for _, it := range model.Activity(v.user) {
				if it.ID == rec.Seq {
					if made[v.user] == nil {
						made[v.user] = map[string]bool{}
					}
					made[v.user][events.Position(rec.Seq)] = true
				}
			}
		}
	}
	total := 0
	for _, v := range viewers {
		var held []activity.Item
		for after := (*domain.Cursor)(nil); ; {
			page, err := store.Page(ctx, v.user, after)
			require.NoError(t, err)
			held = append(held, page.Items...)
			if !page.HasMore {
				break
			}
			after = page.Next
		}
		require.Equal(t, activitytest.Describe(model.Activity(v.user)), activitytest.Describe(held), "user %d's activity is the model's", v.user)
		assert.Empty(t, v.errs, "viewer %d", v.user)
		var got []string
		for _, e := range v.got {
			require.NotEqual(t, "reset", e.event, "viewer %d", v.user)
			if e.event == "activity" {
				require.Equal(t, e.id, e.key, "an activity event's id is its item's")
				got = append(got, e.id)
			}
		}
		for i, id := range got {
			assert.True(t, made[v.user][id], "viewer %d was announced item %s, which no event made for it", v.user, id)
			if i > 0 {
				prev, _ := strconv.ParseUint(got[i-1], 10, 64)
				cur, _ := strconv.ParseUint(id, 10, 64)
				assert.Less(t, prev, cur, "viewer %d's activity events in log order, once each", v.user)
			}
		}
		for _, it := range model.Activity(v.user) {
			if it.ID > v.start {
				assert.Contains(t, got, events.Position(it.ID), "viewer %d holds item %d, made after it connected at %d: announced", v.user, it.ID, v.start)
				total++
			}
		}
	}
	assert.Greater(t, total, 50, "the run made enough items to mean something")
	t.Logf("%d items announced and still held at the end, over %d viewers", total, len(viewers))
}

// likesSeen counts the likes the streams asked the activity about.
type likesSeen struct {
	mu    sync.Mutex
	posts []domain.PostID
}

func (l *likesSeen) ActivityItems(_ context.Context, rec events.Record, _ func(domain.UserID) bool) ([]ActivityItem, error) {
	if e, ok := rec.Event.(events.PostLiked); ok {
		l.mu.Lock()
		l.posts = append(l.posts, e.PostID)
		l.mu.Unlock()
	}
	return nil, nil
}

// TestStreamsAskTheActivityOnlyOfConnectedAuthorsLikes: the activity (a
// wait for its projection and a query) is asked about a like only when the
// liked post's author may be connected: by the author's stream as it writes
// it, or by the reader of the log for a post whose author it does not know.
func TestStreamsAskTheActivityOnlyOfConnectedAuthorsLikes(t *testing.T) {
	r := &streamRig{log: openTestLog(t, localstacktest.NATSForTest(t).ClientURL())}
	var err error
	r.auth, err = NewAuthenticator(testSecret, nil)
	require.NoError(t, err)
	r.ids, err = domain.NewIDGenerator(3)
	require.NoError(t, err)
	seen := &likesSeen{}
	reg := prometheus.NewRegistry()
	quiet := slog.New(slog.DiscardHandler)
	r.streams = NewStreams(StreamDeps{Log: r.log, Activity: seen, Registerer: reg, Logger: quiet}, StreamConfig{Ping: 20 * time.Millisecond})
	r.addr = runStreams(t, NewServer(Deps{Logger: quiet, Registerer: reg, Gatherer: reg, Log: r.log, Auth: r.auth, IDs: r.ids, Streams: r.streams}, Config{}), r.streams)

	connected, other := domain.UserID(2), domain.UserID(1)
	c := openStream(t, r.addr, r.token(t, connected), "", false)
	c.next(t, 5*time.Second) // the first ping: the stream is there
	require.Eventually(t, func() bool { return r.streams.joined(connected) }, 5*time.Second, 5*time.Millisecond)
	before, err := r.log.Head(context.Background())
	require.NoError(t, err)
	theirs, _ := r.newPost(t, other, "not connected")
	mine, _ := r.newPost(t, connected, "connected")
	unknown := domain.PostID(12345)
	for _, p := range []domain.PostID{theirs, mine, unknown} {
		r.append(t, time.Now(), events.PostLiked{PostID: p, UserID: 3})
	}
	head, err := r.log.Head(context.Background())
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		r.streams.mu.Lock()
		defer r.streams.mu.Unlock()
		return r.streams.last >= head
	}, 5*time.Second, 5*time.Millisecond)
	// The connected author's stream asks as it writes.
	require.Eventually(t, func() bool {
		seen.mu.Lock()
		defer seen.mu.Unlock()
		return len(seen.posts) >= 2
	}, 5*time.Second, 5*time.Millisecond)
	seen.mu.Lock()
	assert.ElementsMatch(t, []domain.PostID{mine, unknown}, seen.posts)
	seen.posts = nil
	seen.mu.Unlock()

	// A stream resumed from before the likes replays them, and asks the same.
	resumed := openStream(t, r.addr, r.token(t, connected), events.Position(before), false)
	for {
		m := resumed.next(t, 5*time.Second)
		if pos, _ := strconv.ParseUint(m.id, 10, 64); pos >= head {
			break
		}
	}
	seen.mu.Lock()
	defer seen.mu.Unlock()
	assert.ElementsMatch(t, []domain.PostID{mine, unknown}, seen.posts, "the replay's")
}
