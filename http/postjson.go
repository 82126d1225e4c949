package http

import (
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/gofiber/fiber/v2"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/projections/readmodel"
)

// Posts, the bulk of GET /feed and all of GET /posts/{id}, are written by hand
// rather than by encoding/json: building views of ten posts with their media
// and reflecting over them was over a third of the handler's CPU for a cached
// page. The bytes are those encoding/json writes for the contract's shape
// (postjson_test.go holds that shape and checks them against it).

// sendPost answers a post as GET /posts/{id} does.
func sendPost(c *fiber.Ctx, p readmodel.Post) error {
	body := responseBuffer(c)
	body = appendPost(body, p)
	return sendJSON(c, body)
}

// sendFeedPage answers a page of the home feed: posts, and next (nil at the
// end) as the next cursor.
func sendFeedPage(c *fiber.Ctx, posts []readmodel.Post, next *domain.Cursor) error {
	body := responseBuffer(c)
	body = append(body, `{"posts":[`...)
	for i, p := range posts {
		if i > 0 {
			body = append(body, ',')
		}
		body = appendPost(body, p)
	}
	body = append(body, `],"next_cursor":`...)
	if next == nil {
		body = append(body, "null"...)
	} else {
		body = appendString(body, next.String())
	}
	body = append(body, `,"has_more":`...)
	body = strconv.AppendBool(body, next != nil)
	body = append(body, '}')
	return sendJSON(c, body)
}

// responseBuffer is the response's own body buffer (pooled by fasthttp),
// emptied, so that the answer is written where it is sent from, not copied.
func responseBuffer(c *fiber.Ctx) []byte {
	return c.Response().SwapBody(nil)[:0]
}

// sendJSON makes body, from responseBuffer, the JSON answer.
func sendJSON(c *fiber.Ctx, body []byte) error {
	c.Response().SwapBody(body)
	c.Response().Header.SetContentType(fiber.MIMEApplicationJSON)
	return nil
}

// appendPost writes p as {"id", "user_id", "caption", "created_at",
// "edited_at", "like_count", "comment_count", "has_liked", "media"}.
func appendPost(b []byte, p readmodel.Post) []byte {
	b = append(b, `{"id":"`...)
	b = strconv.AppendInt(b, int64(p.ID), 10)
	b = append(b, `","user_id":"`...)
	b = strconv.AppendInt(b, int64(p.UserID), 10)
	b = append(b, `","caption":`...)
	b = appendString(b, p.Caption)
	b = append(b, `,"created_at":`...)
	b = appendTime(b, p.CreatedAt)
	b = append(b, `,"edited_at":`...)
	if p.EditedAt == nil {
		b = append(b, "null"...)
	} else {
		b = appendTime(b, *p.EditedAt)
	}
	b = append(b, `,"like_count":`...)
	b = strconv.AppendInt(b, int64(p.LikeCount), 10)
	b = append(b, `,"comment_count":`...)
	b = strconv.AppendInt(b, int64(p.CommentCount), 10)
	b = append(b, `,"has_liked":`...)
	b = strconv.AppendBool(b, p.HasLiked)
	b = append(b, `,"media":[`...)
	for i, m := range p.Media {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"url":"`+mediaPath...)
		b = appendEscaped(b, m.Key)
		b = append(b, `","content_type":`...)
		b = appendString(b, m.ContentType)
		b = append(b, `,"width":`...)
		b = strconv.AppendInt(b, int64(m.Width), 10)
		b = append(b, `,"height":`...)
		b = strconv.AppendInt(b, int64(m.Height), 10)
		b = append(b, `,"position":`...)
		b = strconv.AppendInt(b, int64(m.Position), 10)
		b = append(b, '}')
	}
	return append(b, "]}"...)
}

// appendTime writes t as formatTime does, quoted (its characters need no
// escaping). Years of four digits, all that posts have, are written digit by
// digit: time.Time.AppendFormat, which interprets the layout on every call,
// took as long as the rest of a post.
func appendTime(b []byte, t time.Time) []byte {
	t = t.UTC()
	year, month, day := t.Date()
	if year < 0 || year > 9999 {
		b = append(b, '"')
		b = t.AppendFormat(b, timeLayout)
		return append(b, '"')
	}
	hour, minute, second := t.Clock()
	milli := t.Nanosecond() / int(time.Millisecond)
	return append(b, '"',
		byte('0'+year/1000), byte('0'+year/100%10), byte('0'+year/10%10), byte('0'+year%10), '-',
		byte('0'+month/10), byte('0'+month%10), '-', byte('0'+day/10), byte('0'+day%10), 'T',
		byte('0'+hour/10), byte('0'+hour%10), ':', byte('0'+minute/10), byte('0'+minute%10), ':',
		byte('0'+second/10), byte('0'+second%10), '.',
		byte('0'+milli/100), byte('0'+milli/10%10), byte('0'+milli%10), 'Z', '"')
}

const hexDigits = "0123456789abcdef"

// jsonSafe tells the ASCII characters that encoding/json writes as they are
// with HTML escaping on (its htmlSafeSet): all but control characters, ", \,
// <, > and &.
var jsonSafe = [utf8.RuneSelf]bool{
	' ': true, '!': true, '#': true, '$': true, '%': true, '\'': true, '(': true, ')': true,
	'*': true, '+': true, ',': true, '-': true, '.': true, '/': true, '0': true, '1': true,
	'2': true, '3': true, '4': true, '5': true, '6': true, '7': true, '8': true, '9': true,
	':': true, ';': true, '=': true, '?': true, '@': true, 'A': true, 'B': true, 'C': true,
	'D': true, 'E': true, 'F': true, 'G': true, 'H': true, 'I': true, 'J': true, 'K': true,
	'L': true, 'M': true, 'N': true, 'O': true, 'P': true, 'Q': true, 'R': true, 'S': true,
	'T': true, 'U': true, 'V': true, 'W': true, 'X': true, 'Y': true, 'Z': true, '[': true,
	']': true, '^': true, '_': true, '`': true, 'a': true, 'b': true, 'c': true, 'd': true,
	'e': true, 'f': true, 'g': true, 'h': true, 'i': true, 'j': true, 'k': true, 'l': true,
	'm': true, 'n': true, 'o': true, 'p': true, 'q': true, 'r': true, 's': true, 't': true,
	'u': true, 'v': true, 'w': true, 'x': true, 'y': true, 'z': true, '{': true, '|': true,
	'}': true, '~': true, '\u007f': true,
}

// appendString writes s as a JSON string exactly as encoding/json does.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	b = appendEscaped(b, s)
	return append(b, '"')
}

// appendEscaped writes s as the inside of a JSON string exactly as
// encoding/json does (HTML escaping on): ", \ and control characters escaped,
// <, > and & as \u003c and so on, invalid UTF-8 as \ufffd, and U+2028 and
// U+2029 escaped.
func appendEscaped(b []byte, s string) []byte {
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if jsonSafe[c] {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	return append(b, s[start:]...)
}
