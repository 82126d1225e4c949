package projectionstest

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/projections"
)

// T is what RunUntil needs of a test.
type T interface {
	require.TestingT
	Helper()
}

// RunUntil runs p through a runner until it has applied the log's head,
// calling chaos (if not nil) meanwhile, and stops it.
func RunUntil(t T, log *events.Log, p projections.Projector, cfg projections.RunnerConfig, chaos func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cfg.FetchWait = 100 * time.Millisecond
	cfg.MaxBackoff = 20 * time.Millisecond
	r := projections.NewRunner(log, p, cfg, nil, slog.New(slog.DiscardHandler))
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	head, err := log.Head(ctx)
	require.NoError(t, err)
	deadline := time.Now().Add(90 * time.Second)
	for r.Position() < head {
		require.True(t, time.Now().Before(deadline), "projector stuck at %d of %d", r.Position(), head)
		if chaos != nil {
			chaos()
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	require.NoError(t, <-done)
}

// Chaos is what a projector meets besides failed batches: its Postgres
// connections killed, its consumer deleted. Call Step between polls of
// RunUntil; it counts what it did.
type Chaos struct {
	Rng             *rand.Rand
	Pool            *pgxpool.Pool
	Log             *events.Log
	Consumer        string
	Killed, Deleted int
}

// Step does one thing in eight: kill the pool's connections, or delete the
// consumer (the events not yet applied must come again, from the
// checkpoint); otherwise nothing.
func (c *Chaos) Step() {
	switch c.Rng.IntN(8) {
	case 0:
		_, err := c.Pool.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid()`)
		if err == nil {
			c.Killed++
		}
	case 1:
		if c.Log.JetStream().DeleteConsumer(context.Background(), c.Log.Stream(), c.Consumer) == nil {
			c.Deleted++
		}
	}
}
