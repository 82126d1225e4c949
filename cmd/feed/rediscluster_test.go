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

	"github.com/redis/go-redis/v9"
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

	// The follower's inbox is filled on its first read, which the read
	// model answers meanwhile.
	feedFromRedis(t, base, token(follower), last, posted)

	// Kill the master that holds the follower's feed, and wait for its
	// replica to take over.
	rdb := cluster.Client(t)
	slot, err := rdb.ClusterKeySlot(t.Context(), strconv.Itoa(follower)).Result()
	require.NoError(t, err)
	shards, err := rdb.ClusterShards(t.Context()).Result()
	require.NoError(t, err)
	master := -1
	for _, shard := range shards {
		for _, r := range shard.Slots {
			if r.Start > slot || slot > r.End {
				continue
			}
			for _, n := range shard.Nodes {
				if n.Role == "master" {
					master = slices.IndexFunc(cluster.Nodes, func(node *localstack.Redis) bool { return int64(node.Port()) == n.Port })
				}
			}
		}
	}
	require.GreaterOrEqual(t, master, 0, "no master serves slot %d: %+v", slot, shards)
	// Every write is on the replica first: replication is asynchronous, and
	// what a killed master had not sent is lost, which is not this test's
	// subject.
	m := redis.NewClient(&redis.Options{Addr: cluster.Nodes[master].Addr()})
	require.NoError(t, m.Wait(t.Context(), 1, 5*time.Second).Err())
	require.NoError(t, m.Close())
	killed := time.Now()
	cluster.Kill(master)
	// Until the nodes hold the master failed the cluster is still "ok": wait
	// for its replica to take over first.
	replica := redis.NewClient(&redis.Options{Addr: cluster.Nodes[master+3].Addr()})
	defer replica.Close()
	readyz := map[string]int{} // /readyz's answers meanwhile, counted
	notReady := 0
	require.Eventually(t, func() bool {
		status, body := get(t, base+"/readyz")
		readyz[fmt.Sprint(status, " ", body["checks"])]++
		if status == http.StatusServiceUnavailable {
			notReady++
		}
		role, err := replica.Do(t.Context(), "ROLE").Slice()
		return err == nil && role[0] == "master"
	}, 30*time.Second, 100*time.Millisecond, "master %d's replica did not take over", master)
	promoted := time.Since(killed)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	require.NoError(t, cluster.WaitHealthy(ctx))
	waitReady(t, base)
	t.Logf("master %d killed: its replica took over in %v, the service was ready in %v; /readyz meanwhile: %v",
		master, promoted.Round(time.Millisecond), time.Since(killed).Round(time.Millisecond), readyz)
	assert.Positive(t, notReady, "/readyz must say Redis is not ready while a master is down: %v", readyz)

	before := homePages(t, base, "postgres")
	id, pos := createPost(t, base, token(followees[0]))
	got, _ := homeFeed(t, base, token(follower), pos)
	assert.Equal(t, id, got[0], "the new post heads the follower's feed read at its position")
	posted = append(posted, id)
	assert.ElementsMatch(t, posted, got)
	// The first reads may still go to the dead master's address, and be
	// answered from the read model, until the client reloads the slots.
	t.Logf("after the failover, %v pages from the read model", homePages(t, base, "postgres")-before)
	feedFromRedis(t, base, token(follower), pos, posted)
}

// feedFromRedis waits until the token's user's home feed, read at position
// min and paged through, is posts, every page served from Redis.
func feedFromRedis(t *testing.T, base, tok string, min uint64, posts []string) {
	t.Helper()
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		before := homePages(c, base, "cache")
		got, pages := homeFeed(c, base, tok, min)
		require.ElementsMatch(c, posts, got, "the feed holds every post once")
		assert.Equal(c, pages, int(homePages(c, base, "cache")-before), "pages served from Redis of %d", pages)
		assert.Equal(c, (len(posts)+domain.PageSize-1)/domain.PageSize, pages, "pages")
	}, 20*time.Second, 100*time.Millisecond, "the home feed was not served from Redis")
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
func homeFeed(t require.TestingT, base, tok string, min uint64) (ids []string, pages int) {
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
func homePages(t require.TestingT, base, source string) float64 {
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
