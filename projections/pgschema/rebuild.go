package pgschema

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/feedproject/feed/projections"
)

// Config names a projector's schema.
type Config struct {
	// Live is the live state's schema; the shadow is Live_next, the state it
	// replaced Live_old until it is dropped.
	Live string
	// Projector names the checkpoint row (in the schema's
	// projector_checkpoints) and the rebuild's lock.
	Projector string
	// Migrate creates the schema's tables in the named schema.
	Migrate func(ctx context.Context, url, schema string) error
}

// Shadow returns the schema a rebuild builds.
func (c Config) Shadow() string { return c.Live + "_next" }

func (c Config) old() string     { return c.Live + "_old" }
func (c Config) lockKey() string { return "feed.rebuild." + c.Projector }

// Rebuild is a projector's state being rebuilt in a shadow schema beside the
// live one. It holds a session lock that other rebuilds refuse on, released
// by Close or when the process dies.
type Rebuild struct {
	cfg  Config
	conn *pgx.Conn // holds the lock; runs the switch
	pool *pgxpool.Pool
}

// OpenRebuild takes the rebuild lock and opens the shadow: the one an
// interrupted rebuild left, to resume, or a new one when there is none or
// fresh is set.
func OpenRebuild(ctx context.Context, url string, fresh bool, cfg Config) (_ *Rebuild, err error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("connect postgres: %w", Failure(err))
	}
	defer func() {
		if err != nil {
			_ = conn.Close(context.WithoutCancel(ctx))
		}
	}()
	var locked bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtextextended($1, 0))`, cfg.lockKey()).Scan(&locked); err != nil {
		return nil, fmt.Errorf("rebuild lock: %w", Failure(err))
	}
	if !locked {
		return nil, fmt.Errorf("%s: %w", cfg.Projector, projections.ErrRebuildRunning)
	}
	// A switch that committed but was not cleaned up.
	if err := dropSchema(ctx, conn, cfg.old()); err != nil {
		return nil, err
	}
	if fresh {
		if err := dropSchema(ctx, conn, cfg.Shadow()); err != nil {
			return nil, err
		}
	}
	if err := cfg.Migrate(ctx, url, cfg.Shadow()); err != nil {
		return nil, err
	}
	pcfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("parse database url: %w", err)
	}
	pcfg.ConnConfig.RuntimeParams["search_path"] = cfg.Shadow()
	// The shadow's batches commit without waiting for the WAL flush. A crash
	// may then lose its last few commits, but no more than that: each takes
	// its checkpoint with it (they are one transaction), and the WAL is
	// replayed in order, so the shadow comes back as it was at an earlier
	// checkpoint, from which the next Replay resumes. Nothing outside the
	// shadow acts on those commits before the switch, and the switch commits
	// on conn, synchronously: its commit record flushes the WAL before it,
	// every shadow commit included. (The live projector's commits stay
	// synchronous: readers act on them.)
	pcfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("connect postgres: %w", Failure(err))
	}
	return &Rebuild{cfg: cfg, conn: conn, pool: pool}, nil
}

// Pool is the shadow's: unqualified table names resolve in it.
func (r *Rebuild) Pool() *pgxpool.Pool { return r.pool }

func dropSchema(ctx context.Context, conn *pgx.Conn, schema string) error {
	if _, err := conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
		return fmt.Errorf("drop schema %s: %w", schema, Failure(err))
	}
	return nil
}

// Close releases the lock and the shadow's connections. The lock is released
// by name first: the end of its session frees it too, but only once the
// server has handled the disconnection, after Close returns, and a rebuild
// opened right after this one closes must find it free.
func (r *Rebuild) Close() {
	r.pool.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = r.conn.Exec(ctx, `SELECT pg_advisory_unlock(hashtextextended($1, 0))`, r.cfg.lockKey())
	_ = r.conn.Close(ctx)
}

// Switch implements projections.Shadow's Switch. In one transaction it locks
// the live checkpoint table, which stops the live projector before its next
// batch (it locks its checkpoint first), brings the shadow to the live
// position, and swaps the schemas' names. The live projector's waiting batch
// then resolves its tables anew, in the new schema, where the checkpoint is at
// least its own; readers' next statements read the new one (pools hold no
// prepared statements over a swap: Postgres drops every cached plan when a
// schema changes).
func (r *Rebuild) Switch(ctx context.Context, catchUp func(context.Context, uint64) error) error {
	tx, err := r.conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", Failure(err))
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	live := pgx.Identifier{r.cfg.Live}.Sanitize()
	if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '30s'"); err != nil {
		return fmt.Errorf("switch: %w", Failure(err))
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE "+live+".projector_checkpoints IN ACCESS EXCLUSIVE MODE"); err != nil {
		return fmt.Errorf("lock the live checkpoint: %w", Failure(err))
	}
	var pos, epoch int64
	err = tx.QueryRow(ctx, "SELECT position, epoch FROM "+live+".projector_checkpoints WHERE projector = $1", r.cfg.Projector).Scan(&pos, &epoch)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("live checkpoint: %w", Failure(err))
	}
	if err := catchUp(ctx, uint64(pos)); err != nil {
		return err
	}
	// The live projector's lease fences the new state as it did the old.
	if _, err := tx.Exec(ctx, "UPDATE "+pgx.Identifier{r.cfg.Shadow()}.Sanitize()+".projector_checkpoints SET epoch = $2 WHERE projector = $1",
		r.cfg.Projector, epoch); err != nil {
		return fmt.Errorf("switch: %w", Failure(err))
	}
	if _, err := tx.Exec(ctx, "ALTER SCHEMA "+live+" RENAME TO "+pgx.Identifier{r.cfg.old()}.Sanitize()); err != nil {
		return fmt.Errorf("switch: %w", Failure(err))
	}
	if _, err := tx.Exec(ctx, "ALTER SCHEMA "+pgx.Identifier{r.cfg.Shadow()}.Sanitize()+" RENAME TO "+live); err != nil {
		return fmt.Errorf("switch: %w", Failure(err))
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("switch: %w", Failure(err))
	}
	// Its search path names a schema that no longer exists.
	r.pool.Close()
	return nil
}

// Cleanup implements projections.Shadow's Cleanup: it drops the replaced
// state, once the statements still reading it have finished.
func (r *Rebuild) Cleanup(ctx context.Context) error {
	return dropSchema(ctx, r.conn, r.cfg.old())
}
