package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/migrations"
	"github.com/feedproject/feed/projections"
	"github.com/feedproject/feed/projections/feeds"
	"github.com/feedproject/feed/projections/feeds/fanout"
	"github.com/feedproject/feed/projections/lease"
	"github.com/feedproject/feed/projections/readmodel"
)

func runStatus(t *testing.T, env func(string) string, args ...string) statusReport {
	t.Helper()
	var out, errOut bytes.Buffer
	require.NoError(t, run(t.Context(), append([]string{"status", "--json"}, args...), env, &out, &errOut), errOut.String())
	var rep statusReport
	require.NoError(t, json.Unmarshal(out.Bytes(), &rep), out.String())
	require.Len(t, rep.Projectors, 3, out.String())
	return rep
}

func u64(v uint64) *uint64 { return &v }

func TestStatus(t *testing.T) {
	stack := localstacktest.ForTest(t)
	env := stack.Env(nil)
	ctx := t.Context()
	log, js := openTestLog(t, stack.NATS.ClientURL())
	for i := range 8 {
		_, err := log.AppendEvent(ctx, fmt.Sprintf("ev-%d", i), time.Now(), events.PostLiked{UserID: 1, PostID: 100})
		require.NoError(t, err)
	}
	pg, err := readmodel.OpenPool(ctx, stack.Postgres.URL(), migrations.Schema, 0)
	require.NoError(t, err)
	t.Cleanup(pg.Close)
	setCheckpoint := func(pos int) {
		_, err := pg.Exec(ctx, `INSERT INTO projector_checkpoints (projector, position) VALUES ($1, $2)
			ON CONFLICT (projector) DO UPDATE SET position = excluded.position`, readmodel.ProjectorName, pos)
		require.NoError(t, err)
	}
	setCheckpoint(3)
	ropts, err := redis.ParseURL(stack.Redis.URL())
	require.NoError(t, err)
	rdb := redis.NewClient(ropts)
	t.Cleanup(func() { _ = rdb.Close() })
	require.NoError(t, fanout.SetPlannerPosition(ctx, feeds.NewStore(rdb, feeds.Config{}), 5))

	t.Run("no fan-out or dead-letter streams yet", func(t *testing.T) {
		rep := runStatus(t, env, "--interval", "100ms")
		assert.Equal(t, u64(8), rep.Head)
		assert.Equal(t, u64(0), rep.FanoutBacklog)
		rm, fd := rep.Projectors[0], rep.Projectors[1]
		assert.Equal(t, "readmodel", rm.Name)
		assert.Equal(t, u64(3), rm.Position)
		assert.Equal(t, u64(5), rm.Lag)
		assert.Equal(t, u64(0), rm.DeadLetters)
		require.NotNil(t, rm.Rate)
		assert.InDelta(t, 0.0, *rm.Rate, 0)
		assert.Empty(t, rm.Error)
		assert.Equal(t, "feeds", fd.Name)
		assert.Equal(t, u64(5), fd.Position)
		assert.Equal(t, u64(5), fd.Planned)
		assert.Equal(t, u64(3), fd.Lag)
		assert.Equal(t, u64(0), fd.DeadLetters)
		assert.Empty(t, fd.Error)
	})

	t.Run("dead letters and fan-out backlog", func(t *testing.T) {
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: projections.DeadLetterStream, Subjects: []string{"deadletter.>"}})
		require.NoError(t, err)
		for _, subj := range []string{"deadletter.readmodel.2", "deadletter.readmodel.3", "deadletter.feeds.4"} {
			_, err := js.Publish(ctx, subj, []byte("{}"))
			require.NoError(t, err)
		}
		_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: fanout.FanoutStream, Subjects: []string{"fanout.>"}})
		require.NoError(t, err)
		msg := nats.NewMsg("fanout.0")
		msg.Header.Set("Feed-From-Seq", "4")
		msg.Data = []byte("[]")
		_, err = js.PublishMsg(ctx, msg)
		require.NoError(t, err)

		rep := runStatus(t, env, "--interval", "100ms")
		assert.Equal(t, u64(1), rep.FanoutBacklog)
		rm, fd := rep.Projectors[0], rep.Projectors[1]
		assert.Equal(t, u64(2), rm.DeadLetters)
		assert.Equal(t, u64(1), fd.DeadLetters)
		assert.Equal(t, u64(3), fd.Position, "work from 4 is not applied yet")
		assert.Equal(t, u64(5), fd.Planned)
		assert.Equal(t, u64(5), fd.Lag)
	})

	t.Run("rate", func(t *testing.T) {
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		done := make(chan struct{})
		go func() {
			defer close(done)
			for pos := 4; pos <= 8; pos++ {
				select {
				case <-sctx.Done():
					return
				case <-time.After(100 * time.Millisecond):
				}
				_, _ = pg.Exec(sctx, `UPDATE projector_checkpoints SET position = $2 WHERE projector = $1`,
					readmodel.ProjectorName, pos)
			}
		}()
		rep := runStatus(t, env, "--interval", "300ms")
		cancel()
		<-done
		require.NotNil(t, rep.Projectors[0].Rate)
		assert.Greater(t, *rep.Projectors[0].Rate, 0.0)
		assert.LessOrEqual(t, *rep.Projectors[0].Rate, 5/0.3)
	})

	t.Run("table", func(t *testing.T) {
		var out bytes.Buffer
		require.NoError(t, run(ctx, []string{"status", "--interval", "10ms"}, env, &out, io.Discard))
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		require.Len(t, lines, 6, out.String())
		assert.Equal(t, []string{"stream", "FEED_EVENTS", "head", "8"}, strings.Fields(lines[0]))
		assert.Equal(t, "PROJECTOR", strings.Fields(lines[1])[0])
		assert.Equal(t, []string{"feeds", "3", "5", "5"}, strings.Fields(lines[3])[:4])
		// An activity that has not begun to fill itself: the whole log to go.
		assert.Equal(t, []string{"activity", "0", "-", "8"}, strings.Fields(lines[4])[:4])
		assert.Equal(t, []string{"fan-out", "backlog", "1"}, strings.Fields(lines[5]))
		assert.Equal(t, strings.Index(lines[1], "POSITION"), strings.Index(lines[3], "3"), "aligned:\n%s", out.String())
	})

	t.Run("active processes", func(t *testing.T) {
		kv, err := lease.EnsureBucket(ctx, js, time.Second, 1)
		require.NoError(t, err)
		one := lease.New(kv, lease.Config{Process: "one", TTL: time.Second}, nil, slog.New(slog.DiscardHandler))
		two := lease.New(kv, lease.Config{Process: "two", TTL: time.Second}, nil, slog.New(slog.DiscardHandler))
		lctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		defer func() { cancel(); wg.Wait() }()
		idle := func(ctx context.Context, _ uint64) error { <-ctx.Done(); return nil }
		wg.Go(func() { _ = one.Hold(lctx, "readmodel", idle) })
		for _, l := range []*lease.Leases{one, two} {
			wg.Go(func() { _ = l.Share(lctx, "appliers", 4, func(ctx context.Context, _ int) { <-ctx.Done() }) })
		}
		require.Eventually(t, func() bool {
			return one.State("readmodel").State == lease.Active &&
				len(one.State("appliers").Partitions) == 2 && len(two.State("appliers").Partitions) == 2
		}, 5*time.Second, 10*time.Millisecond)

		rep := runStatus(t, env, "--interval", "10ms")
		require.Len(t, rep.Roles, 3, rep.RolesError)
		assert.Equal(t, "one", rep.Roles[0].Active)
		assert.Equal(t, one.State("readmodel").Epoch, rep.Roles[0].Epoch)
		assert.Empty(t, rep.Roles[1].Active, "no planner runs")
		assert.Equal(t, map[string][]int{"one": one.State("appliers").Partitions, "two": two.State("appliers").Partitions}, rep.Roles[2].Partitions)

		var out bytes.Buffer
		require.NoError(t, run(ctx, []string{"status", "--interval", "10ms"}, env, &out, io.Discard))
		assert.Contains(t, out.String(), "ROLE")
		assert.Regexp(t, `readmodel +one +\d+`, out.String())
		assert.Regexp(t, `planner +none`, out.String())
		assert.Regexp(t, `appliers +two +- +\d,\d`, out.String())
	})
}

func TestStatusShowsUnreachableComponentsAsUnavailable(t *testing.T) {
	p := freePort(t)
	env := envMap(map[string]string{
		"NATS_URL":     fmt.Sprintf("nats://127.0.0.1:%d", p),
		"REDIS_URL":    fmt.Sprintf("redis://127.0.0.1:%d/0", p),
		"DATABASE_URL": fmt.Sprintf("postgres://postgres@127.0.0.1:%d/feed?sslmode=disable", p),
	})
	rep := runStatus(t, env, "--interval", "10ms")
	assert.Nil(t, rep.Head)
	assert.Nil(t, rep.FanoutBacklog)
	assert.NotEmpty(t, rep.HeadError)
	for _, p := range rep.Projectors {
		assert.Nil(t, p.Position, p.Name)
		assert.Nil(t, p.Lag, p.Name)
		assert.Nil(t, p.DeadLetters, p.Name)
		assert.NotEmpty(t, p.Error, p.Name)
	}

	var out bytes.Buffer
	require.NoError(t, run(t.Context(), []string{"status", "--interval", "10ms"}, env, &out, io.Discard))
	assert.Contains(t, out.String(), "unavailable")

	err := run(t.Context(), []string{"status", "--interval", "0s"}, env, io.Discard, io.Discard)
	require.ErrorIs(t, err, errUsage)
}
