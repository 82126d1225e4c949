package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/feedproject/feed/cmd/internal/stack"
	"github.com/feedproject/feed/cmd/localstack"
)

// The servers of `feed dev --cluster`.
const (
	devNATSNodes  = 3
	devRedisNodes = 6 // three masters, then a replica of each
	// devClusterName is the JetStream cluster's name.
	devClusterName = "feed-dev"
	// devRedisNodeTimeout is how long the Redis nodes take to hold one
	// failed; its replica takes over a little after.
	devRedisNodeTimeout = 5 * time.Second
	// devClusterStart bounds the start of the servers and the forming of
	// the Redis Cluster.
	devClusterStart = 2 * time.Minute
)

// devClusterEnv is getenv with the defaults of `feed dev --cluster`: every
// stream on three nodes, and the images in the object store every API
// replica shares.
func devClusterEnv(getenv func(string) string) func(string) string {
	defaults := map[string]string{"FEED_STREAM_REPLICAS": "3", "FEED_MEDIA_STORE": stack.MediaObjectStore}
	return func(k string) string {
		if v := getenv(k); v != "" {
			return v
		}
		return defaults[k]
	}
}

// clusterPorts are the loopback ports of the servers of `feed dev
// --cluster`. They are fixed at the first start and kept in the data
// directory (portsFile): the Redis nodes' tables and the NATS routes name
// them.
type clusterPorts struct {
	NATS       []int `json:"nats"`
	NATSRoutes []int `json:"nats_routes"`
	NATSHTTP   []int `json:"nats_http"`
	Redis      []int `json:"redis"`
	Postgres   int   `json:"postgres"`
}

// clusterDir is where `feed dev --cluster` keeps its servers' data, apart
// from `feed dev`'s: a stream and a read model of one must not meet the
// other's.
func clusterDir(cfg stack.Config) string { return filepath.Join(cfg.DataDir, "cluster") }

func portsFile(cfg stack.Config) string { return filepath.Join(clusterDir(cfg), "ports.json") }

// loadClusterPorts reads the ports of an existing cluster, or chooses them
// for a new one and records them: from FEED_NATS_PORT (clients on it and the
// next two, routes 2000 above, monitoring 4000 above), FEED_DEV_REDIS_PORT
// (it and the next five) and FEED_DEV_POSTGRES_PORT; free ones where 0.
func loadClusterPorts(cfg stack.Config) (clusterPorts, bool, error) {
	var p clusterPorts
	b, err := os.ReadFile(portsFile(cfg))
	if err == nil {
		if err := json.Unmarshal(b, &p); err != nil {
			return p, false, fmt.Errorf("%s: %w", portsFile(cfg), err)
		}
		if len(p.NATS) != devNATSNodes || len(p.NATSRoutes) != devNATSNodes || len(p.NATSHTTP) != devNATSNodes || len(p.Redis) != devRedisNodes {
			return p, false, fmt.Errorf("%s does not name %d NATS and %d Redis nodes' ports", portsFile(cfg), devNATSNodes, devRedisNodes)
		}
		return p, true, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return p, false, err
	}
	series := func(base, offset, n int) []int {
		out := make([]int, n)
		for i := range out {
			out[i] = base + offset + i
		}
		return out
	}
	if cfg.NATSPort != 0 {
		p.NATS, p.NATSRoutes, p.NATSHTTP = series(cfg.NATSPort, 0, 3), series(cfg.NATSPort, 2000, 3), series(cfg.NATSPort, 4000, 3)
	} else {
		free, err := localstack.FreePorts(3 * devNATSNodes)
		if err != nil {
			return p, false, err
		}
		p.NATS, p.NATSRoutes, p.NATSHTTP = free[0:3], free[3:6], free[6:9]
	}
	if cfg.DevRedisPort != 0 {
		p.Redis = series(cfg.DevRedisPort, 0, devRedisNodes)
	} else if p.Redis, err = localstack.FreePorts(devRedisNodes); err != nil {
		return p, false, err
	}
	for _, port := range p.Redis {
		// A node's cluster bus listens 10000 above its port.
		if port+10000 > 65535 {
			return p, false, fmt.Errorf("redis port %d: a cluster node's port must be at most 55535 (its bus is 10000 above); set FEED_DEV_REDIS_PORT lower", port)
		}
	}
	p.Postgres = cfg.DevPGPort
	if p.Postgres == 0 {
		free, err := localstack.FreePorts(1)
		if err != nil {
			return p, false, err
		}
		p.Postgres = free[0]
	}
	return p, false, nil
}

func saveClusterPorts(cfg stack.Config, p clusterPorts) error {
	b, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(portsFile(cfg), append(b, '\n'), 0o644)
}

// devCluster is `feed dev --cluster`: it starts on loopback what is unset of
// a three-node JetStream cluster (NATS_URL), a Redis Cluster of three
// masters and three replicas (REDIS_URL) and Postgres (DATABASE_URL), each
// server supervised as dev's are, prints the settings that point more
// processes at them, and serves the configured roles against them until ctx
// ends.
func devCluster(ctx context.Context, cfg stack.Config, logger *slog.Logger, stdout io.Writer) (err error) {
	if err := os.MkdirAll(clusterDir(cfg), 0o755); err != nil {
		return err
	}
	ports, existing, err := loadClusterPorts(cfg)
	if err != nil {
		return err
	}
	if existing {
		logger.Info("the cluster's servers keep the ports of their first start", "file", portsFile(cfg))
	}
	servers := &clusterServers{logger: logger}
	defer func() {
		if err != nil {
			servers.stop()
		}
	}()
	startCtx, cancel := context.WithTimeout(ctx, devClusterStart)
	defer cancel()
	g, gctx := errgroup.WithContext(startCtx)
	natsURL, redisURL, databaseURL := cfg.NATSURL, cfg.RedisURL, cfg.DatabaseURL
	if natsURL == "" {
		g.Go(func() (err error) { natsURL, err = servers.startNATS(gctx, cfg, ports); return err })
	}
	if redisURL == "" {
		g.Go(func() (err error) { redisURL, err = servers.startRedis(gctx, cfg, ports); return err })
	}
	if databaseURL == "" {
		g.Go(func() (err error) { databaseURL, err = servers.startPostgres(gctx, cfg, ports); return err })
	}
	if err := g.Wait(); err != nil {
		return err
	}
	if !existing {
		if err := saveClusterPorts(cfg, ports); err != nil {
			return err
		}
	}
	cfg.NATSURL, cfg.RedisURL, cfg.DatabaseURL = natsURL, redisURL, databaseURL
	if err := writeClusterSettings(cfg, stdout); err != nil {
		return err
	}

	run, stopServe := context.WithCancel(ctx)
	defer stopServe()
	sg, sctx := errgroup.WithContext(run)
	sg.Go(func() error { return serve(sctx, cfg, true, logger, stdout) })
	// A server that keeps dying stops the service, which says why.
	for _, failed := range servers.failed {
		sg.Go(func() error {
			select {
			case err := <-failed:
				return err
			case <-sctx.Done():
				return nil
			}
		})
	}
	err = sg.Wait()
	servers.stop()
	return err
}

// clusterServers are the supervised servers devCluster started.
type clusterServers struct {
	logger *slog.Logger

	mu                    sync.Mutex
	nats, redis, postgres []*localstack.Supervisor
	failed                []<-chan error
}

// startSupervised starts a server by start and supervises it as name:
// restarted by the same start.
func startSupervised[S localstack.Server](ctx context.Context, s *clusterServers, kind *[]*localstack.Supervisor, name string, start func(context.Context) (S, error)) (S, error) {
	first, err := start(ctx)
	if err != nil {
		return first, fmt.Errorf("%s: %w", name, err)
	}
	sup := localstack.Supervise(name, first, func(ctx context.Context) (localstack.Server, error) {
		next, err := start(ctx)
		if err != nil {
			return nil, err
		}
		return next, nil
	}, localstack.SupervisorConfig{}, s.logger)
	s.mu.Lock()
	defer s.mu.Unlock()
	*kind = append(*kind, sup)
	s.failed = append(s.failed, sup.Failed())
	return first, nil
}

// stop stops Postgres and the Redis nodes, then the NATS nodes: the nodes of
// each at once.
func (s *clusterServers) stop() {
	s.mu.Lock()
	kinds := [][]*localstack.Supervisor{s.postgres, s.redis, s.nats}
	s.postgres, s.redis, s.nats = nil, nil, nil
	s.mu.Unlock()
	for _, sups := range kinds {
		var wg sync.WaitGroup
		for _, sup := range sups {
			wg.Go(func() { logStop(s.logger, "server", sup.Stop()) })
		}
		wg.Wait()
	}
}

// startNATS starts the JetStream cluster's nodes, `feed nats` processes, at
// once: none is ready before a majority has elected a leader.
func (s *clusterServers) startNATS(ctx context.Context, cfg stack.Config, ports clusterPorts) (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("start nats: find this binary: %w", err)
	}
	argv := []string{exe, "nats"}
	routes := make([]string, devNATSNodes)
	for i, p := range ports.NATSRoutes {
		routes[i] = "nats-route://127.0.0.1:" + strconv.Itoa(p)
	}
	urls, err := startNodes(ctx, devNATSNodes, func(ctx context.Context, i int) (string, error) {
		name := "nats-" + strconv.Itoa(i+1)
		c := natsConfig(cfg)
		c.Dir = filepath.Join(clusterDir(cfg), name)
		c.Port, c.HTTPPort, c.ServerName = ports.NATS[i], ports.NATSHTTP[i], "n"+strconv.Itoa(i+1)
		c.Cluster = localstack.NATSCluster{Name: devClusterName, Host: "127.0.0.1", Port: ports.NATSRoutes[i], Routes: routes}
		n, err := startSupervised(ctx, s, &s.nats, name, func(ctx context.Context) (*localstack.NATSProcess, error) {
			return localstack.StartNATSProcess(ctx, argv, c, s.logger.With("node", name))
		})
		if err != nil {
			return "", err
		}
		return n.ClientURL(), nil
	})
	if err != nil {
		return "", err
	}
	return strings.Join(urls, ","), nil
}

// startNodes starts n nodes at once, node i by start, and returns their
// addresses.
func startNodes(ctx context.Context, n int, start func(context.Context, int) (string, error)) ([]string, error) {
	addrs := make([]string, n)
	g, gctx := errgroup.WithContext(ctx)
	for i := range n {
		g.Go(func() (err error) {
			addrs[i], err = start(gctx, i)
			return err
		})
	}
	return addrs, g.Wait()
}

// startRedis starts the Redis Cluster's nodes, persistent, and makes them a
// cluster unless they are one already.
func (s *clusterServers) startRedis(ctx context.Context, cfg stack.Config, ports clusterPorts) (string, error) {
	addrs, err := startNodes(ctx, devRedisNodes, func(ctx context.Context, i int) (string, error) {
		name := "redis-" + strconv.Itoa(i+1)
		rc := devRedisConfig(cfg)
		rc.Dir = filepath.Join(clusterDir(cfg), name)
		rc.Port = ports.Redis[i]
		rc.Realtime = 0 // six realtime threads would starve the rest
		rc.ClusterNodeTimeout = devRedisNodeTimeout
		r, err := startSupervised(ctx, s, &s.redis, name, func(ctx context.Context) (*localstack.Redis, error) {
			return localstack.StartRedis(ctx, rc, s.logger.With("node", name))
		})
		if err != nil {
			return "", err
		}
		return r.Addr(), nil
	})
	if err != nil {
		return "", err
	}
	if err := localstack.FormRedisCluster(ctx, addrs); err != nil {
		return "", fmt.Errorf("%w (data in %s)", err, clusterDir(cfg))
	}
	return localstack.RedisClusterURL(addrs), nil
}

func (s *clusterServers) startPostgres(ctx context.Context, cfg stack.Config, ports clusterPorts) (string, error) {
	pc := localstack.PostgresConfig{Dir: filepath.Join(clusterDir(cfg), "postgres"), Port: ports.Postgres, Durable: true}
	p, err := startSupervised(ctx, s, &s.postgres, "postgres", func(ctx context.Context) (*localstack.Postgres, error) {
		return localstack.StartPostgres(ctx, pc, s.logger)
	})
	if err != nil {
		return "", err
	}
	return p.URL(), nil
}

// clusterSettings are the variables that point another process at the
// cluster, as shell lines, and what must be the same in every process.
func clusterSettings(cfg stack.Config) string {
	var b strings.Builder
	line := func(name, value string) { fmt.Fprintf(&b, "export %s='%s'\n", name, value) }
	line("NATS_URL", cfg.NATSURL)
	line("REDIS_URL", cfg.RedisURL)
	line("DATABASE_URL", cfg.DatabaseURL)
	line("FEED_STREAM", cfg.StreamName)
	line("FEED_STREAM_REPLICAS", strconv.Itoa(cfg.Replicas))
	line("FEED_MEDIA_STORE", cfg.MediaStore)
	line("FEED_PARTITIONS", strconv.Itoa(cfg.Partitions))
	if cfg.JWTSecret == "" {
		line("FEED_JWT_SECRET", stack.DevJWTSecret)
	}
	return b.String()
}

// writeClusterSettings prints the settings and keeps them in the cluster's
// directory as a file a shell sources.
func writeClusterSettings(cfg stack.Config, stdout io.Writer) error {
	settings := clusterSettings(cfg)
	file := filepath.Join(clusterDir(cfg), "env")
	if err := os.WriteFile(file, []byte(settings), 0o600); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "feed dev --cluster: %d NATS nodes, a Redis Cluster of 3 masters and 3 replicas, and Postgres are up.\n", devNATSNodes)
	fmt.Fprintf(stdout, "More processes join them with these settings (`. %s` sets them):\n", file)
	for l := range strings.Lines(settings) {
		fmt.Fprint(stdout, "  "+l)
	}
	fmt.Fprintln(stdout, "and FEED_ROLES, FEED_HTTP_ADDR and, for an api process, a FEED_NODE_ID of its own (this one's is "+strconv.Itoa(cfg.NodeID)+").")
	return nil
}
