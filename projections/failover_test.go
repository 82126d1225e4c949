package projections_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/cmd/localstack/natscluster"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/projections"
	"github.com/feedproject/feed/projections/feeds/fanout"
	"github.com/feedproject/feed/projections/feeds/inbox"
	"github.com/feedproject/feed/projections/lease"
	"github.com/feedproject/feed/projections/readmodel"
)

// leaseTTL is the failover tests' lease TTL: a standby takes over within it
// and a fifth of it after the active process dies.
const leaseTTL = 2 * time.Second

// The roles a test process runs, as serve names them.
const (
	roleReadModel = "readmodel"
	rolePlanner   = "planner"
	roleAppliers  = "appliers"
)

// projectorProcess is one process of the service running projector roles
// under leases, on NATS connections of its own, sharing the rig's stores
// with the others, as serve wires them. Its leases have a connection apart
// from its projectors', which kill closes first.
type projectorProcess struct {
	name          string
	nc, leaseConn *nats.Conn
	leases        *lease.Leases
	stop          func()
}

// startProcess starts a process running roles, connected through url.
func (rig *onceRig) startProcess(t *testing.T, name, url string, replicas int, roles ...string) *projectorProcess {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	nc, log := onceConnect(t, url, replicas)
	js := log.JetStream()
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn})).With("process", name)
	leaseConn, leaseLog := onceConnect(t, url, replicas)
	kv, err := lease.EnsureBucket(ctx, leaseLog.JetStream(), leaseTTL, replicas)
	require.NoError(t, err)
	p := &projectorProcess{name: name, nc: nc, leaseConn: leaseConn, leases: lease.New(kv, lease.Config{Process: name, TTL: leaseTTL}, nil, logger)}
	planner := fanout.NewPlanner(rig.store, js, oncePlannerConfig(replicas), nil)
	require.NoError(t, planner.EnsureStream(ctx))
	var wg sync.WaitGroup
	for _, role := range roles {
		switch role {
		case roleReadModel:
			proj := readmodel.NewProjector(rig.live, nil)
			run := projections.NewRunner(log, proj, onceRunnerConfig, nil, logger)
			wg.Go(func() {
				_ = p.leases.Hold(ctx, role, func(ctx context.Context, epoch uint64) error {
					proj.Fence(epoch)
					return run.Run(ctx)
				})
			})
		case rolePlanner:
			run := projections.NewRunner(log, planner, onceRunnerConfig, nil, logger)
			wg.Go(func() {
				_ = p.leases.Hold(ctx, role, func(ctx context.Context, epoch uint64) error {
					planner.Fence(epoch)
					var both sync.WaitGroup
					both.Go(func() { materialise(ctx, planner) })
					defer both.Wait()
					return run.Run(ctx)
				})
			})
		case roleAppliers:
			appliers := fanout.NewApplier(rig.store, js, nil, nil, logger)
			wg.Go(func() {
				_ = p.leases.Share(ctx, role, planner.Partitions(), func(ctx context.Context, part int) {
					_ = appliers.RunPartition(ctx, part)
				})
			})
		}
	}
	var once sync.Once
	p.stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(p.stop)
	return p
}

// kill stops p as a killed process stops: its leases' connection gone
// first, so that nothing it holds is let go (its projectors finish the
// batch in hand on theirs, which a closed connection would leave waiting
// for acknowledgements for ever).
func (p *projectorProcess) kill() {
	p.leaseConn.Close()
	p.stop()
	p.nc.Close()
}

// active waits until p is active in role, and says how long since start
// that took.
func (p *projectorProcess) active(t *testing.T, role string, start time.Time, within time.Duration) time.Duration {
	t.Helper()
	require.Eventually(t, func() bool { return p.leases.State(role).State == lease.Active }, within-time.Since(start), 10*time.Millisecond,
		"%s is not active in %s within %s: %+v", p.name, role, within, p.leases.State(role))
	return time.Since(start)
}

// storedPositions makes the rig read the projectors' positions from their
// stores, wherever the processes running them are.
func (rig *onceRig) storedPositions(t *testing.T) {
	rig.readAt = func() uint64 {
		var pos int64
		err := rig.live.QueryRow(context.Background(), `SELECT position FROM projector_checkpoints WHERE projector = $1`, readmodel.ProjectorName).Scan(&pos)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			t.Errorf("read model checkpoint: %v", err)
		}
		return uint64(pos)
	}
	rig.planAt = func() uint64 {
		pos, _ := fanout.PlannerPosition(context.Background(), rig.store)
		return pos
	}
	rig.stop = func() {}
}

// awaitInboxes waits until every user's inbox is built: the active planner
// builds them on request, and a request taken by a process killed before it
// built the inbox is made again by the user's next read, which these tests
// do not make.
func (rig *onceRig) awaitInboxes(t *testing.T) {
	t.Helper()
	require.Eventually(t, func() bool {
		for u := range onceUsers {
			if _, _, _, ok, err := inbox.ReadAll(context.Background(), rig.store, domain.UserID(u+1)); err != nil || !ok {
				return false
			}
		}
		return true
	}, 30*time.Second, 50*time.Millisecond, "the inboxes asked for are built")
}

// takeoverBound is how soon after the active process dies a standby must be
// active: the lease's TTL, a tick to notice, and two seconds to spare for a
// busy machine.
const takeoverBound = leaseTTL + leaseTTL/5 + 2*time.Second

// TestStandbyTakesOverWhenTheActiveProcessDies runs the read model and the
// planner in two processes sharing the stores, under a steady load of
// posts, follows, unfollows and deletes: one is active, the other stands
// by. The active one is killed (its connection closed, its leases not let
// go); the standby takes over within the bound, and afterwards the read
// model equals a clean replay row for row and every inbox is the pull feed.
func TestStandbyTakesOverWhenTheActiveProcessDies(t *testing.T) {
	ns := localstacktest.NATSForTest(t)
	rig := newOnceStores(t, ns.ClientURL(), 1)
	rig.storedPositions(t)
	a := rig.startProcess(t, "a", ns.ClientURL(), 1, roleReadModel, rolePlanner, roleAppliers)
	a.active(t, roleReadModel, time.Now(), 5*time.Second)
	a.active(t, rolePlanner, time.Now(), 5*time.Second)
	b := rig.startProcess(t, "b", ns.ClientURL(), 1, roleReadModel, rolePlanner, roleAppliers)
	require.Eventually(t, func() bool { return b.leases.State(roleReadModel).Holder == "a" }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, lease.Standby, b.leases.State(rolePlanner).State)
	rig.awaitInboxes(t)

	stopLoad := rig.load(4, 5*time.Millisecond)
	defer stopLoad()
	time.Sleep(2 * time.Second)
	t.Logf("killing a: %s", rig.positions())
	killed := time.Now()
	a.kill()
	took := b.active(t, roleReadModel, killed, takeoverBound)
	took = max(took, b.active(t, rolePlanner, killed, takeoverBound))
	t.Logf("b took over both roles %s after a died (bound %s): %s", took.Round(time.Millisecond), takeoverBound, rig.positions())
	time.Sleep(2 * time.Second)
	stopLoad()
	rig.check(t, rig.settle(t, 30*time.Second))
	b.stop()
}

// TestAppliersRebalanceUnderLoad runs the appliers in two processes, then
// three, then two again (the third killed), under a steady load: the
// partitions are spread over the processes each time within seconds, and
// afterwards every inbox is the pull feed, in order.
func TestAppliersRebalanceUnderLoad(t *testing.T) {
	ns := localstacktest.NATSForTest(t)
	rig := newOnceStores(t, ns.ClientURL(), 1)
	rig.storedPositions(t)
	rig.startProcess(t, "projectors", ns.ClientURL(), 1, roleReadModel, rolePlanner)
	procs := []*projectorProcess{
		rig.startProcess(t, "a", ns.ClientURL(), 1, roleAppliers),
		rig.startProcess(t, "b", ns.ClientURL(), 1, roleAppliers),
	}
	partitions := oncePlannerConfig(1).Partitions
	spread := func(n int) time.Duration {
		t.Helper()
		start := time.Now()
		require.Eventually(t, func() bool {
			held := 0
			for _, p := range procs[:n] {
				s := p.leases.State(roleAppliers)
				if s.Members != n || len(s.Partitions) == 0 {
					return false
				}
				held += len(s.Partitions)
			}
			return held == partitions
		}, 15*time.Second, 10*time.Millisecond, "the partitions are not spread over %d processes: %s", n, sharesOf(procs))
		t.Logf("%d processes: %s", n, sharesOf(procs[:n]))
		return time.Since(start)
	}
	spread(2)
	rig.awaitInboxes(t)
	stopLoad := rig.load(4, 5*time.Millisecond)
	defer stopLoad()
	time.Sleep(time.Second)
	procs = append(procs, rig.startProcess(t, "c", ns.ClientURL(), 1, roleAppliers))
	t.Logf("spread over three %s after the third started", spread(3).Round(time.Millisecond))
	time.Sleep(time.Second)
	procs[2].kill()
	took := spread(2)
	t.Logf("spread over two %s after the third died", took.Round(time.Millisecond))
	assert.LessOrEqual(t, took, takeoverBound, "the dead process's partitions are taken within the bound")
	time.Sleep(time.Second)
	stopLoad()
	rig.check(t, rig.settle(t, 30*time.Second))
}

// sharesOf says which partitions each process holds.
func sharesOf(procs []*projectorProcess) string {
	var out []string
	for _, p := range procs {
		out = append(out, fmt.Sprintf("%s %v", p.name, p.leases.State(roleAppliers).Partitions))
	}
	return strings.Join(out, ", ")
}

// TestStandbyTakesOverOnAClusterWhenTheActiveLosesItsNode is the failover
// on a three-node JetStream cluster, every stream and the lease bucket with
// three replicas: the active process reaches the cluster through one node
// alone, which is killed under load. It cannot renew its leases and stops
// before they expire; the standby, on another node, takes over within the
// bound (which includes the bucket's own leader election when the killed
// node led it), and the read model and inboxes are exact afterwards.
func TestStandbyTakesOverOnAClusterWhenTheActiveLosesItsNode(t *testing.T) {
	c := natscluster.Start(t, natscluster.Config{SyncAlways: true})
	rig := newOnceStores(t, c.URLs(), 3)
	rig.storedPositions(t)
	a := rig.startProcess(t, "a", c.URL(0), 3, roleReadModel, rolePlanner, roleAppliers)
	a.active(t, roleReadModel, time.Now(), 10*time.Second)
	a.active(t, rolePlanner, time.Now(), 10*time.Second)
	b := rig.startProcess(t, "b", c.URL(1)+","+c.URL(2), 3, roleReadModel, rolePlanner, roleAppliers)
	require.Eventually(t, func() bool { return b.leases.State(roleReadModel).Holder == "a" }, 10*time.Second, 10*time.Millisecond)
	rig.awaitInboxes(t)

	stopLoad := rig.load(3, 15*time.Millisecond)
	defer stopLoad()
	time.Sleep(2 * time.Second)
	t.Logf("killing node 0, a's: %s", rig.positions())
	killed := time.Now()
	c.Kill(0)
	const bound = 10 * time.Second
	took := b.active(t, roleReadModel, killed, bound)
	took = max(took, b.active(t, rolePlanner, killed, bound))
	t.Logf("b took over both roles %s after a's node died: %s", took.Round(time.Millisecond), rig.positions())
	assert.Equal(t, lease.Standby, a.leases.State(roleReadModel).State, "a cut off, and still active")
	c.Restart(0)
	c.WaitForReady(20 * time.Second)
	time.Sleep(time.Second)
	stopLoad()
	rig.check(t, rig.settle(t, time.Minute))
}
