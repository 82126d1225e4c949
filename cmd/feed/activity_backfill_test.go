package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	feedhttp "github.com/feedproject/feed/http"
	"github.com/feedproject/feed/projections/activity/activitytest"
)

// TestActivityFillsFromTheWholeLogOfARunningService: a service runs
// without the activity role over a log that already holds thousands of
// events; started again with it, the activity fills from the log's first
// event while the rest serves, and then every user's GET /activity is the
// model's.
func TestActivityFillsFromTheWholeLogOfARunningService(t *testing.T) {
	stack := localstacktest.ForTest(t)
	const secret = "activity-backfill-secret-0123456789"
	env := func(roles string) func(string) string {
		return stack.Env(map[string]string{
			"FEED_ROLES":      roles,
			"FEED_JWT_SECRET": secret,
			"FEED_DATA_DIR":   t.TempDir(),
			"FEED_HTTP_ADDR":  fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		})
	}
	base, stop := startRun(t, "serve", env("api,readmodel,planner,appliers"))
	waitReady(t, base)
	log, _ := openTestLog(t, stack.NATS.ClientURL())
	require.NoError(t, activitytest.AppendWorkload(t.Context(), log, 3000, 11))
	head, err := log.Head(t.Context())
	require.NoError(t, err)
	status, body := get(t, base+"/readyz")
	require.Equal(t, http.StatusOK, status, "%v", body)
	require.NoError(t, stop())

	base, _ = startRun(t, "serve", env("api,readmodel,planner,appliers,activity"))
	waitReady(t, base)
	auth, err := feedhttp.NewAuthenticator(secret, nil)
	require.NoError(t, err)
	model := activitytest.NewModel()
	require.NoError(t, log.Read(t.Context(), events.ReadOptions{StopAtEnd: true}, func(rec events.Record) error {
		model.Apply(rec)
		return nil
	}))
	total := 0
	for u := domain.UserID(1); u <= activitytest.Users; u++ {
		tok, err := auth.Mint(u, false, time.Now(), time.Hour)
		require.NoError(t, err)
		var want, got []string
		for _, it := range model.Activity(u) {
			want = append(want, fmt.Sprintf("%d %s by %d", it.ID, it.Kind, it.Actor))
		}
		for cursor := ""; ; {
			page := activityPage(t, base, tok, cursor, head)
			for _, it := range page.Items {
				got = append(got, fmt.Sprintf("%s %s by %s", it.ID, it.Type, it.ActorID))
			}
			if !page.HasMore {
				break
			}
			cursor = *page.NextCursor
		}
		assert.Equal(t, want, got, "user %d's activity", u)
		total += len(want)
	}
	assert.Greater(t, total, 200, "the log made enough activity to mean something")
}

type activityPageBody struct {
	Items []struct {
		ID      string `json:"id"`
		Type    string `json:"type"`
		ActorID string `json:"actor_id"`
	} `json:"items"`
	NextCursor *string `json:"next_cursor"`
	HasMore    bool    `json:"has_more"`
}

// activityPage reads a page of the token's user's activity at position min,
// waiting while the activity fills.
func activityPage(t *testing.T, base, tok, cursor string, min uint64) activityPageBody {
	t.Helper()
	var page activityPageBody
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		req, err := http.NewRequest(http.MethodGet, base+"/activity?cursor="+url.QueryEscape(cursor), nil)
		require.NoError(c, err)
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("X-Min-Position", strconv.FormatUint(min, 10))
		resp, err := http.DefaultClient.Do(req)
		require.NoError(c, err)
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		require.NoError(c, err)
		require.Equal(c, http.StatusOK, resp.StatusCode, "%s", raw)
		pos, err := strconv.ParseUint(resp.Header.Get("X-Position"), 10, 64)
		require.NoError(c, err)
		require.GreaterOrEqual(c, pos, min, "the activity has filled")
		page = activityPageBody{}
		require.NoError(c, json.Unmarshal(raw, &page))
	}, 2*time.Minute, 200*time.Millisecond)
	return page
}
