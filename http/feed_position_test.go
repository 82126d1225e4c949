package http

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/projections/feeds"
)

// fakePositions is a lookup of the feeds' position that counts its calls and,
// while gate is open (not nil), blocks until it is closed.
type fakePositions struct {
	calls atomic.Int64
	pos   atomic.Uint64
	fail  atomic.Bool
	gate  chan struct{}
}

func (f *fakePositions) lookup(ctx context.Context) (uint64, error) {
	f.calls.Add(1)
	if f.gate != nil {
		select {
		case <-f.gate:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	if f.fail.Load() {
		return 0, errors.New("redis down")
	}
	return f.pos.Load(), nil
}

func TestSharedPositionOneLookupForConcurrentReads(t *testing.T) {
	f := &fakePositions{gate: make(chan struct{})}
	f.pos.Store(42)
	s := &sharedPosition{lookup: f.lookup, ttl: time.Hour}
	var wg sync.WaitGroup
	got := make([]uint64, 20)
	for i := range got {
		wg.Go(func() {
			pos, err := s.get(t.Context(), 0)
			assert.NoError(t, err)
			got[i] = pos
		})
	}
	require.Eventually(t, func() bool { return f.calls.Load() == 1 }, time.Second, time.Millisecond)
	time.Sleep(20 * time.Millisecond) // let the others join the lookup under way
	close(f.gate)
	wg.Wait()
	assert.Equal(t, int64(1), f.calls.Load(), "one lookup answers every concurrent read")
	for _, pos := range got {
		assert.Equal(t, uint64(42), pos)
	}
}

func TestSharedPositionReusesOnlyRecentAndHighEnough(t *testing.T) {
	f := &fakePositions{}
	f.pos.Store(7)
	s := &sharedPosition{lookup: f.lookup, ttl: 30 * time.Millisecond}
	ctx := t.Context()
	pos, err := s.get(ctx, 0)
	require.NoError(t, err)
	assert.Equal(t, uint64(7), pos)

	f.pos.Store(9)
	pos, _ = s.get(ctx, 0)
	assert.Equal(t, uint64(7), pos, "reused within the time to live: a lower bound is a true X-Position")
	assert.Equal(t, int64(1), f.calls.Load())

	pos, _ = s.get(ctx, 8)
	assert.Equal(t, uint64(9), pos, "a read waiting for more looks again")
	assert.Equal(t, int64(2), f.calls.Load())

	f.pos.Store(11)
	time.Sleep(40 * time.Millisecond)
	pos, _ = s.get(ctx, 12)
	assert.Equal(t, uint64(11), pos, "expired: a read waiting for a position looks again")
	assert.Equal(t, int64(3), f.calls.Load())
}

// TestSharedPositionNeverHoldsAReadThatWaitsForNothing: once a position is
// known, a read without X-Min-Position gets the last one at once, even while
// a lookup hangs, and an expired one starts one lookup in the background.
func TestSharedPositionNeverHoldsAReadThatWaitsForNothing(t *testing.T) {
	f := &fakePositions{}
	f.pos.Store(7)
	s := &sharedPosition{lookup: f.lookup, ttl: 20 * time.Millisecond}
	ctx := t.Context()
	pos, err := s.get(ctx, 0)
	require.NoError(t, err)
	require.Equal(t, uint64(7), pos)

	f.gate = make(chan struct{}) // lookups hang from now on
	f.pos.Store(9)
	time.Sleep(30 * time.Millisecond)
	for range 50 {
		done := make(chan uint64)
		go func() {
			pos, _ := s.get(ctx, 0)
			done <- pos
		}()
		select {
		case pos := <-done:
			assert.Equal(t, uint64(7), pos, "the last position known")
		case <-time.After(time.Second):
			t.Fatal("a read asking for no position waited for a lookup")
		}
	}
	// The background lookup runs on a goroutine of its own, which a busy
	// machine may start late: it comes, and it is the only one.
	require.Eventually(t, func() bool { return f.calls.Load() >= 2 }, time.Second, time.Millisecond, "a lookup in the background")
	time.Sleep(10 * time.Millisecond)
	assert.Equal(t, int64(2), f.calls.Load(), "one lookup in the background")

	close(f.gate)
	require.Eventually(t, func() bool {
		pos, _ := s.get(ctx, 0)
		return pos == 9
	}, time.Second, time.Millisecond, "the background lookup's position is served next")
}

func TestSharedPositionDoesNotKeepFailures(t *testing.T) {
	f := &fakePositions{}
	f.fail.Store(true)
	s := &sharedPosition{lookup: f.lookup, ttl: time.Hour}
	_, err := s.get(t.Context(), 0)
	require.Error(t, err)
	f.fail.Store(false)
	f.pos.Store(5)
	pos, err := s.get(t.Context(), 0)
	require.NoError(t, err)
	assert.Equal(t, uint64(5), pos, "a failure is not reused")
	assert.Equal(t, int64(2), f.calls.Load())
}

func TestSharedPositionWaiterGivesUpWithItsRequest(t *testing.T) {
	f := &fakePositions{gate: make(chan struct{})}
	defer close(f.gate)
	s := &sharedPosition{lookup: f.lookup, ttl: time.Hour}
	go func() { _, _ = s.get(context.Background(), 0) }()
	require.Eventually(t, func() bool { return f.calls.Load() == 1 }, time.Second, time.Millisecond)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	_, err := s.get(ctx, 0)
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// GET /feed answers X-Position from the feeds' position once it is known, and
// refuses a malformed X-Min-Position all the same.
func TestHomeFeedPositionHeaders(t *testing.T) {
	w := newFeedWorld(t, feeds.Config{})
	_, err := w.log.AppendEvent(context.Background(), "position-headers", time.Now(), events.UserFollowed{FollowerID: 1, FolloweeID: 2})
	require.NoError(t, err)
	w.settle(t)
	want, err := w.reader.Position(context.Background())
	require.NoError(t, err)
	require.NotZero(t, want)
	tok, err := w.auth.Mint(1, false, time.Now(), time.Hour)
	require.NoError(t, err)
	// get answers the status and X-Position of GET /feed.
	get := func(minPosition string) (int, string) {
		req := httptest.NewRequest(http.MethodGet, "/feed", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		if minPosition != "" {
			req.Header.Set(headerMinPosition, minPosition)
		}
		resp, err := w.srv.App().Test(req, 30_000)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		return resp.StatusCode, resp.Header.Get(headerPosition)
	}
	for _, minPosition := range []string{"", "", events.Position(want)} {
		status, pos := get(minPosition)
		require.Equal(t, http.StatusOK, status)
		assert.Equal(t, events.Position(want), pos)
	}
	for _, bad := range []string{"abc", "-1", "0x10"} {
		status, _ := get(bad)
		assert.Equal(t, http.StatusBadRequest, status, bad)
	}
}
