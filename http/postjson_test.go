package http

import (
	"encoding/json"
	"io"
	"math/rand/v2"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/projections/readmodel"
)

// postView and feedPageView are the posts' JSON as the contract has it, written by
// encoding/json: what appendPost and sendFeedPage must write byte for byte,
// and what tests decode answers into.
type postView struct {
	ID           string      `json:"id"`
	UserID       string      `json:"user_id"`
	Caption      string      `json:"caption"`
	CreatedAt    string      `json:"created_at"`
	EditedAt     *string     `json:"edited_at"`
	LikeCount    int         `json:"like_count"`
	CommentCount int         `json:"comment_count"`
	HasLiked     bool        `json:"has_liked"`
	Media        []mediaView `json:"media"`
}

type mediaView struct {
	URL         string `json:"url"`
	ContentType string `json:"content_type"`
	Width       int    `json:"width"`
	Height      int    `json:"height"`
	Position    int    `json:"position"`
}

type feedPageView struct {
	Posts      []postView `json:"posts"`
	NextCursor *string    `json:"next_cursor"`
	HasMore    bool       `json:"has_more"`
}

func newPostView(p readmodel.Post) postView {
	v := postView{
		ID:           p.ID.String(),
		UserID:       p.UserID.String(),
		Caption:      p.Caption,
		CreatedAt:    formatTime(p.CreatedAt),
		LikeCount:    p.LikeCount,
		CommentCount: p.CommentCount,
		HasLiked:     p.HasLiked,
		Media: views(p.Media, func(m readmodel.Media) mediaView {
			return mediaView{URL: mediaURL(m.Key), ContentType: m.ContentType, Width: m.Width, Height: m.Height, Position: m.Position}
		}),
	}
	if p.EditedAt != nil {
		edited := formatTime(*p.EditedAt)
		v.EditedAt = &edited
	}
	return v
}

// awkwardStrings are what a caption (or anything else) can hold that
// encoding/json escapes.
var awkwardStrings = []string{
	"", "plain", `quote " and backslash \`, "<script>&amp;</script>", "tab\tnew\nline\rcr",
	"\b\f\x00\x01\x1f\x7f", "café ☕ 😀", "line\u2028para\u2029", "bad \xff\xfe utf8 \xe2\x82",
	"trailing \xe2", "\xed\xa0\x80 surrogate", "\uFFFD replacement", strings.Repeat("long caption ", 200),
}

func TestAppendStringIsEncodingJSON(t *testing.T) {
	for _, s := range awkwardStrings {
		want, err := json.Marshal(s)
		require.NoError(t, err)
		assert.Equal(t, string(want), string(appendString(nil, s)), "%q", s)
	}
}

func TestAppendTimeIsFormatTime(t *testing.T) {
	zone := time.FixedZone("elsewhere", -(9*3600 + 30*60))
	times := []time.Time{
		time.Date(0, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(-1, 12, 31, 23, 59, 59, 999_999_999, time.UTC),
		time.Date(9999, 12, 31, 23, 59, 59, 999_999_999, time.UTC), time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 11, 22, 10, 0, 0, 123_456_789, zone), time.Date(9999, 12, 31, 20, 0, 0, 0, zone),
		{},
	}
	r := rand.New(rand.NewPCG(5, 6))
	for range 1000 {
		times = append(times, time.Unix(r.Int64N(1<<36)-1<<35, r.Int64N(1e9)).In(zone))
	}
	for _, at := range times {
		want, err := json.Marshal(formatTime(at))
		require.NoError(t, err)
		require.Equal(t, string(want), string(appendTime(nil, at)), "%v", at)
	}
}

func randomPost(r *rand.Rand) readmodel.Post {
	pick := func() string { return awkwardStrings[r.IntN(len(awkwardStrings))] }
	at := time.Unix(r.Int64N(4e9), r.Int64N(1e9)).In(time.FixedZone("elsewhere", 3600*r.IntN(24)-12*3600))
	p := readmodel.Post{
		ID: domain.PostID(r.Int64N(1 << 53)), UserID: domain.UserID(r.Int64N(1 << 53)),
		Caption: pick(), CreatedAt: at,
		LikeCount: r.IntN(1e6), CommentCount: r.IntN(1e3), HasLiked: r.IntN(2) == 0,
	}
	if r.IntN(2) == 0 {
		edited := at.Add(time.Duration(r.Int64N(int64(time.Hour))))
		p.EditedAt = &edited
	}
	for i := range r.IntN(4) {
		p.Media = append(p.Media, readmodel.Media{
			Key: pick(), ContentType: pick(), Width: r.IntN(5000), Height: r.IntN(5000), Position: i,
		})
	}
	return p
}

func TestAppendPostIsEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		p := randomPost(r)
		want, err := json.Marshal(newPostView(p))
		require.NoError(t, err)
		require.Equal(t, string(want), string(appendPost(nil, p)))
	}
}

func FuzzAppendPost(f *testing.F) {
	for i, s := range awkwardStrings {
		f.Add(int64(i+1), s, s, int64(i)*1e15, i%2 == 0)
	}
	f.Fuzz(func(t *testing.T, id int64, caption, key string, unixNano int64, edited bool) {
		at := time.Unix(0, unixNano)
		p := readmodel.Post{
			ID: domain.PostID(id), UserID: domain.UserID(-id), Caption: caption, CreatedAt: at,
			LikeCount: int(id % 1000), CommentCount: -int(id % 7), HasLiked: edited,
			Media: []readmodel.Media{{Key: key, ContentType: caption, Width: 1, Height: 2}},
		}
		if edited {
			p.EditedAt = &at
		}
		want, err := json.Marshal(newPostView(p))
		require.NoError(t, err)
		require.Equal(t, string(want), string(appendPost(nil, p)))
	})
}

func TestSendFeedPageIsEncodingJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var posts []readmodel.Post
	for range 10 {
		posts = append(posts, randomPost(r))
	}
	next := &domain.Cursor{ID: int64(posts[9].ID), Unix: 1732899000}
	for name, tt := range map[string]struct {
		posts []readmodel.Post
		next  *domain.Cursor
	}{
		"a page with more": {posts, next},
		"the last page":    {posts[:4], nil},
		"no posts":         {nil, nil},
	} {
		t.Run(name, func(t *testing.T) {
			want := feedPageView{Posts: views(tt.posts, newPostView), NextCursor: nextCursor(tt.next), HasMore: tt.next != nil}
			wantBody, err := json.Marshal(want)
			require.NoError(t, err)

			app := fiber.New()
			app.Get("/", func(c *fiber.Ctx) error { return sendFeedPage(c, tt.posts, tt.next) })
			// Twice: the second answer is written into a reused response buffer.
			for range 2 {
				resp, err := app.Test(httptest.NewRequest(fiber.MethodGet, "/", nil))
				require.NoError(t, err)
				body, err := io.ReadAll(resp.Body)
				require.NoError(t, err)
				require.NoError(t, resp.Body.Close())
				assert.Equal(t, string(wantBody), string(body))
				assert.Equal(t, fiber.MIMEApplicationJSON, resp.Header.Get(fiber.HeaderContentType))
			}
		})
	}
}
