package projectionstest

import (
	"context"
	"log/slog"
	"time"

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
