package localstack

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// natsPortWait is how long StartNATSProcess tries again on a taken port
// before it gives up.
const natsPortWait = 2 * time.Second

// natsStopGrace is how long a NATS child gets to flush its store and exit
// after SIGTERM before its process group is killed.
const natsStopGrace = 15 * time.Second

// NATSProcess is the embedded server of StartNATS run in a child process of
// its own: a program that calls RunNATS with the arguments StartNATSProcess
// gives it (this project's binary, as `feed nats`). Its heap and garbage
// collection are then its own, as a deployed NATS server's are: JetStream's
// indexes (a subject per post, the dedup window's ids, block caches) grow
// with the log, and in the service's process they were collected, and
// counted, with the service's memory.
type NATSProcess struct {
	proc *child
	port int
}

// StartNATSProcess starts argv (a binary and the arguments that make it call
// RunNATS with the rest) with cfg's store, port and sync policy, and waits
// until it serves JetStream. Like Redis and Postgres, the child has its own
// process group and is killed by the kernel if this process dies.
func StartNATSProcess(ctx context.Context, argv []string, cfg NATSConfig, log *slog.Logger) (*NATSProcess, error) {
	if len(argv) == 0 {
		return nil, errors.New("start nats: no command")
	}
	dir, err := absDir(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("start nats: store dir: %w", err)
	}
	cfg.Dir = dir
	// A taken port is tried again for a moment: a fixed one may still be held
	// by the server of a process that has just died (killed with it, it is
	// exiting), and a picked one (Port 0) was taken before the child bound it,
	// so the next attempt picks another.
	n, err := startNATSProcessOnce(ctx, argv, cfg, log)
	for deadline := time.Now().Add(natsPortWait); errors.Is(err, errAddrInUse) && time.Now().Before(deadline); {
		log.Info("nats port taken, trying again", "component", "nats", "port", cfg.Port)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("start nats: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
		n, err = startNATSProcessOnce(ctx, argv, cfg, log)
	}
	if err != nil {
		return nil, fmt.Errorf("start nats: %w", err)
	}
	log.Info("nats started", "component", "nats", "url", n.ClientURL(), "store_dir", dir, "sync_always", cfg.SyncAlways, "pid", n.PID())
	return n, nil
}

func startNATSProcessOnce(ctx context.Context, argv []string, cfg NATSConfig, log *slog.Logger) (*NATSProcess, error) {
	if cfg.Port == 0 {
		var err error
		if cfg.Port, err = freePort(); err != nil {
			return nil, err
		}
	}
	args := append(append([]string(nil), argv[1:]...), cfg.args()...)
	args = append(args, "--log", "json")
	proc, err := startChildLeveled("nats", exec.Command(argv[0], args...), log, nil, childRecord)
	if err != nil {
		return nil, err
	}
	n := &NATSProcess{proc: proc, port: cfg.Port}
	if err := proc.waitReady(ctx, natsReadyTimeout, n.ping); err != nil {
		_ = proc.stop(syscall.SIGKILL, time.Second)
		return nil, err
	}
	return n, nil
}

// childRecord makes a line of the NATS child's log, a JSON record of
// log/slog (RunNATS with --log json), into one record here, as if the server
// ran inside this process: its message and attributes as they were, its
// warnings and errors at their level, the rest at debug, as Redis's and
// Postgres's output. A line that is no such record (one its caller logged
// before RunNATS, a panic's trace) is logged whole, at the level its text
// names when it is a warning or an error.
func childRecord(line string) (slog.Level, string, []any) {
	level, msg, attrs, ok := jsonRecord(line)
	if !ok {
		return childLogLevel(line), line, nil
	}
	if level < slog.LevelWarn {
		level = slog.LevelDebug
	}
	return level, msg, attrs
}

// jsonRecord reads a record of slog's JSON handler, keeping its attributes'
// order; the time is left out (the record is logged again now) and so is
// the component (the child's logger names it).
func jsonRecord(line string) (level slog.Level, msg string, attrs []any, ok bool) {
	dec := json.NewDecoder(strings.NewReader(line))
	dec.UseNumber()
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return 0, "", nil, false
	}
	var hasMsg bool
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return 0, "", nil, false
		}
		key, _ := t.(string)
		var v any
		if err := dec.Decode(&v); err != nil {
			return 0, "", nil, false
		}
		switch key {
		case slog.TimeKey, "component":
		case slog.LevelKey:
			s, _ := v.(string)
			if level.UnmarshalText([]byte(s)) != nil {
				return 0, "", nil, false
			}
		case slog.MessageKey:
			msg, hasMsg = v.(string)
		default:
			attrs = append(attrs, key, v)
		}
	}
	return level, msg, attrs, hasMsg
}

// childLogLevel is the level of a line in log/slog's text form: a warning
// or an error at its level, the rest at debug.
func childLogLevel(line string) slog.Level {
	for _, l := range []slog.Level{slog.LevelError, slog.LevelWarn} {
		if strings.Contains(line, "level="+l.String()+" ") {
			return l
		}
	}
	return slog.LevelDebug
}

// childLogger is the log of a NATS child: JSON records on w, one a line,
// at the levels like enables, which its parent reads (childRecord).
func childLogger(w io.Writer, like *slog.Logger) *slog.Logger {
	level := slog.LevelError
	for _, l := range []slog.Level{slog.LevelDebug, slog.LevelInfo, slog.LevelWarn} {
		if like.Enabled(context.Background(), l) {
			level = l
			break
		}
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
}

// ping connects and asks for the JetStream account: the server is up and its
// store is open.
func (n *NATSProcess) ping(ctx context.Context) error {
	nc, err := nats.Connect(n.ClientURL(), nats.Timeout(time.Second), nats.NoReconnect())
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	_, err = js.AccountInfo(ctx)
	return err
}

// ClientURL is the URL clients connect to, e.g. "nats://127.0.0.1:4222".
func (n *NATSProcess) ClientURL() string {
	return "nats://" + loopback + ":" + strconv.Itoa(n.port)
}

// PID is the child's process id.
func (n *NATSProcess) PID() int { return n.proc.pid() }

// Port is the client port the server listens on.
func (n *NATSProcess) Port() int { return n.port }

// Stop asks the server to shut down (SIGTERM), waits for it and kills it if
// it takes too long. It is idempotent.
func (n *NATSProcess) Stop() error { return n.proc.stop(syscall.SIGTERM, natsStopGrace) }

// args are the flags that give RunNATS this configuration.
func (c NATSConfig) args() []string {
	out := []string{"--dir", c.Dir, "--port", strconv.Itoa(c.Port)}
	if c.Host != "" {
		out = append(out, "--host", c.Host)
	}
	if c.SyncAlways {
		out = append(out, "--sync", "always")
	} else if c.SyncInterval > 0 {
		out = append(out, "--sync", c.SyncInterval.String())
	}
	if c.MaxPayload > 0 {
		out = append(out, "--max-payload", strconv.Itoa(int(c.MaxPayload)))
	}
	if c.ServerName != "" {
		out = append(out, "--name", c.ServerName)
	}
	if c.Cluster.Name != "" {
		out = append(out, "--cluster", c.Cluster.Name,
			"--cluster-listen", net.JoinHostPort(c.Cluster.Host, strconv.Itoa(c.Cluster.Port)),
			"--routes", strings.Join(c.Cluster.Routes, ","))
	}
	if c.HTTPPort > 0 {
		out = append(out, "--http-port", strconv.Itoa(c.HTTPPort))
	}
	return out
}

// RunNATS is the child's side of StartNATSProcess: it parses the flags that
// StartNATSProcess passes (def gives their defaults), runs the embedded server
// (StartNATS) until ctx ends, then shuts it down.
func RunNATS(ctx context.Context, args []string, def NATSConfig, stderr io.Writer, log *slog.Logger) error {
	fs := flag.NewFlagSet("nats", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := def
	sync := "always"
	if !def.SyncAlways && def.SyncInterval > 0 {
		sync = def.SyncInterval.String()
	}
	if cfg.Host == "" {
		cfg.Host = loopback
	}
	var maxPayload int
	var clusterListen, routes string
	format := "text"
	fs.StringVar(&format, "log", format, "log format: text (log as given), or json for StartNATSProcess to read")
	fs.StringVar(&cfg.Dir, "dir", cfg.Dir, "JetStream store directory")
	fs.StringVar(&cfg.Host, "host", cfg.Host, "listen address")
	fs.IntVar(&cfg.Port, "port", cfg.Port, "client port; 0 picks a free one")
	fs.StringVar(&sync, "sync", sync, "fsync policy: always (acknowledged = on disk), or an interval such as 2m")
	fs.IntVar(&maxPayload, "max-payload", int(cfg.MaxPayload), "largest message in bytes, headers included; 0 keeps the server's default (1 MiB)")
	fs.StringVar(&cfg.ServerName, "name", cfg.ServerName, "server name, unique in a cluster")
	fs.StringVar(&cfg.Cluster.Name, "cluster", cfg.Cluster.Name, "cluster name, the same on every node; unset runs a single server")
	fs.StringVar(&clusterListen, "cluster-listen", "", "host:port this node listens on for routes from the others")
	fs.StringVar(&routes, "routes", "", "the other nodes' route URLs, comma-separated (nats-route://host:port)")
	fs.IntVar(&cfg.HTTPPort, "http-port", cfg.HTTPPort, "monitoring port (/healthz, /jsz); 0 serves none")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := parseCluster(&cfg, clusterListen, routes); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("nats: unexpected arguments %q", fs.Args())
	}
	if cfg.Dir == "" {
		return errors.New("nats: --dir is required")
	}
	cfg.SyncAlways, cfg.SyncInterval = sync == "always", 0
	if !cfg.SyncAlways {
		d, err := time.ParseDuration(sync)
		if err != nil || d <= 0 {
			return fmt.Errorf("nats: --sync %q is not always or a positive duration", sync)
		}
		cfg.SyncInterval = d
	}
	if maxPayload < 0 || maxPayload > 64<<20 {
		return fmt.Errorf("nats: --max-payload %d is not between 0 and 64 MiB", maxPayload)
	}
	cfg.MaxPayload = int32(maxPayload)
	switch format {
	case "text":
	case "json":
		log = childLogger(stderr, log)
	default:
		return fmt.Errorf("nats: --log %q is not text or json", format)
	}
	ns, err := StartNATS(cfg, log)
	if err != nil {
		return err
	}
	<-ctx.Done()
	ns.Shutdown()
	return nil
}

// parseCluster checks and applies the cluster flags of RunNATS.
func parseCluster(cfg *NATSConfig, listen, routes string) error {
	if cfg.Cluster.Name == "" {
		if listen != "" || routes != "" {
			return errors.New("nats: --cluster-listen and --routes need --cluster")
		}
		return nil
	}
	if cfg.ServerName == "" {
		return errors.New("nats: a cluster node needs a --name of its own")
	}
	host, port, err := net.SplitHostPort(listen)
	n, perr := strconv.Atoi(port)
	if err != nil || perr != nil || n <= 0 || n > 65535 {
		return fmt.Errorf("nats: --cluster-listen %q is not host:port", listen)
	}
	cfg.Cluster.Host, cfg.Cluster.Port = host, n
	cfg.Cluster.Routes = nil
	for r := range strings.SplitSeq(routes, ",") {
		if r = strings.TrimSpace(r); r == "" {
			continue
		}
		u, err := url.Parse(r)
		if err != nil || u.Scheme != "nats-route" || u.Port() == "" {
			return fmt.Errorf("nats: route %q is not nats-route://host:port", r)
		}
		cfg.Cluster.Routes = append(cfg.Cluster.Routes, r)
	}
	if len(cfg.Cluster.Routes) == 0 {
		return errors.New("nats: a cluster node needs --routes to the others")
	}
	return nil
}

// Done is closed once the server's process has exited.
func (n *NATSProcess) Done() <-chan struct{} { return n.proc.done }

// ExitError describes how the server's process exited, with its last output
// lines; it waits for the exit.
func (n *NATSProcess) ExitError() error { return n.proc.exitError() }
