package domain

import (
	"fmt"
	"strconv"
	"strings"
)

// Cursor marks where a page ended: the id of its last item and that item's time
// in Unix seconds, written "<id>:<unix_seconds>". Post and comment ids are
// time-ordered, so their lists continue from the id alone and the seconds only
// keep the cursor meaningful when the item itself is gone; lists ordered by time
// (followers) use both.
type Cursor struct {
	ID   int64
	Unix int64
}

// ParseCursor parses a cursor a client sent back; "" is the first page
// (ok false).
func ParseCursor(s string) (c Cursor, ok bool, err error) {
	if s == "" {
		return Cursor{}, false, nil
	}
	idPart, unixPart, found := strings.Cut(s, ":")
	id, err1 := strconv.ParseInt(idPart, 10, 64)
	unix, err2 := strconv.ParseInt(unixPart, 10, 64)
	if !found || err1 != nil || err2 != nil || id <= 0 || id >= MaxID || unix < 0 ||
		strings.HasPrefix(idPart, "+") || strings.HasPrefix(unixPart, "+") {
		return Cursor{}, false, fmt.Errorf("cursor %q is not <id>:<unix_seconds>: %w", s, ErrInvalid)
	}
	return Cursor{ID: id, Unix: unix}, true, nil
}

// String writes the cursor as clients see it.
func (c Cursor) String() string {
	return strconv.FormatInt(c.ID, 10) + ":" + strconv.FormatInt(c.Unix, 10)
}
