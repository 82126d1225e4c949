package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/internal/stack"
	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	feedhttp "github.com/feedproject/feed/http"
	"github.com/feedproject/feed/migrations"
	"github.com/feedproject/feed/projections"
	"github.com/feedproject/feed/projections/feeds"
	"github.com/feedproject/feed/projections/feeds/fanout"
	"github.com/feedproject/feed/projections/readmodel"
)

// replayWorld is a stack with a log of posts and follows and nothing
// projected yet.
type replayWorld struct {
	stack *localstacktest.Stack
	env   func(string) string
	log   *events.Log
	rdb   *redis.Client
	posts int
}

func newReplayWorld(t *testing.T) *replayWorld {
	t.Helper()
	stack := localstacktest.ForTest(t)
	w := &replayWorld{stack: stack, env: stack.Env(map[string]string{"FEED_LOG_LEVEL": "warn"})}
	w.log, _ = openTestLog(t, stack.NATS.ClientURL())
	ids, err := domain.NewIDGenerator(1)
	require.NoError(t, err)
	for i := range 300 {
		var ev events.Event = events.UserFollowed{FollowerID: domain.UserID(i%7 + 1), FolloweeID: domain.UserID(i%5 + 10)}
		if i%2 == 0 {
			id, at := ids.Next(time.Now())
			ev = events.PostCreated{PostID: domain.PostID(id), UserID: domain.UserID(i%5 + 10), CreatedAt: at, Caption: "p",
				Media: []events.Media{{Key: fmt.Sprintf("%064d.png", id), ContentType: "image/png", Width: 1, Height: 1, Size: 1}}}
			w.posts++
		}
		_, err := w.log.AppendEvent(t.Context(), fmt.Sprintf("ev-%d", i), time.Now(), ev)
		require.NoError(t, err)
	}
	ropts, err := redis.ParseURL(stack.Redis.URL())
	require.NoError(t, err)
	w.rdb = redis.NewClient(ropts)
	t.Cleanup(func() { _ = w.rdb.Close() })
	return w
}

// rebuilt checks that both projectors were rebuilt from the whole log.
func (w *replayWorld) rebuilt(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	pg, err := readmodel.OpenPool(ctx, w.stack.Postgres.URL(), migrations.Schema, 0)
	require.NoError(t, err)
	defer pg.Close()
	var posts, position int
	require.NoError(t, pg.QueryRow(ctx, `SELECT (SELECT count(*) FROM posts), (SELECT position FROM projector_checkpoints)`).Scan(&posts, &position))
	assert.Equal(t, w.posts, posts, "the read model holds every post")
	assert.Equal(t, 300, position)
	store, err := feeds.NewStore(w.rdb, feeds.Config{}).Active(ctx)
	require.NoError(t, err)
	assert.Equal(t, int64(2), store.Version(), "the feeds switched to the rebuilt keyspace")
	pos, err := fanout.PlannerPosition(ctx, store)
	require.NoError(t, err)
	assert.Equal(t, uint64(300), pos)
	outboxes, err := store.Outboxes(ctx, []domain.UserID{10, 11, 12, 13, 14})
	require.NoError(t, err)
	n := 0
	for _, o := range outboxes {
		n += len(o.Posts)
	}
	assert.Equal(t, w.posts, n, "the outboxes hold every post")
}

func TestReplayCommandRebuildsWithAProgressBar(t *testing.T) {
	w := newReplayWorld(t)
	var out, errOut bytes.Buffer
	require.NoError(t, run(t.Context(), []string{"replay", "all", "--batch", "50"}, w.env, &out, &errOut), errOut.String())
	assert.Contains(t, out.String(), "readmodel: rebuilt and switched")
	assert.Contains(t, out.String(), "feeds: rebuilt and switched")
	assert.Contains(t, out.String(), "events/s", "the bar shows the rate")
	assert.Contains(t, out.String(), "100%")
	w.rebuilt(t)
}

func TestReplayCommandRefusesWhileAnotherRuns(t *testing.T) {
	w := newReplayWorld(t)
	held, err := readmodel.OpenRebuild(t.Context(), w.stack.Postgres.URL(), false, nil)
	require.NoError(t, err)
	defer held.Close()
	var out, errOut bytes.Buffer
	err = run(t.Context(), []string{"replay", "readmodel", "--quiet"}, w.env, &out, &errOut)
	require.ErrorIs(t, err, projections.ErrRebuildRunning)
	assert.Contains(t, err.Error(), "another rebuild of this projector is running")
	assert.Equal(t, 1, exitCode(err))

	err = run(t.Context(), []string{"replay", "everything"}, w.env, &out, &errOut)
	require.ErrorIs(t, err, errUsage)
	assert.Contains(t, err.Error(), `unknown projector "everything"`)
}

func TestAdminRebuildRoutes(t *testing.T) {
	w := newReplayWorld(t)
	ctx, cancel := context.WithCancel(t.Context())
	cfg, err := stack.Parse(w.env)
	require.NoError(t, err)
	log, js := openTestLog(t, w.stack.NATS.ClientURL())
	b := newRebuilder(ctx, cfg, log, w.stack.Postgres.URL(), w.rdb, js, slog.New(slog.DiscardHandler))
	t.Cleanup(func() {
		cancel()
		b.wait()
	})
	auth, err := feedhttp.NewAuthenticator(stack.DevJWTSecret, nil)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	srv := feedhttp.NewServer(feedhttp.Deps{Logger: slog.New(slog.DiscardHandler), Registerer: reg, Gatherer: reg,
		Log: log, Auth: auth, Rebuilds: b}, feedhttp.Config{})
	admin, err := auth.Mint(1, true, time.Now(), time.Hour)
	require.NoError(t, err)
	user, err := auth.Mint(2, false, time.Now(), time.Hour)
	require.NoError(t, err)
	call := func(method, path, token string) (int, map[string]any, http.Header) {
		req := httptest.NewRequest(method, path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := srv.App().Test(req, 10_000)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		var v map[string]any
		require.NoError(t, json.Unmarshal(body, &v), string(body))
		return resp.StatusCode, v, resp.Header
	}

	status, _, _ := call(http.MethodPost, "/admin/rebuild/all", "")
	assert.Equal(t, http.StatusUnauthorized, status)
	status, _, _ = call(http.MethodPost, "/admin/rebuild/all", user)
	assert.Equal(t, http.StatusForbidden, status, "admin routes need the admin role")
	status, _, _ = call(http.MethodPost, "/admin/rebuild/nothing", admin)
	assert.Equal(t, http.StatusBadRequest, status)
	status, _, _ = call(http.MethodPost, "/admin/rebuild/feeds?since=yesterday", admin)
	assert.Equal(t, http.StatusBadRequest, status)
	status, _, _ = call(http.MethodGet, "/admin/rebuild/feeds", admin)
	assert.Equal(t, http.StatusNotFound, status, "none started yet")

	// Another rebuild of the read model holds its lock: refused at once.
	held, err := readmodel.OpenRebuild(t.Context(), w.stack.Postgres.URL(), false, nil)
	require.NoError(t, err)
	status, body, _ := call(http.MethodPost, "/admin/rebuild/all", admin)
	assert.Equal(t, http.StatusConflict, status, "%v", body)
	held.Close()

	status, body, header := call(http.MethodPost, "/admin/rebuild/all", admin)
	require.Equal(t, http.StatusAccepted, status, "%v", body)
	assert.Equal(t, "/admin/rebuild/all", header.Get("Location"))
	assert.Len(t, body["rebuilds"], 3)
	for _, name := range []string{"readmodel", "feeds", "activity"} {
		var last map[string]any
		require.Eventually(t, func() bool {
			status, last, _ = call(http.MethodGet, "/admin/rebuild/"+name, admin)
			return status == http.StatusOK && last["state"] != feedhttp.RebuildRunning
		}, 60*time.Second, 20*time.Millisecond, "rebuild of %s did not finish", name)
		assert.Equal(t, feedhttp.RebuildDone, last["state"], "%v", last)
		assert.Equal(t, projections.PhaseDone, last["phase"])
		assert.Equal(t, "300", last["position"])
		assert.InDelta(t, 300, last["done"], 0)
	}
	w.rebuilt(t)
}
