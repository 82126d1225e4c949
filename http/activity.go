package http

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/projections/activity"
)

// Activity is what GET /activity asks of the activity (*activity.Store).
type Activity interface {
	Page(ctx context.Context, user domain.UserID, after *domain.Cursor) (activity.Page, error)
	// Position is the log position the activity has applied.
	Position(ctx context.Context) (uint64, error)
}

// registerActivity adds GET /activity; without an activity it answers 503.
func registerActivity(app *fiber.App, deps Deps, cfg Config) {
	h := &activityReads{store: deps.Activity, wait: cfg.ConsistencyWait}
	app.Get("/activity", deps.Auth.requireAuth, h.page)
}

type activityReads struct {
	store Activity
	wait  time.Duration
}

func (h *activityReads) page(c *fiber.Ctx) error {
	p, _ := principal(c)
	after, err := cursorParam(c)
	if err != nil {
		return err
	}
	if h.store == nil {
		return fmt.Errorf("no activity is configured: %w", domain.ErrUnavailable)
	}
	if err := awaitPosition(c, h.store.Position, h.wait); err != nil {
		return err
	}
	ctx, cancel := queryContext(c)
	defer cancel()
	page, err := h.store.Page(ctx, p.UserID, after)
	if err != nil {
		return err
	}
	return c.JSON(activityPageView{Items: views(page.Items, newActivityItemView), NextCursor: nextCursor(page.Next), HasMore: page.HasMore})
}

// activityItemView is an item as GET /activity and the stream's activity
// events show it: post_id and thumbnail for a like or a comment, comment for
// a comment.
type activityItemView struct {
	ID        string               `json:"id"`
	Type      string               `json:"type"`
	ActorID   string               `json:"actor_id"`
	PostID    *string              `json:"post_id,omitempty"`
	Thumbnail *thumbnailView       `json:"thumbnail,omitempty"`
	Comment   *activityCommentView `json:"comment,omitempty"`
	CreatedAt string               `json:"created_at"`
}

type activityCommentView struct {
	ID   string `json:"id"`
	Text string `json:"text"`
}

type activityPageView struct {
	Items      []activityItemView `json:"items"`
	NextCursor *string            `json:"next_cursor"`
	HasMore    bool               `json:"has_more"`
}

func newActivityItemView(it activity.Item) activityItemView {
	v := activityItemView{
		ID:        strconv.FormatUint(it.ID, 10),
		Type:      it.Kind,
		ActorID:   it.Actor.String(),
		CreatedAt: formatTime(it.CreatedAt),
	}
	if it.Post != 0 {
		id := it.Post.String()
		v.PostID = &id
	}
	if t := it.Thumbnail; t != nil {
		v.Thumbnail = &thumbnailView{URL: mediaURL(t.Key), ContentType: t.ContentType, Width: t.Width, Height: t.Height}
	}
	if it.Kind == activity.KindComment {
		v.Comment = &activityCommentView{ID: it.Comment.String(), Text: it.Text}
	}
	return v
}
