package loadbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/feedproject/feed/domain"
)

// Config is the workload. Every field must be set; DefaultConfig has the
// values of the targets.
type Config struct {
	// The social graph (see GraphConfig); BigThreshold must be the service's
	// FEED_BIG_ACCOUNT.
	Users, AvgFollowers, BigAccounts, BigThreshold int

	// Arrival rates per second of the mixed phase: posts, follows and
	// unfollows together, likes, comments, and GET /feed.
	PostRate, FollowRate, LikeRate, CommentRate, ReadRate float64
	// BigPostShare is the share of posts written by big accounts (the others
	// are by users drawn uniformly): popular accounts post more than most.
	BigPostShare float64
	// NextPageShare is the share of the mixed phase's feed reads that continue
	// a user's paging from the cursor of their last page.
	NextPageShare float64
	// CachedReadRate is the arrival rate of the read phase: first pages of
	// materialised inboxes only.
	CachedReadRate float64

	// Warmup runs the mixed workload unrecorded; Duration is the measured
	// mixed phase; ReadDuration the read phase; RawDuration each raw limit's
	// measurement; SetupTimeout and DrainTimeout bound the waits for the
	// projectors.
	Warmup, Duration, ReadDuration, RawDuration, SetupTimeout, DrainTimeout time.Duration

	// FreshRate is how many posts per second, of ordinary and (separately) of
	// big authors, have their freshness measured; FreshFollowers how many of
	// each such post's followers are polled; FreshTimeout when a poll gives up.
	FreshRate      float64
	FreshFollowers int
	FreshTimeout   time.Duration

	// Viewers is how many users hold a GET /stream open through the mixed
	// phase (its warm-up included), whose announcements of posts are timed.
	Viewers int

	// SetupConcurrency is the number of requests in flight while building the
	// graph and materialising; MaxInFlight bounds the open-loop requests
	// outstanding at once (an arrival beyond it is counted as dropped).
	SetupConcurrency, MaxInFlight int
	// ImageSide is the side in pixels of each post's PNG.
	ImageSide int
	// Seed makes the graph and the choices of the workload repeatable.
	Seed uint64
}

// DefaultConfig is the workload of the targets: 500 posts/s to 100
// followers on average, every inbox materialised, then 5 000 cached feed
// reads/s.
func DefaultConfig() Config {
	return Config{
		Users: 1000, AvgFollowers: 100, BigAccounts: 5, BigThreshold: 500,
		PostRate: 500, FollowRate: 50, LikeRate: 200, CommentRate: 50, ReadRate: 500,
		BigPostShare: 0.02, NextPageShare: 0.3, CachedReadRate: 5000,
		Warmup: 10 * time.Second, Duration: 60 * time.Second, ReadDuration: 20 * time.Second,
		RawDuration: 3 * time.Second, SetupTimeout: 5 * time.Minute, DrainTimeout: time.Minute,
		FreshRate: 10, FreshFollowers: 1, FreshTimeout: 10 * time.Second, Viewers: 100,
		SetupConcurrency: 512, MaxInFlight: 4096, ImageSide: 24, Seed: 1,
	}
}

// Validate says what is wrong with the configuration, the graph's shape
// included, before anything runs.
func (c Config) Validate() error {
	var errs []error
	positive := func(name string, v float64) {
		if v <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, not %v", name, v))
		}
	}
	for name, v := range map[string]float64{
		"post rate": c.PostRate, "read rate": c.ReadRate, "cached read rate": c.CachedReadRate,
		"duration": c.Duration.Seconds(), "read duration": c.ReadDuration.Seconds(), "raw duration": c.RawDuration.Seconds(),
		"setup timeout": c.SetupTimeout.Seconds(), "drain timeout": c.DrainTimeout.Seconds(),
		"freshness rate": c.FreshRate, "freshness timeout": c.FreshTimeout.Seconds(),
		"freshness followers": float64(c.FreshFollowers), "setup concurrency": float64(c.SetupConcurrency),
		"max in flight": float64(c.MaxInFlight), "image side": float64(c.ImageSide),
	} {
		positive(name, v)
	}
	for name, v := range map[string]float64{
		"follow rate": c.FollowRate, "like rate": c.LikeRate, "comment rate": c.CommentRate, "warm-up": c.Warmup.Seconds(),
		"viewers": float64(c.Viewers),
	} {
		if v < 0 {
			errs = append(errs, fmt.Errorf("%s must not be negative, not %v", name, v))
		}
	}
	for name, v := range map[string]float64{"next-page share": c.NextPageShare, "big-post share": c.BigPostShare} {
		if v < 0 || v > 1 {
			errs = append(errs, fmt.Errorf("%s %v is not between 0 and 1", name, v))
		}
	}
	if _, err := followerCounts(c.graphConfig()); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (c Config) graphConfig() GraphConfig {
	return GraphConfig{Users: c.Users, AvgFollowers: c.AvgFollowers, Big: c.BigAccounts, BigThreshold: c.BigThreshold}
}

// Positions is how far the log and the projectors are, at one instant.
type Positions struct {
	// Head is the log's last sequence.
	Head uint64
	// ReadModel is the read model's checkpoint; Planned the feed planner's;
	// Applied how far the feed appliers have applied the planner's work.
	ReadModel, Planned, Applied uint64
	// FanoutSeq is the last sequence of the planner's work stream (messages
	// ever published to it); FanoutBacklog the messages not yet applied.
	FanoutSeq, FanoutBacklog uint64
}

// Target is the service under load and what the bench may observe of it
// besides its HTTP contract. Optional fields left nil are reported as
// unavailable (lag then comes from the service's /metrics).
type Target struct {
	// BaseURL is the service, e.g. http://127.0.0.1:8080 (loopback only).
	BaseURL string
	// Token mints a bearer token for a user.
	Token func(domain.UserID) (string, error)
	// Positions samples the log and projector positions (as `feed status`).
	Positions func(context.Context) (Positions, error)
	// RedisMemory is Redis' used_memory; PostgresSize the database's size.
	RedisMemory  func(context.Context) (int64, error)
	PostgresSize func(context.Context) (int64, error)
	// RedisData is used_memory without the clients' buffers.
	RedisData func(context.Context) (int64, error)
	// RedisCPU and PostgresCPU are the CPU time the servers have used.
	RedisCPU, PostgresCPU func(context.Context) (time.Duration, error)
	// NATSCPU and NATSMemory are the CPU time and the resident memory of the
	// NATS server when it runs on this machine as a process of its own (the
	// service's child `feed nats`); nil when it is not known.
	NATSCPU    func(context.Context) (time.Duration, error)
	NATSMemory func(context.Context) (int64, error)
	// Redis and JetStream are the servers the raw limits are measured on.
	Redis     redis.UniversalClient
	JetStream jetstream.JetStream
	// Stack describes the service for the report (how it was started, its
	// settings).
	Stack string
	// OnPhase is told when a measured phase ("mixed", "reads") starts and
	// ends, e.g. to profile it.
	OnPhase func(phase string, start bool)
	// Progress receives a line per step; nil discards them.
	Progress io.Writer
}

// Run builds the graph, materialises every inbox, measures the raw limits,
// runs the warm-up, the mixed phase and the read phase, and reports. It stops
// by itself; cancelling ctx stops it early with ctx's error.
func Run(ctx context.Context, cfg Config, target Target) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("bench configuration: %w", err)
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x5eed))
	graph, err := NewGraph(cfg.graphConfig(), rng)
	if err != nil {
		return nil, err
	}
	tokens := make([]string, cfg.Users)
	for i := range tokens {
		if tokens[i], err = target.Token(domain.UserID(i + 1)); err != nil {
			return nil, fmt.Errorf("token for user %d: %w", i+1, err)
		}
	}
	images, err := noiseImages(64, cfg.ImageSide, rng)
	if err != nil {
		return nil, err
	}
	progress := target.Progress
	if progress == nil {
		progress = io.Discard
	}
	api, err := newClient(target.BaseURL, tokens, cfg.MaxInFlight)
	if err != nil {
		return nil, err
	}
	r := &runner{
		cfg: cfg, target: target, graph: graph, images: images, progress: progress,
		api:     api,
		slots:   make(chan struct{}, cfg.MaxInFlight),
		fresh:   make(chan struct{}, 256),
		cursors: make([]string, cfg.Users),
		posts:   newRecentPosts(4096),
		report: &Report{Config: cfg, Stack: target.Stack, Started: time.Now(),
			MachineNotes: damonNotes(os.DirFS("/"))},
	}
	defer r.api.close()
	return r.run(ctx, rng)
}

func (r *runner) run(ctx context.Context, rng *rand.Rand) (*Report, error) {
	if err := r.waitReady(ctx, time.Minute); err != nil {
		return nil, err
	}
	smp := startSampler(ctx, r)
	defer smp.stop()

	r.setStage("raw limits")
	r.logf("raw limits: %s each", r.cfg.RawDuration)
	r.report.Raw = measureRaw(ctx, r.target, r.cfg.RawDuration)
	if err := r.setup(ctx, rng); err != nil {
		return nil, err
	}
	if err := r.mixed(ctx, rng); err != nil {
		return nil, err
	}
	if err := r.drain(ctx); err != nil {
		return nil, err
	}
	if err := r.reads(ctx, rng); err != nil {
		return nil, err
	}
	r.report.Samples = smp.stop()
	r.report.Finished = time.Now()
	return r.report, nil
}

func (r *runner) logf(format string, args ...any) {
	at := time.Since(r.report.Started).Seconds()
	fmt.Fprintf(r.progress, "bench: %6.1fs "+format+"\n", append([]any{at}, args...)...)
}

// waitReady waits for the service's /readyz.
func (r *runner) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := r.api.ready(ctx)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("service at %s not ready after %s: %w", r.target.BaseURL, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
