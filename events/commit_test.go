package events_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
)

// groupCommits are the ways a group of appends can be committed: every group
// of two or more as an atomic batch, or every group pipelined.
var groupCommits = []struct {
	name       string
	atomicFrom int
}{
	{"atomic", 2},
	{"pipelined", 1 << 20},
}

// TestGroupCommitStoresEachEventAtItsSequence appends concurrently, so the
// appends share batches, and checks that every caller was told the sequence its
// own event is stored at.
func TestGroupCommitStoresEachEventAtItsSequence(t *testing.T) {
	for _, gc := range groupCommits {
		t.Run(gc.name, func(t *testing.T) { testGroupCommitStoresEachEventAtItsSequence(t, gc.atomicFrom) })
	}
}

func testGroupCommitStoresEachEventAtItsSequence(t *testing.T, atomicFrom int) {
	ctx := context.Background()
	ns := natsForTest(t)
	reg := prometheus.NewRegistry()
	log, err := events.OpenLog(ctx, ns.js, events.Config{MaxBatch: 16, AtomicFrom: atomicFrom}, events.NewMetrics(reg))
	require.NoError(t, err)
	t.Cleanup(log.Close)

	const writers, each = 32, 25
	seqs := make([][]uint64, writers)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			for i := range each {
				res, err := log.AppendEvent(ctx, fmt.Sprintf("w%d-%d", w, i), at,
					events.UserFollowed{FollowerID: domain.UserID(w + 1), FolloweeID: domain.UserID(i + 100)})
				if !assert.NoError(t, err) {
					return
				}
				assert.False(t, res.Duplicate)
				seqs[w] = append(seqs[w], res.Seq)
			}
		})
	}
	wg.Wait()

	seen := map[uint64]bool{}
	for w := range writers {
		for i, seq := range seqs[w] {
			assert.False(t, seen[seq], "sequence %d given twice", seq)
			seen[seq] = true
			if i > 0 {
				assert.Greater(t, seq, seqs[w][i-1], "one writer's appends stay in order")
			}
			rec, err := log.Get(ctx, seq)
			require.NoError(t, err)
			assert.Equal(t, fmt.Sprintf("w%d-%d", w, i), rec.ID, "the event at %d is the one appended", seq)
		}
	}
	head, err := log.Head(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, writers*each, head)

	// Concurrent appends really were committed together.
	batches := testutil.CollectAndCount(reg, "feed_events_commit_batch_size")
	require.Equal(t, 1, batches)
	metrics, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range metrics {
		if mf.GetName() == "feed_events_commit_batch_size" {
			h := mf.GetMetric()[0].GetHistogram()
			assert.Less(t, h.GetSampleCount(), uint64(writers*each), "fewer commits than events")
			assert.InDelta(t, writers*each, h.GetSampleSum(), 0)
		}
	}
}

// TestGroupCommitWithRetriesInTheBatch mixes retries of stored events with new
// ones: the server refuses an atomic batch holding a duplicate, so the committer
// falls back to one append each; pipelined, each is answered on its own. Every
// caller gets the right answer either way.
func TestGroupCommitWithRetriesInTheBatch(t *testing.T) {
	for _, gc := range groupCommits {
		t.Run(gc.name, func(t *testing.T) { testGroupCommitWithRetriesInTheBatch(t, gc.atomicFrom) })
	}
}

func testGroupCommitWithRetriesInTheBatch(t *testing.T, atomicFrom int) {
	ctx := context.Background()
	ns := natsForTest(t)
	log, err := events.OpenLog(ctx, ns.js, events.Config{AtomicFrom: atomicFrom}, nil)
	require.NoError(t, err)
	t.Cleanup(log.Close)

	first := map[string]uint64{}
	for i := range 10 {
		id := fmt.Sprintf("old-%d", i)
		res, err := log.AppendEvent(ctx, id, at, events.PostLiked{UserID: 1, PostID: domain.PostID(i + 1)})
		require.NoError(t, err)
		first[id] = res.Seq
	}
	type outcome struct {
		id  string
		res events.Appended
		err error
	}
	out := make(chan outcome, 40)
	var wg sync.WaitGroup
	for round := range 2 {
		for i := range 10 {
			for _, id := range []string{fmt.Sprintf("old-%d", i), fmt.Sprintf("new-%d-%d", round, i)} {
				wg.Go(func() {
					res, err := log.AppendEvent(ctx, id, at, events.PostLiked{UserID: 2, PostID: domain.PostID(i + 1)})
					out <- outcome{id, res, err}
				})
			}
		}
	}
	wg.Wait()
	close(out)
	for o := range out {
		require.NoError(t, o.err, o.id)
		if strings.HasPrefix(o.id, "old-") {
			assert.True(t, o.res.Duplicate, o.id)
			assert.Equal(t, first[o.id], o.res.Seq, "a retry is told where the first one is")
			continue
		}
		assert.False(t, o.res.Duplicate, o.id)
		rec, err := log.Get(ctx, o.res.Seq)
		require.NoError(t, err)
		assert.Equal(t, o.id, rec.ID)
	}
	head, err := log.Head(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, 30, head, "10 first events and 20 new ones, no retry stored")
}

func TestAppendAfterCloseIsUnavailable(t *testing.T) {
	ctx := context.Background()
	ns := natsForTest(t)
	log, err := events.OpenLog(ctx, ns.js, events.Config{}, nil)
	require.NoError(t, err)
	log.Close()
	_, err = log.AppendEvent(ctx, "late", at, events.PostLiked{UserID: 1, PostID: 1})
	require.ErrorIs(t, err, domain.ErrUnavailable)
}
