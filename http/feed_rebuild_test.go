package http

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/projections"
	"github.com/feedproject/feed/projections/feeds"
	"github.com/feedproject/feed/projections/feeds/repair"
)

// feedTraffic is a steady stream of posts, follows and unfollows, and of home
// feed reads, until stopped; it counts the reads that did not answer 200.
type feedTraffic struct {
	stop            context.CancelFunc
	wg              sync.WaitGroup
	reads, failed   atomic.Int64
	firstFailure    atomic.Value
	writeErr        error
	users, appended int
}

func (w *feedWorld) startTraffic(t *testing.T, users int) *feedTraffic {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	tr := &feedTraffic{stop: stop, users: users}
	tr.wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			a, b := domain.UserID(i%users+1), domain.UserID((i*5)%users+1)
			var ev events.Event
			switch i % 4 {
			case 0, 1:
				id, at := w.ids.Next(time.Now())
				ev = events.PostCreated{PostID: domain.PostID(id), UserID: a, CreatedAt: at,
					Media: []events.Media{{Key: fmt.Sprintf("%064d.png", id), ContentType: "image/png", Width: 1, Height: 1, Size: 1}}}
			case 2:
				ev = follow(a, b)
			default:
				ev = unfollow(b, a)
			}
			if a == b {
				continue
			}
			if _, err := w.log.AppendEvent(ctx, fmt.Sprintf("traffic-%d", i), time.Now(), ev); err != nil {
				if ctx.Err() == nil {
					tr.writeErr = err
				}
				return
			}
			tr.appended++
			time.Sleep(2 * time.Millisecond)
		}
	})
	tok := make([]string, users+1)
	for u := 1; u <= users; u++ {
		var err error
		tok[u], err = w.auth.Mint(domain.UserID(u), false, time.Now(), time.Hour)
		require.NoError(t, err)
	}
	tr.wg.Go(func() {
		for u := 1; ctx.Err() == nil; u = u%users + 1 {
			req := httptest.NewRequest(http.MethodGet, "/feed", nil)
			req.Header.Set("Authorization", "Bearer "+tok[u])
			resp, err := w.srv.App().Test(req, 10_000)
			status := 0
			if err == nil {
				status = resp.StatusCode
				_ = resp.Body.Close()
			}
			tr.reads.Add(1)
			if status != http.StatusOK {
				tr.failed.Add(1)
				tr.firstFailure.CompareAndSwap(nil, fmt.Sprintf("user %d: status %d, %v", u, status, err))
			}
		}
	})
	return tr
}

func (tr *feedTraffic) finish(t *testing.T) {
	t.Helper()
	tr.stop()
	tr.wg.Wait()
	require.NoError(t, tr.writeErr)
	assert.Positive(t, tr.appended, "commands were appended during the rebuild")
	assert.Positive(t, tr.reads.Load(), "feeds were read during the rebuild")
	assert.Zero(t, tr.failed.Load(), "no read failed: %v", tr.firstFailure.Load())
}

// TestFeedsRebuildDuringLiveTraffic rebuilds the feeds into the next keyspace
// version while posts, follows and reads go on; the first rebuild is killed
// half-way and a second resumes it. Afterwards every user's pages are the
// true feed, every inbox is exactly its feed above its floor, the old version
// is gone, and no read failed.
func TestFeedsRebuildDuringLiveTraffic(t *testing.T) {
	ctx := context.Background()
	w := newFeedWorld(t, feeds.Config{InboxCap: 15, OutboxCap: 15, BigThreshold: 6})
	const users = 10
	for i := range 300 {
		a, b := domain.UserID(i%users+1), domain.UserID((i*7)%users+1)
		if i%4 == 3 {
			b = 1 // one account gathers followers and turns big
		}
		switch {
		case i%3 == 0:
			w.post(t, a)
		case a != b:
			w.emit(t, follow(a, b))
		}
	}
	for u := 1; u <= users; u += 2 {
		w.materialise(t, domain.UserID(u))
	}
	w.settle(t)
	traffic := w.startTraffic(t, users)

	cfg := repair.RebuildConfig{Planner: w.plan, Grace: 1500 * time.Millisecond}
	quiet := slog.New(slog.DiscardHandler)
	first, err := repair.OpenRebuild(ctx, w.store, w.js, cfg, quiet)
	require.NoError(t, err)
	_, err = repair.OpenRebuild(ctx, w.store, w.js, cfg, quiet)
	require.ErrorIs(t, err, projections.ErrRebuildRunning, "a second rebuild is refused while one runs")
	killed, kill := context.WithCancel(ctx)
	err = projections.Replay(killed, w.log, first, projections.ReplayOptions{BatchSize: 40, Progress: func(p projections.Progress) {
		if p.Done >= 150 {
			kill()
		}
	}})
	require.ErrorIs(t, err, context.Canceled)
	first.Close()

	second, err := repair.OpenRebuild(ctx, w.store, w.js, cfg, quiet)
	require.NoError(t, err)
	defer second.Close()
	assert.Equal(t, first.Version(), second.Version(), "the second rebuild resumes the first's keyspace")
	var progress []projections.Progress
	require.NoError(t, projections.Replay(ctx, w.log, second, projections.ReplayOptions{BatchSize: 40, Progress: func(p projections.Progress) {
		progress = append(progress, p)
	}}))
	require.NotEmpty(t, progress)
	assert.GreaterOrEqual(t, progress[0].Position, uint64(150), "resumed where the first stopped")
	assert.Equal(t, projections.PhaseDone, progress[len(progress)-1].Phase)

	time.Sleep(300 * time.Millisecond) // traffic goes on after the switch
	traffic.finish(t)

	active, err := w.store.ActiveVersion(ctx)
	require.NoError(t, err)
	assert.Equal(t, second.Version(), active)
	old, err := w.rdb.Keys(ctx, feeds.KeyPrefix(active-1)+"*").Result()
	require.NoError(t, err)
	assert.Empty(t, old, "the replaced keyspace is removed")

	w.settle(t)
	for u := 1; u <= users; u++ {
		w.materialise(t, domain.UserID(u))
	}
	for u := 1; u <= users; u++ {
		w.exact(t, domain.UserID(u))
	}
}
