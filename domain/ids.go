package domain

import (
	"fmt"
	"strconv"
)

// MaxID is the exclusive upper bound of every id: ids are JSON strings to clients,
// but they must also survive a float64 round trip (JavaScript numbers, Redis scores)
// exactly, which holds for integers below 2^53.
const MaxID = 1 << 53

// UserID identifies a user of the identity provider that issues tokens.
type UserID int64

// PostID identifies a post. Post ids are time-ordered (see IDGenerator).
type PostID int64

// CommentID identifies a comment. Comment ids are time-ordered like post ids.
type CommentID int64

// String writes an id as clients see it: decimal.

func (id UserID) String() string    { return strconv.FormatInt(int64(id), 10) }
func (id PostID) String() string    { return strconv.FormatInt(int64(id), 10) }
func (id CommentID) String() string { return strconv.FormatInt(int64(id), 10) }

// parseID parses a decimal id in [1, MaxID).
func parseID(kind, s string) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n >= MaxID || s[0] == '+' {
		return 0, fmt.Errorf("%s id %q is not a positive integer below 2^53: %w", kind, s, ErrInvalid)
	}
	return n, nil
}

// ParseUserID parses a user id as clients and tokens write it.
func ParseUserID(s string) (UserID, error) {
	n, err := parseID("user", s)
	return UserID(n), err
}

// ParsePostID parses a post id as clients write it.
func ParsePostID(s string) (PostID, error) {
	n, err := parseID("post", s)
	return PostID(n), err
}

// ParseCommentID parses a comment id as clients write it.
func ParseCommentID(s string) (CommentID, error) {
	n, err := parseID("comment", s)
	return CommentID(n), err
}
