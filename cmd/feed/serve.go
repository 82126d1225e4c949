package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/feedproject/feed/cmd/internal/stack"
	"github.com/feedproject/feed/cmd/localstack"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	feedhttp "github.com/feedproject/feed/http"
	"github.com/feedproject/feed/http/media"
	"github.com/feedproject/feed/migrations"
	"github.com/feedproject/feed/projections"
	"github.com/feedproject/feed/projections/activity"
	"github.com/feedproject/feed/projections/feeds"
	"github.com/feedproject/feed/projections/feeds/fanout"
	"github.com/feedproject/feed/projections/feeds/homefeed"
	"github.com/feedproject/feed/projections/feeds/inbox"
	"github.com/feedproject/feed/projections/feeds/presence"
	"github.com/feedproject/feed/projections/feeds/repair"
	"github.com/feedproject/feed/projections/lease"
	"github.com/feedproject/feed/projections/readmodel"
)

// infra is the connected dependencies of one process and how to let go of them.
type infra struct {
	nc  *nats.Conn
	js  jetstream.JetStream
	log *events.Log
	// redis is the projectors' (long timeouts, no client retries): one
	// server's client, or a Redis Cluster's.
	redis redis.UniversalClient
	// readRedis serves reads: short timeouts, so an outage is a prompt fall-back.
	readRedis redis.UniversalClient
	// readOpts made it, for the clients of the page cache; nil on a Redis
	// Cluster, where there is no page cache.
	readOpts *redis.Options
	pg       *pgxpool.Pool // the reads'
	// projectorPG is the read model projector's, apart from the reads'
	// (projectorConns).
	projectorPG *pgxpool.Pool
	// databaseURL is Postgres's (a rebuild opens connections of its own).
	databaseURL string
	closers     []func() // run in reverse order by close
	// failed receives from each supervisor of a child server once it gave up.
	failed []<-chan error
}

// supervise keeps the child server first, started by start, running (see
// localstack.Supervisor) until the infrastructure is closed.
func (in *infra) supervise(name string, first localstack.Server, start func(context.Context) (localstack.Server, error), logger *slog.Logger) {
	sup := localstack.Supervise(name, first, start, localstack.SupervisorConfig{}, logger)
	in.closers = append(in.closers, func() { logStop(logger, name, sup.Stop()) })
	in.failed = append(in.failed, sup.Failed())
}

func (in *infra) close() {
	for i := len(in.closers) - 1; i >= 0; i-- {
		in.closers[i]()
	}
	in.closers = nil
}

// startInfra brings up (dev: starts) and connects to NATS, Redis and Postgres,
// applies migrations and opens the event log. On error everything already started
// is stopped again.
func startInfra(ctx context.Context, cfg stack.Config, dev bool, logger *slog.Logger, reg prometheus.Registerer) (_ *infra, err error) {
	in := &infra{}
	defer func() {
		if err != nil {
			in.close()
		}
	}()

	natsOpts := []nats.Option{
		nats.Name("feed"),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		// No buffering while disconnected: a command answered 503 must not be
		// appended later when the connection comes back.
		nats.ReconnectBufSize(-1),
		// A server that stops answering (frozen, or cut off without a reset)
		// is left for another within about 6 s, not the 2-minute default.
		nats.PingInterval(2 * time.Second),
		nats.MaxPingsOutstanding(3),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				logger.Warn("nats disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) { logger.Info("nats reconnected", "url", c.ConnectedUrlRedacted()) }),
	}
	natsURL := cfg.NATSURL
	if natsURL == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("start nats: find this binary: %w", err)
		}
		ns, err := localstack.StartNATSProcess(ctx, []string{exe, "nats"}, natsConfig(cfg), logger)
		if err != nil {
			return nil, err
		}
		in.supervise("nats", ns, func(ctx context.Context) (localstack.Server, error) {
			c := natsConfig(cfg)
			c.Port = ns.Port() // where clients reconnect
			return localstack.StartNATSProcess(ctx, []string{exe, "nats"}, c, logger)
		}, logger)
		natsURL = ns.ClientURL()
	}

	redisURL, databaseURL := cfg.RedisURL, cfg.DatabaseURL
	if dev && redisURL == "" {
		rcfg := devRedisConfig(cfg)
		r, err := localstack.StartRedis(ctx, rcfg, logger)
		if err != nil {
			return nil, err
		}
		rcfg.Port = r.Port()
		in.supervise("redis", r, func(ctx context.Context) (localstack.Server, error) {
			return localstack.StartRedis(ctx, rcfg, logger)
		}, logger)
		redisURL = r.URL()
	}
	if dev && databaseURL == "" {
		pcfg := localstack.PostgresConfig{
			Dir:     filepath.Join(cfg.DataDir, "postgres"),
			Port:    cfg.DevPGPort,
			Durable: true,
		}
		p, err := localstack.StartPostgres(ctx, pcfg, logger)
		if err != nil {
			return nil, err
		}
		pcfg.Port = p.Port()
		in.supervise("postgres", p, func(ctx context.Context) (localstack.Server, error) {
			return localstack.StartPostgres(ctx, pcfg, logger)
		}, logger)
		databaseURL = p.URL()
	}
	if redisURL == "" || databaseURL == "" {
		return nil, errors.New("REDIS_URL and DATABASE_URL must be set for serve (or use `feed dev`, which starts local ones)")
	}

	if in.nc, err = nats.Connect(natsURL, natsOpts...); err != nil {
		return nil, fmt.Errorf("connect nats %s: %w", natsURL, err)
	}
	in.closers = append(in.closers, func() { _ = in.nc.Drain() })
	if in.js, err = jetstream.New(in.nc); err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}

	target, err := stack.ParseRedisURL(redisURL)
	if err != nil {
		return nil, err
	}
	// Two clients, because the two uses want opposite timeouts (see
	// projectorTuning and readerTuning).
	in.redis = target.ProjectorClient(cfg, projectorTuning, replicaAcksShort(logger, reg))
	in.closers = append(in.closers, func() { _ = in.redis.Close() })
	if err := in.redis.Ping(ctx).Err(); err != nil {
		return nil, fmt.Errorf("ping redis %s: %w", target, err)
	}
	if err := stack.CheckRedisMode(ctx, target, in.redis); err != nil {
		return nil, err
	}
	if target.IsCluster() {
		logger.Info("redis is a cluster", "seeds", target.String())
	}
	in.readRedis = target.Client(readerTuning)
	in.readOpts = target.NodeOptions(readerTuning)
	in.closers = append(in.closers, func() { _ = in.readRedis.Close() })

	if err := migrations.Up(ctx, databaseURL, migrations.Schema); err != nil {
		return nil, err
	}
	if err := migrations.UpActivity(ctx, databaseURL, migrations.ActivitySchema); err != nil {
		return nil, err
	}
	in.databaseURL = databaseURL
	if in.pg, err = readmodel.OpenPool(ctx, databaseURL, migrations.Schema, 0); err != nil {
		return nil, err
	}
	in.closers = append(in.closers, in.pg.Close)
	if err := in.pg.Ping(ctx); err != nil {
		return nil, fmt.Errorf("ping postgres: %w", err)
	}
	if in.projectorPG, err = readmodel.OpenPool(ctx, databaseURL, migrations.Schema, projectorConns); err != nil {
		return nil, err
	}
	in.closers = append(in.closers, in.projectorPG.Close)

	maxBatch := 0 // group commit
	if cfg.NATSURL == "" && cfg.NATSSync != "always" {
		// Without a sync per write there is nothing to share, and atomic batches
		// cost the server more than single appends.
		maxBatch = 1
	}
	in.log, err = events.OpenLog(ctx, in.js, events.Config{
		Name:        cfg.StreamName,
		Replicas:    cfg.Replicas,
		DedupWindow: cfg.DedupWindow,
		MaxBatch:    maxBatch,
		Logger:      logger,
	}, events.NewMetrics(reg))
	if err != nil {
		return nil, err
	}
	in.closers = append(in.closers, in.log.Close)
	return in, nil
}

// replicaAcksShort counts and logs, at most once a minute per node, the
// writes that returned without the replicas they asked for.
func replicaAcksShort(logger *slog.Logger, reg prometheus.Registerer) func(addr string) {
	short := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "feed_redis_replica_acks_short_total",
		Help: "Times a Redis node's replicas did not acknowledge a projector's write within 1 s (FEED_REDIS_REPLICA_ACKS); its writes then stop waiting for 5 s, and a failover meanwhile may lose them.",
	}, []string{"node"})
	if reg != nil {
		reg.MustRegister(short)
	}
	var mu sync.Mutex
	logged := map[string]time.Time{}
	return func(addr string) {
		short.WithLabelValues(addr).Inc()
		mu.Lock()
		defer mu.Unlock()
		if time.Since(logged[addr]) > time.Minute {
			logged[addr] = time.Now()
			logger.Warn("redis replicas did not acknowledge writes in time; writing without waiting for them meanwhile", "node", addr)
		}
	}
}

// projectorTuning is the projectors' Redis client's. Their scripts may run
// long (materialising hundreds of inboxes in one pipeline), and a client
// that times out resends the whole pipeline, so it waits long and never
// retries by itself (a failed message is retried by the applier, whose inbox
// guard makes that safe).
var projectorTuning = stack.RedisTuning{ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second, MaxRetries: -1}

// readerTuning is the Redis client's that serves reads, which an outage must
// turn into a prompt read of Postgres rather than seconds per page: short
// timeouts, one retry (a pooled connection Redis closed fails once, and the
// retry dials a new one) made at once, and one attempt a dial (decision 44
// has the measurement).
var readerTuning = stack.RedisTuning{
	DialTimeout: 500 * time.Millisecond, ReadTimeout: time.Second, WriteTimeout: time.Second,
	MaxRetries: 1, MinRetryBackoff: -1, DialerRetries: 1,
}

// devRedisNice is the child Redis's niceness in development mode: every
// projector and feed read waits on Redis's one command thread, which on a
// small machine shared with the service and Postgres gets less than its share
// of a CPU at niceness 0 (decision 24). A deployment gives Redis cores of its
// own instead.
const devRedisNice = -5

// devRedisConfig is the child Redis of development mode: persistent, in the
// data directory, at devRedisNice, and under SCHED_FIFO only when
// FEED_DEV_REDIS_REALTIME asks (a realtime thread can take a core from
// everything else on a laptop; decision 56).
func devRedisConfig(cfg stack.Config) localstack.RedisConfig {
	return localstack.RedisConfig{
		Dir:     filepath.Join(cfg.DataDir, "redis"),
		Port:    cfg.DevRedisPort,
		Persist: true,
		// Inboxes stay compact listpacks up to this many entries.
		ZSetListpackEntries: listpackEntries(cfg),
		Realtime:            cfg.DevRedisRealtime,
		Nice:                devRedisNice,
	}
}

// feedFallbacks is how many reads of the pull feed GET /feed makes at once,
// of a read pool of conns connections: half of them, so that a cache outage
// leaves the other half to the profiles, posts and hydration that read
// Postgres in any case.
func feedFallbacks(conns int32) int { return max(1, int(conns)/2) }

// projectorConns is the size of the read model projector's pool: one batch
// at a time, and a connection spare. Were it to share the reads' pool, it
// would queue behind every read for a connection: at 500 feed reads/s on the
// bench, batches waited seconds for one, the read model fell behind the
// feeds, and reads timed out waiting for it to hydrate their pages.
const projectorConns = 2

// listpackEntries is Redis' zset-max-listpack-entries for the feeds: above the
// inbox cap and a small inbox's five bookkeeping members, so every inbox stays
// a listpack.
func listpackEntries(cfg stack.Config) int { return max(1024, cfg.InboxCap+5) }

// natsConfig is the NATS server that serve and dev run when NATS_URL is unset:
// `feed nats`, a process of its own (localstack.StartNATSProcess).
func natsConfig(cfg stack.Config) localstack.NATSConfig {
	return localstack.NATSConfig{
		Dir:          filepath.Join(cfg.DataDir, "nats"),
		Port:         cfg.NATSPort,
		SyncAlways:   cfg.NATSSync == "always",
		SyncInterval: syncInterval(cfg.NATSSync),
	}
}

func syncInterval(s string) time.Duration {
	d, _ := time.ParseDuration(s) // validated by stack.Parse; "always" gives 0
	return d
}

func logStop(logger *slog.Logger, what string, err error) {
	if err != nil {
		logger.Warn("stop "+what, "err", err)
	}
}

// serve runs the configured roles until ctx ends, then shuts down in order: stop
// taking requests, finish in-flight work, disconnect, stop child processes.
func serve(ctx context.Context, cfg stack.Config, dev bool, logger *slog.Logger, stdout io.Writer) error {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		// Besides the defaults: go_gc_heap_live_bytes, what the last
		// collection found live, the heap's own size whatever GOGC lets it
		// grow to; and go_sched_latencies_seconds, how long goroutines waited
		// for a CPU once runnable (a request's wait before its handler runs).
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(
			collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/gc/heap/live:bytes$|^/sched/latencies:seconds$`)})),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	in, err := startInfra(ctx, cfg, dev, logger, reg)
	if err != nil {
		return err
	}
	defer in.close()

	secret, err := cfg.TokenSecret(dev)
	if err != nil {
		return err
	}
	auth, err := feedhttp.NewAuthenticator(secret, nil)
	if err != nil {
		return fmt.Errorf("FEED_JWT_SECRET: %w", err)
	}
	if secret == stack.DevJWTSecret {
		logger.Warn("using the development JWT secret; set FEED_JWT_SECRET outside development")
	}
	ids, err := domain.NewIDGenerator(cfg.NodeID)
	if err != nil {
		return fmt.Errorf("FEED_NODE_ID: %w", err)
	}
	// The media store is the api role's: one process at a time may open a
	// pack directory; every replica shares an object store.
	api := slices.Contains(cfg.Roles, stack.RoleAPI)
	var store interface {
		media.Store
		media.Collectable
	}
	if api {
		if store, err = openMedia(ctx, cfg, in, logger); err != nil {
			return err
		}
		if c, ok := store.(io.Closer); ok {
			defer func() { _ = c.Close() }()
		}
	}

	checks := []feedhttp.Check{
		{Name: "log", Probe: func(ctx context.Context) error { _, err := in.log.Head(ctx); return err }},
		// Every master: on a cluster a ping without a key goes to any one.
		{Name: "redis", Probe: func(ctx context.Context) error {
			return stack.ForEachMaster(ctx, in.readRedis, func(ctx context.Context, c *redis.Client) error { return c.Ping(ctx).Err() })
		}},
		{Name: "postgres", Probe: in.pg.Ping},
	}
	projMetrics := projections.NewMetrics(reg)
	leases, err := openLeases(ctx, cfg, in, reg, logger)
	if err != nil {
		return err
	}
	// roles are the projector roles this process runs under their leases:
	// one process active in each, the others standing by.
	var roles []projectorRole
	if slices.Contains(cfg.Roles, stack.RoleReadModel) {
		proj := readmodel.NewProjector(in.projectorPG, projMetrics)
		roles = append(roles, projectorRole{
			name:   stack.RoleReadModel,
			runner: projections.NewRunner(in.log, proj, projections.RunnerConfig{}, projMetrics, logger),
			fenced: proj,
		})
	}
	if slices.Contains(cfg.Roles, stack.RoleActivity) {
		// A pool of its own, as the read model projector's (projectorConns).
		pool, err := readmodel.OpenPool(ctx, in.databaseURL, migrations.ActivitySchema, projectorConns)
		if err != nil {
			return err
		}
		defer pool.Close()
		proj := activity.NewProjector(pool, projMetrics, activity.Config{Keep: cfg.ActivityKeep})
		roles = append(roles, projectorRole{
			name:   stack.RoleActivity,
			runner: projections.NewRunner(in.log, proj, projections.RunnerConfig{}, projMetrics, logger),
			fenced: proj,
		})
	}
	feedStore := feeds.NewStore(in.redis, feeds.Config{
		InboxCap: cfg.InboxCap, OutboxCap: cfg.OutboxCap, TTL: cfg.InboxTTL, BigThreshold: cfg.BigAccount,
	})
	if err := inbox.LoadFunctions(ctx, feedStore); errors.Is(err, feeds.ErrRedisTooOld) {
		return err
	} else if err != nil {
		logger.Warn("cannot load the feeds' Lua functions; each call will try again", "err", err)
	}
	checkRedisSettings(ctx, in.redis, feedStore.Config(), logger)
	var (
		planner  *fanout.Planner
		appliers *fanout.Applier
	)
	if slices.Contains(cfg.Roles, stack.RolePlanner) || slices.Contains(cfg.Roles, stack.RoleAppliers) {
		planner = fanout.NewPlanner(feedStore, in.js, fanout.PlannerConfig{Partitions: cfg.Partitions, PendingWork: cfg.Partitions, Replicas: in.log.Replicas()}, projMetrics)
		if err := events.RetryUnavailable(ctx, logger, "create or update stream "+fanout.FanoutStream, func() error {
			return planner.EnsureStream(ctx)
		}); err != nil {
			return err
		}
	}
	if slices.Contains(cfg.Roles, stack.RolePlanner) {
		maintenance := repair.NewMaintenance(in.redis, feedStore, planner, repair.MaintenanceConfig{Batch: cfg.MaintenanceRate}, logger)
		// Viewers with a live stream get their inboxes' work first.
		online := presence.New(in.redis, presence.Config{}).Watch(0)
		planner.ServeFirst(online)
		roles = append(roles, projectorRole{
			name:   stack.RolePlanner,
			runner: projections.NewRunner(in.log, planner, projections.RunnerConfig{}, projMetrics, logger),
			fenced: planner,
			// Materialising and maintenance read the graph the planner
			// changes: the active planner's process alone runs them, between
			// its batches.
			beside: []func(context.Context) error{
				func(ctx context.Context) error { return materialiseLoop(ctx, planner, logger) },
				maintenance.Run,
				online.Run,
			},
		})
	}
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "feed_inbox_repairs_total",
		Help: "Inbox entries the maintenance round had to repair (ghosts, missing posts, over-long inboxes); zero in a correct system.",
	}, func() float64 { return float64(feedStore.Repairs()) }))
	if slices.Contains(cfg.Roles, stack.RoleAppliers) {
		// The partitions this process takes are its share (lease.Share).
		appliers = fanout.NewApplier(feedStore, in.js, nil, projMetrics, logger)
		checks = append(checks, feedhttp.Check{
			Name: "projector:" + fanout.AppliersName,
			Probe: func(context.Context) error {
				if held := len(leases.State(stack.RoleAppliers).Partitions); appliers.Consuming() < held {
					return fmt.Errorf("feed appliers consuming %d of the %d partitions held: %w", appliers.Consuming(), held, domain.ErrUnavailable)
				}
				return nil
			},
			Role: func() any { return leases.State(stack.RoleAppliers) },
		})
	}
	for _, r := range roles {
		checks = append(checks, feedhttp.Check{
			Name: "projector:" + r.runner.Name(),
			Probe: func(context.Context) error {
				// A standby serves its purpose: ready to take over.
				if leases.State(r.name).State == lease.Active && !r.runner.Running() {
					return fmt.Errorf("projector not consuming: %w", domain.ErrUnavailable)
				}
				return nil
			},
			Role: func() any { return leases.State(r.name) },
		})
	}
	readStore := readmodel.NewStore(in.pg)
	var activityStore *activity.Store
	if api {
		pool, err := readmodel.OpenPool(ctx, in.databaseURL, migrations.ActivitySchema, 0)
		if err != nil {
			return err
		}
		defer pool.Close()
		activityStore = activity.NewStore(pool)
	}
	var postCache *readmodel.Cache
	if cfg.PostCache > 0 {
		postCache = readmodel.NewCache(readStore, in.log, readmodel.CacheConfig{Posts: cfg.PostCache, Likes: 5 * cfg.PostCache}, reg, logger)
	}
	reader := homefeed.NewReader(feeds.NewStore(in.readRedis, feedStore.Config()), in.js)
	var feedCache feedhttp.HomeFeedCache = reader
	var pageCache *homefeed.PageCache
	switch {
	case cfg.PageCache > 0 && in.readOpts == nil:
		logger.Info("no page cache on a Redis Cluster: every home feed page is read from Redis", "FEED_PAGE_CACHE", cfg.PageCache)
	case cfg.PageCache > 0:
		pageCache = homefeed.NewPageCache(reader, in.readOpts, homefeed.PageCacheConfig{Pages: cfg.PageCache}, reg, logger)
		feedCache = pageCache
	}
	// Rebuilds started by the admin routes stop with the process, leaving their
	// shadows to resume; they are waited for before the connections close.
	rebuilds := newRebuilder(ctx, cfg, in.log, in.databaseURL, in.redis, in.js, logger)
	defer rebuilds.wait()
	var collector *media.Collector
	if api {
		collector = media.NewCollector(store, in.log, readStore,
			media.CollectorConfig{Grace: cfg.MediaGrace, Interval: cfg.MediaCollectInterval}, logger)
	}
	deps := feedhttp.Deps{
		Logger:     logger,
		Registerer: reg,
		Gatherer:   reg,
		Checks:     checks,
		Log:        in.log,
		Media:      store,
		Auth:       auth,
		IDs:        ids,
		ReadModel:  readStore,
		FeedCache:  feedCache,
		FeedModel:  readStore,
		Rebuilds:   rebuilds,
	}
	if activityStore != nil {
		deps.Activity = activityStore
	}
	if collector != nil {
		deps.MediaCollector = collector
	}
	if postCache != nil {
		deps.FeedPosts = postCache
	}
	if api {
		deps.Streams = feedhttp.NewStreams(feedhttp.StreamDeps{
			Log: in.log, Posts: deps.FeedPosts, Registerer: reg, Logger: logger,
			Activity: feedhttp.NewStreamActivity(activityStore, cfg.ConsistencyWait, logger),
			Presence: presence.New(in.redis, presence.Config{}),
		}, feedhttp.StreamConfig{Window: cfg.ResumeWindow})
	}
	srv := feedhttp.NewServer(deps, feedhttp.Config{
		ConsistencyWait: cfg.ConsistencyWait,
		FeedFallbacks:   feedFallbacks(in.pg.Config().MaxConns),
		OperationsOnly:  !api,
	})
	if api && cfg.ServesWebPage(dev) {
		srv.ServeWebPage(auth, devSignIn(cfg, dev))
	}

	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.HTTPAddr, err)
	}
	logger.Info("feed serving", "http", ln.Addr().String(), "roles", cfg.Roles)
	if dev {
		fmt.Fprintf(stdout, "feed is up: http://%s (readyz: /readyz); Ctrl-C stops everything\n", displayAddr(ln.Addr()))
	}

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return srv.Serve(ln) })
	// A child server that keeps dying stops the process, which says why.
	for _, failed := range in.failed {
		g.Go(func() error {
			select {
			case err := <-failed:
				return err
			case <-gctx.Done():
				return nil
			}
		})
	}
	if postCache != nil {
		g.Go(func() error { return postCache.Run(gctx) })
	}
	if pageCache != nil {
		g.Go(func() error { return pageCache.Run(gctx) })
	}
	if deps.Streams != nil {
		g.Go(func() error { return deps.Streams.Run(gctx) })
	}
	if collector != nil && cfg.MediaCollectInterval > 0 {
		g.Go(func() error { return collector.Run(gctx) })
	}
	// Projectors stop after the API has drained, each finishing its batch.
	projCtx, stopProjectors := context.WithCancel(context.WithoutCancel(ctx))
	defer stopProjectors()
	for _, r := range roles {
		g.Go(func() error { return leases.Hold(projCtx, r.name, r.run) })
	}
	if appliers != nil {
		g.Go(func() error {
			return leases.Share(projCtx, stack.RoleAppliers, cfg.Partitions, func(ctx context.Context, part int) {
				_ = appliers.RunPartition(ctx, part)
			})
		})
	}
	g.Go(func() error {
		<-gctx.Done()
		defer stopProjectors()
		shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout)
		defer cancel()
		logger.Info("shutting down")
		return srv.Shutdown(shutdownCtx)
	})
	err = g.Wait()
	if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}

// projectorRole is a projector role run under its lease: its runner, and
// what runs beside it, while this process is the role's active one.
type projectorRole struct {
	name   string
	runner *projections.Runner
	fenced projections.Fenced
	beside []func(context.Context) error
}

// run runs the role for one term of its lease, whose epoch fences the
// projector's writes, until ctx ends.
func (r projectorRole) run(ctx context.Context, epoch uint64) error {
	r.fenced.Fence(epoch)
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return r.runner.Run(ctx) })
	for _, f := range r.beside {
		g.Go(func() error { return f(ctx) })
	}
	return g.Wait()
}

// openLeases makes the lease bucket, as the streams are made (waiting out a
// cluster without quorum), and returns this process's leases; nil for a
// process that runs no projector role.
func openLeases(ctx context.Context, cfg stack.Config, in *infra, reg prometheus.Registerer, logger *slog.Logger) (*lease.Leases, error) {
	if !slices.ContainsFunc(cfg.Roles, func(r string) bool { return r != stack.RoleAPI }) {
		return nil, nil
	}
	var kv jetstream.KeyValue
	err := events.RetryUnavailable(ctx, logger, "create or update the lease bucket "+lease.Bucket, func() error {
		var err error
		kv, err = lease.EnsureBucket(ctx, in.js, cfg.LeaseTTL, in.log.Replicas())
		return err
	})
	if err != nil {
		return nil, err
	}
	leases := lease.New(kv, lease.Config{TTL: cfg.LeaseTTL}, lease.NewMetrics(reg), logger)
	logger.Info("projector roles run under leases", "process", leases.Process(), "lease_ttl", cfg.LeaseTTL)
	return leases, nil
}

// materialiseLoop builds the inboxes readers ask for, between the planner's
// batches, until ctx ends.
func materialiseLoop(ctx context.Context, planner *fanout.Planner, logger *slog.Logger) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		for {
			n, err := planner.Materialise(ctx, 100)
			if err != nil {
				logger.Warn("materialise inboxes", "err", err)
				break
			}
			if n < 100 {
				break
			}
		}
	}
}

func displayAddr(a net.Addr) string {
	tcp, ok := a.(*net.TCPAddr)
	if ok && tcp.IP.IsUnspecified() {
		return fmt.Sprintf("127.0.0.1:%d", tcp.Port)
	}
	return a.String()
}

// checkRedisSettings warns of the Redis settings that cost the feeds memory
// or correctness: on one server, or on every master of a cluster, each of
// which holds its share of the inboxes.
func checkRedisSettings(ctx context.Context, rdb redis.UniversalClient, conf feeds.Config, logger *slog.Logger) {
	err := stack.ForEachMaster(ctx, rdb, func(ctx context.Context, node *redis.Client) error {
		log := logger.With("redis", node.Options().Addr)
		store := feeds.NewStore(node, conf)
		if n, err := store.CheckListpack(ctx); err != nil {
			log.Warn("cannot read zset-max-listpack-entries", "err", err)
		} else if n < int64(conf.InboxCap+5) {
			log.Warn("Redis zset-max-listpack-entries is below the inbox cap: inboxes will use several times the memory; raise it",
				"zset_max_listpack_entries", n, "want_at_least", conf.InboxCap+5)
		}
		if evicts, policy, err := store.CheckEviction(ctx); err != nil {
			log.Warn("cannot read maxmemory-policy", "err", err)
		} else if evicts {
			log.Warn("Redis may evict keys: an evicted part of an inbox leaves a gap in a home feed; set maxmemory-policy noeviction",
				"maxmemory_policy", policy)
		}
		return nil
	})
	if err != nil {
		logger.Warn("cannot check the Redis settings", "err", err)
	}
}

// openMedia opens the media store FEED_MEDIA_STORE names. The object store's
// bucket is replicated as the event stream is, and made or updated as the
// streams are: waiting out a cluster without quorum.
func openMedia(ctx context.Context, cfg stack.Config, in *infra, logger *slog.Logger) (interface {
	media.Store
	media.Collectable
}, error) {
	if cfg.MediaStore != stack.MediaObjectStore {
		return media.NewPack(filepath.Join(cfg.DataDir, "media"))
	}
	var o *media.ObjectStore
	err := events.RetryUnavailable(ctx, logger, "create or update the media bucket", func() error {
		var err error
		o, err = media.NewObjectStore(ctx, in.js, media.ObjectStoreConfig{Replicas: in.log.Replicas()})
		return events.Classify(err)
	})
	return o, err
}
