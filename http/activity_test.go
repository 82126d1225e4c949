package http

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/migrations"
	"github.com/feedproject/feed/projections"
	"github.com/feedproject/feed/projections/activity"
	"github.com/feedproject/feed/projections/activity/activitytest"
	"github.com/feedproject/feed/projections/readmodel"
)

// activityApp is the real app serving GET /activity from an activity that a
// real projector keeps up with the app's log.
func activityApp(t *testing.T) *testApp {
	t.Helper()
	ctx := context.Background()
	a := newTestApp(t)
	pg := localstacktest.PostgresForTest(t)
	pool, err := readmodel.OpenPool(ctx, pg.URL(), migrations.ActivitySchema, 0)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	reg := prometheus.NewRegistry()
	a.srv = NewServer(Deps{
		Logger: slog.New(slog.DiscardHandler), Registerer: reg, Gatherer: reg,
		Log: a.log, Media: a.media, Auth: a.auth, Activity: activity.NewStore(pool),
	}, Config{ConsistencyWait: 10 * time.Second})
	runCtx, stop := context.WithCancel(ctx)
	r := projections.NewRunner(a.log, activity.NewProjector(pool, nil, activity.Config{}),
		projections.RunnerConfig{BatchSize: 64, FetchWait: 50 * time.Millisecond}, nil, slog.New(slog.DiscardHandler))
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		require.NoError(t, <-done)
	})
	return a
}

// activityPage gets one page of user's activity read at position min.
func (a *testApp) activityPage(t *testing.T, user domain.UserID, cursor string, min uint64) response {
	t.Helper()
	req := httptest.NewRequest("GET", "/activity?cursor="+url.QueryEscape(cursor), nil)
	req.Header.Set("Authorization", "Bearer "+a.token(t, user))
	req.Header.Set(headerMinPosition, events.Position(min))
	return a.do(t, req)
}

// describeJSON writes an answer's items as activitytest.Describe writes
// items, from the JSON alone.
func describeJSON(t *testing.T, items []any) []string {
	t.Helper()
	out := make([]string, 0, len(items))
	for _, v := range items {
		it := v.(map[string]any)
		created, err := time.Parse(time.RFC3339Nano, it["created_at"].(string))
		require.NoError(t, err)
		s := fmt.Sprintf("#%s %s by %s at %s", it["id"], it["type"], it["actor_id"], created.Format(time.RFC3339Nano))
		if p, ok := it["post_id"]; ok {
			s += fmt.Sprint(" post ", p)
		}
		if th, ok := it["thumbnail"].(map[string]any); ok {
			s += " thumb " + strings.TrimPrefix(th["url"].(string), mediaPath)
		}
		if c, ok := it["comment"].(map[string]any); ok {
			s += fmt.Sprintf(" comment %s %q", c["id"], c["text"])
		}
		out = append(out, s)
	}
	return out
}

// TestActivityMatchesTheModel runs a random workload through the log and
// the activity projector, then pages every user's GET /activity, read at
// the log's head, to the end: it is the reference model's activity, item
// for item, each page as the OpenAPI document describes it.
func TestActivityMatchesTheModel(t *testing.T) {
	ctx := context.Background()
	a := activityApp(t)
	schema := jsonSchema(t, loadOpenAPIDoc(t), "/activity", "200")
	require.NoError(t, activitytest.AppendWorkload(ctx, a.log, 3000, 9))
	head, err := a.log.Head(ctx)
	require.NoError(t, err)
	model := activitytest.NewModel()
	for _, rec := range a.records(t) {
		model.Apply(rec)
	}
	total := 0
	for u := domain.UserID(1); u <= activitytest.Users; u++ {
		var got []string
		cursor := ""
		for {
			resp := a.activityPage(t, u, cursor, head)
			require.Equal(t, 200, resp.status, "%s", resp.raw)
			assert.Equal(t, events.Position(head), resp.header.Get(headerPosition))
			var doc any
			require.NoError(t, json.Unmarshal(resp.raw, &doc))
			require.NoError(t, schema.VisitJSON(doc), "%s", resp.raw)
			items := resp.body["items"].([]any)
			got = append(got, describeJSON(t, items)...)
			if resp.body["has_more"] != true {
				assert.Nil(t, resp.body["next_cursor"])
				break
			}
			require.Len(t, items, domain.PageSize)
			cursor = resp.body["next_cursor"].(string)
		}
		want := activitytest.Describe(model.Activity(u))
		total += len(want)
		assert.Equal(t, strings.Join(want, "\n"), strings.Join(got, "\n"), "user %d", u)
	}
	require.Greater(t, total, 100)
}

func TestActivityRefusesBadRequests(t *testing.T) {
	a := activityApp(t)
	resp := a.activityPage(t, 1, "nonsense", 0)
	assert.Equal(t, 400, resp.status)
	assert.Equal(t, "invalid_input", resp.errorCode(), "%s", resp.raw)
	resp = a.do(t, httptest.NewRequest("GET", "/activity", nil))
	assert.Equal(t, 401, resp.status)

	// A user nobody did anything to has an empty list.
	resp = a.activityPage(t, 1, "", 0)
	require.Equal(t, 200, resp.status)
	assert.JSONEq(t, `{"items": [], "next_cursor": null, "has_more": false}`, string(resp.raw))
}
