package activity

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/projections"
	"github.com/feedproject/feed/projections/pgschema"
)

// ProjectorName names the activity projector's checkpoint row, durable
// consumer (projector-activity) and metrics. Persisted: never rename it.
const ProjectorName = "activity"

// DefaultKeep is how many items a user's activity keeps at least by default.
const DefaultKeep = 1000

// Config holds the projector's optional knobs; the zero value works.
type Config struct {
	// Keep is how many of a user's newest items are kept at least; older
	// ones are trimmed once a tenth as many more have come. Default
	// DefaultKeep.
	Keep int
}

// Projector builds the activity from the log. Each batch is one transaction
// that also advances the checkpoint row, which it locks first, so an event is
// applied exactly once in effect even if batches are redelivered or two
// instances run.
type Projector struct {
	pool    *pgxpool.Pool
	metrics *projections.Metrics
	keep    int
	// applied is the checkpoint as of this projector's last read or batch; a
	// stored one below it means the activity was replaced by an older one,
	// and the runner must rewind to it.
	applied atomic.Uint64
	// added counts, by user, the items added since the user's activity was
	// last trimmed by this projector. Apply is called one batch at a time.
	added map[domain.UserID]int // epoch is the lease's under which it writes (see Fence).
	epoch atomic.Uint64
}

// NewProjector returns the activity projector writing to pool, whose search
// path is the activity's schema.
func NewProjector(pool *pgxpool.Pool, metrics *projections.Metrics, cfg Config) *Projector {
	if cfg.Keep <= 0 {
		cfg.Keep = DefaultKeep
	}
	return &Projector{pool: pool, metrics: metrics, keep: cfg.Keep, added: map[domain.UserID]int{}}
}

// Name implements projections.Projector.
func (p *Projector) Name() string { return ProjectorName }

// Fence implements projections.Fenced: every checkpoint write from now on
// carries epoch, and is refused (with the whole batch) once a newer epoch
// wrote the checkpoint.
func (p *Projector) Fence(epoch uint64) { p.epoch.Store(epoch) }

// BatchSize implements projections.BatchSizer: a batch costs two round trips
// and a few statements however many events it holds.
func (p *Projector) BatchSize() int { return 8000 }

// Checkpoint implements projections.Projector.
func (p *Projector) Checkpoint(ctx context.Context) (uint64, error) {
	pos, err := position(ctx, p.pool)
	if err != nil {
		return 0, err
	}
	p.applied.Store(pos)
	return pos, nil
}

// position reads the activity's checkpoint.
func position(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (uint64, error) {
	var pos int64
	err := q.QueryRow(ctx, `SELECT position FROM projector_checkpoints WHERE projector = $1`, ProjectorName).Scan(&pos)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("activity checkpoint: %w", pgschema.Failure(err))
	}
	return uint64(pos), nil
}

// errWentBack is a stored checkpoint below what this projector applied.
var errWentBack = errors.New("the activity's checkpoint went back: rewinding to it")

// Verify implements projections.Verifier: while the log is quiet, it notices
// an activity replaced by one that is behind, so that the runner rewinds.
func (p *Projector) Verify(ctx context.Context) error {
	pos, err := position(ctx, p.pool)
	if err != nil {
		return err
	}
	if applied := p.applied.Load(); pos < applied {
		return fmt.Errorf("at %d, applied %d: %w", pos, applied, errWentBack)
	}
	return nil
}

// Apply implements projections.Projector. A batch is played against the rows
// it is about and written as a few set-based statements; if one of them fails
// on the data, the batch is applied again an event at a time, which names the
// event at fault.
func (p *Projector) Apply(ctx context.Context, batch []events.Record) error {
	err := p.apply(ctx, batch)
	if !isDataError(err) || len(batch) == 1 {
		if isDataError(err) {
			return &projections.EventError{Seq: batch[0].Seq, Err: err}
		}
		return err
	}
	for i := range batch {
		if err := p.Apply(ctx, batch[i:i+1]); err != nil {
			return err
		}
	}
	return nil
}

// Statements that lock the checkpoint row, creating it on the first batch: a
// concurrent instance waits here, then sees the new checkpoint and skips what
// this one applied.
const (
	createCheckpoint = `INSERT INTO projector_checkpoints (projector, position) VALUES ($1, 0)
		ON CONFLICT (projector) DO NOTHING`
	lockCheckpoint    = `SELECT position FROM projector_checkpoints WHERE projector = $1 FOR UPDATE`
	advanceCheckpoint = pgschema.AdvanceCheckpoint
)

// apply runs a batch in one transaction of two round trips: the lock and the
// reads; then the writes, the checkpoint and the commit.
func (p *Projector) apply(ctx context.Context, batch []events.Record) error {
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("connect: %w", pgschema.Failure(err))
	}
	defer conn.Release()
	// A batch that stops half-way leaves its transaction open or aborted.
	defer func() {
		if conn.Conn().PgConn().TxStatus() != 'I' {
			_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
		}
	}()

	applied := p.applied.Load()
	kn := newKnown()
	keys := keysOf(batch[after(batch, applied):])
	var reads pgx.Batch
	reads.Queue("BEGIN")
	// As the read model's: a crash of Postgres may lose the last batches,
	// each with its checkpoint, and the projector applies them again.
	reads.Queue("SET LOCAL synchronous_commit = off")
	reads.Queue(createCheckpoint, ProjectorName)
	reads.Queue(lockCheckpoint, ProjectorName)
	keys.queueReads(&reads)
	results := conn.SendBatch(ctx, &reads)
	cp, err := lockAndRead(results, keys, kn)
	if err != nil {
		return err
	}
	if cp < applied {
		return fmt.Errorf("at %d, applied %d: %w", cp, applied, errWentBack)
	}
	fresh := batch[after(batch, cp):]
	if len(fresh) == 0 {
		p.applied.Store(cp) // another instance applied them
		return nil
	}
	if cp != applied {
		// Another instance applied events meanwhile: read the state again
		// for the events left, under the lock still.
		kn, keys = newKnown(), keysOf(fresh)
		var again pgx.Batch
		keys.queueReads(&again)
		results := conn.SendBatch(ctx, &again)
		err := keys.read(results, kn)
		if closeErr := results.Close(); err == nil && closeErr != nil {
			err = fmt.Errorf("read state: %w", pgschema.Failure(closeErr))
		}
		if err != nil {
			return err
		}
	}

	m := merge(fresh)
	pl := planOf(m, kn)
	p.metrics.CountMerged(ProjectorName, m.collapsed, pl.noops)
	var b pgx.Batch
	pl.queueWrites(&b)
	trimmed := p.queueTrims(&b, pl)
	last := fresh[len(fresh)-1].Seq
	b.Queue(advanceCheckpoint, ProjectorName, int64(last), int64(p.epoch.Load()))
	b.Queue("COMMIT")
	if err := commit(conn.SendBatch(ctx, &b), b.Len()); err != nil {
		return err
	}
	for _, u := range trimmed {
		p.added[u] = 0
	}
	p.applied.Store(last)
	return nil
}

// queueTrims trims the activity of the users this batch brought a tenth of
// Keep more items since their last trim, and returns them.
func (p *Projector) queueTrims(b *pgx.Batch, pl *plan) []domain.UserID {
	var owners []int64
	var trimmed []domain.UserID
	every := max(1, p.keep/10)
	for _, it := range pl.items() {
		p.added[it.Owner]++
		// (Counted once: a count above it is one a failed batch left.)
		if p.added[it.Owner] >= every && !slices.Contains(trimmed, it.Owner) {
			owners = append(owners, int64(it.Owner))
			trimmed = append(trimmed, it.Owner)
		}
	}
	if len(owners) > 0 {
		b.Queue(trim, owners, p.keep)
	}
	return trimmed
}

// trim keeps each user's newest $2 items: older comments go, older follows and
// likes stay unseen (not kept) as the memory that they stand. Items not kept
// are always the oldest: every new item's id is above every stored one.
const trim = `WITH cut AS (
		SELECT o.owner_id, b.id FROM unnest($1::bigint[]) AS o (owner_id)
		CROSS JOIN LATERAL (SELECT id FROM items WHERE owner_id = o.owner_id AND kept
			ORDER BY id DESC OFFSET $2 LIMIT 1) AS b),
	gone AS (
		DELETE FROM items i USING cut
		WHERE i.owner_id = cut.owner_id AND i.id <= cut.id AND i.comment_id IS NOT NULL)
	UPDATE items i SET kept = false FROM cut
	WHERE i.owner_id = cut.owner_id AND i.id <= cut.id AND i.kept AND i.comment_id IS NULL`

// lockAndRead takes and closes the results of the first round trip of apply:
// the checkpoint, locked, and the state, into kn.
func lockAndRead(results pgx.BatchResults, keys *keys, kn *known) (uint64, error) {
	var cp int64
	err := func() error {
		for _, what := range []string{"begin", "asynchronous commit", "checkpoint row"} {
			if _, err := results.Exec(); err != nil {
				return fmt.Errorf("%s: %w", what, pgschema.Failure(err))
			}
		}
		if err := results.QueryRow().Scan(&cp); err != nil {
			return fmt.Errorf("lock checkpoint: %w", pgschema.Failure(err))
		}
		return keys.read(results, kn)
	}()
	if closeErr := results.Close(); err == nil && closeErr != nil {
		err = fmt.Errorf("read state: %w", pgschema.Failure(closeErr))
	}
	return uint64(cp), err
}

// commit takes and closes the results of a batch's n statements, ending with
// its COMMIT.
func commit(results pgx.BatchResults, n int) error {
	for range n - 1 {
		if _, err := results.Exec(); err != nil {
			_ = results.Close()
			if fenced := pgschema.Fenced(err); fenced != nil {
				return fenced
			}
			if isDataError(err) {
				return err
			}
			return fmt.Errorf("apply: %w", pgschema.Failure(err))
		}
	}
	tag, err := results.Exec()
	if closeErr := results.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		return fmt.Errorf("commit: %w", pgschema.Failure(err))
	}
	if tag.String() != "COMMIT" { // ROLLBACK: the transaction had failed
		return fmt.Errorf("commit: %w", pgx.ErrTxCommitRollback)
	}
	return nil
}

// after is the index of the first record of batch (in log order) after seq.
func after(batch []events.Record, seq uint64) int {
	for i, rec := range batch {
		if rec.Seq > seq {
			return i
		}
	}
	return len(batch)
}

// isDataError tells a failure caused by the event's data (a value Postgres
// cannot store, a constraint it breaks) from one of the store.
func isDataError(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	switch pgErr.Code[:2] {
	case "22", "23": // data exception, integrity constraint violation
		return true
	}
	return false
}
