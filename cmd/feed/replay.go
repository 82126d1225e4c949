package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"github.com/schollz/progressbar/v3"

	"github.com/feedproject/feed/cmd/internal/stack"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	feedhttp "github.com/feedproject/feed/http"
	"github.com/feedproject/feed/projections"
	"github.com/feedproject/feed/projections/activity"
	"github.com/feedproject/feed/projections/feeds"
	"github.com/feedproject/feed/projections/feeds/fanout"
	"github.com/feedproject/feed/projections/feeds/repair"
	"github.com/feedproject/feed/projections/readmodel"
)

// rebuildable are the projectors a rebuild knows, in the order "all" takes.
var rebuildable = []string{readmodel.ProjectorName, fanout.PlannerName, activity.ProjectorName}

// rebuilder rebuilds projectors by replay into a shadow: in the foreground for
// `feed replay`, and in the background of a serving process for the admin
// routes (it implements feedhttp.Rebuilds).
type rebuilder struct {
	log         *events.Log
	databaseURL string
	feeds       *feeds.Store
	js          jetstream.JetStream
	planner     fanout.PlannerConfig
	// activityKeep is the rebuilt activity's (FEED_ACTIVITY_KEEP).
	activityKeep int
	logger       *slog.Logger

	// ctx bounds background rebuilds (the process's life); runs holds the
	// latest of each projector.
	ctx  context.Context
	wg   sync.WaitGroup
	mu   sync.Mutex
	runs map[string]*feedhttp.RebuildStatus
}

// targets resolves a projector name ("all": each).
func targets(name string) ([]string, error) {
	if name == "all" {
		return rebuildable, nil
	}
	for _, n := range rebuildable {
		if n == name {
			return []string{n}, nil
		}
	}
	return nil, fmt.Errorf("unknown projector %q (want readmodel, feeds, activity or all): %w", name, domain.ErrInvalid)
}

// open takes the projector's rebuild lock and opens its shadow.
func (b *rebuilder) open(ctx context.Context, name string, fresh bool) (projections.Shadow, func(), error) {
	switch name {
	case readmodel.ProjectorName:
		rb, err := readmodel.OpenRebuild(ctx, b.databaseURL, fresh, nil)
		if err != nil {
			return nil, nil, err
		}
		return rb, rb.Close, nil
	case activity.ProjectorName:
		rb, err := activity.OpenRebuild(ctx, b.databaseURL, fresh, nil, activity.Config{Keep: b.activityKeep})
		if err != nil {
			return nil, nil, err
		}
		return rb, rb.Close, nil
	case fanout.PlannerName:
		rb, err := repair.OpenRebuild(ctx, b.feeds, b.js, repair.RebuildConfig{Planner: b.planner, Fresh: fresh}, b.logger)
		if err != nil {
			return nil, nil, err
		}
		return rb, rb.Close, nil
	}
	return nil, nil, fmt.Errorf("unknown projector %q: %w", name, domain.ErrInvalid)
}

type opened struct {
	name   string
	shadow projections.Shadow
	close  func()
}

// openAll opens every target's shadow, or none.
func (b *rebuilder) openAll(ctx context.Context, names []string, fresh bool) ([]opened, error) {
	var all []opened
	for _, n := range names {
		s, closeFn, err := b.open(ctx, n, fresh)
		if err != nil {
			for _, o := range all {
				o.close()
			}
			return nil, err
		}
		all = append(all, opened{n, s, closeFn})
	}
	return all, nil
}

// Start implements feedhttp.Rebuilds.
func (b *rebuilder) Start(ctx context.Context, name string, req feedhttp.RebuildRequest) ([]feedhttp.RebuildStatus, error) {
	names, err := targets(name)
	if err != nil {
		return nil, err
	}
	all, err := b.openAll(ctx, names, req.Fresh)
	if err != nil {
		return nil, err
	}
	var started []feedhttp.RebuildStatus
	b.mu.Lock()
	for _, o := range all {
		st := &feedhttp.RebuildStatus{State: feedhttp.RebuildRunning,
			Progress: projections.Progress{Projector: o.name, Phase: projections.PhaseReplaying, Started: time.Now()}}
		b.runs[o.name] = st
		started = append(started, *st)
	}
	b.mu.Unlock()
	b.wg.Go(func() {
		failed := false
		for _, o := range all {
			if failed {
				o.close()
				b.finish(o.name, errors.New("not run: an earlier rebuild failed"))
				continue
			}
			err := projections.Replay(b.ctx, b.log, o.shadow, projections.ReplayOptions{
				FromSeq: req.FromSeq, Since: req.Since,
				Progress: func(p projections.Progress) { b.update(o.name, p) },
			})
			o.close()
			b.finish(o.name, err)
			if err != nil {
				b.logger.Error("rebuild failed", "projector", o.name, "err", err)
				failed = true
			}
		}
	})
	return started, nil
}

func (b *rebuilder) update(name string, p projections.Progress) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.runs[name].Progress = p
}

func (b *rebuilder) finish(name string, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	st := b.runs[name]
	now := time.Now()
	st.Finished = &now
	st.State = feedhttp.RebuildDone
	if err != nil {
		st.State, st.Error = feedhttp.RebuildFailed, err.Error()
	}
}

// Status implements feedhttp.Rebuilds.
func (b *rebuilder) Status(name string) (feedhttp.RebuildStatus, error) {
	if _, err := targets(name); err != nil || name == "all" {
		return feedhttp.RebuildStatus{}, fmt.Errorf("unknown projector %q (want readmodel, feeds or activity): %w", name, domain.ErrInvalid)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	st, ok := b.runs[name]
	if !ok {
		return feedhttp.RebuildStatus{}, fmt.Errorf("no rebuild of %s was started in this process: %w", name, domain.ErrNotFound)
	}
	return *st, nil
}

// wait waits for the background rebuilds, which end with the rebuilder's ctx.
func (b *rebuilder) wait() { b.wg.Wait() }

// replay is `feed replay`: it rebuilds projectors in the foreground with a
// progress bar; Ctrl-C leaves the shadow to resume.
func replay(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fresh := fs.Bool("fresh", false, "discard the shadow an interrupted rebuild left instead of resuming it")
	from := fs.Uint64("from", 0, "start a new shadow at this log sequence (events before it are not applied)")
	since := fs.Duration("since", 0, "start a new shadow at the events of this last duration, e.g. 24h")
	batch := fs.Int("batch", 0, "events per batch (default 0: the projector's own, 8000 for the read model and 1000 for the feeds)")
	quiet := fs.Bool("quiet", false, "no progress bar; a line per phase")
	// Flags may come after the projector name.
	var name string
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		name, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return flagError("replay", err)
	}
	if name == "" && fs.NArg() > 0 {
		name = fs.Arg(0)
	} else if fs.NArg() > 0 {
		return fmt.Errorf("%w: replay: unexpected argument %q", errUsage, fs.Arg(0))
	}
	names, err := targets(name)
	if err != nil {
		return fmt.Errorf("%w: replay: %w", errUsage, err)
	}
	if *from != 0 && *since != 0 {
		return fmt.Errorf("%w: replay: give --from or --since, not both", errUsage)
	}
	if *batch < 0 {
		return fmt.Errorf("%w: replay: --batch must be at least 1, or 0 for the projector's own", errUsage)
	}
	cfg, err := stack.Parse(getenv)
	if err != nil {
		return err
	}
	logger := newLogger(cfg, stderr)
	logRedisThrough(logger)
	b, closeAll, err := connectRebuilder(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer closeAll()
	opts := projections.ReplayOptions{FromSeq: *from, BatchSize: *batch}
	if *since > 0 {
		opts.Since = time.Now().Add(-*since)
	}
	all, err := b.openAll(ctx, names, *fresh)
	if err != nil {
		return err
	}
	defer func() {
		for _, o := range all {
			o.close()
		}
	}()
	for _, o := range all {
		show := newProgressView(stdout, o.name, *quiet)
		opts.Progress = show.update
		err := projections.Replay(ctx, b.log, o.shadow, opts)
		show.done(err)
		if ctx.Err() != nil {
			fmt.Fprintf(stdout, "%s: interrupted; run the same command again to resume\n", o.name)
			return nil
		}
		if err != nil {
			return fmt.Errorf("rebuild %s: %w", o.name, err)
		}
	}
	return nil
}

// connectRebuilder connects to the log, Redis and Postgres of a running
// service the way `feed status` does.
func connectRebuilder(ctx context.Context, cfg stack.Config, logger *slog.Logger) (*rebuilder, func(), error) {
	natsURL := cfg.NATSEndpoint()
	nc, err := nats.Connect(natsURL, nats.Name("feed replay"), nats.Timeout(5*time.Second))
	if err != nil {
		return nil, nil, fmt.Errorf("connect nats %s (is the service running?): %w", natsURL, err)
	}
	closers := []func(){nc.Close}
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	fail := func(err error) (*rebuilder, func(), error) {
		closeAll()
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return fail(fmt.Errorf("jetstream: %w", err))
	}
	log, err := events.AttachLog(ctx, js, events.Config{Name: cfg.StreamName, MaxBatch: 1}, nil)
	if err != nil {
		return fail(err)
	}
	closers = append(closers, log.Close)
	target, err := stack.ParseRedisURL(cfg.RedisEndpoint())
	if err != nil {
		return fail(err)
	}
	rdb := target.ProjectorClient(cfg, projectorTuning, replicaAcksShort(logger, nil))
	closers = append(closers, func() { _ = rdb.Close() })
	if err := rdb.Ping(ctx).Err(); err != nil {
		return fail(fmt.Errorf("ping redis %s: %w", target, err))
	}
	if err := stack.CheckRedisMode(ctx, target, rdb); err != nil {
		return fail(err)
	}
	databaseURL := cfg.DatabaseEndpoint()
	return newRebuilder(ctx, cfg, log, databaseURL, rdb, js, logger), closeAll, nil
}

func newRebuilder(ctx context.Context, cfg stack.Config, log *events.Log, databaseURL string, rdb redis.UniversalClient, js jetstream.JetStream, logger *slog.Logger) *rebuilder {
	return &rebuilder{
		log: log, databaseURL: databaseURL, js: js, logger: logger, ctx: ctx,
		feeds: feeds.NewStore(rdb, feeds.Config{
			InboxCap: cfg.InboxCap, OutboxCap: cfg.OutboxCap, TTL: cfg.InboxTTL, BigThreshold: cfg.BigAccount,
		}),
		planner:      fanout.PlannerConfig{Partitions: cfg.Partitions, PendingWork: cfg.Partitions, Replicas: log.Replicas()},
		activityKeep: cfg.ActivityKeep,
		runs:         map[string]*feedhttp.RebuildStatus{},
	}
}

// progressView shows a rebuild's progress: a bar of events done of the total
// with rate and ETA, or with quiet a line per phase.
type progressView struct {
	w     io.Writer
	name  string
	quiet bool
	bar   *progressbar.ProgressBar
	base  uint64 // events done before this run (a resumed shadow)
	phase string
}

func newProgressView(w io.Writer, name string, quiet bool) *progressView {
	return &progressView{w: w, name: name, quiet: quiet}
}

func (v *progressView) update(p projections.Progress) {
	if v.bar == nil && !v.quiet {
		v.base = p.Done
		if p.Done > 0 {
			fmt.Fprintf(v.w, "%s: resuming the shadow at %d of %d events\n", v.name, p.Done, p.Total)
		}
		v.bar = progressbar.NewOptions64(int64(p.Total-p.Done),
			progressbar.OptionSetWriter(v.w),
			progressbar.OptionSetDescription(v.name+" "+p.Phase),
			progressbar.OptionShowCount(),
			progressbar.OptionShowIts(),
			progressbar.OptionSetItsString("events"),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionSetElapsedTime(true),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionSetWidth(30),
		)
	}
	if p.Phase != v.phase {
		v.phase = p.Phase
		if v.quiet {
			fmt.Fprintf(v.w, "%s: %s at %d of %d events\n", v.name, p.Phase, p.Position, p.Head)
		} else {
			v.bar.Describe(v.name + " " + p.Phase)
		}
	}
	if v.bar != nil && p.Total >= v.base {
		v.bar.ChangeMax64(int64(p.Total - v.base))
		_ = v.bar.Set64(int64(p.Done - min(p.Done, v.base)))
	}
}

func (v *progressView) done(err error) {
	if v.bar != nil {
		if err == nil {
			_ = v.bar.Finish()
		}
		fmt.Fprintln(v.w)
	}
	if err == nil {
		fmt.Fprintf(v.w, "%s: rebuilt and switched\n", v.name)
	}
}
