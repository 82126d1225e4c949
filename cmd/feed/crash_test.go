package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	feedhttp "github.com/feedproject/feed/http"
	"github.com/feedproject/feed/migrations"
	"github.com/feedproject/feed/projections/readmodel"
)

// TestMain runs the tests; but started as `<test binary> serve` or `dev`, it
// is the feed command: the crash test kills such a process like a real one,
// and the bench starts the service as `<its binary> dev`.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && (os.Args[1] == "serve" || os.Args[1] == "dev" || os.Args[1] == "nats") {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr)
		stop()
		if err != nil {
			fmt.Fprintln(os.Stderr, "feed:", err)
			os.Exit(exitCode(err))
		}
		os.Exit(0)
	}
	os.Exit(localstacktest.RunTests(m))
}

// child is `feed serve` in a process of its own.
type child struct {
	cmd *exec.Cmd
	out *bytes.Buffer
}

func startChild(t *testing.T, env []string, base string) *child {
	t.Helper()
	c := &child{cmd: exec.Command(os.Args[0], "serve"), out: &bytes.Buffer{}}
	c.cmd.Env = append(os.Environ(), env...)
	c.cmd.Stdout, c.cmd.Stderr = c.out, c.out
	require.NoError(t, c.cmd.Start())
	t.Cleanup(func() {
		if c.cmd.ProcessState == nil {
			_ = c.cmd.Process.Kill()
			_ = c.cmd.Wait()
		}
	})
	require.Eventually(t, func() bool {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 60*time.Second, 50*time.Millisecond, "feed serve did not become ready: %s", c.out)
	return c
}

// TestNoAcknowledgedCommandIsLostWhenTheProcessIsKilled (the guarantee that
// no acknowledged command is lost, docs/architecture.md): commands stream in from several clients, the process is killed
// with SIGKILL mid-stream, and after a restart every command that was answered
// 202 is in the log at the position it was given, and in the read model.
func TestNoAcknowledgedCommandIsLostWhenTheProcessIsKilled(t *testing.T) {
	stack := localstacktest.ForTest(t)
	dir := t.TempDir()
	ports := freePorts(t, 2)
	httpPort, natsPort := ports[0], ports[1]
	base := fmt.Sprintf("http://127.0.0.1:%d", httpPort)
	const secret = "crash-test-secret-0123456789"
	env := []string{
		"FEED_DATA_DIR=" + dir,
		fmt.Sprintf("FEED_HTTP_ADDR=127.0.0.1:%d", httpPort),
		fmt.Sprintf("FEED_NATS_PORT=%d", natsPort),
		"FEED_JWT_SECRET=" + secret,
		"FEED_LOG_LEVEL=warn",
		"NATS_URL=",
		"REDIS_URL=" + stack.Redis.URL(),
		"DATABASE_URL=" + stack.Postgres.URL(),
	}
	first := startChild(t, env, base)

	auth, err := feedhttp.NewAuthenticator(secret, nil)
	require.NoError(t, err)
	type acked struct {
		follower, followee domain.UserID
		seq                uint64
	}
	var (
		mu   sync.Mutex
		acks []acked
		wg   sync.WaitGroup
	)
	client := &http.Client{Timeout: 5 * time.Second}
	for w := range 4 {
		follower := domain.UserID(1000 + w)
		tok, err := auth.Mint(follower, false, time.Now(), time.Hour)
		require.NoError(t, err)
		wg.Go(func() {
			for i := 0; ; i++ {
				followee := domain.UserID(100_000 + i)
				req, _ := http.NewRequest(http.MethodPost, fmt.Sprintf("%s/users/%d/follow", base, followee), nil)
				req.Header.Set("Authorization", "Bearer "+tok)
				resp, err := client.Do(req)
				if err != nil {
					return // the process is gone: this command's fate is unknown to the client
				}
				var body struct {
					Position string `json:"position"`
				}
				decodeErr := json.NewDecoder(resp.Body).Decode(&body)
				_ = resp.Body.Close()
				if resp.StatusCode != http.StatusAccepted || decodeErr != nil {
					return
				}
				var seq uint64
				if _, err := fmt.Sscan(body.Position, &seq); err != nil {
					return
				}
				mu.Lock()
				acks = append(acks, acked{follower, followee, seq})
				mu.Unlock()
			}
		})
	}
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(acks) >= 300
	}, 60*time.Second, 5*time.Millisecond, "commands were not acknowledged")
	require.NoError(t, first.cmd.Process.Signal(syscall.SIGKILL))
	_ = first.cmd.Wait()
	wg.Wait()
	t.Logf("%d commands acknowledged before the kill", len(acks))

	second := startChild(t, env, base)
	log, _ := openTestLog(t, fmt.Sprintf("nats://127.0.0.1:%d", natsPort))
	head, err := log.Head(t.Context())
	require.NoError(t, err)
	for _, a := range acks {
		require.LessOrEqual(t, a.seq, head, "an acknowledged position beyond the log's head")
		rec, err := log.Get(t.Context(), a.seq)
		require.NoError(t, err, "the event at %d", a.seq)
		assert.Equal(t, events.UserFollowed{FollowerID: a.follower, FolloweeID: a.followee}, rec.Event, "the event at %d", a.seq)
	}

	pg, err := readmodel.OpenPool(t.Context(), stack.Postgres.URL(), migrations.Schema, 0)
	require.NoError(t, err)
	defer pg.Close()
	store := readmodel.NewStore(pg)
	require.Eventually(t, func() bool {
		pos, err := store.Position(t.Context())
		return err == nil && pos >= head
	}, 60*time.Second, 20*time.Millisecond, "the read model did not catch up after the restart")
	for _, a := range acks {
		var n int
		require.NoError(t, pg.QueryRow(t.Context(), `SELECT count(*) FROM follows WHERE follower_id = $1 AND followee_id = $2`,
			int64(a.follower), int64(a.followee)).Scan(&n))
		assert.Equal(t, 1, n, "follow %d → %d (acknowledged at %d) is in the read model", a.follower, a.followee, a.seq)
	}

	require.NoError(t, second.cmd.Process.Signal(os.Interrupt))
	require.NoError(t, second.cmd.Wait(), "a clean stop after the restart: %s", second.out)
}
