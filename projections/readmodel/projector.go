package readmodel

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/projections"
	"github.com/feedproject/feed/projections/pgschema"
)

// ProjectorName names the read model projector's checkpoint row, durable
// consumer (projector-readmodel) and metrics. Persisted: never rename it.
const ProjectorName = "readmodel"

// Projector builds the Postgres read model from the log. Each batch is one
// transaction that also advances the checkpoint row, which it locks first, so
// an event is applied exactly once in effect even if batches are redelivered or
// two instances run.
type Projector struct {
	pool    *pgxpool.Pool
	metrics *projections.Metrics
	// applied is the checkpoint as of this projector's last read or batch. A
	// stored checkpoint below it means the read model was replaced by an older
	// one (a rebuild's switch, a restore): the runner must rewind to it, or the
	// events between would be missing from the new one for good.
	applied atomic.Uint64
	// planners are the memory of planning, used again batch after batch, and
	// known is what the batches of a catch-up left the rows as. Apply is
	// called one batch at a time (by a replay), never by two goroutines at
	// once, and plans in the first planner. Send (by a Runner) plans a batch
	// while the one before it may still be written from its planner: each
	// batch takes the planner the one before it did not (next).
	planners [2]planner
	next     int
	known    known
	// catchUp is the smallest batch that is remembered (catchUpBatch).
	catchUp int
	// last is the batch Send sent last.
	last *flight
	// epoch is the lease's under which it writes (see Fence).
	epoch atomic.Uint64
}

// flight is a batch handed to Send.
type flight struct {
	done chan struct{}
	err  error  // once done
	last uint64 // its last event
	// planned: Send planned it ahead from what is known, and it does not
	// change what is known once sent.
	planned bool
}

// NewProjector returns the read model projector writing to pool.
func NewProjector(pool *pgxpool.Pool, metrics *projections.Metrics) *Projector {
	return &Projector{pool: pool, metrics: metrics, catchUp: catchUpBatch}
}

// Name implements projections.Projector.
func (p *Projector) Name() string { return ProjectorName }

// Fence implements projections.Fenced: every checkpoint write from now on
// carries epoch, and is refused (with the whole batch) once a newer epoch
// wrote the checkpoint. What it remembers of the rows is forgotten: another
// process may have changed them.
func (p *Projector) Fence(epoch uint64) {
	p.epoch.Store(epoch)
	p.known.forget()
	p.last = nil
}

// BatchSize implements projections.BatchSizer. A batch's cost has a part
// that its size does not change (two round trips, a commit) and statements
// that take each post and pair once however many of its events it holds; in
// a replay (BenchmarkReplay), batches of 8 000 events cost Postgres a fifth
// less than batches of 2 000, and larger ones no less.
func (p *Projector) BatchSize() int { return 8000 }

// Checkpoint implements projections.Projector.
func (p *Projector) Checkpoint(ctx context.Context) (uint64, error) {
	pos, err := p.stored(ctx)
	if err != nil {
		return 0, err
	}
	p.applied.Store(pos)
	return pos, nil
}

func (p *Projector) stored(ctx context.Context) (uint64, error) {
	var pos int64
	err := p.pool.QueryRow(ctx, `SELECT position FROM projector_checkpoints WHERE projector = $1`, ProjectorName).Scan(&pos)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read model checkpoint: %w", pgFailure(err))
	}
	return uint64(pos), nil
}

// errWentBack is a stored checkpoint below what this projector applied.
var errWentBack = errors.New("the read model's checkpoint went back: rewinding to it")

// Verify implements projections.Verifier: while the log is quiet, it notices a
// read model replaced by one that is behind, so that the runner rewinds.
func (p *Projector) Verify(ctx context.Context) error {
	pos, err := p.stored(ctx)
	if err != nil {
		return err
	}
	if applied := p.applied.Load(); pos < applied {
		return fmt.Errorf("at %d, applied %d: %w", pos, applied, errWentBack)
	}
	return nil
}

// Apply implements projections.Projector. A batch is played against the rows
// it is about and written as a few set-based statements (see plan); if one of
// them fails on the data, the batch is applied again event by event, which
// names the event at fault. It must not be called concurrently: two instances
// are two Projectors.
func (p *Projector) Apply(ctx context.Context, batch []events.Record) error {
	return p.applyWith(ctx, batch, &p.planners[0])
}

// applyWith applies batch as Apply does, planning in pr.
func (p *Projector) applyWith(ctx context.Context, batch []events.Record, pr *planner) error {
	err := p.apply(ctx, batch, pr, true)
	if isDataError(err) {
		return p.apply(ctx, batch, pr, false)
	}
	return err
}

// Statements that lock the checkpoint row, creating it on the first batch: a
// concurrent instance waits here, then sees the new checkpoint and skips what
// this one applied.
const (
	createCheckpoint = `INSERT INTO projector_checkpoints (projector, position) VALUES ($1, 0)
		ON CONFLICT (projector) DO NOTHING`
	lockCheckpoint = `SELECT position FROM projector_checkpoints WHERE projector = $1 FOR UPDATE`
	// advanceCheckpoint refuses a write under an older epoch than the last
	// (migration 5): the transaction fails, and every write of the batch
	// with it.
	advanceCheckpoint = pgschema.AdvanceCheckpoint
)

// apply runs a batch in one transaction of two round trips: BEGIN, the lock
// and the reads; then the writes, the checkpoint and COMMIT. The transaction
// statements travel in the pipelines rather than on round trips of their own.
func (p *Projector) apply(ctx context.Context, batch []events.Record, pr *planner, bulk bool) error {
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		p.known.forget()
		return fmt.Errorf("connect: %w", pgFailure(err))
	}
	defer conn.Release()
	// A batch that stops half-way leaves its transaction open or aborted.
	// (Were the rollback lost, the pool drops a connection released in a
	// transaction.)
	defer func() {
		if conn.Conn().PgConn().TxStatus() != 'I' {
			_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
		}
	}()

	applied := p.applied.Load()
	expected := batch[after(batch, applied):]
	kn := &p.known
	switch {
	case !bulk || len(batch) < p.catchUp:
		// Caught up (or applying event by event): nothing is remembered.
		kn.forget()
	case !kn.on || kn.at != applied:
		kn.start(applied)
	}
	// Whatever the outcome of a batch that does not commit, the knowledge
	// may not hold after it.
	committed := false
	defer func() {
		if !committed {
			kn.forget()
		}
	}()
	// Knowledge that starts at checkpoint 0 knows the whole read model if it
	// is empty (as it must be: only this projector writes it, and every
	// batch moves the checkpoint); that is checked, once.
	checkEmpty := kn.on && applied == 0 && kn.size() == 0 && !kn.complete

	// The lock, then (after whatever another instance committed) the rows the
	// events after this projector's checkpoint are about, but for those it
	// knows.
	st := newState()
	keys := keysOf(expected, kn, st)

	var reads pgx.Batch
	reads.Queue("BEGIN")
	// The commit does not wait for its WAL to reach the disk. A crash of
	// Postgres may then lose the last batches, but each with its checkpoint,
	// atomically, and the log still has them: the projector finds its
	// checkpoint behind what it applied, rewinds, and applies them again. A
	// wait for the disk per batch is what kept a busy server's projector
	// behind live traffic.
	reads.Queue("SET LOCAL synchronous_commit = off")
	reads.Queue(createCheckpoint, ProjectorName)
	reads.Queue(lockCheckpoint, ProjectorName)
	if checkEmpty {
		reads.Queue(readModelEmpty)
	}
	keys.queueReads(&reads)
	cp, empty, err := lockAndRead(conn.SendBatch(ctx, &reads), checkEmpty, keys, st)
	if err != nil {
		return err
	}
	if uint64(cp) < applied {
		return fmt.Errorf("at %d, applied %d: %w", cp, applied, errWentBack)
	}
	fresh := batch[after(batch, uint64(cp)):]
	if len(fresh) == 0 {
		p.applied.Store(uint64(cp)) // another instance applied them
		return nil
	}
	if uint64(cp) != applied {
		// Another instance applied events meanwhile: what this one knows is
		// out of date, and the state was read taking what they create to be
		// new (see keys). Read it again for the events left, under the lock
		// still.
		kn.forget()
		st = newState()
		keys = keysOf(fresh, kn, st)
		var again pgx.Batch
		keys.queueReads(&again)
		if err = readAll(conn.SendBatch(ctx, &again), keys, st); err != nil {
			return err
		}
	} else if checkEmpty && empty {
		kn.complete = true
	}

	merged := projections.MergeFollows(fresh)
	records, noops := dropNoops(merged, st.follows)
	p.metrics.CountMerged(ProjectorName, merged.Collapsed, noops)

	var b pgx.Batch
	b.Queue(planWrites)
	owner := []uint64{0} // the event of each queued statement, 0 for none or several
	if bulk {
		pr.planOf(records, merged, st).queueWrites(&b)
		owner = make([]uint64, b.Len())
	} else {
		for _, rec := range records {
			if queue(&b, rec, merged.Restarted[rec.Seq], merged.Since[rec.Seq]) {
				owner = append(owner, rec.Seq)
			}
		}
	}
	last := fresh[len(fresh)-1].Seq
	b.Queue(advanceCheckpoint, ProjectorName, int64(last), int64(p.epoch.Load()))
	b.Queue("COMMIT")
	owner = append(owner, 0)

	if err := commitResults(conn.SendBatch(ctx, &b), owner); err != nil {
		return err
	}
	committed = true
	p.advance(last)
	if kn.on {
		kn.learn(last, keys, st, pr, records)
	}
	return nil
}

// commitResults takes and closes the results of a batch's writes, ending
// with its COMMIT: owner holds the event of each statement before it (0 for
// none or several), which a failure on the data is put down to.
func commitResults(results pgx.BatchResults, owner []uint64) error {
	for _, seq := range owner {
		if _, err := results.Exec(); err != nil {
			_ = results.Close()
			var pgErr *pgconn.PgError
			switch {
			case errors.As(err, &pgErr) && pgErr.Code == checkpointElsewhere:
				return fmt.Errorf("%w: %w", errBatchBefore, err)
			case pgschema.Fenced(err) != nil:
				return pgschema.Fenced(err)
			case seq != 0 && isDataError(err):
				return &projections.EventError{Seq: seq, Err: err}
			}
			return fmt.Errorf("apply: %w", pgFailure(err))
		}
	}
	tag, err := results.Exec()
	if closeErr := results.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		return fmt.Errorf("commit: %w", pgFailure(err))
	}
	if tag.String() != "COMMIT" { // ROLLBACK: the transaction had failed
		return fmt.Errorf("commit: %w", pgx.ErrTxCommitRollback)
	}
	return nil
}

// advance moves applied up to seq. Batches sent ahead commit in order, but
// their goroutines may learn it in another.
func (p *Projector) advance(seq uint64) {
	for {
		old := p.applied.Load()
		if old >= seq || p.applied.CompareAndSwap(old, seq) {
			return
		}
	}
}

// Send implements projections.Pipeliner, for catching up faster than Apply
// can: Postgres applies a batch's writes while the next batch is planned.
//
// A batch of a catch-up whose rows are all known (see known) is planned at
// once, as if the batches sent before it had committed, and what it leaves
// the rows as is known from then on. It is sent in one round trip on a
// connection of its own, opening with lock_checkpoint_at (migration 4):
// Postgres starts it the moment the batch before it commits, and refuses it
// unless that one did. What is known then runs ahead of the checkpoint,
// and the runner's next start, at the checkpoint, finds it out of date.
//
// Any other batch is applied as by Apply, once the batch before it has
// been; one that failed voids it.
//
// A projector is driven by Apply or by Send, not by both at once.
func (p *Projector) Send(ctx context.Context, batch []events.Record) <-chan error {
	result := make(chan error, 1)
	prev := p.last
	f := &flight{done: make(chan struct{}), last: batch[len(batch)-1].Seq}
	p.last = f
	if prev != nil && !prev.planned {
		<-prev.done // it may change what is known until it ends
	}
	pr := &p.planners[p.next]
	p.next ^= 1
	b, last := p.planAhead(batch, pr)
	f.planned = b != nil
	go func() {
		var err error
		switch {
		case f.planned:
			err = p.sendPlanned(ctx, b, last)
		case prev != nil && batch[0].Seq > prev.last && func() bool { <-prev.done; return prev.err != nil }():
			// (A batch that does not come after it is a new start.)
			err = errBatchBefore
		default:
			err = p.applyWith(ctx, batch, pr)
		}
		f.err = err
		close(f.done)
		result <- err
	}()
	return result
}

// errBatchBefore voids a batch sent ahead.
var errBatchBefore = errors.New("the batch sent before this one was not applied")

// checkpointElsewhere is the error lock_checkpoint_at raises.
const checkpointElsewhere = "FE001"

// planAhead plans batch from what is known, in pr, as the writes of one
// transaction that takes effect only after the batch sent before it (see
// Send), and knows what it leaves the rows as. It returns nil if batch is
// not of a catch-up or names a row that is not known.
func (p *Projector) planAhead(batch []events.Record, pr *planner) (*pgx.Batch, uint64) {
	kn := &p.known
	if !kn.on || len(batch) < p.catchUp || after(batch, kn.at) != 0 {
		return nil, 0
	}
	st := newState()
	keys := keysOf(batch, kn, st)
	if len(keys.posts)+len(keys.likePosts)+len(keys.followers) > 0 {
		return nil, 0
	}
	merged := projections.MergeFollows(batch)
	records, noops := dropNoops(merged, st.follows)
	p.metrics.CountMerged(ProjectorName, merged.Collapsed, noops)
	last := batch[len(batch)-1].Seq
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue("SET LOCAL synchronous_commit = off") // as in apply
	b.Queue(createCheckpoint, ProjectorName)
	b.Queue(lockCheckpointAt, ProjectorName, int64(kn.at))
	b.Queue(planWrites)
	pr.planOf(records, merged, st).queueWrites(b)
	b.Queue(advanceCheckpoint, ProjectorName, int64(last), int64(p.epoch.Load()))
	b.Queue("COMMIT")
	kn.learn(last, keys, st, pr, records)
	return b, last
}

// lockCheckpointAt locks the checkpoint row and fails with
// checkpointElsewhere unless the checkpoint is at $2.
const lockCheckpointAt = `SELECT lock_checkpoint_at($1, $2)`

// sendPlanned applies the writes planAhead planned, up to seq last.
func (p *Projector) sendPlanned(ctx context.Context, b *pgx.Batch, last uint64) error {
	conn, err := p.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("connect: %w", pgFailure(err))
	}
	defer conn.Release()
	defer func() { // as in apply
		if conn.Conn().PgConn().TxStatus() != 'I' {
			_, _ = conn.Exec(context.WithoutCancel(ctx), "ROLLBACK")
		}
	}()
	if err := commitResults(conn.SendBatch(ctx, b), make([]uint64, b.Len()-1)); err != nil {
		return err
	}
	p.advance(last)
	return nil
}

// readModelEmpty tells whether the read model has none of the rows a batch
// reads.
const readModelEmpty = `SELECT NOT EXISTS (SELECT FROM posts) AND NOT EXISTS (SELECT FROM likes)
	AND NOT EXISTS (SELECT FROM follows)`

// lockAndRead takes and closes the results of the first round trip of
// apply: the checkpoint, locked, whether the read model is empty (if
// checked), and the state, into st.
func lockAndRead(results pgx.BatchResults, checkEmpty bool, keys keys, st *state) (cp int64, empty bool, err error) {
	err = func() error {
		if _, err := results.Exec(); err != nil {
			return fmt.Errorf("begin: %w", pgFailure(err))
		}
		if _, err := results.Exec(); err != nil {
			return fmt.Errorf("asynchronous commit: %w", pgFailure(err))
		}
		if _, err := results.Exec(); err != nil {
			return fmt.Errorf("checkpoint row: %w", pgFailure(err))
		}
		if err := results.QueryRow().Scan(&cp); err != nil {
			return fmt.Errorf("lock checkpoint: %w", pgFailure(err))
		}
		if checkEmpty {
			if err := results.QueryRow().Scan(&empty); err != nil {
				return fmt.Errorf("read model empty: %w", pgFailure(err))
			}
		}
		return nil
	}()
	if err != nil {
		_ = results.Close()
		return 0, false, err
	}
	return cp, empty, readAll(results, keys, st)
}

// readAll takes and closes the results of keys.queueReads, into st.
func readAll(results pgx.BatchResults, keys keys, st *state) error {
	err := keys.readState(results, st)
	if closeErr := results.Close(); err == nil && closeErr != nil {
		err = fmt.Errorf("read state: %w", pgFailure(closeErr))
	}
	return err
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

// dropNoops removes the follow events whose net effect is the current state:
// following someone already followed (unless the batch unfollowed them
// first), unfollowing someone not followed. It filters merged.Records in
// place.
func dropNoops(merged projections.Merged, following set[projections.FollowPair]) ([]events.Record, int) {
	out := merged.Records[:0]
	noops := 0
	for _, rec := range merged.Records {
		switch e := rec.Event.(type) {
		case events.UserFollowed:
			if following.has(projections.FollowPair{Follower: e.FollowerID, Followee: e.FolloweeID}) && !merged.Restarted[rec.Seq] {
				noops++
				continue
			}
		case events.UserUnfollowed:
			if !following.has(projections.FollowPair{Follower: e.FollowerID, Followee: e.FolloweeID}) {
				noops++
				continue
			}
		}
		out = append(out, rec)
	}
	return out, noops
}

// The statements below are written so that replaying an event changes nothing
// and so that a deleted post stays deleted: edits, likes and comments of a post
// that is not live are no-ops.
const (
	insertPost = `WITH p AS (
		INSERT INTO posts (id, user_id, caption, created_at) VALUES ($1, $2, $3, $4)
		ON CONFLICT (id) DO NOTHING RETURNING id)
	INSERT INTO post_media (post_id, position, media_key, content_type, width, height, size)
	SELECT p.id, m.ord - 1, m.media_key, m.content_type, m.width, m.height, m.size
	FROM p, unnest($5::text[], $6::text[], $7::int[], $8::int[], $9::bigint[])
		WITH ORDINALITY AS m(media_key, content_type, width, height, size, ord)`
	editPost   = `UPDATE posts SET caption = $2, edited_at = $3 WHERE id = $1 AND deleted_at IS NULL`
	deletePost = `UPDATE posts SET deleted_at = $2 WHERE id = $1 AND deleted_at IS NULL`
	// A follow after an unfollow in the same batch restarts the relation (new
	// time); otherwise following again keeps the original time.
	follow   = `INSERT INTO follows (follower_id, followee_id, created_at) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`
	refollow = `INSERT INTO follows (follower_id, followee_id, created_at) VALUES ($1, $2, $3)
		ON CONFLICT (follower_id, followee_id) DO UPDATE SET created_at = EXCLUDED.created_at`
	unfollow = `DELETE FROM follows WHERE follower_id = $1 AND followee_id = $2`
	like     = `WITH l AS (
		INSERT INTO likes (post_id, user_id)
		SELECT $1, $2 WHERE EXISTS (SELECT 1 FROM posts WHERE id = $1 AND deleted_at IS NULL)
		ON CONFLICT DO NOTHING RETURNING post_id)
	UPDATE posts SET like_count = like_count + 1 WHERE id IN (SELECT post_id FROM l)`
	unlike = `WITH l AS (
		DELETE FROM likes WHERE post_id = $1 AND user_id = $2
			AND EXISTS (SELECT 1 FROM posts WHERE id = $1 AND deleted_at IS NULL)
		RETURNING post_id)
	UPDATE posts SET like_count = like_count - 1 WHERE id IN (SELECT post_id FROM l)`
	comment = `WITH c AS (
		INSERT INTO comments (id, post_id, user_id, text, created_at)
		SELECT $1, $2, $3, $4, $5 WHERE EXISTS (SELECT 1 FROM posts WHERE id = $2 AND deleted_at IS NULL)
		ON CONFLICT (id) DO NOTHING RETURNING post_id)
	UPDATE posts SET comment_count = comment_count + 1 WHERE id IN (SELECT post_id FROM c)`
)

// queue adds the statement of one event to b; false for events that change
// nothing in the read model (unknown or dead-lettered: Event nil). A follow
// carries when its relation began (see projections.Merged.Since).
func queue(b *pgx.Batch, rec events.Record, restarted bool, since time.Time) bool {
	switch e := rec.Event.(type) {
	case events.PostCreated:
		n := len(e.Media)
		keys, types := make([]string, n), make([]string, n)
		widths, heights, sizes := make([]int32, n), make([]int32, n), make([]int64, n)
		for i, m := range e.Media {
			keys[i], types[i], widths[i], heights[i], sizes[i] = m.Key, m.ContentType, int32(m.Width), int32(m.Height), m.Size
		}
		b.Queue(insertPost, int64(e.PostID), int64(e.UserID), e.Caption, e.CreatedAt, keys, types, widths, heights, sizes)
	case events.PostEdited:
		b.Queue(editPost, int64(e.PostID), e.Caption, e.EditedAt)
	case events.PostDeleted:
		b.Queue(deletePost, int64(e.PostID), e.DeletedAt)
	case events.UserFollowed:
		stmt := follow
		if restarted {
			stmt = refollow
		}
		b.Queue(stmt, int64(e.FollowerID), int64(e.FolloweeID), since.Truncate(time.Second))
	case events.UserUnfollowed:
		b.Queue(unfollow, int64(e.FollowerID), int64(e.FolloweeID))
	case events.PostLiked:
		b.Queue(like, int64(e.PostID), int64(e.UserID))
	case events.PostUnliked:
		b.Queue(unlike, int64(e.PostID), int64(e.UserID))
	case events.CommentAdded:
		b.Queue(comment, int64(e.CommentID), int64(e.PostID), int64(e.UserID), e.Text, e.CreatedAt)
	default:
		return false
	}
	return true
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

// pgFailure marks failures to reach Postgres as domain.ErrUnavailable (see
// unreachable), keeping the original in the chain.
func pgFailure(err error) error {
	if unreachable(err) {
		return fmt.Errorf("%w: %w", domain.ErrUnavailable, err)
	}
	return err
}
