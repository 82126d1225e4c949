package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"io"
	"mime/multipart"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack"
	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/domain"
	feedhttp "github.com/feedproject/feed/http"
)

// TestServeRunsOnARedisClusterThroughAFailover: `feed serve` with every role
// and REDIS_URL naming a Redis Cluster becomes ready, takes follows and
// posts, and serves a follower's paged home feed from Redis. Then the master
// holding the follower's feed is killed: once its replica has taken over, the
// service is ready again and a new post is in the follower's feed read at the
// post's position.
func TestServeRunsOnARedisClusterThroughAFailover(t *testing.T) {
	cluster := localstacktest.RedisClusterForTest(t)
	ns, pg := localstacktest.NATSForTest(t), localstacktest.PostgresForTest(t)
	const secret = "redis-cluster-test-secret-0123456789"
	base, _, serveLog := startRunLogged(t, "serve", envMap(map[string]string{
		"NATS_URL":        ns.ClientURL(),
		"REDIS_URL":       cluster.URL(),
		"DATABASE_URL":    pg.URL(),
		"FEED_JWT_SECRET": secret,
		"FEED_DATA_DIR":   t.TempDir(),
		"FEED_HTTP_ADDR":  fmt.Sprintf("127.0.0.1:%d", freePort(t)),
	}))
	ready := waitReady(t, base)
	assert.Equal(t, "ok", ready["checks"].(map[string]any)["redis"])
	assert.Contains(t, serveLog.String(), "no page cache on a Redis Cluster")

	auth, err := feedhttp.NewAuthenticator(secret, nil)
	require.NoError(t, err)
	token := func(u domain.UserID) string {
		tok, err := auth.Mint(u, false, time.Now(), time.Hour)
		require.NoError(t, err)
		return tok
	}
	const follower = 404
	followees := []domain.UserID{501, 502}
	for _, f := range followees {
		follow(t, base, token(follower), int(f))
	}
	var posted []string
	var last uint64
	for i := range domain.PageSize + 3 { // two pages
		var id string
		id, last = createPost(t, base, token(followees[i%2]))
		posted = append(posted, id)
	}

	// Every page from Redis: the follower's inbox is filled on its first
	// read, which the read model answers meanwhile.
	var pages, fromRedis float64
	require.Eventually(t, func() bool {
		before := homePages(t, base, "cache")
		var got []string
		got, pages = homeFeed(t, base, token(follower), last)
		fromRedis = homePages(t, base, "cache") - before
		require.ElementsMatch(t, posted, got, "the follower's feed holds every post once")
		return fromRedis == pages
	}, 20*time.Second, 100*time.Millisecond, "the home feed was not served from Redis")
	assert.EqualValues(t, 2, pages)

	// Kill the master that holds the follower's feed, and wait for its
	// replica to take over.
	rdb := cluster.Client(t)
	slot, err := rdb.ClusterKeySlot(t.Context(), strconv.Itoa(follower)).Result()
	require.NoError(t, err)
	slots, err := rdb.ClusterSlots(t.Context()).Result()
	require.NoError(t, err)
	master := -1
	for _, s := range slots {
		if int64(s.Start) <= slot && slot <= int64(s.End) {
			master = slices.IndexFunc(cluster.Nodes, func(n *localstack.Redis) bool { return n.Addr() == s.Nodes[0].Addr })
		}
	}
	require.GreaterOrEqual(t, master, 0, "no node serves slot %d: %v", slot, slots)
	killed := time.Now()
	cluster.Kill(master)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	require.NoError(t, cluster.WaitHealthy(ctx))
	healed := time.Since(killed)
	waitReady(t, base)
	t.Logf("master %d killed: the cluster healed in %v, the service was ready in %v", master, healed.Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))

	before := homePages(t, base, "cache")
	id, pos := createPost(t, base, token(followees[0]))
	got, _ := homeFeed(t, base, token(follower), pos)
	assert.Equal(t, id, got[0], "the new post heads the follower's feed read at its position")
	assert.ElementsMatch(t, append(posted, id), got)
	t.Logf("after the failover, %v of the feed's pages were served from Redis", homePages(t, base, "cache")-before)
}

// createPost posts one small PNG as the token's user and returns the post's
// id and position.
func createPost(t *testing.T, base, tok string) (string, uint64) {
	t.Helper()
	img := image.NewGray(image.Rect(0, 0, 2, 2))
	var body bytes.Buffer
	form := multipart.NewWriter(&body)
	w, err := form.CreateFormFile("images", "p.png")
	require.NoError(t, err)
	require.NoError(t, png.Encode(w, img))
	require.NoError(t, form.Close())
	req, err := http.NewRequest(http.MethodPost, base+"/posts", &body)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", form.FormDataContentType())
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusAccepted, resp.StatusCode, "%s", raw)
	var accepted struct{ ID, Position string }
	require.NoError(t, json.Unmarshal(raw, &accepted))
	pos, err := strconv.ParseUint(accepted.Position, 10, 64)
	require.NoError(t, err)
	return accepted.ID, pos
}

// homeFeed pages through the token's user's home feed read at position min,
// and returns its post ids and how many pages it took.
func homeFeed(t *testing.T, base, tok string, min uint64) (ids []string, pages float64) {
	t.Helper()
	cursor := ""
	for {
		req, err := http.NewRequest(http.MethodGet, base+"/feed?cursor="+cursor, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+tok)
		req.Header.Set("X-Min-Position", strconv.FormatUint(min, 10))
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		var page struct {
			Posts []struct {
				ID string `json:"id"`
			} `json:"posts"`
			NextCursor *string `json:"next_cursor"`
			HasMore    bool    `json:"has_more"`
		}
		raw, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, "GET /feed: %s", raw)
		require.NoError(t, json.Unmarshal(raw, &page))
		pages++
		for _, p := range page.Posts {
			ids = append(ids, p.ID)
		}
		if !page.HasMore {
			return ids, pages
		}
		require.NotNil(t, page.NextCursor)
		cursor = *page.NextCursor
	}
}

// homePages is feed_home_pages_total of source on /metrics.
func homePages(t *testing.T, base, source string) float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	text, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^feed_home_pages_total\{source="` + regexp.QuoteMeta(source) + `"\} (\S+)$`).FindSubmatch(text)
	if m == nil {
		return 0 // no such page served yet
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	require.NoError(t, err)
	return v
}
