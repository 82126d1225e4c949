package events

import (
	"time"

	"github.com/feedproject/feed/domain"
)

// The event type names. They are persisted in the log: never rename, reorder
// the meaning of, or reuse one. A changed payload gets a new version (….v2) and
// both stay decodable. docs/events.md documents each payload.
const (
	TypePostCreated    = "post.created.v1"
	TypePostEdited     = "post.edited.v1"
	TypePostDeleted    = "post.deleted.v1"
	TypeUserFollowed   = "user.followed.v1"
	TypeUserUnfollowed = "user.unfollowed.v1"
	TypePostLiked      = "post.liked.v1"
	TypePostUnliked    = "post.unliked.v1"
	TypeCommentAdded   = "comment.added.v1"
)

// Media describes one stored image of a post; the bytes live in the media store
// under Key, never in the log.
type Media struct {
	Key         string `json:"key"`
	ContentType string `json:"content_type"`
	Width       int    `json:"width"`
	Height      int    `json:"height"`
	Size        int64  `json:"size"`
}

// PostCreated records a new post. Media position is the slice index; position 0
// is the thumbnail.
type PostCreated struct {
	PostID    domain.PostID `json:"post_id,string"`
	UserID    domain.UserID `json:"user_id,string"`
	Caption   string        `json:"caption"`
	CreatedAt time.Time     `json:"created_at"`
	Media     []Media       `json:"media"`
}

// PostEdited records a new caption.
type PostEdited struct {
	PostID   domain.PostID `json:"post_id,string"`
	UserID   domain.UserID `json:"user_id,string"`
	Caption  string        `json:"caption"`
	EditedAt time.Time     `json:"edited_at"`
}

// PostDeleted records that a post is gone for good; later events for it are
// no-ops in every projection.
type PostDeleted struct {
	PostID    domain.PostID `json:"post_id,string"`
	UserID    domain.UserID `json:"user_id,string"`
	DeletedAt time.Time     `json:"deleted_at"`
}

// UserFollowed records that FollowerID follows FolloweeID (repeats are allowed
// and change nothing).
type UserFollowed struct {
	FollowerID domain.UserID `json:"follower_id,string"`
	FolloweeID domain.UserID `json:"followee_id,string"`
}

// UserUnfollowed records that FollowerID no longer follows FolloweeID.
type UserUnfollowed struct {
	FollowerID domain.UserID `json:"follower_id,string"`
	FolloweeID domain.UserID `json:"followee_id,string"`
}

// PostLiked records a like; a user likes a post at most once.
type PostLiked struct {
	UserID domain.UserID `json:"user_id,string"`
	PostID domain.PostID `json:"post_id,string"`
}

// PostUnliked withdraws a like.
type PostUnliked struct {
	UserID domain.UserID `json:"user_id,string"`
	PostID domain.PostID `json:"post_id,string"`
}

// CommentAdded records a comment on a post.
type CommentAdded struct {
	CommentID domain.CommentID `json:"comment_id,string"`
	PostID    domain.PostID    `json:"post_id,string"`
	UserID    domain.UserID    `json:"user_id,string"`
	Text      string           `json:"text"`
	CreatedAt time.Time        `json:"created_at"`
}

// Type, Actor and Subject implement Event for each payload.

func (PostCreated) Type() string    { return TypePostCreated }
func (PostEdited) Type() string     { return TypePostEdited }
func (PostDeleted) Type() string    { return TypePostDeleted }
func (UserFollowed) Type() string   { return TypeUserFollowed }
func (UserUnfollowed) Type() string { return TypeUserUnfollowed }
func (PostLiked) Type() string      { return TypePostLiked }
func (PostUnliked) Type() string    { return TypePostUnliked }
func (CommentAdded) Type() string   { return TypeCommentAdded }

func (e PostCreated) Actor() domain.UserID    { return e.UserID }
func (e PostEdited) Actor() domain.UserID     { return e.UserID }
func (e PostDeleted) Actor() domain.UserID    { return e.UserID }
func (e UserFollowed) Actor() domain.UserID   { return e.FollowerID }
func (e UserUnfollowed) Actor() domain.UserID { return e.FollowerID }
func (e PostLiked) Actor() domain.UserID      { return e.UserID }
func (e PostUnliked) Actor() domain.UserID    { return e.UserID }
func (e CommentAdded) Actor() domain.UserID   { return e.UserID }

func (e PostCreated) Subject() string { return Subject(e.UserID, KindPost, int64(e.PostID)) }
func (e PostEdited) Subject() string  { return Subject(e.UserID, KindPost, int64(e.PostID)) }
func (e PostDeleted) Subject() string { return Subject(e.UserID, KindPost, int64(e.PostID)) }
func (e UserFollowed) Subject() string {
	return Subject(e.FollowerID, KindFollow, int64(e.FolloweeID))
}
func (e UserUnfollowed) Subject() string {
	return Subject(e.FollowerID, KindFollow, int64(e.FolloweeID))
}
func (e PostLiked) Subject() string    { return Subject(e.UserID, KindLike, int64(e.PostID)) }
func (e PostUnliked) Subject() string  { return Subject(e.UserID, KindLike, int64(e.PostID)) }
func (e CommentAdded) Subject() string { return Subject(e.UserID, KindComment, int64(e.PostID)) }
