package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/migrations"
	"github.com/feedproject/feed/projections/readmodel"
)

// childPID is the process id of this process's child whose command line
// holds every one of words, or 0.
func childPID(t *testing.T, words ...string) int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	require.NoError(t, err)
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, not ')'.
		fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(fields) < 2 || fields[1] != strconv.Itoa(os.Getpid()) {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.ReplaceAll(string(cmdline), "\x00", " ")
		found := true
		for _, w := range words {
			found = found && strings.Contains(args, w)
		}
		if found {
			return pid
		}
	}
	return 0
}

// follow sends POST /users/{followee}/follow as the token's user until it is
// acknowledged (a 503 while a dependency restarts is retried), and returns
// its position.
func follow(t *testing.T, base, tok string, followee int) uint64 {
	t.Helper()
	var pos uint64
	require.Eventually(t, func() bool {
		req, err := http.NewRequest(http.MethodPost, fmt.Sprintf("%s/users/%d/follow", base, followee), nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var body struct {
			Position string `json:"position"`
		}
		if resp.StatusCode != http.StatusAccepted || json.NewDecoder(resp.Body).Decode(&body) != nil {
			return false
		}
		pos, err = strconv.ParseUint(body.Position, 10, 64)
		return err == nil
	}, 30*time.Second, 100*time.Millisecond, "follow %d was not acknowledged", followee)
	return pos
}

// TestDevRestartsAChildThatDies: Redis, Postgres and the NATS server, each
// killed with SIGKILL, are started again on their ports and data; the
// service is ready again and every command acknowledged before a kill is in
// the log and the read model. A child killed again and again stops dev with
// the reason and an error.
func TestDevRestartsAChildThatDies(t *testing.T) {
	dir, err := os.MkdirTemp("", "feed-dev-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755)) // the postgres user must reach its data dir
	p := freePorts(t, 3)
	ports := devPorts{nats: p[0], redis: p[1], postgres: p[2]}
	base, stop := startDev(t, dir, ports)
	waitReady(t, base)
	var tok strings.Builder
	require.NoError(t, run(context.Background(), []string{"token", "--user", "404"}, func(string) string { return "" }, &tok, io.Discard))
	token := strings.TrimSpace(tok.String())

	children := []struct {
		name  string
		words []string
	}{
		// Redis shows its address in place of its arguments.
		{"redis", []string{"redis-server", fmt.Sprintf("127.0.0.1:%d", ports.redis)}},
		{"postgres", []string{"postgres", filepath.Join(dir, "postgres")}},
		{"nats", []string{" nats ", filepath.Join(dir, "nats")}},
	}
	acked := map[int]uint64{} // followee → position
	followee := 1000
	for _, c := range children {
		for range 5 {
			followee++
			acked[followee] = follow(t, base, token, followee)
		}
		pid := childPID(t, c.words...)
		require.NotZero(t, pid, "no %s child", c.name)
		require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
		require.Eventually(t, func() bool {
			again := childPID(t, c.words...)
			return again != 0 && again != pid
		}, 30*time.Second, 50*time.Millisecond, "%s was not restarted", c.name)
		waitReady(t, base)
		followee++
		acked[followee] = follow(t, base, token, followee)
	}

	log, _ := openTestLog(t, fmt.Sprintf("nats://127.0.0.1:%d", ports.nats))
	head, err := log.Head(t.Context())
	require.NoError(t, err)
	for f, seq := range acked {
		rec, err := log.Get(t.Context(), seq)
		require.NoError(t, err, "the event at %d", seq)
		assert.Equal(t, events.UserFollowed{FollowerID: 404, FolloweeID: domain.UserID(f)}, rec.Event, "the event at %d", seq)
	}
	pg, err := readmodel.OpenPool(t.Context(), fmt.Sprintf("postgres://postgres@127.0.0.1:%d/feed?sslmode=disable", ports.postgres), migrations.Schema, 0)
	require.NoError(t, err)
	defer pg.Close()
	store := readmodel.NewStore(pg)
	require.Eventually(t, func() bool {
		pos, err := store.Position(t.Context())
		return err == nil && pos >= head
	}, 30*time.Second, 50*time.Millisecond, "the read model did not reach %d", head)
	var n int
	require.NoError(t, pg.QueryRow(t.Context(), `SELECT count(*) FROM follows WHERE follower_id = 404`).Scan(&n))
	assert.Equal(t, len(acked), n, "every acknowledged follow is in the read model")

	// Killed each time it comes back: dev gives up and says why.
	redis := children[0].words
	last := 0
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if pid := childPID(t, redis...); pid != 0 && pid != last {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			last = pid
		}
		time.Sleep(20 * time.Millisecond)
		if childPID(t, redis...) == 0 && childPID(t, children[1].words...) == 0 {
			break // dev has stopped its children: it is exiting
		}
	}
	err = stop()
	require.Error(t, err)
	assert.ErrorContains(t, err, "redis failed 5 times within 1m0s; giving up")
	assert.Equal(t, 1, exitCode(err))
}
