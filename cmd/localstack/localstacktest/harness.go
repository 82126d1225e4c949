// Package localstacktest starts the servers the tests run against, each on
// a random loopback port in a temporary directory, and stops them when the
// test ends; the feed binary does not link it.
package localstacktest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/feedproject/feed/cmd/localstack"
)

// Stack is the full set of dependencies, each on its own random loopback
// port, for one test.
type Stack struct {
	NATS     *localstack.NATS
	Redis    *localstack.Redis
	Postgres *localstack.Postgres
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
		pg  *localstack.Postgres
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
func NATSForTest(tb testing.TB) *localstack.NATS {
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
func RedisForTest(tb testing.TB) *localstack.Redis {
	tb.Helper()
	return RedisUnderForTest(tb)
}

// RedisUnderForTest is RedisForTest with the server run under wrapper (see
// localstack.RedisConfig.Wrapper).
func RedisUnderForTest(tb testing.TB, wrapper ...string) *localstack.Redis {
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
// migrations; DatabaseCopyForTest makes more migrated databases.
func PostgresForTest(tb testing.TB) *localstack.Postgres {
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

func (h *harness) nats() (*localstack.NATS, error) {
	return localstack.StartNATS(localstack.NATSConfig{Dir: filepath.Join(h.dir, "nats")}, h.natsLog)
}

func (h *harness) redis(wrapper []string) (*localstack.Redis, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return localstack.StartRedis(ctx, localstack.RedisConfig{Dir: filepath.Join(h.dir, "redis"), Wrapper: wrapper}, h.log)
}

func (h *harness) postgres() (*localstack.Postgres, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return localstack.StartPostgresCopy(ctx, filepath.Join(h.dir, "postgres"), h.log)
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

// RunTests runs a test binary's tests and then removes the Postgres
// template cluster. Use it from TestMain to leave nothing behind:
//
//	func TestMain(m *testing.M) { os.Exit(localstacktest.RunTests(m)) }
//
// Without it the template (~40MB) stays in os.TempDir until a later test
// process sweeps it.
func RunTests(m *testing.M) int {
	code := m.Run()
	localstack.RemovePostgresTemplate()
	return code
}

// RunTestsOrNATS is RunTests for a test binary that StartNATSProcess runs as
// its NATS server (argv `<test binary> nats ...`): started so, it serves
// NATS as `feed nats` does until interrupted, and returns the exit code.
//
//	func TestMain(m *testing.M) { os.Exit(localstacktest.RunTestsOrNATS(m)) }
func RunTestsOrNATS(m *testing.M) int {
	if len(os.Args) < 2 || os.Args[1] != "nats" {
		return RunTests(m)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := localstack.RunNATS(ctx, os.Args[2:], localstack.NATSConfig{}, os.Stderr, slog.New(slog.NewTextHandler(os.Stderr, nil))); err != nil {
		fmt.Fprintln(os.Stderr, "nats:", err)
		return 1
	}
	return 0
}

// DatabaseCopyForTest creates the database name on pg as a copy of its
// migrated "feed" database (much faster than migrating a new one) and returns
// its URL.
func DatabaseCopyForTest(tb testing.TB, pg *localstack.Postgres, name string) string {
	tb.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, pg.AdminURL())
	if err != nil {
		tb.Fatalf("localstack: connect postgres: %v", err)
	}
	defer func() { _ = admin.Close(ctx) }()
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" TEMPLATE feed"); err != nil {
		tb.Fatalf("localstack: create database %s: %v", name, err)
	}
	return strings.Replace(pg.URL(), "/feed?", "/"+name+"?", 1)
}
