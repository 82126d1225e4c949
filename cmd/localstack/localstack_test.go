package localstack_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/feedproject/feed/cmd/localstack"
	"github.com/feedproject/feed/cmd/localstack/localstacktest"
)

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// reachableTempDir is like t.TempDir but traversable by the postgres OS
// user when the test runs as root (t.TempDir's parent is 0700).
func reachableTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "localstack-test-*")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(dir, 0o755))
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// requireGone asserts that neither the process nor any member of its
// process group (postgres backends) is still alive.
func requireGone(t *testing.T, pid int) {
	t.Helper()
	require.Positive(t, pid)
	assert.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "process %d still exists", pid)
	assert.ErrorIs(t, syscall.Kill(-pid, 0), syscall.ESRCH, "process group %d still has members", pid)
}

func TestNATSForTestJetStream(t *testing.T) {
	t.Parallel()
	n := localstacktest.NATSForTest(t)

	nc, err := nats.Connect(n.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:     "EVENTS",
		Subjects: []string{"events.>"},
		Storage:  jetstream.FileStorage,
	})
	require.NoError(t, err)

	ack, err := js.Publish(ctx, "events.post.created", []byte(`{"id":1}`))
	require.NoError(t, err)
	assert.Equal(t, "EVENTS", ack.Stream)
	assert.EqualValues(t, 1, ack.Sequence)

	msg, err := stream.GetMsg(ctx, ack.Sequence)
	require.NoError(t, err)
	assert.Equal(t, "events.post.created", msg.Subject)
	assert.Equal(t, `{"id":1}`, string(msg.Data))
}

// TestNATSFixedPortInUseFailsFast: a server, in this process or a child,
// whose port is taken fails at once and says which port.
func TestNATSFixedPortInUseFailsFast(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port

	for _, tc := range []struct {
		name  string
		start func(localstack.NATSConfig) (stop func(), err error)
	}{
		{"in process", func(cfg localstack.NATSConfig) (func(), error) {
			n, err := localstack.StartNATS(cfg, testLogger(t))
			if err != nil {
				return nil, err
			}
			return n.Shutdown, nil
		}},
		{"child process", func(cfg localstack.NATSConfig) (func(), error) {
			n, err := localstack.StartNATSProcess(context.Background(), natsArgv(), cfg, testLogger(t))
			if err != nil {
				return nil, err
			}
			return func() { _ = n.Stop() }, nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			stop, err := tc.start(localstack.NATSConfig{Dir: t.TempDir(), Port: port})
			if stop != nil {
				stop()
			}
			require.Error(t, err)
			assert.Contains(t, err.Error(), strconv.Itoa(port))
			assert.Contains(t, err.Error(), "address already in use", "the server's own explanation")
			assert.Less(t, time.Since(start), 5*time.Second, "should not wait for the readiness timeout")
		})
	}
}

func TestNATSSyncAlwaysRestartKeepsStream(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	n, err := localstack.StartNATS(localstack.NATSConfig{Dir: dir, SyncAlways: true}, testLogger(t))
	require.NoError(t, err)
	publishKept(ctx, t, n.ClientURL())
	n.Shutdown()
	n.Shutdown() // idempotent

	n, err = localstack.StartNATS(localstack.NATSConfig{Dir: dir}, testLogger(t))
	require.NoError(t, err)
	t.Cleanup(n.Shutdown)
	requireKept(ctx, t, n.ClientURL())
}

// publishKept creates stream S and acknowledges "kept" in it.
func publishKept(ctx context.Context, t *testing.T, url string) {
	t.Helper()
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s"}})
	require.NoError(t, err)
	_, err = js.Publish(ctx, "s", []byte("kept"))
	require.NoError(t, err)
}

// requireKept checks that the server at url has publishKept's message.
func requireKept(ctx context.Context, t *testing.T, url string) {
	t.Helper()
	nc, err := nats.Connect(url)
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	stream, err := js.Stream(ctx, "S")
	require.NoError(t, err)
	msg, err := stream.GetMsg(ctx, 1)
	require.NoError(t, err)
	assert.Equal(t, "kept", string(msg.Data))
}

func newRedisClient(t *testing.T, url string) *redis.Client {
	t.Helper()
	opts, err := redis.ParseURL(url)
	require.NoError(t, err)
	c := redis.NewClient(opts)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestRedisForTestSetGetAndStop(t *testing.T) {
	t.Parallel()
	r := localstacktest.RedisForTest(t)
	assert.Equal(t, "redis://"+r.Addr()+"/0", r.URL())

	ctx := context.Background()
	c := newRedisClient(t, r.URL())
	require.NoError(t, c.Set(ctx, "greeting", "hello", 0).Err())
	got, err := c.Get(ctx, "greeting").Result()
	require.NoError(t, err)
	assert.Equal(t, "hello", got)

	// Tests run without any persistence.
	cfg, err := c.ConfigGet(ctx, "appendonly").Result()
	require.NoError(t, err)
	assert.Equal(t, "no", cfg["appendonly"])
	cfg, err = c.ConfigGet(ctx, "bind").Result()
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1", cfg["bind"])

	require.NoError(t, r.Stop())
	require.NoError(t, r.Stop(), "Stop is idempotent")
	requireGone(t, r.PID())
}

func TestRedisPersistKeepsKeyAcrossRestart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cfg := localstack.RedisConfig{Dir: dir, Persist: true, ZSetListpackEntries: 512}

	r, err := localstack.StartRedis(ctx, cfg, testLogger(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Stop() })
	c := newRedisClient(t, r.URL())
	require.NoError(t, c.Set(ctx, "durable", "yes", 0).Err())
	zcfg, err := c.ConfigGet(ctx, "zset-max-listpack-entries").Result()
	require.NoError(t, err)
	assert.Equal(t, "512", zcfg["zset-max-listpack-entries"])
	require.NoError(t, r.Stop())
	requireGone(t, r.PID())

	r2, err := localstack.StartRedis(ctx, cfg, testLogger(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = r2.Stop() })
	got, err := newRedisClient(t, r2.URL()).Get(ctx, "durable").Result()
	require.NoError(t, err)
	assert.Equal(t, "yes", got)
}

// TestRedisNiceness: the server's command thread runs at the niceness asked
// for when the process may lower it, and at the default otherwise, started
// all the same.
func TestRedisNiceness(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := localstack.StartRedis(ctx, localstack.RedisConfig{Dir: t.TempDir(), Nice: -3}, testLogger(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Stop() })
	got, err := syscall.Getpriority(syscall.PRIO_PROCESS, r.PID())
	require.NoError(t, err)
	// The raw system call answers 20 - niceness.
	want := -3
	if os.Geteuid() != 0 {
		want = 0
	}
	assert.Equal(t, want, 20-got)
	require.NoError(t, newRedisClient(t, r.URL()).Ping(ctx).Err())
}

// TestRedisRealtime: the server's command thread runs under SCHED_FIFO at the
// priority asked for, its forks under the default policy, when the process
// may set it; otherwise at the fallback niceness (or the default), started
// all the same.
func TestRedisRealtime(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, err := localstack.StartRedis(ctx, localstack.RedisConfig{Dir: t.TempDir(), Realtime: 2, Nice: -3}, testLogger(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Stop() })
	attr, err := unix.SchedGetAttr(r.PID(), 0)
	require.NoError(t, err)
	if os.Geteuid() == 0 {
		assert.Equal(t, uint32(unix.SCHED_FIFO), attr.Policy)
		assert.Equal(t, uint32(2), attr.Priority)
		assert.Equal(t, uint64(unix.SCHED_FLAG_RESET_ON_FORK), attr.Flags&unix.SCHED_FLAG_RESET_ON_FORK,
			"the server's forks must start under the default policy")
	} else {
		assert.Equal(t, uint32(unix.SCHED_NORMAL), attr.Policy)
		got, err := syscall.Getpriority(syscall.PRIO_PROCESS, r.PID())
		require.NoError(t, err)
		assert.Equal(t, 0, 20-got, "without privilege the niceness cannot be lowered either")
	}
	threads, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", r.PID()))
	require.NoError(t, err)
	for _, th := range threads {
		if th.Name() == strconv.Itoa(r.PID()) {
			continue
		}
		tid, err := strconv.Atoi(th.Name())
		require.NoError(t, err)
		other, err := unix.SchedGetAttr(tid, 0)
		require.NoError(t, err)
		assert.Equal(t, uint32(unix.SCHED_NORMAL), other.Policy, "only the command thread runs under a realtime policy (thread %d)", tid)
	}
	require.NoError(t, newRedisClient(t, r.URL()).Ping(ctx).Err())
}

// TestRedisUnderAWrapper: a wrapper is started with the server's path and
// arguments after its own, and the server it runs is the one answering.
func TestRedisUnderAWrapper(t *testing.T) {
	t.Parallel()
	seen := filepath.Join(t.TempDir(), "argv")
	r := localstacktest.RedisUnderForTest(t, "sh", "-c", `printf '%s\n' "$@" > "$0"; exec "$@"`, seen)
	require.NoError(t, newRedisClient(t, r.URL()).Ping(context.Background()).Err())
	argv, err := os.ReadFile(seen)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(argv)), "\n")
	assert.Equal(t, "redis-server", filepath.Base(lines[0]), "the server's path comes first after the wrapper's arguments")
	assert.Contains(t, lines, strconv.Itoa(r.Port()))
}

func TestRedisMissingBinaryExplainsInstall(t *testing.T) {
	t.Parallel()
	_, err := localstack.StartRedis(context.Background(), localstack.RedisConfig{
		Dir:    t.TempDir(),
		Binary: filepath.Join(t.TempDir(), "redis-server"),
	}, testLogger(t))
	require.ErrorIs(t, err, localstack.ErrBinaryNotFound)
	assert.Contains(t, err.Error(), "apt-get install -y redis-server")
}

func TestPostgresForTestQuery(t *testing.T) {
	t.Parallel()
	p := localstacktest.PostgresForTest(t)
	assert.Equal(t, "postgres://postgres@127.0.0.1:"+strconv.Itoa(p.Port())+"/feed?sslmode=disable", p.URL())

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.URL())
	require.NoError(t, err)
	defer conn.Close(ctx)
	var db string
	var sum int
	require.NoError(t, conn.QueryRow(ctx, "SELECT current_database(), 1 + 1").Scan(&db, &sum))
	assert.Equal(t, "feed", db)
	assert.Equal(t, 2, sum)
	var fsync string
	require.NoError(t, conn.QueryRow(ctx, "SHOW fsync").Scan(&fsync))
	assert.Equal(t, "off", fsync, "tests trade durability for speed")
}

func TestPostgresRestartKeepsData(t *testing.T) {
	t.Parallel()
	// A fresh directory, so this also covers initdb inside StartPostgres
	// (the harness copies a template instead).
	dir := filepath.Join(reachableTempDir(t), "postgres")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := localstack.PostgresConfig{Dir: dir, Database: "restart_test"}

	p, err := localstack.StartPostgres(ctx, cfg, testLogger(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Stop() })
	conn, err := pgx.Connect(ctx, p.URL())
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "CREATE TABLE kept (v text); INSERT INTO kept VALUES ('survives')")
	require.NoError(t, err)
	// An open session must not stop a fast shutdown.
	require.NoError(t, p.Stop())
	require.NoError(t, p.Stop(), "Stop is idempotent")
	requireGone(t, p.PID())
	_ = conn.Close(ctx)

	p2, err := localstack.StartPostgres(ctx, cfg, testLogger(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = p2.Stop() })
	conn2, err := pgx.Connect(ctx, p2.URL())
	require.NoError(t, err)
	defer conn2.Close(ctx)
	var v string
	require.NoError(t, conn2.QueryRow(ctx, "SELECT v FROM kept").Scan(&v))
	assert.Equal(t, "survives", v)
}

func TestPostgresUnreachableDirExplainsFix(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("only root hands the data dir to the postgres OS user")
	}
	t.Parallel()
	// t.TempDir's parent is 0700 and owned by root.
	_, err := localstack.StartPostgres(context.Background(), localstack.PostgresConfig{
		Dir: filepath.Join(t.TempDir(), "postgres"),
	}, testLogger(t))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "not reachable by the \"postgres\" OS user")
	assert.Contains(t, err.Error(), "FEED_DATA_DIR")
}

func TestPostgresMissingBinariesExplainInstall(t *testing.T) {
	t.Parallel()
	_, err := localstack.StartPostgres(context.Background(), localstack.PostgresConfig{
		Dir:    filepath.Join(t.TempDir(), "postgres"),
		BinDir: t.TempDir(),
	}, testLogger(t))
	require.ErrorIs(t, err, localstack.ErrBinaryNotFound)
	assert.Contains(t, err.Error(), "apt-get install -y postgresql")
}

func TestForTestFullStack(t *testing.T) {
	t.Parallel()
	s := localstacktest.ForTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	nc, err := nats.Connect(s.NATS.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	require.NoError(t, nc.FlushWithContext(ctx))

	require.NoError(t, newRedisClient(t, s.Redis.URL()).Ping(ctx).Err())

	conn, err := pgx.Connect(ctx, s.Postgres.URL())
	require.NoError(t, err)
	defer conn.Close(ctx)
	require.NoError(t, conn.Ping(ctx))
}

// TestFreePortsAreDifferent: ports picked together are never the same port,
// even though the kernel may hand a just-closed port out again (picked and
// closed one by one, 256 ports held a repeat about 99 times in 100 here).
func TestFreePortsAreDifferent(t *testing.T) {
	t.Parallel()
	ports, err := localstack.FreePorts(256)
	require.NoError(t, err)
	seen := make(map[int]bool, len(ports))
	for _, p := range ports {
		assert.False(t, seen[p], "port %d picked twice in %v", p, ports)
		seen[p] = true
		assert.Positive(t, p)
	}
	assert.Len(t, ports, 256)
}
