package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/internal/stack"
	"github.com/feedproject/feed/cmd/localstack"
	"github.com/feedproject/feed/cmd/localstack/localstacktest"
)

// devEnv is a dev-mode environment on free loopback ports in dir.
func devEnv(dir string, ports devPorts) func(string) string {
	env := map[string]string{
		"FEED_DATA_DIR":          dir,
		"FEED_HTTP_ADDR":         "127.0.0.1:0",
		"FEED_NATS_PORT":         strconv.Itoa(ports.nats),
		"FEED_DEV_REDIS_PORT":    strconv.Itoa(ports.redis),
		"FEED_DEV_POSTGRES_PORT": strconv.Itoa(ports.postgres),
		"FEED_LOG_LEVEL":         "warn",
	}
	return func(k string) string { return env[k] }
}

type devPorts struct{ nats, redis, postgres int }

func freePort(t *testing.T) int {
	return freePorts(t, 1)[0]
}

// freePorts is n different free loopback ports.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	ports, err := localstack.FreePorts(n)
	require.NoError(t, err)
	return ports
}

// startDev runs `feed dev` in the background and returns its base URL and a stop
// function that interrupts it and returns run's error.
func startDev(t *testing.T, dir string, ports devPorts) (string, func() error) {
	t.Helper()
	return startRun(t, "dev", devEnv(dir, ports))
}

// startRun runs `feed <command>` (dev or serve) in the background and returns
// its base URL, the fixed FEED_HTTP_ADDR of env or else the one it prints, and
// a stop function that interrupts it and returns run's error.
func startRun(t *testing.T, command string, env func(string) string) (string, func() error) {
	t.Helper()
	base, stop, _ := startRunLogged(t, command, env)
	return base, stop
}

// startRunLogged is startRun that also returns the log the command writes;
// command may hold flags ("dev --cluster").
func startRunLogged(t *testing.T, command string, env func(string) string) (string, func() error, *localstacktest.SyncBuffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out, w := io.Pipe()
	stderr := &localstacktest.SyncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, strings.Fields(command), env, w, stderr)
		_ = w.Close()
	}()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("feed %s's log:\n%s", command, stderr)
		}
	})
	urls := make(chan string, 1)
	if addr := env("FEED_HTTP_ADDR"); addr != "" && !strings.HasSuffix(addr, ":0") {
		urls <- "http://" + addr
		go func() { _, _ = io.Copy(io.Discard, out) }()
	} else {
		go func() {
			re := regexp.MustCompile(`http://[0-9.:]+`)
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if u := re.FindString(sc.Text()); u != "" {
					urls <- u
				}
			}
		}()
	}
	var base string
	select {
	case base = <-urls:
	case err := <-done:
		cancel()
		t.Fatalf("feed %s exited before serving: %v", command, err)
	case <-time.After(60 * time.Second):
		cancel()
		t.Fatalf("feed %s did not start within 60s", command)
	}
	var once bool
	stop := func() error {
		if once {
			return nil
		}
		once = true
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(30 * time.Second):
			return fmt.Errorf("feed %s did not stop within 30s of the interrupt", command)
		}
	}
	t.Cleanup(func() { _ = stop() })
	return base, stop, stderr
}

// waitReady polls /readyz until it answers 200: the projectors start
// consuming a moment after the HTTP port opens, and readiness says so.
func waitReady(t *testing.T, base string) map[string]any {
	t.Helper()
	var body map[string]any
	require.Eventually(t, func() bool {
		resp, err := http.Head(base + "/healthz")
		if err != nil {
			return false // not listening yet
		}
		_ = resp.Body.Close()
		var status int
		status, body = get(t, base+"/readyz")
		return status == http.StatusOK
	}, 60*time.Second, 50*time.Millisecond, "readyz: %v", body)
	return body
}

func get(t *testing.T, url string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	var body map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	return resp.StatusCode, body
}

func TestDevModeRunsTheWholeStackAndRestartsWithItsData(t *testing.T) {
	dir, err := os.MkdirTemp("", "feed-dev-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755)) // the postgres user must reach its data dir

	p := freePorts(t, 3)
	ports := devPorts{nats: p[0], redis: p[1], postgres: p[2]}
	base, stop := startDev(t, dir, ports)
	body := waitReady(t, base)
	assert.Equal(t, map[string]any{"log": "ok", "redis": "ok", "postgres": "ok",
		"projector:readmodel": "ok", "projector:feeds": "ok", "projector:feeds-appliers": "ok", "projector:activity": "ok"}, body["checks"])
	status, _ := get(t, base+"/healthz")
	assert.Equal(t, http.StatusOK, status)

	resp, err := http.Get(base + "/metrics")
	require.NoError(t, err)
	metrics, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	assert.Contains(t, string(metrics), `feed_http_requests_total{method="GET",route="/readyz",status="200"} 1`)
	assert.Contains(t, string(metrics), "go_goroutines")

	// A command through the dev service, with a token from `feed token`.
	var tok strings.Builder
	require.NoError(t, run(context.Background(), []string{"token", "--user", "404"}, func(string) string { return "" }, &tok, io.Discard))
	req, err := http.NewRequest(http.MethodPost, base+"/users/501/follow", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(tok.String()))
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	var accepted map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&accepted))
	resp.Body.Close()
	assert.Equal(t, http.StatusAccepted, resp.StatusCode)
	assert.Equal(t, "1", accepted["position"])

	// Read your own write: the read waits for the read model projector.
	req, err = http.NewRequest(http.MethodGet, base+"/users/501/followers", nil)
	require.NoError(t, err)
	req.Header.Set("X-Min-Position", "1")
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	var followers map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&followers))
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "1", resp.Header.Get("X-Position"))
	assert.Equal(t, []any{"404"}, followers["users"])

	// The home feed, through the feed projector: 501 has not posted yet.
	req, err = http.NewRequest(http.MethodGet, base+"/feed", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(tok.String()))
	req.Header.Set("X-Min-Position", "1")
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	var home map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&home))
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, map[string]any{"posts": []any{}, "next_cursor": nil, "has_more": false}, home)

	status, body = get(t, base+"/no/such/route")
	assert.Equal(t, http.StatusNotFound, status)
	assert.Equal(t, "not_found", body["error"].(map[string]any)["code"])

	require.NoError(t, stop(), "Ctrl-C must exit cleanly")

	// Leave a mark in each store through a second run, then check a third sees
	// them all: a restart keeps the stream, Redis and Postgres data.
	ctx := context.Background()
	natsURL := fmt.Sprintf("nats://127.0.0.1:%d", ports.nats)
	pgURL := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/feed?sslmode=disable", ports.postgres)
	_, stop = startDev(t, dir, ports)
	nc, err := nats.Connect(natsURL) // the port the nats CLI uses
	require.NoError(t, err)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, err = js.Publish(ctx, "ev.1.follow.2", []byte(`{"id":"mark","type":"user.followed.v1","actor":"1","payload":{"follower_id":"1","followee_id":"2"}}`))
	require.NoError(t, err)
	nc.Close()
	rdb := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", ports.redis)})
	require.NoError(t, rdb.Set(ctx, "mark", "kept", 0).Err())
	require.NoError(t, rdb.Close())
	conn, err := pgx.Connect(ctx, pgURL)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "CREATE TABLE mark (v text); INSERT INTO mark VALUES ('kept')")
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))
	require.NoError(t, stop())

	base, stop = startDev(t, dir, ports)
	waitReady(t, base)
	nc, err = nats.Connect(natsURL)
	require.NoError(t, err)
	defer nc.Close()
	js, err = jetstream.New(nc)
	require.NoError(t, err)
	stream, err := js.Stream(ctx, "FEED_EVENTS")
	require.NoError(t, err)
	info, err := stream.Info(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, 2, info.State.Msgs, "the stream keeps its events")
	rdb = redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", ports.redis)})
	defer rdb.Close()
	v, err := rdb.Get(ctx, "mark").Result()
	require.NoError(t, err)
	assert.Equal(t, "kept", v, "redis keeps its data")
	conn, err = pgx.Connect(ctx, pgURL)
	require.NoError(t, err)
	require.NoError(t, conn.QueryRow(ctx, "SELECT v FROM mark").Scan(&v))
	assert.Equal(t, "kept", v, "postgres keeps its data")
	require.NoError(t, conn.Close(ctx))
	require.NoError(t, stop())

	// Nothing is left behind: the child servers and the embedded NATS are gone.
	for name, port := range map[string]int{"nats": ports.nats, "redis": ports.redis, "postgres": ports.postgres} {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
		if err == nil {
			c.Close()
			t.Errorf("%s still listens on %d after the service stopped", name, port)
		}
	}
}

func TestServeNeedsRedisAndPostgres(t *testing.T) {
	dir := t.TempDir()
	env := map[string]string{"FEED_DATA_DIR": dir, "FEED_NATS_PORT": "0", "FEED_HTTP_ADDR": "127.0.0.1:0"}
	err := run(context.Background(), []string{"serve"}, func(k string) string { return env[k] }, io.Discard, io.Discard)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "REDIS_URL and DATABASE_URL")
}

func TestBadConfigurationIsReportedWhole(t *testing.T) {
	env := map[string]string{"FEED_LOG_LEVEL": "loud", "FEED_ROLES": "api,chef", "FEED_DEDUP_WINDOW": "soon"}
	_, err := stack.Parse(func(k string) string { return env[k] })
	require.Error(t, err)
	for _, want := range []string{"FEED_LOG_LEVEL", `unknown role "chef"`, "FEED_DEDUP_WINDOW"} {
		assert.Contains(t, err.Error(), want)
	}
}

func TestUnknownSubcommand(t *testing.T) {
	var stderr strings.Builder
	err := run(context.Background(), []string{"fly"}, func(string) string { return "" }, io.Discard, &stderr)
	assert.ErrorIs(t, err, errUsage)
	assert.Contains(t, stderr.String(), "Usage:")
}
