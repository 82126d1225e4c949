package http

import (
	"context"
	"encoding/json"
	"log/slog"
	"time"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/projections/activity"
)

// ActivityMade is what the stream's activity events ask of the activity
// (*activity.Store).
type ActivityMade interface {
	// Position is the log position the activity has applied.
	Position(ctx context.Context) (uint64, error)
	// MadeBy is the item the event at pos made, if it made one still shown:
	// a follow of owner by actor, or (post not 0) actor's like of or
	// comment on post.
	MadeBy(ctx context.Context, pos uint64, actor, owner domain.UserID, post domain.PostID) (activity.Item, bool, error)
}

// NewStreamActivity makes the activity events of GET /stream from the
// activity projection: an event's item, once the projection has applied the
// event, waiting at most wait for it. An event the projection has not
// reached by then (far behind, or rebuilding from the start) is announced
// with no item, and GET /activity shows the item once it has; the stream
// does not hold every viewer's events for it.
func NewStreamActivity(made ActivityMade, wait time.Duration, logger *slog.Logger) StreamActivity {
	return &streamActivity{
		made:   made,
		pos:    &sharedPosition{lookup: made.Position, ttl: positionReuse},
		wait:   wait,
		logger: logger,
		behind: newSampledLog(),
	}
}

type streamActivity struct {
	made   ActivityMade
	pos    *sharedPosition
	wait   time.Duration
	logger *slog.Logger
	behind *sampledLog
}

func (a *streamActivity) ActivityItems(ctx context.Context, rec events.Record, wants func(domain.UserID) bool) ([]ActivityItem, error) {
	var actor, owner domain.UserID
	var post domain.PostID
	switch e := rec.Event.(type) {
	case events.UserFollowed:
		actor, owner = e.FollowerID, e.FolloweeID
		if !wants(owner) {
			return nil, nil
		}
	case events.PostLiked:
		actor, post = e.UserID, e.PostID
	case events.CommentAdded:
		actor, post = e.UserID, e.PostID
	default:
		return nil, nil
	}
	waitCtx, cancel := context.WithTimeout(ctx, a.wait)
	reached := awaitApplied(waitCtx, a.pos, rec.Seq)
	cancel()
	if !reached {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		a.behind.log(ctx, a.logger, slog.LevelWarn, "stream: the activity has not applied an event in time; announced without its item", "position", rec.Seq)
		return nil, nil
	}
	it, ok, err := a.made.MadeBy(ctx, rec.Seq, actor, owner, post)
	if err != nil || !ok || !wants(it.Owner) {
		return nil, err
	}
	body, err := json.Marshal(newActivityItemView(it))
	if err != nil {
		return nil, err
	}
	return []ActivityItem{{User: it.Owner, JSON: body}}, nil
}
