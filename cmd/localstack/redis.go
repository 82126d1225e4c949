package localstack

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const (
	redisReadyTimeout = 15 * time.Second
	redisStopGrace    = 10 * time.Second
)

// RedisInstallHint tells a developer how to get redis-server.
const RedisInstallHint = "install it with `apt-get install -y redis-server` or run `go tool task setup`"

// RedisConfig configures a redis-server child process. Only Dir is required.
type RedisConfig struct {
	// Dir is the working and persistence directory (required).
	Dir string
	// Port is the TCP port; 0 picks a free loopback port.
	Port int
	// Persist enables the append-only file (dev mode: data survives
	// restarts). When false nothing is ever written to disk (tests).
	Persist bool
	// ZSetListpackEntries, if > 0, is passed as --zset-max-listpack-entries
	// so feed inboxes (sorted sets of ~500 entries) stay in the compact
	// encoding.
	ZSetListpackEntries int
	// ClusterNodeTimeout, if > 0, makes the server a Redis Cluster node
	// (cluster-enabled, its node table in Dir) that holds a node unreachable
	// for this long failed: its replica takes over after about that.
	ClusterNodeTimeout time.Duration
	// Binary is the redis-server executable; default "redis-server" from
	// PATH, then /usr/bin/redis-server, /usr/local/bin/redis-server.
	Binary string
	// Wrapper, if set, is a command the server runs under, with its
	// arguments, before the server's own path and arguments: valgrind and
	// its options, to count what the server executes.
	Wrapper []string
	// Nice, if not 0, is the niceness the server's command thread is given
	// once started. Lowering it below 0 takes privilege (root or
	// CAP_SYS_NICE); without it the server keeps the default, and says so in
	// the log.
	Nice int
	// Realtime, if > 0, runs the server's command thread under the realtime
	// policy SCHED_FIFO at this priority once started: it runs whenever it
	// has work, ahead of every thread under the default policy whatever its
	// niceness (the kernel still leaves those 5 % of each second). Its forks
	// (an append-only file's rewrite, a snapshot) start under the default
	// policy. It takes the same privilege as Nice; without it the server
	// runs at Nice instead, and says so in the log.
	Realtime int
}

// Redis is a running redis-server child process.
type Redis struct {
	proc *child
	port int
}

// StartRedis starts redis-server bound to 127.0.0.1 and waits until it
// answers PING. ctx bounds only the start-up; the process runs until Stop.
func StartRedis(ctx context.Context, cfg RedisConfig, log *slog.Logger) (*Redis, error) {
	dir, err := absDir(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("start redis: dir: %w", err)
	}
	cfg.Dir = dir
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("start redis: %w", err)
	}
	bin := cfg.Binary
	if bin == "" {
		bin, err = findBinary("redis-server", "/usr/bin/redis-server", "/usr/local/bin/redis-server")
		if err != nil {
			return nil, fmt.Errorf("start redis: redis-server not found in PATH, /usr/bin or /usr/local/bin: %s: %w", RedisInstallHint, err)
		}
	} else if !isExecutable(bin) {
		return nil, fmt.Errorf("start redis: %s is not an executable file: %s: %w", bin, RedisInstallHint, ErrBinaryNotFound)
	}

	r, err := startRedisOnce(ctx, bin, cfg, log)
	if errors.Is(err, errAddrInUse) && cfg.Port == 0 {
		// Someone took the port we picked before redis bound it; a second
		// pick is all but certain to succeed.
		log.Info("redis port taken, retrying with another", "component", "redis")
		r, err = startRedisOnce(ctx, bin, cfg, log)
	}
	if err != nil {
		return nil, fmt.Errorf("start redis: %w", err)
	}
	log.Info("redis started", "component", "redis", "addr", r.Addr(), "dir", dir, "persist", cfg.Persist, "pid", r.PID())
	return r, nil
}

func startRedisOnce(ctx context.Context, bin string, cfg RedisConfig, log *slog.Logger) (*Redis, error) {
	port := cfg.Port
	if port == 0 {
		var err error
		if port, err = freePort(); err != nil {
			return nil, err
		}
	}
	args := []string{
		// Loopback only and protected mode: no auth is configured, so the
		// server must be unreachable from the network.
		"--bind", loopback,
		"--port", strconv.Itoa(port),
		"--protected-mode", "yes",
		// We supervise the process; it must stay in the foreground.
		"--daemonize", "no",
		"--supervised", "no",
		"--dir", cfg.Dir,
		"--logfile", "",
		// RDB snapshots are off in both modes: tests want no disk writes and
		// dev mode relies on the AOF, so periodic full dumps would only add
		// IO and a second copy of the data.
		"--save", "",
	}
	if cfg.Persist {
		args = append(args, "--appendonly", "yes", "--appendfsync", "everysec")
	} else {
		args = append(args, "--appendonly", "no")
	}
	if cfg.ZSetListpackEntries > 0 {
		args = append(args, "--zset-max-listpack-entries", strconv.Itoa(cfg.ZSetListpackEntries))
	}
	if cfg.ClusterNodeTimeout > 0 {
		args = append(args, "--cluster-enabled", "yes",
			"--cluster-config-file", "nodes-"+strconv.Itoa(port)+".conf",
			"--cluster-node-timeout", strconv.FormatInt(cfg.ClusterNodeTimeout.Milliseconds(), 10))
	}
	name, argv := bin, args
	if len(cfg.Wrapper) > 0 {
		name, argv = cfg.Wrapper[0], slices.Concat(cfg.Wrapper[1:], []string{bin}, args)
	}
	cmd := exec.Command(name, argv...)
	cmd.Dir = cfg.Dir
	proc, err := startChild("redis", cmd, log)
	if err != nil {
		return nil, err
	}
	r := &Redis{proc: proc, port: port}
	if err := proc.waitReady(ctx, redisReadyTimeout, r.ping); err != nil {
		_ = proc.stop(syscall.SIGKILL, time.Second)
		return nil, err
	}
	r.prioritise(cfg, log)
	return r, nil
}

// prioritise gives the server's command thread the policy or niceness cfg
// asks for. On Linux both are a thread's: the process's id is its main
// thread's, the one that runs every command.
func (r *Redis) prioritise(cfg RedisConfig, log *slog.Logger) {
	if cfg.Realtime > 0 {
		err := unix.SchedSetAttr(r.PID(), &unix.SchedAttr{
			Policy: unix.SCHED_FIFO, Priority: uint32(cfg.Realtime), Flags: unix.SCHED_FLAG_RESET_ON_FORK,
		}, 0)
		if err == nil {
			log.Info("redis runs under a realtime policy", "component", "redis", "policy", "SCHED_FIFO", "priority", cfg.Realtime)
			return
		}
		log.Info("redis keeps the default policy", "component", "redis", "realtime", cfg.Realtime, "err", err)
	}
	if cfg.Nice != 0 {
		if err := syscall.Setpriority(syscall.PRIO_PROCESS, r.PID(), cfg.Nice); err != nil {
			log.Info("redis keeps the default niceness", "component", "redis", "nice", cfg.Nice, "err", err)
		} else {
			log.Info("redis niceness set", "component", "redis", "nice", cfg.Nice)
		}
	}
}

// ping speaks just enough RESP to tell "accepting commands" apart from
// "still loading the AOF" (-LOADING) and to make sure the server answering
// is our child rather than some other redis that grabbed the port we
// picked, without pulling a client library's pools and background
// goroutines into the readiness check.
func (r *Redis) ping(ctx context.Context) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", r.Addr())
	if err != nil {
		return err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if _, err := conn.Write([]byte("PING\r\nINFO server\r\n")); err != nil {
		return err
	}
	br := bufio.NewReader(conn)
	line, err := br.ReadString('\n')
	if err != nil {
		return err
	}
	if line = strings.TrimSpace(line); line != "+PONG" {
		return fmt.Errorf("PING answered %q", line)
	}
	// INFO's reply is a bulk string: "$<len>\r\n<len bytes>\r\n".
	line, err = br.ReadString('\n')
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(strings.TrimPrefix(strings.TrimSpace(line), "$"))
	if err != nil || !strings.HasPrefix(line, "$") {
		return fmt.Errorf("INFO answered %q", strings.TrimSpace(line))
	}
	info := make([]byte, n)
	if _, err := io.ReadFull(br, info); err != nil {
		return err
	}
	want := "process_id:" + strconv.Itoa(r.PID()) + "\r\n"
	if !strings.Contains(string(info), want) {
		return fmt.Errorf("%s is served by another redis process, not pid %d", r.Addr(), r.PID())
	}
	return nil
}

// URL returns a go-redis style URL for database 0, e.g.
// "redis://127.0.0.1:6379/0".
func (r *Redis) URL() string { return "redis://" + r.Addr() + "/0" }

// Addr returns the host:port the server listens on.
func (r *Redis) Addr() string { return net.JoinHostPort(loopback, strconv.Itoa(r.port)) }

// Port returns the TCP port the server listens on.
func (r *Redis) Port() int { return r.port }

// PID returns the redis-server process id.
func (r *Redis) PID() int { return r.proc.pid() }

// Stop sends SIGTERM (redis flushes the AOF and exits), waits up to 10s and
// then SIGKILLs. It is idempotent.
func (r *Redis) Stop() error {
	return r.proc.stop(syscall.SIGTERM, redisStopGrace)
}

// Kill ends the server at once (SIGKILL), as a crash of its machine would;
// Stop then reports the kill.
func (r *Redis) Kill() {
	_ = r.proc.stop(syscall.SIGKILL, redisStopGrace)
}

// Done is closed once the server's process has exited.
func (r *Redis) Done() <-chan struct{} { return r.proc.done }

// ExitError describes how the server's process exited, with its last output
// lines; it waits for the exit.
func (r *Redis) ExitError() error { return r.proc.exitError() }
