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
}

// NewProjector returns the read model projector writing to pool.
func NewProjector(pool *pgxpool.Pool, metrics *projections.Metrics) *Projector {
	return &Projector{pool: pool, metrics: metrics}
}

// Name implements projections.Projector.
func (p *Projector) Name() string { return ProjectorName }

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

// Apply implements projections.Projector. A batch is applied as a few
// set-based statements (see plan); if one of them fails on the data, the batch
// is applied again event by event, which names the event at fault.
func (p *Projector) Apply(ctx context.Context, batch []events.Record) error {
	err := p.apply(ctx, batch, true)
	if isDataError(err) {
		return p.apply(ctx, batch, false)
	}
	return err
}

func (p *Projector) apply(ctx context.Context, batch []events.Record, bulk bool) error {
	tx, err := p.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", pgFailure(err))
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	// Lock the checkpoint: a concurrent instance waits here, then sees the new
	// checkpoint and skips what this one applied.
	if _, err := tx.Exec(ctx, `INSERT INTO projector_checkpoints (projector, position) VALUES ($1, 0)
		ON CONFLICT (projector) DO NOTHING`, ProjectorName); err != nil {
		return fmt.Errorf("checkpoint row: %w", pgFailure(err))
	}
	var cp int64
	if err := tx.QueryRow(ctx, `SELECT position FROM projector_checkpoints WHERE projector = $1 FOR UPDATE`,
		ProjectorName).Scan(&cp); err != nil {
		return fmt.Errorf("lock checkpoint: %w", pgFailure(err))
	}
	if applied := p.applied.Load(); uint64(cp) < applied {
		return fmt.Errorf("at %d, applied %d: %w", cp, applied, errWentBack)
	}
	fresh := batch[:0:0]
	for _, rec := range batch {
		if rec.Seq > uint64(cp) {
			fresh = append(fresh, rec)
		}
	}
	if len(fresh) == 0 {
		p.applied.Store(uint64(cp)) // another instance applied them
		return nil
	}

	merged := projections.MergeFollows(fresh)
	records, noops, err := p.dropNoopFollows(ctx, tx, merged)
	if err != nil {
		return err
	}
	p.metrics.CountMerged(ProjectorName, merged.Collapsed, noops)

	var (
		b     pgx.Batch
		owner []uint64 // the event of each queued statement, 0 for several
	)
	if bulk {
		reduce(records, merged).queueBulk(&b)
		owner = make([]uint64, b.Len())
	} else {
		for _, rec := range records {
			if queue(&b, rec, merged.Restarted[rec.Seq], merged.Since[rec.Seq]) {
				owner = append(owner, rec.Seq)
			}
		}
	}
	b.Queue(`UPDATE projector_checkpoints SET position = $2, updated_at = now() WHERE projector = $1`,
		ProjectorName, int64(fresh[len(fresh)-1].Seq))
	owner = append(owner, 0)

	results := tx.SendBatch(ctx, &b)
	for _, seq := range owner {
		if _, err := results.Exec(); err != nil {
			_ = results.Close()
			if seq != 0 && isDataError(err) {
				return &projections.EventError{Seq: seq, Err: err}
			}
			return fmt.Errorf("apply: %w", pgFailure(err))
		}
	}
	if err := results.Close(); err != nil {
		return fmt.Errorf("apply: %w", pgFailure(err))
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", pgFailure(err))
	}
	p.applied.Store(fresh[len(fresh)-1].Seq)
	return nil
}

// dropNoopFollows removes the follow events whose net effect is the current
// state: following someone already followed (unless the batch unfollowed them
// first), unfollowing someone not followed.
func (p *Projector) dropNoopFollows(ctx context.Context, tx pgx.Tx, merged projections.Merged) ([]events.Record, int, error) {
	var followers, followees []int64
	for _, rec := range merged.Records {
		switch e := rec.Event.(type) {
		case events.UserFollowed:
			followers, followees = append(followers, int64(e.FollowerID)), append(followees, int64(e.FolloweeID))
		case events.UserUnfollowed:
			followers, followees = append(followers, int64(e.FollowerID)), append(followees, int64(e.FolloweeID))
		}
	}
	if len(followers) == 0 {
		return merged.Records, 0, nil
	}
	rows, err := tx.Query(ctx, `SELECT f.follower_id, f.followee_id FROM follows f
		JOIN unnest($1::bigint[], $2::bigint[]) AS q(follower_id, followee_id) USING (follower_id, followee_id)`,
		followers, followees)
	if err != nil {
		return nil, 0, fmt.Errorf("current follows: %w", pgFailure(err))
	}
	following := map[projections.FollowPair]bool{}
	for rows.Next() {
		var a, b int64
		if err := rows.Scan(&a, &b); err != nil {
			rows.Close()
			return nil, 0, fmt.Errorf("current follows: %w", pgFailure(err))
		}
		following[projections.FollowPair{Follower: domain.UserID(a), Followee: domain.UserID(b)}] = true
	}
	if err := rows.Err(); err != nil {
		return nil, 0, fmt.Errorf("current follows: %w", pgFailure(err))
	}
	out := merged.Records[:0:0]
	noops := 0
	for _, rec := range merged.Records {
		switch e := rec.Event.(type) {
		case events.UserFollowed:
			if following[projections.FollowPair{Follower: e.FollowerID, Followee: e.FolloweeID}] && !merged.Restarted[rec.Seq] {
				noops++
				continue
			}
		case events.UserUnfollowed:
			if !following[projections.FollowPair{Follower: e.FollowerID, Followee: e.FolloweeID}] {
				noops++
				continue
			}
		}
		out = append(out, rec)
	}
	return out, noops, nil
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
