package main

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/internal/stack"
	"github.com/feedproject/feed/domain"
	feedhttp "github.com/feedproject/feed/http"
)

// TestDevClusterServesAndTakesMoreProcesses: `feed dev --cluster` starts a
// three-node JetStream cluster, a Redis Cluster of three masters and three
// replicas and Postgres, and is ready with every role; a post is in a
// follower's feed. A second `feed serve`, an api replica given only the
// settings dev wrote, is ready too and serves the post and its image, which
// the first replica stored. Started again on the same data directory, dev
// reuses the cluster: the same servers' ports, the post still in the feed.
func TestDevClusterServesAndTakesMoreProcesses(t *testing.T) {
	dir, err := os.MkdirTemp("", "feed-devcluster-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755)) // the postgres user must reach its data dir
	env := envMap(map[string]string{
		"FEED_DATA_DIR":          dir,
		"FEED_HTTP_ADDR":         "127.0.0.1:0",
		"FEED_NATS_PORT":         "0",
		"FEED_DEV_REDIS_PORT":    "0",
		"FEED_DEV_POSTGRES_PORT": "0",
		"FEED_LOG_LEVEL":         "warn",
	})
	base, stop, _ := startRunLogged(t, "dev --cluster", env)
	ready := waitReady(t, base)
	assert.Equal(t, map[string]any{"log": "ok", "redis": "ok", "postgres": "ok",
		"projector:readmodel": "ok", "projector:feeds": "ok", "projector:feeds-appliers": "ok", "projector:activity": "ok"}, ready["checks"])

	settings := clusterEnvFile(t, dir)
	assert.Len(t, strings.Split(settings["NATS_URL"], ","), 3, "NATS_URL names the three nodes")
	redisTarget, err := stack.ParseRedisURL(settings["REDIS_URL"])
	require.NoError(t, err)
	require.True(t, redisTarget.IsCluster(), "REDIS_URL names a cluster: %s", settings["REDIS_URL"])
	assert.Len(t, redisTarget.Cluster.Addrs, 6)
	assert.Equal(t, "3", settings["FEED_STREAM_REPLICAS"])
	assert.Equal(t, stack.MediaObjectStore, settings["FEED_MEDIA_STORE"])

	auth, err := feedhttp.NewAuthenticator(settings["FEED_JWT_SECRET"], nil)
	require.NoError(t, err)
	token := func(u domain.UserID) string {
		tok, err := auth.Mint(u, false, time.Now(), time.Hour)
		require.NoError(t, err)
		return tok
	}
	follow(t, base, token(1), 2)
	id, pos := createPost(t, base, token(2))
	feedFromRedis(t, base, token(1), pos, []string{id})

	// A second api replica, with the settings dev wrote and its own node id.
	second := map[string]string{
		"FEED_ROLES":     "api",
		"FEED_NODE_ID":   "1",
		"FEED_HTTP_ADDR": "127.0.0.1:" + strconv.Itoa(freePort(t)),
		"FEED_DATA_DIR":  t.TempDir(),
		"FEED_LOG_LEVEL": "warn",
	}
	for k, v := range settings {
		second[k] = v
	}
	base2, stop2, _ := startRunLogged(t, "serve", envMap(second))
	assert.Equal(t, map[string]any{"log": "ok", "redis": "ok", "postgres": "ok"}, waitReady(t, base2)["checks"])
	got, _ := homeFeed(t, base2, token(1), pos)
	assert.Equal(t, []string{id}, got, "the second replica serves the feed")
	status, body := getWithPosition(t, base2+"/posts/"+id, pos)
	require.Equal(t, http.StatusOK, status, "%v", body)
	media := body["media"].([]any)
	require.Len(t, media, 1)
	resp, err := http.Get(base2 + media[0].(map[string]any)["url"].(string))
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode, "the second replica serves the image the first stored")
	assert.Equal(t, "image/png", resp.Header.Get("Content-Type"))
	require.NoError(t, stop2())
	require.NoError(t, stop(), "Ctrl-C must exit cleanly")

	var ports clusterPorts
	raw, err := os.ReadFile(filepath.Join(dir, "cluster", "ports.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(raw, &ports))
	base, stop, _ = startRunLogged(t, "dev --cluster", env)
	waitReady(t, base)
	assert.Equal(t, settings, clusterEnvFile(t, dir), "a restart reuses the cluster's servers and ports")
	got, _ = homeFeed(t, base, token(1), pos)
	assert.Equal(t, []string{id}, got, "the post is kept across a restart")
	require.NoError(t, stop())
	for _, port := range append(append([]int{ports.Postgres}, ports.NATS...), ports.Redis...) {
		assert.False(t, listening(port), "port %d still taken after dev stopped", port)
	}
}

// clusterEnvFile reads the settings `feed dev --cluster` wrote in dir.
func clusterEnvFile(t *testing.T, dir string) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "cluster", "env"))
	require.NoError(t, err)
	out := map[string]string{}
	for line := range strings.Lines(string(raw)) {
		kv, ok := strings.CutPrefix(strings.TrimSpace(line), "export ")
		require.True(t, ok, "line %q", line)
		k, v, ok := strings.Cut(kv, "=")
		require.True(t, ok, "line %q", line)
		out[k] = strings.Trim(v, "'")
	}
	return out
}

// getWithPosition is GET url read at position min.
func getWithPosition(t *testing.T, url string, min uint64) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	req.Header.Set("X-Min-Position", strconv.FormatUint(min, 10))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var body map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	return resp.StatusCode, body
}

// listening reports whether a server listens on the loopback port.
func listening(port int) bool {
	c, err := (&net.Dialer{Timeout: time.Second}).Dial("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	c.Close()
	return true
}
