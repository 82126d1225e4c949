package localstack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/feedproject/feed/migrations"
)

// Stack is the full set of dependencies, each on its own random loopback
// port, for one test.
type Stack struct {
	NATS     *NATS
	Redis    *Redis
	Postgres *Postgres
}

// ForTest starts NATS, Redis and Postgres on random loopback ports in a
// fresh temporary directory. Cleanup stops them and removes the directory.
// A missing binary fails the test (it is never skipped), so a machine
// without the dependencies cannot silently pass.
func ForTest(tb testing.TB) *Stack {
	tb.Helper()
	h := newHarness(tb)
	// Postgres dominates start-up time, so it starts while the others do.
	type pgResult struct {
		pg  *Postgres
		err error
	}
	pgc := make(chan pgResult, 1)
	go func() {
		pg, err := h.postgres()
		pgc <- pgResult{pg, err}
	}()
	n, natsErr := h.nats()
	r, redisErr := h.redis(nil)
	res := <-pgc
	// Register every successful start for cleanup before failing, so a
	// partial stack does not leak processes.
	if n != nil {
		tb.Cleanup(n.Shutdown)
	}
	if r != nil {
		tb.Cleanup(func() { h.logStopErr("redis", r.Stop()) })
	}
	if res.pg != nil {
		tb.Cleanup(func() { h.logStopErr("postgres", res.pg.Stop()) })
	}
	if err := errors.Join(natsErr, redisErr, res.err); err != nil {
		tb.Fatalf("localstack: %v", err)
	}
	return &Stack{NATS: n, Redis: r, Postgres: res.pg}
}

// NATSForTest starts an embedded JetStream server on a random loopback
// port; Cleanup shuts it down and removes its store.
func NATSForTest(tb testing.TB) *NATS {
	tb.Helper()
	h := newHarness(tb)
	n, err := h.nats()
	if err != nil {
		tb.Fatalf("localstack: %v", err)
	}
	tb.Cleanup(n.Shutdown)
	return n
}

// JetStreamForTest starts an embedded JetStream server as NATSForTest does
// and returns a client of it, connected as the service connects (reconnecting
// for ever, nothing buffered while disconnected); Cleanup closes it.
func JetStreamForTest(tb testing.TB) jetstream.JetStream {
	tb.Helper()
	nc, err := nats.Connect(NATSForTest(tb).ClientURL(), nats.MaxReconnects(-1), nats.ReconnectBufSize(-1))
	if err != nil {
		tb.Fatalf("localstack: connect to nats: %v", err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatalf("localstack: jetstream: %v", err)
	}
	return js
}

// RedisForTest starts a non-persistent redis-server on a random loopback
// port; Cleanup stops it and removes its directory.
func RedisForTest(tb testing.TB) *Redis {
	tb.Helper()
	return RedisUnderForTest(tb)
}

// RedisUnderForTest is RedisForTest with the server run under wrapper (see
// RedisConfig.Wrapper).
func RedisUnderForTest(tb testing.TB, wrapper ...string) *Redis {
	tb.Helper()
	h := newHarness(tb)
	r, err := h.redis(wrapper)
	if err != nil {
		tb.Fatalf("localstack: %v", err)
	}
	tb.Cleanup(func() { h.logStopErr("redis", r.Stop()) })
	return r
}

// PostgresForTest starts a non-durable Postgres with a "feed" database at the
// current schema (every migration applied) on a random loopback port; Cleanup
// stops it and removes its data. The cluster is copied from a per-process
// template, so only the first call in a test binary pays for initdb and
// migrations; `CREATE DATABASE x TEMPLATE feed` makes more migrated databases.
func PostgresForTest(tb testing.TB) *Postgres {
	tb.Helper()
	h := newHarness(tb)
	p, err := h.postgres()
	if err != nil {
		tb.Fatalf("localstack: %v", err)
	}
	tb.Cleanup(func() { h.logStopErr("postgres", p.Stop()) })
	return p
}

// harness holds one test's temporary directory and logger.
type harness struct {
	tb      testing.TB
	dir     string
	log     *slog.Logger
	natsLog *slog.Logger
}

// newHarness creates the test's directory and logger. Cleanups registered
// here run after (LIFO) the servers' stop cleanups registered by callers.
func newHarness(tb testing.TB) *harness {
	tb.Helper()
	// Not tb.TempDir: its parent is 0700, and when we are root the postgres
	// user must be able to traverse down to its data directory.
	dir, err := os.MkdirTemp("", "feed-localstack-*")
	if err != nil {
		tb.Fatalf("localstack: create temp dir: %v", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		tb.Fatalf("localstack: chmod temp dir: %v", err)
	}
	tb.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			tb.Errorf("localstack: remove temp dir: %v", err)
		}
	})
	w := &testWriter{w: tb.Output()}
	tb.Cleanup(w.close)
	return &harness{
		tb:  tb,
		dir: dir,
		log: slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo})),
		// nats-server announces a dozen lines of configuration at notice
		// level on every start; in test output only its problems matter.
		natsLog: slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
}

func (h *harness) nats() (*NATS, error) {
	return StartNATS(NATSConfig{Dir: filepath.Join(h.dir, "nats")}, h.natsLog)
}

func (h *harness) redis(wrapper []string) (*Redis, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return StartRedis(ctx, RedisConfig{Dir: filepath.Join(h.dir, "redis"), Wrapper: wrapper}, h.log)
}

func (h *harness) postgres() (*Postgres, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tmpl, err := postgresTemplate()
	if err != nil {
		return nil, err
	}
	owner, err := postgresOwner()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(h.dir, "postgres")
	if err := copyTree(tmpl.dataDir, dir, owner); err != nil {
		return nil, fmt.Errorf("copy postgres template cluster: %w", err)
	}
	return StartPostgres(ctx, PostgresConfig{Dir: dir, BinDir: tmpl.binDir}, h.log)
}

func (h *harness) logStopErr(component string, err error) {
	if err != nil {
		h.tb.Errorf("localstack: stop %s: %v", component, err)
	}
}

// testWriter forwards log output to the test's output stream until the
// test's cleanups are done. Servers may log from their own goroutines a
// moment later, and writing to a finished test panics.
type testWriter struct {
	mu     sync.Mutex
	w      io.Writer
	closed bool
}

func (t *testWriter) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return len(p), nil
	}
	return t.w.Write(p)
}

func (t *testWriter) close() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
}

// pgTemplate is an initdb'd, never-started cluster that tests copy.
type pgTemplate struct {
	binDir  string
	dataDir string
}

// templateCache holds the per-process Postgres template cluster: initdb
// takes seconds, copying its result takes milliseconds, so only the first
// test in a binary pays for initdb.
//
// This is the package's one process-wide variable, an exception to the
// no-globals rule: the cache must outlive individual tests, and a test
// binary offers no hook to hand it from one test to the next. It lives in a
// pid-named directory under os.TempDir so parallel test processes (go test
// runs packages in separate processes) never share it; RunTests removes it
// and later processes sweep leftovers of dead ones.
var templateCache struct {
	mu    sync.Mutex
	built bool
	tmpl  *pgTemplate
	err   error
}

// postgresTemplate returns the template, building it on first use. A
// failure is remembered too, so a missing binary fails every test quickly
// instead of retrying initdb in each.
func postgresTemplate() (*pgTemplate, error) {
	templateCache.mu.Lock()
	defer templateCache.mu.Unlock()
	if !templateCache.built {
		// Logging is discarded because the first test's logger would be
		// gone when later tests reuse the template.
		templateCache.tmpl, templateCache.err = buildPostgresTemplate(slog.New(slog.DiscardHandler))
		templateCache.built = true
	}
	return templateCache.tmpl, templateCache.err
}

const templatePrefix = "feed-localstack-pgtemplate-"

// RunTests runs a test binary's tests and then removes the Postgres
// template cluster. Use it from TestMain to leave nothing behind:
//
//	func TestMain(m *testing.M) { os.Exit(localstack.RunTests(m)) }
//
// Without it the template (~40MB) stays in os.TempDir until a later test
// process sweeps it.
func RunTests(m *testing.M) int {
	code := m.Run()
	templateCache.mu.Lock()
	defer templateCache.mu.Unlock()
	if templateCache.tmpl != nil {
		_ = os.RemoveAll(filepath.Dir(templateCache.tmpl.dataDir))
		// Tests may not run after m.Run, but if something does, it gets
		// a fresh template rather than a deleted one.
		templateCache.built, templateCache.tmpl = false, nil
	}
	return code
}

// RunTestsOrNATS is RunTests for a test binary that StartNATSProcess runs as
// its NATS server (argv `<test binary> nats ...`): started so, it serves
// NATS as `feed nats` does until interrupted, and returns the exit code.
//
//	func TestMain(m *testing.M) { os.Exit(localstack.RunTestsOrNATS(m)) }
func RunTestsOrNATS(m *testing.M) int {
	if len(os.Args) < 2 || os.Args[1] != "nats" {
		return RunTests(m)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := RunNATS(ctx, os.Args[2:], NATSConfig{}, os.Stderr, slog.New(slog.NewTextHandler(os.Stderr, nil))); err != nil {
		fmt.Fprintln(os.Stderr, "nats:", err)
		return 1
	}
	return 0
}

// buildPostgresTemplate initdb's a cluster into a fresh pid-named directory,
// with the feed database migrated.
func buildPostgresTemplate(log *slog.Logger) (*pgTemplate, error) {
	sweepStaleTemplates()
	bins, err := findPostgresBins("")
	if err != nil {
		return nil, err
	}
	owner, err := postgresOwner()
	if err != nil {
		return nil, err
	}
	root := filepath.Join(os.TempDir(), templatePrefix+strconv.Itoa(os.Getpid()))
	_ = os.RemoveAll(root) // a previous process with our pid
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, fmt.Errorf("postgres template: %w", err)
	}
	if err := os.Chmod(root, 0o755); err != nil { // umask may have narrowed it
		return nil, fmt.Errorf("postgres template: %w", err)
	}
	data := filepath.Join(root, "data")
	if err := prepareDataDir(data, owner); err != nil {
		return nil, fmt.Errorf("postgres template: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := initCluster(ctx, bins, data, owner, false, log); err != nil {
		_ = os.RemoveAll(root)
		return nil, fmt.Errorf("postgres template: %w", err)
	}
	// Start it once to create the feed database at the current schema: every
	// test's copy then starts migrated, and `CREATE DATABASE x TEMPLATE feed`
	// gives a test more migrated databases in milliseconds.
	pg, err := StartPostgres(ctx, PostgresConfig{Dir: data, BinDir: filepath.Dir(bins.postgres)}, log)
	if err != nil {
		_ = os.RemoveAll(root)
		return nil, fmt.Errorf("postgres template: %w", err)
	}
	merr := migrations.Up(ctx, pg.URL(), migrations.Schema)
	if err := errors.Join(merr, pg.Stop()); err != nil {
		_ = os.RemoveAll(root)
		return nil, fmt.Errorf("postgres template: migrate: %w", err)
	}
	return &pgTemplate{binDir: filepath.Dir(bins.postgres), dataDir: data}, nil
}

// sweepStaleTemplates removes template directories whose process is gone,
// best effort: a test binary has no exit hook to remove its own.
func sweepStaleTemplates() {
	entries, err := os.ReadDir(os.TempDir())
	if err != nil {
		return
	}
	for _, e := range entries {
		pidStr, ok := strings.CutPrefix(e.Name(), templatePrefix)
		if !ok {
			continue
		}
		pid, err := strconv.Atoi(pidStr)
		if err != nil || pid == os.Getpid() {
			continue
		}
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			_ = os.RemoveAll(filepath.Join(os.TempDir(), e.Name()))
		}
	}
}

// copyTree copies the directory src to dst (which must not exist),
// preserving permission bits and handing everything to owner (nil: keep
// ours). Postgres insists on a 0700/0750 data directory owned by the user
// it runs as.
func copyTree(src, dst string, owner *osUser) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			if err := os.Mkdir(target, info.Mode().Perm()); err != nil {
				return err
			}
			// Mkdir's mode is filtered by the umask.
			if err := os.Chmod(target, info.Mode().Perm()); err != nil {
				return err
			}
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(path)
			if err != nil {
				return err
			}
			if err := os.Symlink(link, target); err != nil {
				return err
			}
		case d.Type().IsRegular():
			if err := copyFile(path, target, info.Mode().Perm()); err != nil {
				return err
			}
		default:
			return nil // sockets, fifos: never part of a stopped cluster
		}
		return owner.chown(target)
	})
}

func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	// io.Copy between files uses copy_file_range on Linux, so the ~40MB
	// cluster copies in the kernel.
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Chmod(perm); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
