package lease_test

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/projections/lease"
)

// ttl is the tests' lease TTL: short, so that takeovers take a second or two.
const ttl = time.Second

// process is one process's leases on a connection of its own, which kill
// closes as a dying process's would: nothing let go.
type process struct {
	nc     *nats.Conn
	leases *lease.Leases
}

func newProcess(t *testing.T, url, name string) *process {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.ReconnectBufSize(-1))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	kv, err := lease.EnsureBucket(context.Background(), js, ttl, 1)
	require.NoError(t, err)
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	return &process{nc: nc, leases: lease.New(kv, lease.Config{Process: name, TTL: ttl}, nil, logger.With("process", name))}
}

// TestEpochsRiseAcrossANewBucket: a bucket made again (deleted, or on a new
// NATS) still gives higher epochs than the one before, which the stores'
// fences remember.
func TestEpochsRiseAcrossANewBucket(t *testing.T) {
	ctx := context.Background()
	js := localstacktest.JetStreamForTest(t)
	kv, err := lease.EnsureBucket(ctx, js, ttl, 1)
	require.NoError(t, err)
	first, err := kv.Create(ctx, "readmodel", []byte("{}"))
	require.NoError(t, err)
	assert.Greater(t, first, uint64(time.Now().Add(-time.Minute).UnixMilli()), "revisions start at the time")
	require.NoError(t, js.DeleteKeyValue(ctx, lease.Bucket))
	time.Sleep(2 * time.Millisecond)
	kv, err = lease.EnsureBucket(ctx, js, ttl, 1)
	require.NoError(t, err)
	second, err := kv.Create(ctx, "readmodel", []byte("{}"))
	require.NoError(t, err)
	assert.Greater(t, second, first)
}

// TestStandbyTakesOverWhenTheActiveDies runs a role in two processes: one
// is active, the other stands by; when the active one's connection is cut
// (as a killed process's: its lease not let go), its work stops before the
// lease could be taken, and the standby takes over within the TTL and a
// tick, with a higher epoch; the two never work at once.
func TestStandbyTakesOverWhenTheActiveDies(t *testing.T) {
	url := localstacktest.NATSForTest(t).ClientURL()
	a, b := newProcess(t, url, "a"), newProcess(t, url, "b")
	var (
		working atomic.Int32
		overlap atomic.Bool
		mu      sync.Mutex
		epochs  []uint64
		stopped = map[string]time.Time{}
		started = map[string]time.Time{}
	)
	work := func(name string) func(context.Context, uint64) error {
		return func(ctx context.Context, epoch uint64) error {
			if working.Add(1) > 1 {
				overlap.Store(true)
			}
			mu.Lock()
			epochs = append(epochs, epoch)
			started[name] = time.Now()
			mu.Unlock()
			<-ctx.Done()
			mu.Lock()
			stopped[name] = time.Now()
			mu.Unlock()
			working.Add(-1)
			return nil
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	wg.Go(func() { _ = a.leases.Hold(ctx, "readmodel", work("a")) })
	require.Eventually(t, func() bool { return a.leases.State("readmodel").State == lease.Active }, 5*time.Second, 10*time.Millisecond)
	wg.Go(func() { _ = b.leases.Hold(ctx, "readmodel", work("b")) })
	require.Eventually(t, func() bool { return b.leases.State("readmodel").Holder == "a" }, 5*time.Second, 10*time.Millisecond)
	assert.Equal(t, lease.Standby, b.leases.State("readmodel").State)

	killed := time.Now()
	a.nc.Close()
	require.Eventually(t, func() bool { return b.leases.State("readmodel").State == lease.Active }, ttl+ttl, 10*time.Millisecond,
		"the standby takes over within the TTL and a tick")
	took := time.Since(killed)
	t.Logf("took over %s after the kill", took.Round(time.Millisecond))
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, epochs, 2)
	assert.Greater(t, epochs[1], epochs[0])
	assert.False(t, overlap.Load(), "both worked at once")
	assert.True(t, stopped["a"].Before(started["b"]), "the dead holder stops before the standby starts")
	assert.Equal(t, lease.Standby, a.leases.State("readmodel").State)
}

// TestActiveLetsGoOnStop: a holder that stops lets its lease go, and the
// standby takes over within a tick, not a TTL.
func TestActiveLetsGoOnStop(t *testing.T) {
	url := localstacktest.NATSForTest(t).ClientURL()
	a, b := newProcess(t, url, "a"), newProcess(t, url, "b")
	idle := func(ctx context.Context, _ uint64) error { <-ctx.Done(); return nil }
	actx, stopA := context.WithCancel(context.Background())
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { stopA(); cancel(); wg.Wait() }()
	wg.Go(func() { _ = a.leases.Hold(actx, "planner", idle) })
	require.Eventually(t, func() bool { return a.leases.State("planner").State == lease.Active }, 5*time.Second, 10*time.Millisecond)
	wg.Go(func() { _ = b.leases.Hold(ctx, "planner", idle) })
	require.Eventually(t, func() bool { return b.leases.State("planner").Holder == "a" }, 5*time.Second, 10*time.Millisecond)
	stopped := time.Now()
	stopA()
	require.Eventually(t, func() bool { return b.leases.State("planner").State == lease.Active }, ttl/2, 5*time.Millisecond)
	t.Logf("took over %s after the stop", time.Since(stopped).Round(time.Millisecond))
}

// TestSharesMoveWithoutOverlap runs a shared role's partitions in two, then
// three, then two processes (the third killed): every partition is worked on
// by exactly one process at a time, the shares are even, and after each
// change every partition is worked on again within a few seconds.
func TestSharesMoveWithoutOverlap(t *testing.T) {
	url := localstacktest.NATSForTest(t).ClientURL()
	const parts = 6
	var (
		running [parts]atomic.Int32
		overlap atomic.Int32
	)
	work := func(ctx context.Context, p int) {
		if running[p].Add(1) > 1 {
			overlap.Add(1)
		}
		<-ctx.Done()
		time.Sleep(50 * time.Millisecond) // the work in hand, finished
		running[p].Add(-1)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	procs := []*process{newProcess(t, url, "a"), newProcess(t, url, "b")}
	start := func(p *process) { wg.Go(func() { _ = p.leases.Share(ctx, "appliers", parts, work) }) }
	start(procs[0])
	start(procs[1])
	settled := func(n int) {
		t.Helper()
		require.Eventually(t, func() bool {
			total := 0
			for _, p := range procs[:n] {
				s := p.leases.State("appliers")
				if len(s.Partitions) != parts/n || s.Members != n {
					return false
				}
				total += len(s.Partitions)
			}
			for p := range parts {
				if running[p].Load() != 1 {
					return false
				}
			}
			return total == parts
		}, 3*ttl, 10*time.Millisecond, "%d processes share the partitions evenly, each worked on", n)
	}
	settled(2)
	procs = append(procs, newProcess(t, url, "c"))
	began := time.Now()
	start(procs[2])
	settled(3)
	t.Logf("three processes share the partitions %s after the third started", time.Since(began).Round(time.Millisecond))
	began = time.Now()
	procs[2].nc.Close()
	// Its partitions stay held until the leases expire; the work it had
	// stops (its renewals fail) before the others take them.
	settled(2)
	t.Logf("two processes share the partitions %s after the third died", time.Since(began).Round(time.Millisecond))
	assert.Zero(t, overlap.Load(), "a partition was worked on by two processes at once")
}
