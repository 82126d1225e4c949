package loadbench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/feedproject/feed/domain"
)

// setupRetries is how often a setup request is tried before it counts as
// failed.
const setupRetries = 3

// setup creates the graph's follows, waits for the projectors to apply them,
// and materialises every inbox.
func (r *runner) setup(ctx context.Context, rng *rand.Rand) error {
	r.setStage("graph")
	r.report.BeforeGraph = r.mark(ctx)
	edges := r.graph.Shuffled(rng)
	r.logf("graph: %d users, %d follows (%d followers on average, most %d), %d big accounts above %d followers",
		r.graph.Users(), len(edges), r.cfg.AvgFollowers, r.mostFollowers(), len(r.graph.BigAccounts()), r.cfg.BigThreshold)
	start := time.Now()
	var next atomic.Int64
	failed, err := r.parallel(ctx, func(ctx context.Context) (bool, error) {
		i := int(next.Add(1)) - 1
		if i >= len(edges) {
			return false, nil
		}
		pos, err := retry(ctx, func() (uint64, error) {
			return r.api.follow(ctx, edges[i].Follower, edges[i].Followee, true)
		})
		r.noteDone(kindFollow, pos)
		return true, err
	})
	if err != nil {
		return err
	}
	r.report.Setup.Follows = len(edges)
	r.report.Setup.FollowErrors = failed
	r.report.Setup.FollowTime = time.Since(start)
	r.logf("graph: %d follows in %s (%.0f/s), %d failed", len(edges), r.report.Setup.FollowTime.Round(time.Millisecond),
		float64(len(edges))/r.report.Setup.FollowTime.Seconds(), failed)
	if failed > len(edges)/100 {
		return fmt.Errorf("graph: %d of %d follows failed", failed, len(edges))
	}
	waited, err := r.waitApplied(ctx, r.maxPosition.Load(), r.cfg.SetupTimeout)
	if err != nil {
		return fmt.Errorf("graph: %w", err)
	}
	r.logf("graph: projectors caught up %s later", waited.Round(time.Millisecond))
	if err := r.materialise(ctx); err != nil {
		return err
	}
	r.report.Materialised = r.mark(ctx)
	return nil
}

// mark reads the stores' sizes now.
func (r *runner) mark(ctx context.Context) Mark {
	m := Mark{Position: r.maxPosition.Load(), RedisData: -1, PostgresSize: -1}
	if r.target.RedisData != nil {
		if v, err := r.target.RedisData(ctx); err == nil {
			m.RedisData = v
		}
	}
	if r.target.PostgresSize != nil {
		if v, err := r.target.PostgresSize(ctx); err == nil {
			m.PostgresSize = v
		}
	}
	return m
}

func (r *runner) mostFollowers() int {
	most := 0
	for i := range r.graph.Users() {
		most = max(most, len(r.graph.Followers(domain.UserID(i+1))))
	}
	return most
}

// retry tries a setup request up to setupRetries times.
func retry(ctx context.Context, f func() (uint64, error)) (uint64, error) {
	var err error
	for attempt := range setupRetries {
		var pos uint64
		if pos, err = f(); err == nil || ctx.Err() != nil {
			return pos, err
		}
		time.Sleep(time.Duration(attempt+1) * 100 * time.Millisecond)
	}
	return 0, err
}

// parallel runs work from SetupConcurrency goroutines until it reports no more
// (false) or ctx ends; it returns how many calls failed.
func (r *runner) parallel(ctx context.Context, work func(context.Context) (bool, error)) (int, error) {
	var failed atomic.Int64
	var wg sync.WaitGroup
	for range r.cfg.SetupConcurrency {
		wg.Go(func() {
			for ctx.Err() == nil {
				more, err := work(ctx)
				if err != nil {
					failed.Add(1)
				}
				if !more {
					return
				}
			}
		})
	}
	wg.Wait()
	return int(failed.Load()), ctx.Err()
}

// waitApplied waits until both projectors have applied the log up to pos,
// asking the service itself (X-Min-Position on a feed read and on a read
// model read), so it works against any service; it returns how long it
// waited.
func (r *runner) waitApplied(ctx context.Context, pos uint64, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	deadline := start.Add(timeout)
	for {
		_, feedPos, err := r.api.feed(ctx, 1, "", pos)
		if err == nil && feedPos >= pos {
			var rmPos uint64
			rmPos, err = r.api.readModelPosition(ctx, 1, pos)
			if err == nil && rmPos >= pos {
				return time.Since(start), nil
			}
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if err != nil {
			time.Sleep(50 * time.Millisecond) // the feed read did not wait
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = errors.New("still behind")
			}
			return 0, fmt.Errorf("projectors did not reach position %d within %s: %w", pos, timeout, err)
		}
	}
}

// materialise reads every user's feed until a whole pass is served from the
// cache: the first read of a cold inbox comes from Postgres and asks the
// planner to build it.
func (r *runner) materialise(ctx context.Context) error {
	r.setStage("materialise")
	start := time.Now()
	deadline := start.Add(r.cfg.SetupTimeout)
	for pass := 1; ; pass++ {
		before, err := r.api.metrics(ctx)
		if err != nil {
			return fmt.Errorf("materialise: %w", err)
		}
		var next atomic.Int64
		failed, err := r.parallel(ctx, func(ctx context.Context) (bool, error) {
			u := int(next.Add(1))
			if u > r.graph.Users() {
				return false, nil
			}
			_, _, err := r.api.feed(ctx, domain.UserID(u), "", 0)
			return true, err
		})
		if err != nil {
			return err
		}
		after, err := r.api.metrics(ctx)
		if err != nil {
			return fmt.Errorf("materialise: %w", err)
		}
		cold := after.sum(metricPages, "source", "postgres") - before.sum(metricPages, "source", "postgres")
		r.logf("materialise: pass %d: %.0f of %d first pages from Postgres, %d failed", pass, cold, r.graph.Users(), failed)
		if cold == 0 && failed == 0 {
			r.report.Setup.MaterialiseTime = time.Since(start)
			r.report.Setup.MaterialisePasses = pass
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("materialise: %.0f inboxes still cold after %s", cold, r.cfg.SetupTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// metricPages is the service's counter of home feed pages by source.
const metricPages = "feed_home_pages_total"

// mixed runs the warm-up and then the measured mixed phase, back to back,
// with the viewers' streams open throughout.
func (r *runner) mixed(ctx context.Context, rng *rand.Rand) error {
	if r.cfg.Viewers > 0 {
		vctx, stop := context.WithCancel(ctx)
		opened := time.Now()
		v, err := r.openViewers(vctx, rand.New(rand.NewPCG(r.cfg.Seed, 0x57ea)), r.cfg.Viewers)
		if err != nil {
			stop()
			v.close()
			return fmt.Errorf("mixed: open the viewers' streams: %w", err)
		}
		r.logf("mixed: %d viewers' streams open in %s", r.cfg.Viewers, time.Since(opened).Round(time.Millisecond))
		r.viewers = v
		defer func() {
			stop()
			v.close()
			r.report.Streams = StreamsReport{Viewers: r.cfg.Viewers, Events: v.events.Load(), Reconnects: v.reconnects.Load()}
		}()
	}
	start := time.Now().Add(100 * time.Millisecond)
	warm := newPhase("warm-up", start, start.Add(r.cfg.Warmup))
	measured := newPhase("mixed", warm.end, warm.end.Add(r.cfg.Duration))
	r.logf("mixed: %s warm-up, then %s measured: %.0f posts/s, %.0f follows+unfollows/s, %.0f likes/s, %.0f comments/s, %.0f feed reads/s",
		r.cfg.Warmup, r.cfg.Duration, r.cfg.PostRate, r.cfg.FollowRate, r.cfg.LikeRate, r.cfg.CommentRate, r.cfg.ReadRate)
	r.report.Warmup, r.report.Mixed = warm, measured
	return r.runPhases(ctx, rng, []*phase{warm, measured}, r.mixedLoops())
}

// reads runs the read phase: first pages of materialised inboxes only. Each
// user's first page is read once before, unrecorded, so that the phase
// measures pages the service holds (with the viewer's like states of their
// posts), not every user's first read after the mixed phase at once.
func (r *runner) reads(ctx context.Context, rng *rand.Rand) error {
	var next atomic.Int64
	failed, err := r.parallel(ctx, func(ctx context.Context) (bool, error) {
		u := next.Add(1)
		if u > int64(r.graph.Users()) {
			return false, nil
		}
		return true, r.api.firstPage(ctx, domain.UserID(u))
	})
	if err != nil {
		return err
	}
	r.logf("reads: every user's first page read once, unrecorded (%d failed)", failed)
	start := time.Now().Add(100 * time.Millisecond)
	p := newPhase("reads", start, start.Add(r.cfg.ReadDuration))
	r.logf("reads: %s of %.0f cached first pages/s", r.cfg.ReadDuration, r.cfg.CachedReadRate)
	r.report.Reads = p
	loops := []loop{{r.cfg.CachedReadRate, func(rng *rand.Rand) func(time.Time) arrival { return r.planRead(rng, 0) }}}
	return r.runPhases(ctx, rng, []*phase{p}, loops)
}

// runPhases schedules loops over phases, scraping the service's metrics at
// each phase's start and end and telling OnPhase about the measured ones.
func (r *runner) runPhases(ctx context.Context, rng *rand.Rand, phases []*phase, loops []loop) error {
	var wg sync.WaitGroup
	wg.Go(func() { r.schedule(ctx, rng, phases, loops) })
	var errs []error
	for _, p := range phases {
		errs = append(errs, r.atTime(ctx, p.start, func() error {
			r.setStage(p.name)
			r.phaseEvent(p.name, true)
			p.schedBefore = readSched()
			var err error
			p.before, err = r.api.metrics(ctx)
			return err
		}))
		errs = append(errs, r.atTime(ctx, p.end, func() error {
			p.schedAfter = readSched()
			var err error
			p.after, err = r.api.metrics(ctx)
			r.phaseEvent(p.name, false)
			r.logf("%s: %d errors, %d dropped", p.name, p.errors(), p.dropped.Load())
			return err
		}))
	}
	wg.Wait()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return errors.Join(errs...)
}

func (r *runner) phaseEvent(name string, start bool) {
	if r.target.OnPhase != nil && name != "warm-up" {
		r.target.OnPhase(name, start)
	}
}

// atTime runs f at t, or not at all if ctx ends first.
func (r *runner) atTime(ctx context.Context, t time.Time, f func() error) error {
	select {
	case <-ctx.Done():
		return nil
	case <-time.After(time.Until(t)):
		return f()
	}
}

// drain waits for the projectors to apply everything the mixed phase
// appended: how long that takes says whether they kept up.
func (r *runner) drain(ctx context.Context) error {
	r.setStage("drain")
	pos := r.maxPosition.Load()
	took, err := r.waitApplied(ctx, pos, r.cfg.DrainTimeout)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	r.report.DrainPosition = pos
	if err != nil {
		r.report.DrainError = err.Error()
		r.logf("drain: %v", err)
		return nil
	}
	r.report.Drain = took
	r.report.Drained = r.mark(ctx)
	r.logf("drain: the projectors reached position %d %s after the mixed phase", pos, took.Round(time.Millisecond))
	return nil
}
