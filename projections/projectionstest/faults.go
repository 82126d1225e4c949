// Package projectionstest holds what tests of projectors share: failures to
// inject into the batches a runner sends and around it, and a way to run a
// projector to the log's head.
package projectionstest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
)

// Faults injects the failures of real life into a tenth of the batches a
// runner sends each: a transaction cut off half-way, and a crash after
// commit but before the runner knows.
type Faults struct {
	Rng              *rand.Rand
	Aborted, Crashed int
}

// Send sends batch with send (a projections.Pipeliner's), perhaps failing it.
func (f *Faults) Send(ctx context.Context, batch []events.Record, send func(context.Context, []events.Record) <-chan error) <-chan error {
	switch f.Rng.IntN(10) {
	case 0:
		// The transaction dies mid-batch: the context ends while statements run.
		ctx, cancel := context.WithTimeout(ctx, time.Duration(f.Rng.IntN(3000))*time.Microsecond)
		f.Aborted++
		return relay(send(ctx, batch), func(err error) error {
			cancel()
			if err != nil {
				return fmt.Errorf("injected: %w", err)
			}
			return nil
		})
	case 1:
		// Committed, then "killed" before the runner knows: it rewinds.
		f.Crashed++
		return relay(send(ctx, batch), func(err error) error {
			if err != nil {
				return err
			}
			return fmt.Errorf("injected crash after commit: %w", domain.ErrUnavailable)
		})
	}
	return send(ctx, batch)
}

// relay is the outcome on in, as fn makes it.
func relay(in <-chan error, fn func(error) error) <-chan error {
	out := make(chan error, 1)
	go func() { out <- fn(<-in) }()
	return out
}
