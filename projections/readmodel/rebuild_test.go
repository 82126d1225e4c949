package readmodel_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack"
	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/migrations"
	"github.com/feedproject/feed/projections"
	"github.com/feedproject/feed/projections/projectionstest"
	"github.com/feedproject/feed/projections/readmodel"
)

func pjURL(pg *localstack.Postgres, name string) string {
	return strings.Replace(pg.URL(), "/feed?", "/"+name+"?", 1)
}

// liveRunner runs the live read model projector until the test ends.
func liveRunner(t *testing.T, log *events.Log, p *readmodel.Projector) *projections.Runner {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := projections.NewRunner(log, p, projections.RunnerConfig{BatchSize: 50, FetchWait: 50 * time.Millisecond, MaxBackoff: 20 * time.Millisecond},
		nil, slog.New(slog.DiscardHandler))
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return r
}

// caughtUp waits until the live read model's stored checkpoint is at the head.
func caughtUp(t *testing.T, log *events.Log, store *readmodel.Store) {
	t.Helper()
	head, err := log.Head(context.Background())
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		pos, err := store.Position(context.Background())
		return err == nil && pos >= head
	}, 60*time.Second, 10*time.Millisecond, "the live projector did not reach %d", head)
}

var errStop = errors.New("stop")

// liveReadModel is a log of n events of workload's and a read model that the
// live projector keeps up with it.
func liveReadModel(t *testing.T, n int, seed uint64) (*localstack.Postgres, *events.Log, *pgxpool.Pool, *readmodel.Store) {
	t.Helper()
	pg := localstacktest.PostgresForTest(t)
	log := pjLog(t)
	workload(t, log, n, seed)
	live := pjDatabase(t, pg, "live")
	store := readmodel.NewStore(live)
	liveRunner(t, log, readmodel.NewProjector(live, nil))
	caughtUp(t, log, store)
	return pg, log, live, store
}

// TestRebuildDuringLiveTraffic rebuilds the read model into a shadow while
// events keep coming and readers keep reading; the first rebuild is killed
// half-way and a second one resumes it. Afterwards the live read model equals a
// clean replay, no read failed, and only the live schema is left.
func TestRebuildDuringLiveTraffic(t *testing.T) {
	ctx := context.Background()
	pg, log, live, store := liveReadModel(t, 2500, 11)

	// Traffic: commands appended at a steady pace, and reads.
	traffic, stopTraffic := context.WithCancel(ctx)
	var (
		wg                  sync.WaitGroup
		reads, readFailures atomic.Int64
		writeErr            error
		firstReadErr        atomic.Value
	)
	wg.Go(func() {
		err := appendWorkload(traffic, log, 1_000_000, 12, time.Millisecond)
		if traffic.Err() == nil {
			writeErr = err
		}
	})
	for range 2 {
		wg.Go(func() {
			for u := domain.UserID(1); traffic.Err() == nil; u = u%12 + 1 {
				_, err1 := store.ProfileGrid(traffic, u, nil)
				_, err2 := store.Feed(traffic, u, nil, 20)
				_, err3 := store.Position(traffic)
				if err := errors.Join(err1, err2, err3); err != nil && traffic.Err() == nil {
					readFailures.Add(1)
					firstReadErr.CompareAndSwap(nil, err)
				}
				reads.Add(1)
			}
		})
	}

	// A rebuild, killed half-way.
	url := pjURL(pg, "live")
	first, err := readmodel.OpenRebuild(ctx, url, true, nil)
	require.NoError(t, err)
	// Small batches are remembered and sent ahead, as a replay's large ones
	// are (see readmodel.Projector.Send).
	readmodel.SetCatchUpBatch(first.Projector, 1)
	_, err = readmodel.OpenRebuild(ctx, url, false, nil)
	require.ErrorIs(t, err, projections.ErrRebuildRunning, "a second rebuild is refused while one runs")
	killed, kill := context.WithCancel(ctx)
	err = projections.Replay(killed, log, first, projections.ReplayOptions{BatchSize: 100, Progress: func(p projections.Progress) {
		if p.Done >= 1200 {
			kill()
		}
	}})
	require.ErrorIs(t, err, context.Canceled)
	first.Close()

	// Started again, it resumes the shadow and finishes.
	second, err := readmodel.OpenRebuild(ctx, url, false, nil)
	require.NoError(t, err)
	defer second.Close()
	readmodel.SetCatchUpBatch(second.Projector, 1)
	var progress []projections.Progress
	require.NoError(t, projections.Replay(ctx, log, second, projections.ReplayOptions{BatchSize: 100, Progress: func(p projections.Progress) {
		progress = append(progress, p)
	}}))
	require.NotEmpty(t, progress)
	assert.GreaterOrEqual(t, progress[0].Position, uint64(1200), "resumed where the first stopped")
	last := progress[len(progress)-1]
	assert.Equal(t, projections.PhaseDone, last.Phase)
	assert.Equal(t, last.Total, last.Done, "every event applied")

	time.Sleep(200 * time.Millisecond) // reads and writes go on after the switch
	stopTraffic()
	wg.Wait()
	require.NoError(t, writeErr)
	caughtUp(t, log, store)

	clean := pjDatabase(t, pg, "clean")
	replay(t, log, clean)
	assert.Equal(t, pjDump(t, clean), pjDump(t, live), "the rebuilt read model is a clean replay's")
	assert.Positive(t, reads.Load())
	assert.Zero(t, readFailures.Load(), "no read failed: %v", firstReadErr.Load())
	assert.Equal(t, "[readmodel]", pjQuery(t, live, `SELECT string_agg(nspname, ',') FROM pg_namespace WHERE nspname LIKE 'readmodel%'`),
		"the shadow became the live schema and the old one is gone")
}

// TestLiveProjectorRewindsWhenTheReadModelGoesBack switches to a shadow that
// is behind the live projector (no catching up): the live projector notices
// the checkpoint went back and replays the difference instead of carrying on
// from its own position.
func TestLiveProjectorRewindsWhenTheReadModelGoesBack(t *testing.T) {
	ctx := context.Background()
	pg, log, live, store := liveReadModel(t, 1500, 21)

	rb, err := readmodel.OpenRebuild(ctx, pjURL(pg, "live"), true, nil)
	require.NoError(t, err)
	defer rb.Close()
	var batch []events.Record
	err = log.Read(ctx, events.ReadOptions{StopAtEnd: true}, func(r events.Record) error {
		if len(batch) == 400 {
			return errStop
		}
		batch = append(batch, r)
		return nil
	})
	require.ErrorIs(t, err, errStop)
	require.NoError(t, rb.Apply(ctx, batch))
	require.NoError(t, rb.Switch(ctx, func(context.Context, uint64) error { return nil }))
	require.NoError(t, rb.Cleanup(ctx))
	require.Equal(t, "[400]", pjQuery(t, live, `SELECT position FROM projector_checkpoints`), "the live read model went back")

	caughtUp(t, log, store)
	clean := pjDatabase(t, pg, "clean")
	replay(t, log, clean)
	assert.Equal(t, pjDump(t, clean), pjDump(t, live))
}

// TestRebuildSkipsAPoisonEventSentAhead: an event no Postgres row can hold
// fails the batch a rebuild sent ahead, which voids the batch sent after it;
// both are applied again the careful way, the event is skipped, and the
// result is the live projector's, which dead-lettered it.
func TestRebuildSkipsAPoisonEventSentAhead(t *testing.T) {
	ctx := context.Background()
	pg := localstacktest.PostgresForTest(t)
	log := pjLog(t)
	workload(t, log, 700, 31)
	poison := created(1<<40, 5)
	poison.Caption = "nul \x00 byte"
	_, err := log.AppendEvent(ctx, "poison", t0, poison)
	require.NoError(t, err)
	for i := range 150 {
		_, err := log.AppendEvent(ctx, fmt.Sprint("after-", i), t0, events.UserFollowed{FollowerID: domain.UserID(100 + i), FolloweeID: 5})
		require.NoError(t, err)
	}
	want := pjDatabase(t, pg, "want")
	projectionstest.RunUntil(t, log, readmodel.NewProjector(want, nil), projections.RunnerConfig{BatchSize: 100}, nil)

	pjDatabase(t, pg, "live")
	rb, err := readmodel.OpenRebuild(ctx, pjURL(pg, "live"), true, nil)
	require.NoError(t, err)
	defer rb.Close()
	readmodel.SetCatchUpBatch(rb.Projector, 1)
	var last projections.Progress
	require.NoError(t, projections.Replay(ctx, log, rb, projections.ReplayOptions{BatchSize: 100, Progress: func(p projections.Progress) {
		last = p
	}}))
	assert.Equal(t, projections.PhaseDone, last.Phase)
	assert.Equal(t, 1, last.Skipped)
	assert.Equal(t, last.Total, last.Done)
	pool, err := readmodel.OpenPool(ctx, pjURL(pg, "live"), migrations.Schema, 0)
	require.NoError(t, err)
	defer pool.Close()
	assert.Equal(t, pjDump(t, want), pjDump(t, pool))
}
