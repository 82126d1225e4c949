package readmodel

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/feedproject/feed/domain"
)

// SetBeforeFill makes c run f between each read from Postgres and its fill, so
// a test can let events overtake a read. Set it before c is used.
func SetBeforeFill(c *Cache, f func()) { c.beforeFill = f }

// SetPruneEvery makes c forget its marks, and read the read model's
// position, every d instead of every second. Set it before Run.
func SetPruneEvery(c *Cache, d time.Duration) { c.pruneEvery = d }

// AllPostIDs lists every post in s, deleted or not, in id order.
func AllPostIDs(ctx context.Context, s *Store) ([]domain.PostID, error) {
	rows, err := s.pool.Query(ctx, `SELECT id FROM posts ORDER BY id`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (domain.PostID, error) {
		var id int64
		err := r.Scan(&id)
		return domain.PostID(id), err
	})
}

// MaxLikers is how many likers a cached post keeps.
const MaxLikers = maxLikers

// SetCatchUpBatch makes p remember what batches of n events or more leave
// the rows as (catchUpBatch).
func SetCatchUpBatch(p *Projector, n int) { p.catchUp = n }

// ErrBatchBefore voids a batch sent ahead of one that was not applied.
var ErrBatchBefore = errBatchBefore

// CacheSizes is how many posts and like states c holds, expired or not.
func CacheSizes(c *Cache) (posts, likes int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.posts.Len(), c.likes.Len()
}
