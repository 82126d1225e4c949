package activity_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/projections"
	"github.com/feedproject/feed/projections/activity"
	"github.com/feedproject/feed/projections/activity/activitytest"
	"github.com/feedproject/feed/projections/projectionstest"
)

func testLog(t *testing.T) *events.Log {
	t.Helper()
	log, err := events.OpenLog(context.Background(), localstacktest.JetStreamForTest(t), events.Config{}, nil)
	require.NoError(t, err)
	t.Cleanup(log.Close)
	return log
}

// modelOf is the reference model of the whole log.
func modelOf(t *testing.T, log *events.Log) *activitytest.Model {
	t.Helper()
	m := activitytest.NewModel()
	require.NoError(t, log.Read(context.Background(), events.ReadOptions{StopAtEnd: true, IncludeUnknown: true}, func(r events.Record) error {
		m.Apply(r)
		return nil
	}))
	return m
}

// matchesModel pages through every user's activity and compares it with m.
func matchesModel(t *testing.T, store *activity.Store, m *activitytest.Model) {
	t.Helper()
	total := 0
	for u := domain.UserID(1); u <= activitytest.Users; u++ {
		want := activitytest.Describe(m.Activity(u))
		total += len(want)
		assert.Equal(t, strings.Join(want, "\n"), strings.Join(activitytest.Describe(all(t, store, u)), "\n"), "user %d", u)
	}
	require.Greater(t, total, 100, "the workload makes items")
}

// dump renders the activity's tables, ordered, for comparing states.
func dump(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	var b strings.Builder
	for _, q := range []string{
		`SELECT id, user_id, media_key, content_type, width, height FROM posts ORDER BY id`,
		`SELECT owner_id, id, actor_id, post_id, comment_id, text, created_at, kept FROM items ORDER BY owner_id, id`,
	} {
		rows, err := pool.Query(context.Background(), q)
		require.NoError(t, err)
		for rows.Next() {
			vals, err := rows.Values()
			require.NoError(t, err)
			fmt.Fprintln(&b, vals...)
		}
		require.NoError(t, rows.Err())
		b.WriteString("--\n")
	}
	return b.String()
}

// replay builds an activity from sequence 1 with plain reads of the log, in
// batches of random size, independent of the runner.
func replay(t *testing.T, log *events.Log, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	p := activity.NewProjector(pool, nil, activity.Config{})
	rng := rand.New(rand.NewPCG(7, 7))
	var batch []events.Record
	size := 1 + rng.IntN(300)
	require.NoError(t, log.Read(ctx, events.ReadOptions{StopAtEnd: true, IncludeUnknown: true}, func(r events.Record) error {
		batch = append(batch, r)
		if len(batch) == size {
			if err := p.Apply(ctx, batch); err != nil {
				return err
			}
			batch, size = nil, 1+rng.IntN(300)
		}
		return nil
	}))
	if len(batch) > 0 {
		require.NoError(t, p.Apply(ctx, batch))
	}
}

// TestBackfillFromTheWholeLog adds the activity to a log that already holds
// thousands of events: once caught up, every user's activity, paged to the
// end, is the reference model's, and equals a replay in batches of other
// sizes row for row.
func TestBackfillFromTheWholeLog(t *testing.T) {
	pg := localstacktest.PostgresForTest(t)
	log := testLog(t)
	require.NoError(t, activitytest.AppendWorkload(context.Background(), log, 5000, 1))

	live := activityDB(t, pg, "live")
	projectionstest.RunUntil(t, log, activity.NewProjector(live, nil, activity.Config{}), projections.RunnerConfig{}, nil)
	matchesModel(t, activity.NewStore(live), modelOf(t, log))

	clean := activityDB(t, pg, "clean")
	replay(t, log, clean)
	assert.Equal(t, dump(t, clean), dump(t, live))
}

// faulty wraps the projector with the failures of real life.
type faulty struct {
	*activity.Projector
	projectionstest.Faults
}

// Send is how a runner hands the projector its batches (it is a
// projections.Pipeliner): the failures are injected there.
func (f *faulty) Send(ctx context.Context, batch []events.Record) <-chan error {
	return f.Faults.Send(ctx, batch, f.Projector.Send)
}

// TestExactlyOnceUnderFailure applies thousands of events through the runner
// while transactions fail half-way, the process "crashes" right after a
// commit, the consumer disappears (redelivery) and Postgres connections are
// killed; the result must equal a clean replay row for row, and the model.
func TestExactlyOnceUnderFailure(t *testing.T) {
	pg := localstacktest.PostgresForTest(t)
	log := testLog(t)
	require.NoError(t, activitytest.AppendWorkload(context.Background(), log, 4000, 2))

	live := activityDB(t, pg, "live")
	f := &faulty{Projector: activity.NewProjector(live, nil, activity.Config{}), Faults: projectionstest.Faults{Rng: rand.New(rand.NewPCG(3, 3))}}
	chaos := &projectionstest.Chaos{Rng: rand.New(rand.NewPCG(4, 4)), Pool: live, Log: log, Consumer: projections.ConsumerName(activity.ProjectorName)}
	projectionstest.RunUntil(t, log, f, projections.RunnerConfig{BatchSize: 97}, chaos.Step)
	t.Logf("injected: %d aborted transactions, %d crashes after commit, %d killed connections, %d deleted consumers",
		f.Aborted, f.Crashed, chaos.Killed, chaos.Deleted)
	require.Positive(t, f.Aborted+f.Crashed)
	live.Reset()

	clean := activityDB(t, pg, "clean")
	replay(t, log, clean)
	assert.Equal(t, dump(t, clean), dump(t, live))
	matchesModel(t, activity.NewStore(live), modelOf(t, log))
}

// TestRebuildSwitchesToAnEqualActivity rebuilds the activity into a shadow
// while the live projector runs and events keep coming; afterwards the live
// schema equals a clean replay, readers follow the switch, and only the live
// schema is left.
func TestRebuildSwitchesToAnEqualActivity(t *testing.T) {
	ctx := context.Background()
	pg := localstacktest.PostgresForTest(t)
	log := testLog(t)
	require.NoError(t, activitytest.AppendWorkload(ctx, log, 2000, 3))
	url := localstacktest.DatabaseCopyForTest(t, pg, "live")
	live, err := pgxpool.New(ctx, url+"&search_path=activity")
	require.NoError(t, err)
	t.Cleanup(live.Close)
	runCtx, stop := context.WithCancel(ctx)
	r := projections.NewRunner(log, activity.NewProjector(live, nil, activity.Config{}),
		projections.RunnerConfig{BatchSize: 50, FetchWait: 50 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}, nil, slog.New(slog.DiscardHandler))
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		require.NoError(t, <-done)
	})
	// Events keep coming during the rebuild.
	more := make(chan error, 1)
	go func() { more <- activitytest.AppendWorkload(ctx, log, 500, 4) }()

	rb, err := activity.OpenRebuild(ctx, url, false, nil, activity.Config{})
	require.NoError(t, err)
	_, err = activity.OpenRebuild(ctx, url, false, nil, activity.Config{})
	require.ErrorIs(t, err, projections.ErrRebuildRunning)
	require.NoError(t, projections.Replay(ctx, log, rb, projections.ReplayOptions{BatchSize: 300}))
	rb.Close()
	require.NoError(t, <-more)

	head, err := log.Head(ctx)
	require.NoError(t, err)
	store := activity.NewStore(live)
	require.Eventually(t, func() bool {
		pos, err := store.Position(ctx)
		return err == nil && pos >= head
	}, 30*time.Second, 10*time.Millisecond)
	clean := activityDB(t, pg, "clean")
	replay(t, log, clean)
	assert.Equal(t, dump(t, clean), dump(t, live))
	matchesModel(t, store, modelOf(t, log))
	var schemas string
	require.NoError(t, live.QueryRow(ctx, `SELECT string_agg(nspname, ',' ORDER BY nspname) FROM pg_namespace WHERE nspname LIKE 'activity%'`).Scan(&schemas))
	assert.Equal(t, "activity", schemas)
}

// TestSentAheadUnderFailure replays the log into an emptied activity again
// and again, each time with failures from a different random start: until
// the first, the projector remembers every row and plans each batch while
// the one before it is written (see Projector.Send); the failures hit such
// pairs. Each replay must equal a clean one row for row.
func TestSentAheadUnderFailure(t *testing.T) {
	ctx := context.Background()
	pg := localstacktest.PostgresForTest(t)
	log := testLog(t)
	require.NoError(t, activitytest.AppendWorkload(ctx, log, 2000, 5))
	clean := activityDB(t, pg, "clean")
	replay(t, log, clean)
	want := dump(t, clean)

	pool := activityDB(t, pg, "ahead")
	for round := range 4 {
		_, err := pool.Exec(ctx, `TRUNCATE posts, items; DELETE FROM projector_checkpoints`)
		require.NoError(t, err)
		p := activity.NewProjector(pool, nil, activity.Config{})
		activity.SetCatchUpBatch(p, 1)
		f := &faulty{Projector: p, Faults: projectionstest.Faults{Rng: rand.New(rand.NewPCG(uint64(round), 12))}}
		chaosRng := rand.New(rand.NewPCG(uint64(round), 13))
		projectionstest.RunUntil(t, log, f, projections.RunnerConfig{BatchSize: 50}, func() {
			if chaosRng.IntN(20) == 0 {
				_, _ = pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
					WHERE datname = current_database() AND pid <> pg_backend_pid()`)
			}
		})
		pool.Reset()
		require.Equal(t, want, dump(t, pool), "round %d: %d aborted, %d crashed", round, f.Aborted, f.Crashed)
	}
}

// TestReplayFromMemory replays the log through the runner into an empty
// activity, every batch but the first planned from what the projector
// remembers (see Projector.Send): the result is the reference model's and a
// clean replay's, row for row.
func TestReplayFromMemory(t *testing.T) {
	pg := localstacktest.PostgresForTest(t)
	log := testLog(t)
	require.NoError(t, activitytest.AppendWorkload(context.Background(), log, 3000, 6))

	pool := activityDB(t, pg, "memory")
	p := activity.NewProjector(pool, nil, activity.Config{})
	activity.SetCatchUpBatch(p, 1)
	projectionstest.RunUntil(t, log, p, projections.RunnerConfig{BatchSize: 37}, nil)
	matchesModel(t, activity.NewStore(pool), modelOf(t, log))

	clean := activityDB(t, pg, "clean")
	replay(t, log, clean)
	assert.Equal(t, dump(t, clean), dump(t, pool))
}
