package events

import (
	"time"
	"unicode/utf8"

	"github.com/feedproject/feed/domain"
)

// decodeWritten decodes data if it is an envelope of a registered type exactly
// as json.Marshal writes one (NewEnvelope's, as every writer of the log
// stores it): names in the structs' order, no spaces, numbers and times in
// their usual form, strings with nothing escaped. Anything else, it reports
// false, and the general decoder reads data. What it decodes, the general
// decoder decodes the same (FuzzWrittenAsGeneral).
//
// It exists for speed: a replay is bound by the CPU of the machine's cores,
// and the general decoder's reflection was a third of the projectors' own
// work; reading the known layout straight through costs a fraction of that.
func decodeWritten(data []byte) (Envelope, Event, bool) {
	r := scan{b: data, ok: true}
	var env Envelope
	r.lit(`{"id":`)
	env.ID = r.str()
	r.lit(`,"type":`)
	typ := r.raw()
	r.lit(`,"occurred_at":`)
	env.OccurredAt = r.time()
	r.lit(`,"actor":`)
	env.Actor = domain.UserID(r.quotedInt())
	r.lit(`,"payload":`)
	start := r.i
	var ev Event
	// The type's name is compared where it stands: string(typ) in a switch
	// does not allocate, and the matching constant then stands in for it.
	switch string(typ) {
	case TypePostCreated:
		env.Type, ev = TypePostCreated, r.postCreated()
	case TypePostEdited:
		var e PostEdited
		e.PostID, e.UserID = r.postOf(`{`)
		r.lit(`,"caption":`)
		e.Caption = r.str()
		r.lit(`,"edited_at":`)
		e.EditedAt = r.time()
		env.Type, ev = TypePostEdited, e
	case TypePostDeleted:
		var e PostDeleted
		e.PostID, e.UserID = r.postOf(`{`)
		r.lit(`,"deleted_at":`)
		e.DeletedAt = r.time()
		env.Type, ev = TypePostDeleted, e
	// An unfollow is laid out as a follow, an unlike as a like.
	case TypeUserFollowed:
		env.Type, ev = TypeUserFollowed, r.follow()
	case TypeUserUnfollowed:
		env.Type, ev = TypeUserUnfollowed, UserUnfollowed(r.follow())
	case TypePostLiked:
		env.Type, ev = TypePostLiked, r.like()
	case TypePostUnliked:
		env.Type, ev = TypePostUnliked, PostUnliked(r.like())
	case TypeCommentAdded:
		var e CommentAdded
		r.lit(`{"comment_id":`)
		e.CommentID = domain.CommentID(r.quotedInt())
		e.PostID, e.UserID = r.postOf(`,`)
		r.lit(`,"text":`)
		e.Text = r.str()
		r.lit(`,"created_at":`)
		e.CreatedAt = r.time()
		env.Type, ev = TypeCommentAdded, e
	default:
		return Envelope{}, nil, false
	}
	r.lit(`}`)
	end := r.i
	r.lit(`}`)
	if !r.ok || r.i != len(data) {
		return Envelope{}, nil, false
	}
	env.Payload = data[start:end]
	return env, ev, true
}

func (r *scan) postCreated() PostCreated {
	var e PostCreated
	e.PostID, e.UserID = r.postOf(`{`)
	r.lit(`,"caption":`)
	e.Caption = r.str()
	r.lit(`,"created_at":`)
	e.CreatedAt = r.time()
	r.lit(`,"media":`)
	if r.next("null") {
		return e
	}
	r.lit(`[`)
	e.Media = []Media{}
	for r.ok && !r.next("]") {
		if len(e.Media) > 0 {
			r.lit(`,`)
		}
		var m Media
		r.lit(`{"key":`)
		m.Key = r.str()
		r.lit(`,"content_type":`)
		m.ContentType = r.str()
		r.lit(`,"width":`)
		m.Width = int(r.int())
		r.lit(`,"height":`)
		m.Height = int(r.int())
		r.lit(`,"size":`)
		m.Size = r.int()
		r.lit(`}`)
		e.Media = append(e.Media, m)
	}
	return e
}

// postOf reads what follows sep in the events about a post: the post and
// the user, in that order.
func (r *scan) postOf(sep string) (domain.PostID, domain.UserID) {
	r.lit(sep)
	r.lit(`"post_id":`)
	p := domain.PostID(r.quotedInt())
	r.lit(`,"user_id":`)
	return p, domain.UserID(r.quotedInt())
}

func (r *scan) follow() UserFollowed {
	var e UserFollowed
	r.lit(`{"follower_id":`)
	e.FollowerID = domain.UserID(r.quotedInt())
	r.lit(`,"followee_id":`)
	e.FolloweeID = domain.UserID(r.quotedInt())
	return e
}

func (r *scan) like() PostLiked {
	var e PostLiked
	r.lit(`{"user_id":`)
	e.UserID = domain.UserID(r.quotedInt())
	r.lit(`,"post_id":`)
	e.PostID = domain.PostID(r.quotedInt())
	return e
}

// scan reads a body front to back. The first thing that is not as expected
// clears ok, and every read after it does nothing.
type scan struct {
	b  []byte
	i  int
	ok bool
}

// lit reads s.
func (r *scan) lit(s string) {
	if !r.next(s) {
		r.ok = false
	}
}

// next reads s if it comes next, and reports whether it did.
func (r *scan) next(s string) bool {
	if r.ok && len(r.b)-r.i >= len(s) && string(r.b[r.i:r.i+len(s)]) == s {
		r.i += len(s)
		return true
	}
	return false
}

// raw reads a string and returns its bytes, unquoted: no escapes, no control
// characters, valid UTF-8 (anything else, json.Marshal would have escaped or
// the general decoder would have replaced).
func (r *scan) raw() []byte {
	if !r.next(`"`) {
		r.ok = false
		return nil
	}
	start, ascii := r.i, true
	for ; r.i < len(r.b); r.i++ {
		switch c := r.b[r.i]; {
		case c == '"':
			s := r.b[start:r.i]
			r.i++
			if !ascii && !utf8.Valid(s) {
				r.ok = false
			}
			return s
		case c < 0x20 || c == '\\':
			r.ok = false
			return nil
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	r.ok = false
	return nil
}

// str reads a string as raw does.
func (r *scan) str() string {
	if s := r.raw(); r.ok {
		return string(s)
	}
	return ""
}

// int reads an integer as json.Marshal writes one: an optional minus, no
// leading zero, and (to need no overflow check) at most 18 digits.
func (r *scan) int() int64 {
	if !r.ok {
		return 0
	}
	neg := r.next("-")
	start := r.i
	var n int64
	for r.i < len(r.b) && r.b[r.i] >= '0' && r.b[r.i] <= '9' {
		n = n*10 + int64(r.b[r.i]-'0')
		r.i++
	}
	if d := r.i - start; d == 0 || d > 18 || (d > 1 && r.b[start] == '0') {
		r.ok = false
		return 0
	}
	if neg {
		return -n
	}
	return n
}

// quotedInt reads an integer in quotes (a `json:",string"` field).
func (r *scan) quotedInt() int64 {
	r.lit(`"`)
	n := r.int()
	r.lit(`"`)
	return n
}

// time reads a time as time.Time's MarshalJSON writes one in UTC:
// "2006-01-02T15:04:05.999999999Z", with a year of four digits from 1000.
func (r *scan) time() time.Time {
	const layout = len(`"2006-01-02T15:04:05`)
	b := r.b[r.i:]
	if !r.ok || len(b) < layout+2 || b[0] != '"' || b[5] != '-' || b[8] != '-' || b[11] != 'T' || b[14] != ':' || b[17] != ':' || b[1] == '0' {
		r.ok = false
		return time.Time{}
	}
	ok := true
	digits := func(from, to int) int {
		n := 0
		for _, c := range b[from:to] {
			if c < '0' || c > '9' {
				ok = false
			}
			n = n*10 + int(c-'0')
		}
		return n
	}
	year, month, day := digits(1, 5), digits(6, 8), digits(9, 11)
	hour, minute, sec := digits(12, 14), digits(15, 17), digits(18, 20)
	i, nsec := layout, 0
	if b[i] == '.' {
		i++
		start := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == start || i-start > 9 {
			ok = false
		} else {
			nsec = digits(start, i)
			for range 9 - (i - start) {
				nsec *= 10
			}
		}
	}
	if !ok || len(b) < i+2 || b[i] != 'Z' || b[i+1] != '"' {
		r.ok = false
		return time.Time{}
	}
	t := time.Date(year, time.Month(month), day, hour, minute, sec, nsec, time.UTC)
	// time.Date normalises what is out of range (the 31st of April is the
	// 1st of May); a parser refuses it.
	if t.Year() != year || int(t.Month()) != month || t.Day() != day || t.Hour() != hour || t.Minute() != minute || t.Second() != sec {
		r.ok = false
		return time.Time{}
	}
	r.i += i + 2
	return t
}
