package activity

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/projections/pgschema"
)

// Store answers reads of the activity from pool, whose search path is the
// activity's schema.
type Store struct {
	pool *pgxpool.Pool
}

// NewStore returns a store reading pool.
func NewStore(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// Page is one page of a user's activity, newest first.
type Page struct {
	Items []Item
	// Next is the cursor of the page after; nil at the end.
	Next    *domain.Cursor
	HasMore bool
}

// selectItems reads items with their post's thumbnail; kept tells an item
// shown from one beyond the newest the user keeps.
const selectItems = `SELECT i.id, i.actor_id, i.post_id, i.comment_id, i.text, i.created_at, i.kept,
		p.media_key, p.content_type, p.width, p.height
	FROM items i LEFT JOIN posts p ON p.id = i.post_id
	WHERE i.owner_id = $1 `

// Page reads the page of user's activity after the cursor (nil: the first).
// Items are newest first by id (the log's order of the actions), so a page
// continues from the cursor's id alone; the items beyond those kept end the
// list.
func (s *Store) Page(ctx context.Context, user domain.UserID, after *domain.Cursor) (Page, error) {
	before := int64(domain.MaxID)
	if after != nil {
		before = after.ID
	}
	items, err := s.query(ctx, selectItems+`AND i.id < $2 ORDER BY i.id DESC LIMIT $3`, user, before, domain.PageSize+1)
	if err != nil {
		return Page{}, err
	}
	page := Page{Items: items}
	if len(items) > domain.PageSize {
		page.Items, page.HasMore = items[:domain.PageSize], true
		last := page.Items[domain.PageSize-1]
		page.Next = &domain.Cursor{ID: int64(last.ID), Unix: last.CreatedAt.Unix()}
	}
	return page, nil
}

// After reads user's items made after log position pos, oldest first, at
// most limit of them: what a live stream announces once the activity has
// applied the events past pos (Position).
func (s *Store) After(ctx context.Context, user domain.UserID, pos uint64, limit int) ([]Item, error) {
	return s.query(ctx, selectItems+`AND i.id > $2 AND i.kept ORDER BY i.id LIMIT $3`, user, int64(pos), limit)
}

// query reads items, up to the first not kept.
func (s *Store) query(ctx context.Context, sql string, user domain.UserID, pos int64, limit int) ([]Item, error) {
	rows, err := s.pool.Query(ctx, sql, int64(user), pos, limit)
	if err != nil {
		return nil, queryError(err)
	}
	var (
		items            []Item
		id, actor        int64
		post, comment    *int64
		text, key, ctype *string
		at               time.Time
		kept             bool
		width, height    *int32
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &actor, &post, &comment, &text, &at, &kept, &key, &ctype, &width, &height}, func() error {
		if !kept {
			return errBeyondKept
		}
		it := Item{ID: uint64(id), Kind: KindFollow, Owner: user, Actor: domain.UserID(actor), CreatedAt: at.UTC()}
		if post != nil {
			it.Kind, it.Post = KindLike, domain.PostID(*post)
			if key != nil {
				it.Thumbnail = &Thumbnail{Key: *key, ContentType: deref(ctype), Width: int(deref(width)), Height: int(deref(height))}
			}
		}
		if comment != nil {
			it.Kind, it.Comment, it.Text = KindComment, domain.CommentID(*comment), deref(text)
		}
		items = append(items, it)
		return nil
	})
	if err != nil && !errors.Is(err, errBeyondKept) {
		return nil, queryError(err)
	}
	return items, nil
}

// errBeyondKept ends a read at the first item beyond those kept: all after it
// are too.
var errBeyondKept = errors.New("beyond the items kept")

// Position is the log position the activity has applied.
func (s *Store) Position(ctx context.Context) (uint64, error) {
	pos, err := position(ctx, s.pool)
	if err != nil {
		return 0, fmt.Errorf("activity position: %w", err)
	}
	return pos, nil
}

// queryError marks a failure to reach Postgres as domain.ErrUnavailable.
func queryError(err error) error {
	if errors.Is(err, context.Canceled) {
		return err
	}
	return fmt.Errorf("read activity: %w", pgschema.Failure(err))
}
