package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/feedproject/feed/cmd/feedbench/internal/loadbench"
	"github.com/feedproject/feed/cmd/internal/stack"
	"github.com/feedproject/feed/cmd/localstack"
	"github.com/feedproject/feed/domain"
	feedhttp "github.com/feedproject/feed/http"
	"github.com/feedproject/feed/projections/feeds/fanout"
)

// benchOptions are bench's flags beyond the workload.
type benchOptions struct {
	url        string        // a running service; "" starts one
	feed       string        // the feed binary that serves the started stack
	out        string        // directory for report.md, chart.png and summary.json
	cpuProfile bool          // profile the service's measured phases
	trace      time.Duration // trace the service from each measured phase's start
	keep       bool          // keep the started stack's data directory
	// ports picks the started service's free ports; nil is
	// localstack.FreePorts.
	ports func(n int) ([]int, error)
}

func parseBench(args []string, stderr io.Writer) (loadbench.Config, benchOptions, error) {
	cfg := loadbench.DefaultConfig()
	var opts benchOptions
	fs := flag.NewFlagSet("feedbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	fs.StringVar(&opts.url, "url", "", "benchmark the service running at this loopback URL instead of starting one")
	fs.StringVar(&opts.feed, "feed", "", "the feed binary to start the service with (default: feed beside this program, else on PATH)")
	fs.StringVar(&opts.out, "out", "bench-out", "directory for report.md, chart.png and summary.json")
	fs.BoolVar(&opts.cpuProfile, "cpuprofile", false, "write the service's CPU profile of each measured phase, and heap profiles at its start and end, to the output directory (from its admin route /admin/pprof/)")
	fs.DurationVar(&opts.trace, "trace", 0, "write an execution trace of the service this long from each measured phase's start to the output directory (0: none)")
	fs.BoolVar(&opts.keep, "keep", false, "keep the started stack's data directory")
	fs.IntVar(&cfg.Users, "users", cfg.Users, "users in the synthetic graph")
	fs.IntVar(&cfg.AvgFollowers, "followers", cfg.AvgFollowers, "followers per account on average")
	fs.IntVar(&cfg.BigAccounts, "big", cfg.BigAccounts, "accounts above the big-account threshold")
	fs.IntVar(&cfg.BigThreshold, "big-threshold", cfg.BigThreshold, "FEED_BIG_ACCOUNT of the service (set in the started stack; must match with --url)")
	fs.Float64Var(&cfg.PostRate, "post-rate", cfg.PostRate, "posts per second in the mixed phase")
	fs.Float64Var(&cfg.BigPostShare, "big-post-share", cfg.BigPostShare, "share of the posts written by big accounts")
	fs.Float64Var(&cfg.FollowRate, "follow-rate", cfg.FollowRate, "follows and unfollows per second in the mixed phase")
	fs.Float64Var(&cfg.LikeRate, "like-rate", cfg.LikeRate, "likes per second in the mixed phase")
	fs.Float64Var(&cfg.CommentRate, "comment-rate", cfg.CommentRate, "comments per second in the mixed phase")
	fs.Float64Var(&cfg.ReadRate, "read-rate", cfg.ReadRate, "feed reads per second in the mixed phase")
	fs.Float64Var(&cfg.NextPageShare, "next-page", cfg.NextPageShare, "share of the mixed phase's feed reads that page on with a cursor")
	fs.Float64Var(&cfg.CachedReadRate, "cached-read-rate", cfg.CachedReadRate, "first pages per second in the read phase")
	fs.DurationVar(&cfg.Warmup, "warmup", cfg.Warmup, "unrecorded mixed load before the measured phase")
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "the measured mixed phase")
	fs.DurationVar(&cfg.ReadDuration, "read-duration", cfg.ReadDuration, "the read phase")
	fs.DurationVar(&cfg.RawDuration, "raw-duration", cfg.RawDuration, "each raw limit's measurement")
	fs.DurationVar(&cfg.DrainTimeout, "drain-timeout", cfg.DrainTimeout, "longest wait for the projectors after the mixed phase")
	fs.DurationVar(&cfg.SetupTimeout, "setup-timeout", cfg.SetupTimeout, "longest wait for the projectors during setup")
	fs.Float64Var(&cfg.FreshRate, "fresh-rate", cfg.FreshRate, "posts per second, of ordinary and of big authors each, whose freshness is measured")
	fs.IntVar(&cfg.FreshFollowers, "fresh-followers", cfg.FreshFollowers, "followers polled per sampled post")
	fs.IntVar(&cfg.Viewers, "viewers", cfg.Viewers, "users holding a GET /stream open through the mixed phase, whose announcements are timed (0: none)")
	fs.IntVar(&cfg.SetupConcurrency, "setup-concurrency", cfg.SetupConcurrency, "requests in flight while building the graph")
	fs.IntVar(&cfg.MaxInFlight, "max-in-flight", cfg.MaxInFlight, "most open-loop requests outstanding (more are dropped and counted)")
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the graph and the workload's choices")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return cfg, opts, err
		}
		return cfg, opts, fmt.Errorf("%w: %w", errUsage, err)
	}
	if fs.NArg() > 0 {
		return cfg, opts, fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	if err := cfg.Validate(); err != nil {
		return cfg, opts, fmt.Errorf("%w: %w", errUsage, err)
	}
	if opts.url != "" {
		if err := checkLoopbackURL(opts.url); err != nil {
			return cfg, opts, fmt.Errorf("%w: --url: %w", errUsage, err)
		}
		if opts.feed != "" || opts.keep {
			return cfg, opts, fmt.Errorf("%w: --feed and --keep are about the stack the bench starts, not one at --url", errUsage)
		}
	}
	if opts.trace < 0 {
		return cfg, opts, fmt.Errorf("%w: --trace %s: a trace lasts a positive time, or 0 for none", errUsage, opts.trace)
	}
	return cfg, opts, nil
}

// checkLoopbackURL refuses any target but this machine: the bench is a load
// generator.
func checkLoopbackURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	if u.Scheme != "http" || u.Host == "" {
		return fmt.Errorf("%q is not an http://host:port URL", raw)
	}
	host := u.Hostname()
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("%q is not a loopback address: the bench only loads this machine", host)
}

// run is the whole program behind main, callable from tests: it runs the
// end-to-end load benchmark and writes its report.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	wl, opts, err := parseBench(args, stderr)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(opts.out, 0o755); err != nil {
		return fmt.Errorf("bench: output directory: %w", err)
	}
	var rep *loadbench.Report
	if opts.url != "" {
		rep, err = benchURL(ctx, wl, opts, getenv, stderr)
	} else {
		rep, err = benchStarted(ctx, wl, opts, getenv, stderr)
	}
	if err != nil && (rep == nil || ctx.Err() != nil) {
		if ctx.Err() != nil {
			return fmt.Errorf("bench interrupted, no report: %w", ctx.Err())
		}
		return fmt.Errorf("bench: %w", err)
	}
	rep.CommandLine = strings.Join(append([]string{"feedbench"}, args...), " ")
	// A run that finished is reported even if the service then failed to
	// stop (it was killed): the failure is returned after it.
	return errors.Join(writeBenchReport(rep, opts.out, stdout), wrapBench(err))
}

func wrapBench(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("bench: %w", err)
}

func writeBenchReport(rep *loadbench.Report, dir string, stdout io.Writer) error {
	files := []struct {
		name  string
		write func(io.Writer) error
	}{
		{"report.md", rep.WriteMarkdown},
		{"chart.png", rep.WriteChart},
		{"summary.json", rep.WriteJSON},
	}
	for _, f := range files {
		if err := writeFile(filepath.Join(dir, f.name), f.write); err != nil {
			return err
		}
	}
	if err := rep.WriteMarkdown(stdout); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "Written: %s, %s, %s\n", filepath.Join(dir, "report.md"), filepath.Join(dir, "chart.png"), filepath.Join(dir, "summary.json"))
	return nil
}

func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if err := write(f); err != nil {
		f.Close()
		return fmt.Errorf("bench: %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("bench: %s: %w", path, err)
	}
	return nil
}

// benchStarted starts the whole service the way `feed dev` does, on free
// loopback ports with a temporary data directory (NATS_URL, REDIS_URL and
// DATABASE_URL, when set, are used instead of starting servers, as in dev
// mode: point them at scratch servers), and runs the bench against it.
func benchStarted(ctx context.Context, wl loadbench.Config, opts benchOptions, getenv func(string) string, stderr io.Writer) (*loadbench.Report, error) {
	return startRetrying(stderr, func() (*loadbench.Report, error) {
		return benchStartedOnce(ctx, wl, opts, getenv, stderr)
	})
}

// startRetrying runs start again, up to benchStartAttempts times in all, while
// it fails before the service served because a port was taken.
func startRetrying(stderr io.Writer, start func() (*loadbench.Report, error)) (*loadbench.Report, error) {
	for attempt := 1; ; attempt++ {
		rep, err := start()
		if attempt < benchStartAttempts && errors.Is(err, errNotServing) && portTaken(err) {
			fmt.Fprintf(stderr, "bench: another process took one of the service's ports before it bound it; starting again on others\n")
			continue
		}
		return rep, err
	}
}

// benchStartAttempts is how many times the bench starts the service when
// another process takes one of its picked ports first.
const benchStartAttempts = 3

// errNotServing marks a failure of the started service before it served: the
// load has not begun.
var errNotServing = errors.New("the service did not start")

// portTaken reports whether err says a port was already in use, as Go
// ("address already in use"), Redis and Postgres ("Address already in use")
// put it; a child's error quotes its last output lines.
func portTaken(err error) bool {
	return err != nil && strings.Contains(strings.ToLower(err.Error()), "address already in use")
}

// benchStartedOnce is one start of the service and, once it serves, the bench.
// A service that fails to start leaves no data directory behind.
func benchStartedOnce(ctx context.Context, wl loadbench.Config, opts benchOptions, getenv func(string) string, stderr io.Writer) (rep *loadbench.Report, err error) {
	dir, err := os.MkdirTemp("", "feed-bench-")
	if err != nil {
		return nil, fmt.Errorf("data directory: %w", err)
	}
	defer func() {
		if !opts.keep || errors.Is(err, errNotServing) {
			os.RemoveAll(dir)
		}
	}()
	// When run as root, Postgres runs as the postgres user, who must reach its
	// data directory.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, fmt.Errorf("data directory: %w", err)
	}
	pick := opts.ports
	if pick == nil {
		pick = localstack.FreePorts
	}
	ports, err := pick(4)
	if err != nil {
		return nil, err
	}
	cfg, env, err := benchStackConfig(dir, ports, wl, getenv)
	if err != nil {
		return nil, err
	}
	return benchChild(ctx, wl, opts, cfg, env, stderr)
}

// benchChild runs the service as `feed dev` in a process of its own, so that
// the load generator and the service share no Go runtime (scheduler, garbage
// collector): its latencies are those a client on the same machine sees.
func benchChild(ctx context.Context, wl loadbench.Config, opts benchOptions, cfg stack.Config, env func(string) string, stderr io.Writer) (*loadbench.Report, error) {
	exe, err := feedBinary(opts.feed)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "dev")
	cmd.Env = childEnviron(env)
	// The child's output (its warnings and errors) is shown as it comes.
	proc, err := localstack.StartProcess("feed dev", cmd, slog.New(slog.DiscardHandler), stderr)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(stderr, "bench: started the service as process %d (data in %s)\n", proc.PID(), cfg.DataDir)
	stop := func() error { return proc.Stop(cfg.ShutdownTimeout + time.Minute) }
	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	go func() {
		// A service that stopped on its own fails the bench at once.
		select {
		case <-proc.Done():
			cancelRun()
		case <-runCtx.Done():
		}
	}()
	if err := waitServing(runCtx, "http://"+cfg.HTTPAddr, 2*time.Minute); err != nil {
		return nil, fmt.Errorf("%w: %w", errNotServing, errors.Join(err, stop()))
	}
	target := loadbench.Target{
		BaseURL: "http://" + cfg.HTTPAddr,
		Stack: fmt.Sprintf("started as a process of its own like `feed dev` (child NATS with sync %s, Redis and Postgres), FEED_BIG_ACCOUNT=%d, "+
			"FEED_PARTITIONS=%d, FEED_INBOX_CAP=%d, FEED_DEV_REDIS_REALTIME=%d, GOGC=%s, GOMAXPROCS=%s",
			cfg.NATSSync, cfg.BigAccount, cfg.Partitions, cfg.InboxCap, cfg.DevRedisRealtime, env("GOGC"), env("GOMAXPROCS")),
		Progress: stderr,
	}
	if target.Token, err = benchTokens(cfg.JWTSecret); err != nil {
		return nil, errors.Join(err, stop())
	}
	rep, err := runObserved(runCtx, wl, target, cfg, rawServers{redis: true, nats: true, started: true}, opts)
	if serr := stop(); serr != nil {
		// A service that failed explains the bench's own error; a run that
		// finished keeps its report (see bench).
		return rep, errors.Join(err, fmt.Errorf("service: %w", serr))
	}
	return rep, err
}

// feedBinary is the feed binary to run: path if given, else `feed` beside
// this program, else on PATH.
func feedBinary(path string) (string, error) {
	if path != "" {
		return exec.LookPath(path)
	}
	if self, err := os.Executable(); err == nil {
		beside := filepath.Join(filepath.Dir(self), "feed")
		if _, err := exec.LookPath(beside); err == nil {
			return beside, nil
		}
	}
	p, err := exec.LookPath("feed")
	if err != nil {
		return "", fmt.Errorf("no feed binary beside this program or on PATH (build one with `go build -o .bin/feed ./cmd/feed`, or pass --feed): %w", err)
	}
	return p, nil
}

// benchRuntime are the settings the bench gives the service it starts where
// its environment leaves them unset: those its recorded figures were measured
// with on a small shared machine, rather than the service's defaults
// (decision 56).
func benchRuntime() map[string]string {
	return map[string]string{
		"GOGC":                    "400",
		"GOMAXPROCS":              strconv.Itoa(2 * runtime.GOMAXPROCS(0)),
		"FEED_DEV_REDIS_REALTIME": "1",
	}
}

// runtimeVariables are the Go runtime's variables the service's child is
// given as env has them.
var runtimeVariables = []string{"GOGC", "GOMAXPROCS"}

// childEnviron is this process's environment with the service's variables
// (see stack.Variables) and the runtime's as env has them.
func childEnviron(env func(string) string) []string {
	names := slices.Clone(runtimeVariables)
	for _, v := range stack.Variables {
		names = append(names, v.Name)
	}
	out := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return slices.Contains(names, name)
	})
	for _, name := range names {
		if value := env(name); value != "" {
			out = append(out, name+"="+value)
		}
	}
	return out
}

// waitServing waits until the service at base answers /readyz with 200.
func waitServing(ctx context.Context, base string, timeout time.Duration) error {
	client := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(timeout)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/readyz", nil)
		if err != nil {
			return fmt.Errorf("readyz: %w", err)
		}
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("readyz answered %d", resp.StatusCode)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the service at %s is not ready after %s: %w", base, timeout, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the service at %s is not ready: %w", base, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// benchStackConfig is the started service's configuration, and the
// environment it is parsed from: the caller's, with its own data directory,
// four free loopback ports (HTTP, NATS, Redis, Postgres), the bench's
// big-account threshold, a random JWT secret and benchRuntime where the
// caller's leaves them unset.
func benchStackConfig(dir string, ports []int, wl loadbench.Config, getenv func(string) string) (stack.Config, func(string) string, error) {
	secret := make([]byte, 24)
	if _, err := rand.Read(secret); err != nil {
		return stack.Config{}, nil, fmt.Errorf("jwt secret: %w", err)
	}
	overrides := map[string]string{
		"FEED_DATA_DIR":          dir,
		"FEED_HTTP_ADDR":         "127.0.0.1:" + strconv.Itoa(ports[0]),
		"FEED_NATS_PORT":         strconv.Itoa(ports[1]),
		"FEED_DEV_REDIS_PORT":    strconv.Itoa(ports[2]),
		"FEED_DEV_POSTGRES_PORT": strconv.Itoa(ports[3]),
		"FEED_BIG_ACCOUNT":       strconv.Itoa(wl.BigThreshold),
		"FEED_JWT_SECRET":        hex.EncodeToString(secret),
	}
	if getenv("FEED_LOG_LEVEL") == "" {
		overrides["FEED_LOG_LEVEL"] = "warn"
	}
	for k, v := range benchRuntime() {
		if getenv(k) == "" {
			overrides[k] = v
		}
	}
	env := func(k string) string {
		if v, ok := overrides[k]; ok {
			return v
		}
		return getenv(k)
	}
	cfg, err := stack.Parse(env)
	return cfg, env, err
}

// benchURL runs the bench against a running service. Tokens are signed with
// FEED_JWT_SECRET (or the development secret of `feed dev`); positions,
// memory and sizes are read as `feed status` reads them; the raw limits are
// measured only against servers named by NATS_URL and REDIS_URL.
func benchURL(ctx context.Context, wl loadbench.Config, opts benchOptions, getenv func(string) string, stderr io.Writer) (*loadbench.Report, error) {
	cfg, err := stack.Parse(getenv)
	if err != nil {
		return nil, err
	}
	secret, _ := cfg.TokenSecret(true)
	if secret == stack.DevJWTSecret {
		fmt.Fprintln(stderr, "bench: FEED_JWT_SECRET is unset; signing tokens with the development secret that `feed dev` accepts")
	}
	cfg.JWTSecret = secret
	target := loadbench.Target{
		BaseURL:  strings.TrimRight(opts.url, "/"),
		Stack:    fmt.Sprintf("running at %s (FEED_BIG_ACCOUNT given as %d)", opts.url, wl.BigThreshold),
		Progress: stderr,
	}
	if target.Token, err = benchTokens(secret); err != nil {
		return nil, err
	}
	return runObserved(ctx, wl, target, cfg, rawServers{redis: cfg.RedisURL != "", nats: cfg.NATSURL != ""}, opts)
}

// benchTokens mints the workload's users' tokens, signed with secret.
func benchTokens(secret string) (func(domain.UserID) (string, error), error) {
	mint, err := benchMinter(secret)
	if err != nil {
		return nil, err
	}
	return func(u domain.UserID) (string, error) { return mint(u, false) }, nil
}

// benchMinter mints a day's tokens signed with secret, with the admin role
// if asked.
func benchMinter(secret string) (func(u domain.UserID, admin bool) (string, error), error) {
	auth, err := feedhttp.NewAuthenticator(secret, nil)
	if err != nil {
		return nil, fmt.Errorf("FEED_JWT_SECRET: %w", err)
	}
	now := time.Now()
	return func(u domain.UserID, admin bool) (string, error) { return auth.Mint(u, admin, now, 24*time.Hour) }, nil
}

// rawServers says which servers the raw limits may be measured on: those of
// a stack the bench started, or named by REDIS_URL and NATS_URL. started
// says the bench started the stack, so that a NATS server it did not name by
// NATS_URL is the service's child process on this machine.
type rawServers struct{ redis, nats, started bool }

// runObserved connects the observers (positions, memory, sizes, CPU and the
// raw limits' servers) to the service's servers, runs the bench (with the
// service profiled as opts ask), and disconnects.
func runObserved(ctx context.Context, wl loadbench.Config, target loadbench.Target, cfg stack.Config, raw rawServers, opts benchOptions) (*loadbench.Report, error) {
	prof, err := benchProfiler(ctx, opts, wl, target.BaseURL, cfg.JWTSecret, target.Progress)
	if err != nil {
		return nil, err
	}
	if prof != nil {
		target.OnPhase = prof.onPhase
	}
	obs := connectObservers(ctx, cfg, raw.started, target.Progress)
	defer obs.close()
	target.Positions, target.RedisMemory, target.RedisCPU, target.PostgresSize = obs.positions, obs.redisMemory, obs.redisCPU, obs.postgresSize
	target.RedisData = obs.redisData
	target.PostgresCPU = obs.postgresCPU
	target.NATSCPU, target.NATSMemory = obs.natsCPU, obs.natsMemory
	if raw.redis && obs.redisMemory != nil { // set once Redis answered
		target.Redis = obs.rdb
	}
	if raw.nats && obs.js != nil {
		target.JetStream = obs.js
	}
	rep, err := loadbench.Run(ctx, wl, target)
	prof.wait()
	return rep, err
}

// observers are the bench's own connections to the service's servers. A nil
// function is unavailable; the bench then falls back to the service's metrics.
type observers struct {
	status       *stack.Conns
	stream       jetstream.Stream
	streamName   string
	rdb          redis.UniversalClient
	js           jetstream.JetStream
	pg           *pgxpool.Pool
	positions    func(context.Context) (loadbench.Positions, error)
	redisMemory  func(context.Context) (int64, error)
	redisData    func(context.Context) (int64, error)
	redisCPU     func(context.Context) (time.Duration, error)
	postgresCPU  func(context.Context) (time.Duration, error)
	postgresSize func(context.Context) (int64, error)
	natsCPU      func(context.Context) (time.Duration, error)
	natsMemory   func(context.Context) (int64, error)
	closes       []func()
}

func (o *observers) close() {
	for i := len(o.closes) - 1; i >= 0; i-- {
		o.closes[i]()
	}
	if o.status != nil {
		o.status.Close()
	}
}

// connectObservers connects to whatever of NATS, Redis and Postgres it can
// reach (the URLs of cfg, or the dev ports), within a few seconds. When the
// bench started the stack (started) without NATS_URL, the NATS server is the
// service's child process `feed nats`, observed from /proc by its port.
func connectObservers(ctx context.Context, cfg stack.Config, started bool, progress io.Writer) *observers {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	o := &observers{streamName: cfg.StreamName, status: stack.Connect(cctx, cfg)}
	for what, why := range o.status.Errs {
		fmt.Fprintf(progress, "bench: %s unavailable to the bench (%s); its figures are left out\n", what, why)
	}
	if o.status.JetStream != nil && o.status.Postgres != nil && o.status.Feeds != nil {
		o.positions = o.readPositions
	}
	if nc, err := nats.Connect(cfg.NATSEndpoint(), nats.Name("feed bench"), nats.Timeout(2*time.Second)); err == nil {
		o.closes = append(o.closes, nc.Close)
		// Publishes are asynchronous in the raw limit: a wide window of acks.
		o.js, _ = jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	}
	if target, err := stack.ParseRedisURL(cfg.RedisEndpoint()); err == nil {
		o.rdb = target.Client(stack.RedisTuning{})
		o.closes = append(o.closes, func() { _ = o.rdb.Close() })
		if o.rdb.Ping(cctx).Err() == nil {
			o.redisMemory, o.redisData, o.redisCPU = o.readRedisMemory, o.readRedisData, o.readRedisCPU
		}
	}
	if o.status.Postgres != nil {
		o.pg = o.status.Postgres
		o.postgresSize = o.readPostgresSize
	}
	if port := stackPostgresPort(cfg); port > 0 {
		probe := loadbench.PostgresCPU(port)
		if _, err := probe(cctx); err == nil {
			o.postgresCPU = probe
		}
	}
	if started && cfg.NATSURL == "" && cfg.NATSPort > 0 {
		cpu, memory := loadbench.NATSProcess(cfg.NATSPort)
		if _, err := cpu(cctx); err == nil {
			o.natsCPU, o.natsMemory = cpu, memory
		} else {
			fmt.Fprintf(progress, "bench: the NATS server process is not visible to the bench (%v); its CPU and memory are left out\n", err)
		}
	}
	return o
}

// stackPostgresPort is the port of the service's Postgres if it is on this
// machine; 0 if not known.
func stackPostgresPort(cfg stack.Config) int {
	if cfg.DatabaseURL == "" {
		return cfg.DevPGPort
	}
	u, err := url.Parse(cfg.DatabaseURL)
	if err != nil {
		return 0
	}
	if h := u.Hostname(); h != "localhost" && !net.ParseIP(h).IsLoopback() {
		return 0
	}
	port, _ := strconv.Atoi(u.Port())
	if port == 0 {
		port = 5432
	}
	return port
}

// readPositions samples the projectors as `feed status` does, and the log's
// head.
func (o *observers) readPositions(ctx context.Context) (loadbench.Positions, error) {
	if o.stream == nil {
		s, err := o.status.JetStream.Stream(ctx, o.streamName)
		if err != nil {
			return loadbench.Positions{}, fmt.Errorf("stream %s: %w", o.streamName, err)
		}
		o.stream = s
	}
	info, err := o.stream.Info(ctx)
	if err != nil {
		return loadbench.Positions{}, fmt.Errorf("stream %s info: %w", o.streamName, err)
	}
	s := o.status.Positions(ctx)
	if s.ReadModel == nil || s.Planned == nil || s.Applied == nil {
		var why []string
		for k, v := range s.Errs {
			why = append(why, k+": "+v)
		}
		return loadbench.Positions{}, fmt.Errorf("projector positions: %s", strings.Join(why, "; "))
	}
	pos := loadbench.Positions{Head: info.State.LastSeq, ReadModel: *s.ReadModel, Planned: *s.Planned, Applied: *s.Applied}
	if stream, err := o.status.JetStream.Stream(ctx, fanout.FanoutStream); err == nil {
		if fi, err := stream.Info(ctx); err == nil {
			pos.FanoutSeq, pos.FanoutBacklog = fi.State.LastSeq, fi.State.Msgs
		}
	}
	return pos, nil
}

// readRedisCPU is the CPU time Redis has used, from INFO cpu: on a cluster,
// its masters' together.
func (o *observers) readRedisCPU(ctx context.Context) (time.Duration, error) {
	var micros atomic.Int64
	err := stack.ForEachMaster(ctx, o.rdb, func(ctx context.Context, node *redis.Client) error {
		info, err := node.InfoMap(ctx, "cpu").Result()
		if err != nil {
			return fmt.Errorf("redis %s info cpu: %w", node.Options().Addr, err)
		}
		for _, k := range []string{"used_cpu_sys", "used_cpu_user"} {
			v, err := strconv.ParseFloat(info["CPU"][k], 64)
			if err != nil {
				return fmt.Errorf("redis %s %s: %w", node.Options().Addr, k, err)
			}
			micros.Add(int64(v * 1e6))
		}
		return nil
	})
	return time.Duration(micros.Load()) * time.Microsecond, err
}

// readRedisMemory is Redis's used_memory: on a cluster, its masters'
// together.
func (o *observers) readRedisMemory(ctx context.Context) (int64, error) {
	return o.readRedisInfo(ctx, "used_memory")
}

// readRedisData is Redis's used_memory without its clients' buffers, which
// follow the connections open at the moment, not the data held.
func (o *observers) readRedisData(ctx context.Context) (int64, error) {
	return o.readRedisInfo(ctx, "used_memory", "-mem_clients_normal", "-mem_clients_slaves")
}

// readRedisInfo adds up fields of INFO memory ("-" before a name subtracts
// it) over the masters.
func (o *observers) readRedisInfo(ctx context.Context, fields ...string) (int64, error) {
	var total atomic.Int64
	err := stack.ForEachMaster(ctx, o.rdb, func(ctx context.Context, node *redis.Client) error {
		info, err := node.InfoMap(ctx, "memory").Result()
		if err != nil {
			return fmt.Errorf("redis %s info memory: %w", node.Options().Addr, err)
		}
		for _, f := range fields {
			name, minus := strings.CutPrefix(f, "-")
			v, err := strconv.ParseInt(info["Memory"][name], 10, 64)
			if err != nil {
				return fmt.Errorf("redis %s %s: %w", node.Options().Addr, name, err)
			}
			if minus {
				v = -v
			}
			total.Add(v)
		}
		return nil
	})
	return total.Load(), err
}

func (o *observers) readPostgresSize(ctx context.Context) (int64, error) {
	var n int64
	if err := o.pg.QueryRow(ctx, `SELECT pg_database_size(current_database())`).Scan(&n); err != nil {
		return 0, fmt.Errorf("postgres database size: %w", err)
	}
	return n, nil
}
