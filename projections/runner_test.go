package projections_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/projections"
)

// testLog is an event log on an embedded server of the test's own.
func testLog(t *testing.T) *events.Log {
	t.Helper()
	log, err := events.OpenLog(context.Background(), localstacktest.JetStreamForTest(t), events.Config{}, nil)
	require.NoError(t, err)
	t.Cleanup(log.Close)
	return log
}

// sized is a projector that names its batch size and records the sizes of
// the batches it is given.
type sized struct {
	size int

	mu      sync.Mutex
	applied uint64
	batches []int
}

func (s *sized) Name() string   { return "sized" }
func (s *sized) BatchSize() int { return s.size }

func (s *sized) Checkpoint(context.Context) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applied, nil
}

func (s *sized) Apply(_ context.Context, batch []events.Record) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.batches = append(s.batches, len(batch))
	s.applied = batch[len(batch)-1].Seq
	return nil
}

// TestRunnerTakesTheProjectorsBatchSize: a backlog comes in batches of the
// size the projector names, unless the runner's config names one.
func TestRunnerTakesTheProjectorsBatchSize(t *testing.T) {
	for _, c := range []struct {
		name         string
		config, want int
	}{
		{"the projector's", 0, 3},
		{"the config's over the projector's", 5, 5},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			log := testLog(t)
			const n = 12
			for i := range n {
				_, err := log.AppendEvent(ctx, fmt.Sprint(i), time.Now(), events.UserFollowed{FollowerID: domain.UserID(i + 1), FolloweeID: 99})
				require.NoError(t, err)
			}

			p := &sized{size: 3}
			r := projections.NewRunner(log, p, projections.RunnerConfig{BatchSize: c.config, FetchWait: 100 * time.Millisecond},
				nil, slog.New(slog.DiscardHandler))
			done := make(chan error, 1)
			go func() { done <- r.Run(ctx) }()
			require.Eventually(t, func() bool { return r.Position() == n }, 10*time.Second, 5*time.Millisecond)
			cancel()
			require.NoError(t, <-done)
			p.mu.Lock()
			defer p.mu.Unlock()
			assert.Equal(t, c.want, p.batches[0], "batches %v", p.batches)
			assert.Equal(t, c.want, slices.Max(p.batches), "batches %v", p.batches)
		})
	}
}

// held is a projector whose first batch waits until released, and which
// records the batches it is given.
type held struct {
	started, release chan struct{}
	once             sync.Once

	mu      sync.Mutex
	applied uint64
	batches [][]uint64
}

func (h *held) Name() string { return "held" }

func (h *held) Checkpoint(context.Context) (uint64, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.applied, nil
}

func (h *held) Apply(_ context.Context, batch []events.Record) error {
	h.once.Do(func() {
		close(h.started)
		<-h.release
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	var seqs []uint64
	for _, rec := range batch {
		seqs = append(seqs, rec.Seq)
	}
	h.batches = append(h.batches, seqs)
	h.applied = batch[len(batch)-1].Seq
	return nil
}

// TestRunnerHandsOverWhatArrivedDuringTheApply: the batch fetched ahead while
// one is applied takes, when handed over, the events that arrived since, so
// that live events wait for one apply, not two.
func TestRunnerHandsOverWhatArrivedDuringTheApply(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := testLog(t)
	appendN := func(from, to int) {
		for i := from; i <= to; i++ {
			_, err := log.AppendEvent(ctx, fmt.Sprint(i), time.Now(), events.UserFollowed{FollowerID: domain.UserID(i), FolloweeID: 99})
			require.NoError(t, err)
		}
	}

	p := &held{started: make(chan struct{}), release: make(chan struct{})}
	r := projections.NewRunner(log, p, projections.RunnerConfig{BatchSize: 100, FetchWait: 100 * time.Millisecond},
		nil, slog.New(slog.DiscardHandler))
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	appendN(1, 1)
	<-p.started
	// Event 2 is fetched ahead while event 1 is applied; 3 to 10 come later,
	// still during that apply.
	appendN(2, 2)
	time.Sleep(300 * time.Millisecond)
	appendN(3, 10)
	close(p.release)
	require.Eventually(t, func() bool { return r.Position() == 10 }, 10*time.Second, 5*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	p.mu.Lock()
	defer p.mu.Unlock()
	assert.Equal(t, [][]uint64{{1}, {2, 3, 4, 5, 6, 7, 8, 9, 10}}, p.batches)
}

// TestRunnerRecordsEachEventsDelay: every event applied is observed in the
// delay histogram, as the time since it occurred.
func TestRunnerRecordsEachEventsDelay(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := testLog(t)
	const n = 5
	at := time.Now().Add(-2 * time.Second)
	for i := range n {
		_, err := log.AppendEvent(ctx, fmt.Sprint(i), at, events.UserFollowed{FollowerID: domain.UserID(i + 1), FolloweeID: 99})
		require.NoError(t, err)
	}
	reg := prometheus.NewRegistry()
	r := projections.NewRunner(log, &sized{size: 2}, projections.RunnerConfig{FetchWait: 100 * time.Millisecond},
		projections.NewMetrics(reg), slog.New(slog.DiscardHandler))
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	require.Eventually(t, func() bool { return r.Position() == n }, 10*time.Second, 5*time.Millisecond)
	cancel()
	require.NoError(t, <-done)

	h := delayHistogram(t, reg, "sized")
	assert.Equal(t, uint64(n), h.GetSampleCount())
	assert.GreaterOrEqual(t, h.GetSampleSum(), 2.0*n)
	assert.Less(t, h.GetSampleSum(), 12.0*n)
}

// delayHistogram is projector's feed_projector_delay_seconds in reg.
func delayHistogram(t *testing.T, reg *prometheus.Registry, projector string) *dto.Histogram {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != "feed_projector_delay_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "projector" && l.GetValue() == projector {
					return m.GetHistogram()
				}
			}
		}
	}
	require.Failf(t, "no delay histogram", "projector %s", projector)
	return nil
}

// piped is a Pipeliner whose batches the test settles: each one sent is
// handed to the test on sent, and applied or failed with what the test puts
// on its outcome.
type piped struct {
	t    *testing.T
	sent chan *pipedBatch

	mu      sync.Mutex
	applied uint64
}

type pipedBatch struct {
	first, last uint64
	outcome     chan error
}

func (p *piped) Name() string { return "piped" }

func (p *piped) Checkpoint(context.Context) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.applied, nil
}

func (p *piped) Apply(context.Context, []events.Record) error {
	p.t.Error("a Pipeliner is sent its batches")
	return nil
}

func (p *piped) Send(_ context.Context, batch []events.Record) <-chan error {
	b := &pipedBatch{first: batch[0].Seq, last: batch[len(batch)-1].Seq, outcome: make(chan error)}
	result := make(chan error, 1)
	go func() {
		err := <-b.outcome
		if err == nil {
			p.mu.Lock()
			p.applied = b.last
			p.mu.Unlock()
		}
		result <- err
	}()
	p.sent <- b
	return result
}

// runPiped runs a runner of a piped projector over n events, in batches of
// 3, with a fetch that waits wait when caught up.
func runPiped(t *testing.T, ctx context.Context, n int, wait time.Duration) (*piped, *projections.Runner, <-chan error) {
	t.Helper()
	log := testLog(t)
	for i := range n {
		_, err := log.AppendEvent(ctx, fmt.Sprint(i), time.Now(), events.UserFollowed{FollowerID: domain.UserID(i + 1), FolloweeID: 99})
		require.NoError(t, err)
	}
	p := &piped{t: t, sent: make(chan *pipedBatch)}
	r := projections.NewRunner(log, p, projections.RunnerConfig{BatchSize: 3, FetchWait: wait, MaxBackoff: 50 * time.Millisecond},
		nil, slog.New(slog.DiscardHandler))
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	return p, r, done
}

// next is the next batch sent, within a few seconds.
func (p *piped) next(t *testing.T) *pipedBatch {
	t.Helper()
	select {
	case b := <-p.sent:
		return b
	case <-time.After(5 * time.Second):
		require.FailNow(t, "no batch sent")
		return nil
	}
}

// TestPipelinedRunnerSendsAheadAndSettlesEachBatch: the next batch is sent
// while the one before it is still being applied; each moves the position
// once applied, even when no batch comes after it to wake the runner.
func TestPipelinedRunnerSendsAheadAndSettlesEachBatch(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// A long fetch wait: the last batch must not wait for it.
	p, r, done := runPiped(t, ctx, 6, 3*time.Second)
	b1 := p.next(t)
	b2 := p.next(t)
	assert.Equal(t, []uint64{1, 3, 4, 6}, []uint64{b1.first, b1.last, b2.first, b2.last})
	assert.Zero(t, r.Position(), "nothing is applied yet")
	b1.outcome <- nil
	require.Eventually(t, func() bool { return r.Position() == 3 }, 2*time.Second, time.Millisecond)
	b2.outcome <- nil
	require.Eventually(t, func() bool { return r.Position() == 6 }, time.Second, time.Millisecond)
	cancel()
	require.NoError(t, <-done)
}

// TestPipelinedRunnerWaitsForWhatFollowsAFailure: when a batch fails, the
// one sent after it is waited for before the runner rewinds, so that no
// batch of the next attempt is sent while it may still be applied.
func TestPipelinedRunnerWaitsForWhatFollowsAFailure(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p, r, done := runPiped(t, ctx, 6, 100*time.Millisecond)
	b1 := p.next(t)
	b2 := p.next(t)
	b1.outcome <- errors.New("postgres went away")
	select {
	case b := <-p.sent:
		require.Failf(t, "sent while the batch before was outstanding", "%d..%d", b.first, b.last)
	case <-time.After(300 * time.Millisecond):
	}
	b2.outcome <- errors.New("void: the batch before failed")
	again := p.next(t)
	assert.Equal(t, []uint64{1, 3}, []uint64{again.first, again.last}, "rewound to the checkpoint")
	again.outcome <- nil
	p.next(t).outcome <- nil
	require.Eventually(t, func() bool { return r.Position() == 6 }, 5*time.Second, time.Millisecond)
	cancel()
	require.NoError(t, <-done)
}

// TestPipelinedRunnerFinishesWhatItSentAtShutdown: shutdown waits for the
// batches outstanding, and their position counts.
func TestPipelinedRunnerFinishesWhatItSentAtShutdown(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p, r, done := runPiped(t, ctx, 6, 100*time.Millisecond)
	b1 := p.next(t)
	b2 := p.next(t)
	cancel()
	select {
	case err := <-done:
		require.Fail(t, "returned with batches outstanding", "%v", err)
	case <-time.After(200 * time.Millisecond):
	}
	b1.outcome <- nil
	b2.outcome <- nil
	require.NoError(t, <-done)
	assert.Equal(t, uint64(6), r.Position())
}
