// Package natscluster runs a JetStream cluster inside a test's process, on
// loopback ports and temporary stores, and injects the faults the service must
// survive: nodes killed and restarted, client connections cut. It is for
// tests only; the service's binary never links it.
package natscluster

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/feedproject/feed/cmd/localstack"
)

// account is the account streams live in when the server has none configured.
const account = server.DEFAULT_GLOBAL_ACCOUNT

// Timeouts bound every wait, so a cluster that does not form or recover
// fails the test instead of hanging it.
const (
	startTimeout   = 30 * time.Second
	restartTimeout = 10 * time.Second
)

// Config configures a cluster; the zero value is three nodes.
type Config struct {
	// Nodes is the number of servers; default 3.
	Nodes int
	// SyncAlways makes every node fsync each write, as the service's
	// production setting does.
	SyncAlways bool
}

// Cluster is a running JetStream cluster. Its methods fail the test they were
// started with, so call them from the test's goroutine.
type Cluster struct {
	tb    testing.TB
	name  string
	cfg   Config
	nodes []*node
	log   *testLog
}

// node is one server and what it needs to start again as itself.
type node struct {
	name       string
	dir        string
	clientPort int
	routePort  int

	mu  sync.Mutex
	srv *server.Server // nil while killed
}

func (n *node) server() *server.Server {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.srv
}

// Start starts a cluster and waits until it has a meta leader and every node
// is current. Cleanup shuts every node down and removes the stores.
func Start(tb testing.TB, cfg Config) *Cluster {
	tb.Helper()
	if cfg.Nodes == 0 {
		cfg.Nodes = 3
	}
	dir, err := os.MkdirTemp("", "feed-natscluster-*")
	if err != nil {
		tb.Fatalf("natscluster: %v", err)
	}
	c := &Cluster{tb: tb, name: "feed-test", cfg: cfg, log: newTestLog(tb)}
	tb.Cleanup(func() {
		c.shutdown()
		if err := os.RemoveAll(dir); err != nil {
			tb.Errorf("natscluster: remove stores: %v", err)
		}
	})
	// Route ports must be known before the first node starts, since each
	// node's configuration lists them all. A port taken between picking and
	// binding (by another process) makes the whole start try again.
	deadline := time.Now().Add(startTimeout)
	for attempt := 0; ; attempt++ {
		err := c.start(filepath.Join(dir, strconv.Itoa(attempt)))
		if err == nil {
			break
		}
		c.shutdown()
		if !errors.Is(err, errPortTaken) || time.Now().After(deadline) {
			tb.Fatalf("natscluster: %v", err)
		}
	}
	c.WaitForReady(startTimeout)
	return c
}

func (c *Cluster) start(dir string) error {
	ports, err := localstack.FreePorts(2 * c.cfg.Nodes)
	if err != nil {
		return err
	}
	c.nodes = make([]*node, c.cfg.Nodes)
	for i := range c.nodes {
		c.nodes[i] = &node{
			name:       "n" + strconv.Itoa(i),
			dir:        filepath.Join(dir, "n"+strconv.Itoa(i)),
			clientPort: ports[2*i],
			routePort:  ports[2*i+1],
		}
	}
	for i := range c.nodes {
		if err := c.startNode(i); err != nil {
			return err
		}
	}
	return nil
}

var errPortTaken = errors.New("port taken")

// startNode starts node i on its ports and store.
func (c *Cluster) startNode(i int) error {
	n := c.nodes[i]
	routes := make([]*url.URL, 0, len(c.nodes))
	for _, o := range c.nodes {
		routes = append(routes, &url.URL{Scheme: "nats-route", Host: net.JoinHostPort("127.0.0.1", strconv.Itoa(o.routePort))})
	}
	opts := &server.Options{
		ServerName: n.name,
		Host:       "127.0.0.1",
		Port:       n.clientPort,
		JetStream:  true,
		StoreDir:   n.dir,
		SyncAlways: c.cfg.SyncAlways,
		Cluster: server.ClusterOpts{
			Name: c.name,
			Host: "127.0.0.1",
			Port: n.routePort,
		},
		Routes:                 routes,
		NoSigs:                 true,
		DisableJetStreamBanner: true,
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		return fmt.Errorf("node %d: %w", i, err)
	}
	logger := &nodeLogger{log: c.log, name: n.name}
	srv.SetLoggerV2(logger, false, false, false)
	srv.Start()
	if err := logger.fatal(); err != nil {
		srv.Shutdown()
		srv.WaitForShutdown()
		if strings.Contains(err.Error(), "address already in use") {
			err = fmt.Errorf("%w: %w", errPortTaken, err)
		}
		return fmt.Errorf("node %d: %w", i, err)
	}
	if !srv.ReadyForConnections(restartTimeout) {
		srv.Shutdown()
		srv.WaitForShutdown()
		return fmt.Errorf("node %d: not ready for connections after %s", i, restartTimeout)
	}
	n.mu.Lock()
	n.srv = srv
	n.mu.Unlock()
	return nil
}

func (c *Cluster) shutdown() {
	for i := range c.nodes {
		c.stop(i)
	}
}

// stop shuts node i down and waits until it has; it reports whether the node
// was running.
func (c *Cluster) stop(i int) bool {
	n := c.nodes[i]
	n.mu.Lock()
	srv := n.srv
	n.srv = nil
	n.mu.Unlock()
	if srv == nil {
		return false
	}
	srv.Shutdown()
	srv.WaitForShutdown()
	return true
}

// Size is the number of nodes.
func (c *Cluster) Size() int { return len(c.nodes) }

// Addr is node i's client address, host:port; it stays the same across
// restarts.
func (c *Cluster) Addr(i int) string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(c.nodes[i].clientPort))
}

// URL is node i's client URL.
func (c *Cluster) URL(i int) string { return "nats://" + c.Addr(i) }

// URLs lists every node's client URL, comma-separated, as nats.Connect takes
// them.
func (c *Cluster) URLs() string {
	urls := make([]string, len(c.nodes))
	for i := range c.nodes {
		urls[i] = c.URL(i)
	}
	return strings.Join(urls, ",")
}

// Server is node i's server, nil while it is killed.
func (c *Cluster) Server(i int) *server.Server { return c.nodes[i].server() }

// Kill shuts node i down: its clients and routes are cut, and its raft groups
// lose it. (An embedded server cannot be killed harder; it steps down from
// what it leads on the way out.)
func (c *Cluster) Kill(i int) {
	c.tb.Helper()
	if !c.stop(i) {
		c.tb.Fatalf("natscluster: kill node %d: not running", i)
	}
}

// Restart starts node i again on the same ports and store, so that it rejoins
// the cluster with what it had, and waits until it accepts clients. A port
// taken meanwhile by another process is tried again for a while.
func (c *Cluster) Restart(i int) {
	c.tb.Helper()
	if c.nodes[i].server() != nil {
		c.tb.Fatalf("natscluster: restart node %d: still running", i)
	}
	deadline := time.Now().Add(restartTimeout)
	for {
		err := c.startNode(i)
		if err == nil {
			return
		}
		if !errors.Is(err, errPortTaken) || time.Now().After(deadline) {
			c.tb.Fatalf("natscluster: restart: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// StreamLeader is the index of the node leading stream, -1 if none does.
func (c *Cluster) StreamLeader(stream string) int {
	for i, n := range c.nodes {
		if srv := n.server(); srv != nil && srv.JetStreamIsStreamLeader(account, stream) {
			return i
		}
	}
	return -1
}

// ServerOf is the index of the node nc is connected to, -1 if it is not
// connected to any running node.
func (c *Cluster) ServerOf(nc *nats.Conn) int {
	id := nc.ConnectedServerId()
	if id == "" || !nc.IsConnected() {
		return -1
	}
	for i, n := range c.nodes {
		if srv := n.server(); srv != nil && srv.ID() == id {
			return i
		}
	}
	return -1
}

// WaitForReady waits until the cluster has a meta leader that sees every
// node as a peer and every running node is current with it.
func (c *Cluster) WaitForReady(timeout time.Duration) {
	c.tb.Helper()
	c.waitFor(timeout, "the cluster to be ready", func() bool {
		var leader *server.Server
		for _, n := range c.nodes {
			srv := n.server()
			if srv == nil {
				continue
			}
			if !srv.JetStreamIsCurrent() {
				return false
			}
			if srv.JetStreamIsLeader() {
				leader = srv
			}
		}
		return leader != nil && len(leader.JetStreamClusterPeers()) == len(c.nodes)
	})
}

// WaitForStreamLeader waits until stream has a leader and returns its index.
func (c *Cluster) WaitForStreamLeader(stream string, timeout time.Duration) int {
	c.tb.Helper()
	leader := -1
	c.waitFor(timeout, "a leader of stream "+stream, func() bool {
		leader = c.StreamLeader(stream)
		return leader >= 0
	})
	return leader
}

// WaitForStreamCurrent waits until node i's replica of stream is current with
// its leader and holds everything the leader held when the wait began.
func (c *Cluster) WaitForStreamCurrent(i int, stream string, timeout time.Duration) {
	c.tb.Helper()
	var want uint64
	c.waitFor(timeout, fmt.Sprintf("a leader of %s", stream), func() bool {
		leader := c.StreamLeader(stream)
		if leader < 0 {
			return false
		}
		last, ok := c.lastSeq(leader, stream)
		want = last
		return ok
	})
	c.waitFor(timeout, fmt.Sprintf("node %d's replica of %s to reach %d", i, stream, want), func() bool {
		srv := c.nodes[i].server()
		if srv == nil || !srv.JetStreamIsStreamCurrent(account, stream) {
			return false
		}
		last, ok := c.lastSeq(i, stream)
		return ok && last >= want
	})
}

// lastSeq is the last sequence in node i's replica of stream.
func (c *Cluster) lastSeq(i int, stream string) (uint64, bool) {
	srv := c.nodes[i].server()
	if srv == nil {
		return 0, false
	}
	info, err := srv.Jsz(&server.JSzOptions{Streams: true, Account: account})
	if err != nil {
		return 0, false
	}
	for _, acc := range info.AccountDetails {
		for _, s := range acc.Streams {
			if s.Name == stream {
				return s.State.LastSeq, true
			}
		}
	}
	return 0, false
}

func (c *Cluster) waitFor(timeout time.Duration, what string, ok func() bool) {
	c.tb.Helper()
	deadline := time.Now().Add(timeout)
	for !ok() {
		if time.Now().After(deadline) {
			c.tb.Fatalf("natscluster: waited %s for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// testLog writes the nodes' problems to the test's output until the test's
// cleanups are done: a server logs from its own goroutines, and writing to a
// finished test panics.
type testLog struct {
	mu     sync.Mutex
	tb     testing.TB
	closed bool
}

func newTestLog(tb testing.TB) *testLog {
	l := &testLog{tb: tb}
	tb.Cleanup(func() {
		l.mu.Lock()
		l.closed = true
		l.mu.Unlock()
	})
	return l
}

func (l *testLog) printf(format string, v ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		l.tb.Logf(format, v...)
	}
}

// nodeLogger keeps a node's errors for the test's output and remembers a
// fatal one instead of exiting the process. Warnings are left out: every kill
// makes the other nodes warn of the lost routes.
type nodeLogger struct {
	log  *testLog
	name string

	mu       sync.Mutex
	fatalErr error
}

var _ server.Logger = (*nodeLogger)(nil)

func (l *nodeLogger) Noticef(string, ...any) {}
func (l *nodeLogger) Warnf(string, ...any)   {}
func (l *nodeLogger) Debugf(string, ...any)  {}
func (l *nodeLogger) Tracef(string, ...any)  {}

func (l *nodeLogger) Errorf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	if strings.HasPrefix(msg, "Error trying to connect to route") {
		return // a peer not started yet, or killed: the test knows
	}
	l.log.printf("nats %s: %s", l.name, msg)
}

func (l *nodeLogger) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	l.log.printf("nats %s: fatal: %s", l.name, msg)
	l.mu.Lock()
	if l.fatalErr == nil {
		l.fatalErr = errors.New(msg)
	}
	l.mu.Unlock()
}

func (l *nodeLogger) fatal() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fatalErr
}
