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
	// last trimmed by this projector. Batches are planned one at a time: by
	// Apply, or by Send after the transaction of the batch before is over.
	added map[domain.UserID]int
	// last is the batch Send sent last; mem is what a replay knows of every
	// row (see memory), catchUp the smallest batch it plans from it.
	last    *flight
	mem     memory
	catchUp int
	// epoch is the lease's under which it writes (see Fence).
	epoch atomic.Uint64
}

// flight is a batch handed to Send.
type flight struct {
	last uint64 // its last event
	// locked is closed once its transaction holds the checkpoint's lock (or
	// failed to take it); over once its first transaction ended, err its
	// outcome.
	locked, over chan struct{}
	hasLock      bool
	err          error
	// learns: it finds out whether the activity is empty, and if so begins
	// the memory of the rows (see memory).
	learns bool
}

func newFlight(last uint64) *flight {
	return &flight{last: last, locked: make(chan struct{}), over: make(chan struct{})}
}

// NewProjector returns the activity projector writing to pool, whose search
// path is the activity's schema.
func NewProjector(pool *pgxpool.Pool, metrics *projections.Metrics, cfg Config) *Projector {
	if cfg.Keep <= 0 {
		cfg.Keep = DefaultKeep
	}
	return &Projector{pool: pool, metrics: metrics, keep: cfg.Keep, added: map[domain.UserID]int{}, catchUp: catchUpBatch}
}

// Name implements projections.Projector.
func (p *Projector) Name() string { return ProjectorName }

// Fence implements projections.Fenced: every checkpoint write from now on
// carries epoch, and is refused (with the whole batch) once a newer epoch
// wrote the checkpoint.
func (p *Projector) Fence(epoch uint64) {
	p.epoch.Store(epoch)
	p.last, p.mem = nil, memory{}
}

// BatchSize implements projections.BatchSizer: a batch costs two round trips
// and a few statements however many events it holds.
func (p *Projector) BatchSize() int { return 8000 }

// Checkpoint implements projections.Projector. A runner reads it on every
// start, with no batch outstanding: the next batch sent starts afresh.
func (p *Projector) Checkpoint(ctx context.Context) (uint64, error) {
	p.last, p.mem = nil, memory{}
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
// event at fault. Batches sent after it start afresh (a replay applies
// again with Apply the batches Send failed).
func (p *Projector) Apply(ctx context.Context, batch []events.Record) error {
	p.last, p.mem = nil, memory{}
	return p.applyAfter(ctx, batch, nil, nil)
}

// applyAfter applies batch as Apply does, after batch prev (nil: none), as
// flight f (nil: not sent).
func (p *Projector) applyAfter(ctx context.Context, batch []events.Record, prev, f *flight) error {
	err := p.apply(ctx, batch, prev, f)
	if !isDataError(err) || len(batch) == 1 {
		if isDataError(err) {
			return &projections.EventError{Seq: batch[0].Seq, Err: err}
		}
		return err
	}
	for i := range batch {
		if err := p.applyAfter(ctx, batch[i:i+1], nil, nil); err != nil {
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

// Send implements projections.Pipeliner. A batch of a replay from an
// empty activity is planned from memory (see memory) while the batch before
// it is written, and sent in one round trip once that one committed. Any
// other batch asks for the checkpoint's lock and its reads as soon as the
// batch before it holds the lock, so Postgres reads for it the moment that
// one commits, and is planned once the transaction of that one is over.
// Either is void (errBatchBefore) if the batch before it did not commit.
//
// A projector is driven by Apply or by Send, not by both at once.
func (p *Projector) Send(ctx context.Context, batch []events.Record) <-chan error {
	result := make(chan error, 1)
	prev := p.last
	if prev != nil && batch[0].Seq != prev.last+1 {
		prev = nil // a new start
	}
	last := batch[len(batch)-1].Seq
	f := newFlight(last)
	p.last = f
	if prev != nil && prev.learns {
		<-prev.over // it may begin the memory
	}
	if b := p.planAhead(batch); b != nil {
		go func() { result <- p.sendPlanned(ctx, b, last, prev, f) }()
		return result
	}
	f.learns = prev == nil && p.applied.Load() == 0 && len(batch) >= p.catchUp
	go func() { result <- p.applyAfter(ctx, batch, prev, f) }()
	return result
}

// errBatchBefore voids a batch sent after one that did not commit.
var errBatchBefore = errors.New("the batch sent before this one was not applied")

// apply runs a batch in one transaction of two round trips: the lock and the
// reads; then the writes, the checkpoint and the commit. After batch prev,
// its lock is asked for once prev holds the lock, and it is played once
// prev's transaction is over; f, if sent, learns the same of this one.
func (p *Projector) apply(ctx context.Context, batch []events.Record, prev, f *flight) (err error) {
	if f != nil {
		defer func() { f.end(err) }()
	}
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

	// The state is read for the events after the checkpoint this batch
	// expects: prev's last, once prev commits. Asked for after prev holds
	// the lock, the reads wait for prev's commit in Postgres.
	expected := p.applied.Load()
	if prev != nil {
		<-prev.locked
		expected = prev.last
	}
	learns := f != nil && f.learns
	kn := newKnown()
	keys := keysOf(batch[after(batch, expected):])
	var reads pgx.Batch
	reads.Queue("BEGIN")
	// As the read model's: a crash of Postgres may lose the last batches,
	// each with its checkpoint, and the projector applies them again.
	reads.Queue("SET LOCAL synchronous_commit = off")
	reads.Queue(createCheckpoint, ProjectorName)
	reads.Queue(lockCheckpoint, ProjectorName)
	if learns {
		reads.Queue(activityEmpty)
	}
	keys.queueReads(&reads)
	results := conn.SendBatch(ctx, &reads)
	cp, empty, err := lockAndRead(results, learns, keys, kn)
	f.lock()
	if err != nil {
		return err
	}
	if prev != nil {
		// Holding the lock, this batch waits for no transaction of prev's.
		if <-prev.over; prev.err != nil {
			return errBatchBefore
		}
	}
	applied := p.applied.Load()
	if cp < applied {
		return fmt.Errorf("at %d, applied %d: %w", cp, applied, errWentBack)
	}
	fresh := batch[after(batch, cp):]
	if len(fresh) == 0 {
		p.applied.Store(cp) // another instance applied them
		return nil
	}
	if cp != expected {
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
	if learns && empty && cp == 0 {
		// What the batch read and left is every row there is.
		p.mem = memory{kn: kn, at: last}
	}
	return nil
}

// lock tells the batch after f that f's transaction holds the checkpoint's
// lock, or never will; f may be nil.
func (f *flight) lock() {
	if f != nil && !f.hasLock {
		f.hasLock = true
		close(f.locked)
	}
}

// end tells the batch after f that f's transaction is over, with err.
func (f *flight) end(err error) {
	f.lock()
	f.err = err
	close(f.over)
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
// the checkpoint, locked, whether the activity is empty (if checked), and
// the state, into kn.
func lockAndRead(results pgx.BatchResults, checkEmpty bool, keys *keys, kn *known) (cp uint64, empty bool, err error) {
	var pos int64
	err = func() error {
		for _, what := range []string{"begin", "asynchronous commit", "checkpoint row"} {
			if _, err := results.Exec(); err != nil {
				return fmt.Errorf("%s: %w", what, pgschema.Failure(err))
			}
		}
		if err := results.QueryRow().Scan(&pos); err != nil {
			return fmt.Errorf("lock checkpoint: %w", pgschema.Failure(err))
		}
		if checkEmpty {
			if err := results.QueryRow().Scan(&empty); err != nil {
				return fmt.Errorf("activity empty: %w", pgschema.Failure(err))
			}
		}
		return keys.read(results, kn)
	}()
	if closeErr := results.Close(); err == nil && closeErr != nil {
		err = fmt.Errorf("read state: %w", pgschema.Failure(closeErr))
	}
	return uint64(pos), empty, err
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
