package activity

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/projections/pgschema"
)

// A replay from the first event into an empty activity (a new deployment,
// a lost database) remembers every post and every follow and like item its
// batches leave, so that a batch reads nothing: it is planned from memory
// while the batch before it is written, and sent in one round trip (see
// Send). Memory begins with a batch that finds the activity empty under the
// checkpoint's lock at 0, and ends with anything but the next large batch
// sent, at every start of the runner (Checkpoint) and past maxMemory rows: a
// live projector's memory does not grow with the activity.

// catchUpBatch is the smallest batch that is planned from memory: a runner
// hands over a batch as large as the backlog, so one this large means it is
// behind.
const catchUpBatch = 1000

// maxMemory bounds the posts and items remembered.
const maxMemory = 2_000_000

// memory is what the batches of a replay left every row as.
type memory struct {
	kn *known // nil: none
	at uint64 // the last event planned into it
}

// activityEmpty tells whether the activity has no rows.
const activityEmpty = `SELECT NOT EXISTS (SELECT FROM items) AND NOT EXISTS (SELECT FROM posts)`

// lockCheckpointAt locks the checkpoint row and fails with
// checkpointElsewhere unless the checkpoint is at $2.
const lockCheckpointAt = `SELECT lock_checkpoint_at($1, $2)`

// checkpointElsewhere is the error lock_checkpoint_at raises.
const checkpointElsewhere = "FE001"

// planAhead plans batch from memory as one transaction that takes effect
// only after the batch planned before it, and remembers what it leaves the
// rows as. It returns nil, and forgets, if batch is not the next large one.
func (p *Projector) planAhead(batch []events.Record) *pgx.Batch {
	mem := &p.mem
	if mem.kn == nil || len(batch) < p.catchUp || batch[0].Seq != mem.at+1 ||
		len(mem.kn.posts)+len(mem.kn.items) > maxMemory {
		*mem = memory{}
		return nil
	}
	m := merge(batch)
	pl := planOf(m, mem.kn)
	p.metrics.CountMerged(ProjectorName, m.collapsed, pl.noops)
	last := batch[len(batch)-1].Seq
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue("SET LOCAL synchronous_commit = off") // as in apply
	b.Queue(createCheckpoint, ProjectorName)
	b.Queue(lockCheckpointAt, ProjectorName, int64(mem.at))
	pl.queueWrites(b)
	// Counted as if it commits: if it does not, the runner starts again
	// and the trims come a little later.
	for _, u := range p.queueTrims(b, pl) {
		p.added[u] = 0
	}
	b.Queue(advanceCheckpoint, ProjectorName, int64(last), int64(p.epoch.Load()))
	b.Queue("COMMIT")
	mem.at = last
	return b
}

// sendPlanned applies the transaction planAhead planned, up to seq last,
// once the transaction of prev (nil: none) is over and if it committed.
func (p *Projector) sendPlanned(ctx context.Context, b *pgx.Batch, last uint64, prev, f *flight) (err error) {
	defer func() { f.end(err) }()
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("connect: %w", pgschema.Failure(err))
	}
	defer conn.Release()
	defer func() { // as in apply
		if conn.Conn().PgConn().TxStatus() != 'I' {
			_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
		}
	}()
	if prev != nil {
		// (Sent at once, it could reach the lock before prev.)
		if <-prev.over; prev.err != nil {
			return errBatchBefore
		}
	}
	if err := commit(conn.SendBatch(ctx, b), b.Len()); err != nil {
		if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == checkpointElsewhere {
			return fmt.Errorf("%w: %w", errBatchBefore, err)
		}
		if isDataError(err) {
			// Applied again by the runner's next start, without memory,
			// the batch names the event at fault.
			return fmt.Errorf("apply: %w", err)
		}
		return err
	}
	p.applied.Store(last)
	return nil
}
