package localstack

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// natsReadyTimeout bounds how long StartNATS waits for the client listener.
const natsReadyTimeout = 10 * time.Second

// NATSConfig configures the embedded NATS server. Only Dir is required.
type NATSConfig struct {
	// Dir is the JetStream store directory (required). The server keeps its
	// streams under Dir/jetstream.
	Dir string
	// Host is the listen address; default "127.0.0.1".
	Host string
	// Port is the client port; 0 picks a random free port. Dev mode passes
	// 4222 so the `nats` CLI works with no flags.
	Port int
	// SyncAlways makes JetStream fsync every write (sync_interval: always).
	SyncAlways bool
	// SyncInterval is the background fsync interval used when SyncAlways is
	// false; 0 keeps the server default (2 minutes).
	SyncInterval time.Duration
	// ServerName is the server's name in logs and monitoring; default "feed".
	ServerName string
	// MaxPayload is the largest message the server takes, headers included;
	// 0 keeps the server's default (1 MiB).
	MaxPayload int32
	// Cluster, if its Name is set, makes the server a node of a JetStream
	// cluster; every node needs its own ServerName and Dir.
	Cluster NATSCluster
	// HTTPPort, if above 0, serves the server's monitoring endpoints
	// (/healthz, /jsz, /routez) on Host.
	HTTPPort int
}

// NATSCluster is a server's place in a cluster.
type NATSCluster struct {
	// Name is the cluster's name, the same on every node.
	Name string
	// Host and Port are where this node listens for routes from the others;
	// Host defaults to the server's.
	Host string
	Port int
	// Routes are the other nodes' route URLs (nats-route://host:port); a
	// node's own is ignored.
	Routes []string
}

// NATS is a running embedded NATS server with JetStream enabled.
type NATS struct {
	srv  *server.Server
	log  *slog.Logger
	once sync.Once
}

// StartNATS starts an embedded nats-server with JetStream enabled and waits
// until it accepts client connections. The server's logs go to log; it
// installs no signal handlers, so shutdown stays the caller's decision.
func StartNATS(cfg NATSConfig, log *slog.Logger) (*NATS, error) {
	dir, err := absDir(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("start nats: store dir: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("start nats: %w", err)
	}
	if cfg.Host == "" {
		cfg.Host = loopback
	}
	if cfg.ServerName == "" {
		cfg.ServerName = "feed"
	}
	port := cfg.Port
	if port == 0 {
		// The server binds port 0 itself and reports the real port through
		// ClientURL, so unlike the child processes there is no pick-then-bind
		// race here.
		port = server.RANDOM_PORT
	}
	opts := &server.Options{
		ServerName: cfg.ServerName,
		Host:       cfg.Host,
		Port:       port,
		JetStream:  true,
		StoreDir:   dir,
		// The embedding process owns signals (dev mode shuts everything
		// down in order on Ctrl-C; tests must not be killed by SIGINT
		// handlers they did not ask for).
		NoSigs: true,
		// The ASCII-art banner is noise in test output.
		DisableJetStreamBanner: true,
		SyncAlways:             cfg.SyncAlways,
		MaxPayload:             cfg.MaxPayload,
	}
	if !cfg.SyncAlways && cfg.SyncInterval > 0 {
		opts.SyncInterval = cfg.SyncInterval
	}
	if cfg.Cluster.Name != "" {
		opts.Cluster.Name = cfg.Cluster.Name
		opts.Cluster.Host = cmp.Or(cfg.Cluster.Host, cfg.Host)
		opts.Cluster.Port = cfg.Cluster.Port
		opts.Routes = server.RoutesFromStr(strings.Join(cfg.Cluster.Routes, ","))
	}
	if cfg.HTTPPort > 0 {
		opts.HTTPHost, opts.HTTPPort = cfg.Host, cfg.HTTPPort
	}
	// Debug logs from the server are only worth producing when someone will
	// see them; trace (every protocol message) is never useful here.
	debug := log.Enabled(context.Background(), slog.LevelDebug)
	opts.Debug = debug

	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("start nats: %w", err)
	}
	logger := &natsLogger{log: log.With("component", "nats")}
	srv.SetLoggerV2(logger, debug, false, false)

	// Start returns once listeners are set up; failures such as a taken
	// port are only reported through Fatalf, which our logger records
	// instead of exiting the process.
	srv.Start()
	if err := logger.fatal(); err != nil {
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, fmt.Errorf("start nats on %s:%d: %w", cfg.Host, cfg.Port, err)
	}
	if !srv.ReadyForConnections(natsReadyTimeout) {
		err := logger.fatal()
		srv.Shutdown()
		srv.WaitForShutdown()
		if err == nil {
			err = fmt.Errorf("not ready for connections after %s", natsReadyTimeout)
		}
		return nil, fmt.Errorf("start nats: %w", err)
	}
	n := &NATS{srv: srv, log: log}
	log.Info("nats started", "component", "nats", "url", n.ClientURL(), "store_dir", dir, "sync_always", cfg.SyncAlways)
	return n, nil
}

// ClientURL returns the URL clients connect to, e.g. "nats://127.0.0.1:4222".
func (n *NATS) ClientURL() string { return n.srv.ClientURL() }

// Server returns the embedded server, for tests that need to inspect it.
func (n *NATS) Server() *server.Server { return n.srv }

// Shutdown stops the server and waits until it has shut down. It is
// idempotent.
func (n *NATS) Shutdown() {
	n.once.Do(func() {
		n.srv.Shutdown()
		n.srv.WaitForShutdown()
		n.log.Info("nats stopped", "component", "nats")
	})
}

// natsLogger adapts nats-server's printf-style logger to slog. Fatalf is
// logged at error level and remembered instead of exiting, because an
// embedded server must never terminate its host process.
type natsLogger struct {
	log *slog.Logger

	mu       sync.Mutex
	fatalErr error
}

var _ server.Logger = (*natsLogger)(nil)

func (l *natsLogger) Noticef(format string, v ...any) { l.emit(slog.LevelInfo, format, v) }
func (l *natsLogger) Warnf(format string, v ...any)   { l.emit(slog.LevelWarn, format, v) }
func (l *natsLogger) Errorf(format string, v ...any)  { l.emit(slog.LevelError, format, v) }
func (l *natsLogger) Debugf(format string, v ...any)  { l.emit(slog.LevelDebug, format, v) }

// Tracef logs below debug: traces are per protocol message and would drown
// everything else if a handler were at debug level.
func (l *natsLogger) Tracef(format string, v ...any) { l.emit(slog.LevelDebug-4, format, v) }

func (l *natsLogger) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	l.log.Error(msg, "fatal", true)
	l.mu.Lock()
	if l.fatalErr == nil {
		l.fatalErr = errors.New(msg)
	}
	l.mu.Unlock()
}

func (l *natsLogger) fatal() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fatalErr
}

func (l *natsLogger) emit(level slog.Level, format string, v []any) {
	if !l.log.Enabled(context.Background(), level) {
		return
	}
	l.log.Log(context.Background(), level, strings.TrimSpace(fmt.Sprintf(format, v...)))
}
