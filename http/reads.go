package http

import (
	"context"
	"fmt"
	"time"

	"github.com/gofiber/fiber/v2"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/projections/readmodel"
)

// ReadModel is what the read routes ask the Postgres read model
// (*readmodel.Store).
type ReadModel interface {
	Post(ctx context.Context, id domain.PostID, viewer domain.UserID) (readmodel.Post, error)
	ProfileGrid(ctx context.Context, user domain.UserID, after *domain.Cursor) (readmodel.Page[readmodel.GridItem], error)
	Comments(ctx context.Context, post domain.PostID, after *domain.Cursor) (readmodel.Page[readmodel.Comment], error)
	Followers(ctx context.Context, user domain.UserID, after *domain.Cursor) (readmodel.Page[domain.UserID], error)
	Following(ctx context.Context, user domain.UserID, after *domain.Cursor) (readmodel.Page[domain.UserID], error)
	// Position is the log position the read model has applied.
	Position(ctx context.Context) (uint64, error)
}

const (
	// readTimeout bounds each query of a read, so a store that hangs is a prompt
	// 503 rather than a hung request.
	readTimeout = 5 * time.Second
	// The backoff of polling a projection's position while a read waits for it:
	// short at first, since a projection is usually a few milliseconds behind a
	// command's answer, then capped so a long wait costs few queries.
	firstPoll = 2 * time.Millisecond
	maxPoll   = 50 * time.Millisecond
)

// Headers of read-your-writes (docs/api.md).
const (
	headerMinPosition = "X-Min-Position"
	headerPosition    = "X-Position"
)

// registerReads adds the routes answered from the read model. They are
// registered whatever the dependencies, so the router always matches the
// contract; without a read model they answer 503.
func registerReads(app *fiber.App, deps Deps, cfg Config) {
	h := &reads{model: deps.ReadModel, wait: cfg.ConsistencyWait}
	app.Get("/posts/:id", deps.Auth.optionalAuth, h.post)
	app.Get("/posts/:id/comments", h.comments)
	app.Get("/users/feed", h.profileGridByQuery)
	app.Get("/users/:id/posts", h.profileGrid)
	app.Get("/users/:id/followers", h.followers)
	app.Get("/users/:id/following", h.following)
}

// reads handles the read side of the contract from the Postgres read model.
type reads struct {
	model ReadModel
	wait  time.Duration
}

// optionalAuth admits anonymous requests, but a token that is sent must be
// valid: a client that believes it is signed in learns that it is not, rather
// than silently getting the anonymous view.
func (a *Authenticator) optionalAuth(c *fiber.Ctx) error {
	if _, _, err := a.fromRequest(c); err != nil {
		return err
	}
	return c.Next()
}

// positionFunc reports how far a projection has applied the log.
type positionFunc func(context.Context) (uint64, error)

// awaitPosition gives a read its consistency: it waits, up to wait, until
// position reaches the request's X-Min-Position (a position a command
// answered), and answers X-Position with the position reached. Past the bound
// the read goes ahead anyway: a slightly stale answer, which X-Position shows,
// serves the client better than an error. Handlers call it after validating
// their input, so bad input never waits, and before querying, so the answer
// reflects at least X-Position.
func awaitPosition(c *fiber.Ctx, position positionFunc, wait time.Duration) error {
	want, err := minPositionHeader(c)
	if err != nil {
		return err
	}
	ctx := c.UserContext()
	poll := func() (uint64, error) {
		ctx, cancel := context.WithTimeout(ctx, readTimeout)
		defer cancel()
		return position(ctx)
	}
	pos, err := poll()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(wait)
	for backoff := firstPoll; pos < want; backoff = min(2*backoff, maxPoll) {
		left := time.Until(deadline)
		if left <= 0 {
			break
		}
		t := time.NewTimer(min(backoff, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("wait for position %d: %w", want, ctx.Err())
		case <-t.C:
		}
		if pos, err = poll(); err != nil {
			return err
		}
	}
	c.Set(headerPosition, events.Position(pos))
	return nil
}

// minPositionHeader is the request's X-Min-Position, 0 when absent.
func minPositionHeader(c *fiber.Ctx) (uint64, error) {
	h := c.Get(headerMinPosition)
	if h == "" {
		return 0, nil
	}
	want, err := events.ParsePosition(h)
	if err != nil {
		return 0, fmt.Errorf("header %s: %w", headerMinPosition, err)
	}
	return want, nil
}

// ready waits for the read model to reach the request's X-Min-Position (see
// awaitPosition); without a read model the read is a 503.
func (h *reads) ready(c *fiber.Ctx) error {
	if h.model == nil {
		return fmt.Errorf("no read model is configured: %w", domain.ErrUnavailable)
	}
	return awaitPosition(c, h.model.Position, h.wait)
}

// queryContext bounds a read's query by readTimeout.
func queryContext(c *fiber.Ctx) (context.Context, context.CancelFunc) {
	return context.WithTimeout(c.UserContext(), readTimeout)
}

// cursorParam parses the cursor query parameter; nil is the first page.
func cursorParam(c *fiber.Ctx) (*domain.Cursor, error) {
	cur, ok, err := domain.ParseCursor(c.Query("cursor"))
	if err != nil || !ok {
		return nil, err
	}
	return &cur, nil
}

func (h *reads) post(c *fiber.Ctx) error {
	id, err := domain.ParsePostID(c.Params("id"))
	if err != nil {
		return err
	}
	var viewer domain.UserID // anonymous
	if p, ok := principal(c); ok {
		viewer = p.UserID
	}
	if err := h.ready(c); err != nil {
		return err
	}
	ctx, cancel := queryContext(c)
	defer cancel()
	p, err := h.model.Post(ctx, id, viewer)
	if err != nil {
		return err
	}
	return sendPost(c, p)
}

func (h *reads) profileGridByQuery(c *fiber.Ctx) error {
	if c.Query("userid") == "" {
		return fmt.Errorf("query parameter userid is required: %w", domain.ErrInvalid)
	}
	return h.grid(c, c.Query("userid"))
}

func (h *reads) profileGrid(c *fiber.Ctx) error { return h.grid(c, c.Params("id")) }

func (h *reads) grid(c *fiber.Ctx, userParam string) error {
	user, err := domain.ParseUserID(userParam)
	if err != nil {
		return err
	}
	return listPage(h, c, func(ctx context.Context, after *domain.Cursor) (readmodel.Page[readmodel.GridItem], error) {
		return h.model.ProfileGrid(ctx, user, after)
	}, func(p readmodel.Page[readmodel.GridItem]) any {
		return gridPageView{Posts: views(p.Items, newGridItemView), NextCursor: nextCursor(p.Next), HasMore: p.HasMore}
	})
}

func (h *reads) comments(c *fiber.Ctx) error {
	post, err := domain.ParsePostID(c.Params("id"))
	if err != nil {
		return err
	}
	return listPage(h, c, func(ctx context.Context, after *domain.Cursor) (readmodel.Page[readmodel.Comment], error) {
		return h.model.Comments(ctx, post, after)
	}, func(p readmodel.Page[readmodel.Comment]) any {
		return commentPageView{Comments: views(p.Items, newCommentView), NextCursor: nextCursor(p.Next), HasMore: p.HasMore}
	})
}

func (h *reads) followers(c *fiber.Ctx) error {
	return h.userList(c, ReadModel.Followers)
}

func (h *reads) following(c *fiber.Ctx) error {
	return h.userList(c, ReadModel.Following)
}

func (h *reads) userList(c *fiber.Ctx, list func(ReadModel, context.Context, domain.UserID, *domain.Cursor) (readmodel.Page[domain.UserID], error)) error {
	user, err := domain.ParseUserID(c.Params("id"))
	if err != nil {
		return err
	}
	return listPage(h, c, func(ctx context.Context, after *domain.Cursor) (readmodel.Page[domain.UserID], error) {
		return list(h.model, ctx, user, after)
	}, func(p readmodel.Page[domain.UserID]) any {
		return userPageView{Users: views(p.Items, domain.UserID.String), NextCursor: nextCursor(p.Next), HasMore: p.HasMore}
	})
}

// listPage is every paged read after its path is parsed: the cursor is checked
// (bad input never waits), the read waits for X-Min-Position, and the page is
// queried and answered as its JSON view.
func listPage[T any](h *reads, c *fiber.Ctx, query func(context.Context, *domain.Cursor) (readmodel.Page[T], error), view func(readmodel.Page[T]) any) error {
	after, err := cursorParam(c)
	if err != nil {
		return err
	}
	if err := h.ready(c); err != nil {
		return err
	}
	ctx, cancel := queryContext(c)
	defer cancel()
	page, err := query(ctx, after)
	if err != nil {
		return err
	}
	return c.JSON(view(page))
}

// The answers' JSON, as openapi.yaml has them: ids as strings,
// times by formatTime, lists never null. Posts are written by appendPost.

type thumbnailView struct {
	URL         string `json:"url"`
	ContentType string `json:"content_type"`
	Width       int    `json:"width"`
	Height      int    `json:"height"`
}

type gridItemView struct {
	ID           string        `json:"id"`
	CreatedAt    string        `json:"created_at"`
	LikeCount    int           `json:"like_count"`
	CommentCount int           `json:"comment_count"`
	Thumbnail    thumbnailView `json:"thumbnail"`
}

type gridPageView struct {
	Posts      []gridItemView `json:"posts"`
	NextCursor *string        `json:"next_cursor"`
	HasMore    bool           `json:"has_more"`
}

type commentView struct {
	ID        string `json:"id"`
	UserID    string `json:"user_id"`
	Text      string `json:"text"`
	CreatedAt string `json:"created_at"`
}

type commentPageView struct {
	Comments   []commentView `json:"comments"`
	NextCursor *string       `json:"next_cursor"`
	HasMore    bool          `json:"has_more"`
}

type userPageView struct {
	Users      []string `json:"users"`
	NextCursor *string  `json:"next_cursor"`
	HasMore    bool     `json:"has_more"`
}

func newGridItemView(g readmodel.GridItem) gridItemView {
	t := g.Thumbnail
	return gridItemView{
		ID:           g.ID.String(),
		CreatedAt:    formatTime(g.CreatedAt),
		LikeCount:    g.LikeCount,
		CommentCount: g.CommentCount,
		Thumbnail:    thumbnailView{URL: mediaURL(t.Key), ContentType: t.ContentType, Width: t.Width, Height: t.Height},
	}
}

func newCommentView(cm readmodel.Comment) commentView {
	return commentView{ID: cm.ID.String(), UserID: cm.UserID.String(), Text: cm.Text, CreatedAt: formatTime(cm.CreatedAt)}
}

// mediaPath is where GET /media/{key} serves images.
const mediaPath = "/media/"

// mediaURL is where GET /media/{key} serves an image. Keys are hex digests with
// an extension, so they need no escaping.
func mediaURL(key string) string { return mediaPath + key }

// nextCursor writes a page's next cursor; null at the end.
func nextCursor(c *domain.Cursor) *string {
	if c == nil {
		return nil
	}
	s := c.String()
	return &s
}

// views maps items to their JSON, giving [] rather than null for none.
func views[T, B any](items []T, body func(T) B) []B {
	out := make([]B, len(items))
	for i, it := range items {
		out[i] = body(it)
	}
	return out
}
