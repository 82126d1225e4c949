package http

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/jpeg"
	"image/png"
	"io"
	"log/slog"
	"mime/multipart"
	"net"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
)

func pngImage(t testing.TB, w, h int) []byte {
	t.Helper()
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	img.Set(0, 0, color.RGBA{R: 200, A: 255})
	var buf bytes.Buffer
	require.NoError(t, png.Encode(&buf, img))
	return buf.Bytes()
}

func jpegImage(t testing.TB, w, h int) []byte {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, jpeg.Encode(&buf, image.NewGray(image.Rect(0, 0, w, h)), nil))
	return buf.Bytes()
}

// part is one field of a multipart form: a file when filename is set.
type part struct {
	name, filename, contentType string
	data                        []byte
}

func multipartBody(t testing.TB, parts ...part) (string, []byte) {
	t.Helper()
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	for _, p := range parts {
		h := textproto.MIMEHeader{}
		if p.filename != "" {
			h.Set("Content-Disposition", fmt.Sprintf(`form-data; name=%q; filename=%q`, p.name, p.filename))
			ct := p.contentType
			if ct == "" {
				ct = "application/octet-stream"
			}
			h.Set("Content-Type", ct)
		} else {
			h.Set("Content-Disposition", fmt.Sprintf(`form-data; name=%q`, p.name))
		}
		pw, err := w.CreatePart(h)
		require.NoError(t, err)
		_, err = pw.Write(p.data)
		require.NoError(t, err)
	}
	require.NoError(t, w.Close())
	return w.FormDataContentType(), buf.Bytes()
}

func images(data ...[]byte) []part {
	out := make([]part, len(data))
	for i, d := range data {
		out[i] = part{name: "images", filename: fmt.Sprintf("img%d.jpg", i), contentType: "image/jpeg", data: d}
	}
	return out
}

func (a *testApp) createPost(t *testing.T, user domain.UserID, parts []part, headers ...string) response {
	t.Helper()
	ct, body := multipartBody(t, parts...)
	req := httptest.NewRequest(http.MethodPost, "/posts", bytes.NewReader(body))
	req.Header.Set("Content-Type", ct)
	req.Header.Set("Authorization", "Bearer "+a.token(t, user))
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	return a.do(t, req)
}

// post creates a post of user with one image and returns its id.
func (a *testApp) post(t *testing.T, user domain.UserID) string {
	t.Helper()
	r := a.createPost(t, user, append(images(pngImage(t, 4, 4)), part{name: "caption", data: []byte("hi")}))
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.raw)
	return r.body["id"].(string)
}

func TestCreatePost(t *testing.T) {
	a := newTestApp(t)
	pngData, jpegData := pngImage(t, 3, 2), jpegImage(t, 16, 9)
	r := a.createPost(t, 501, append([]part{{name: "caption", data: []byte("sunset ☀")}}, images(pngData, jpegData)...))
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.raw)

	id := r.body["id"].(string)
	assert.Equal(t, "/posts/"+id, r.header.Get("Location"))
	created, err := time.Parse(time.RFC3339, r.body["created_at"].(string))
	require.NoError(t, err)
	assert.Regexp(t, `^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`, r.body["created_at"])
	postID, err := domain.ParsePostID(id)
	require.NoError(t, err)
	assert.Equal(t, domain.IDTime(int64(postID)), created, "created_at agrees with the id's order")

	recs := a.records(t)
	require.Len(t, recs, 1)
	assert.Equal(t, events.Position(recs[0].Seq), r.body["position"])
	assert.Equal(t, events.TypePostCreated, recs[0].Type)
	assert.Equal(t, "ev.501.post."+id, recs[0].Subject)
	ev := recs[0].Event.(events.PostCreated)
	assert.Equal(t, postID, ev.PostID)
	assert.Equal(t, domain.UserID(501), ev.UserID)
	assert.Equal(t, "sunset ☀", ev.Caption)
	require.Len(t, ev.Media, 2)
	assert.Equal(t, events.Media{Key: ev.Media[0].Key, ContentType: "image/png", Width: 3, Height: 2, Size: int64(len(pngData))}, ev.Media[0])
	assert.Equal(t, "image/jpeg", ev.Media[1].ContentType, "type from content, whatever the part says")
	assert.Equal(t, [2]int{16, 9}, [2]int{ev.Media[1].Width, ev.Media[1].Height})
	// The event carries keys, never bytes.
	assert.Less(t, len(recs[0].Payload), 1024)

	// The media are served with their type and a long cache lifetime.
	m := a.do(t, httptest.NewRequest(http.MethodGet, "/media/"+ev.Media[0].Key, nil))
	assert.Equal(t, http.StatusOK, m.status)
	assert.Equal(t, "image/png", m.header.Get("Content-Type"))
	assert.Contains(t, m.header.Get("Cache-Control"), "max-age=31536000")
	assert.Equal(t, pngData, m.raw)
	for _, key := range []string{"nope", strings.Repeat("a", 64) + ".png", "..%2F..%2Fetc%2Fpasswd"} {
		m = a.do(t, httptest.NewRequest(http.MethodGet, "/media/"+key, nil))
		assert.Equal(t, http.StatusNotFound, m.status, key)
		assert.Equal(t, "not_found", m.errorCode())
	}
}

func TestCreatePostRejectsBadInput(t *testing.T) {
	a := newTestApp(t)
	img := pngImage(t, 2, 2)
	eleven := make([][]byte, 11)
	for i := range eleven {
		eleven[i] = pngImage(t, i+1, 1)
	}
	big := make([]byte, 6<<20)
	copy(big, img) // a PNG header, then far too many bytes
	tests := []struct {
		name   string
		parts  []part
		status int
		code   string
	}{
		{"no images", []part{{name: "caption", data: []byte("x")}}, 400, "invalid_input"},
		{"eleven images", images(eleven...), 400, "invalid_input"},
		{"a 6 MiB image", images(img, big), 413, "too_large"},
		{"a text file named .jpg", []part{{name: "images", filename: "cat.jpg", contentType: "image/jpeg", data: []byte("this is not an image")}}, 415, "unsupported_media_type"},
		{"caption of 2201 characters", append(images(img), part{name: "caption", data: []byte(strings.Repeat("é", 2201))}), 400, "invalid_input"},
		{"caption of invalid UTF-8", append(images(img), part{name: "caption", data: []byte{0xff, 0xfe}}), 400, "invalid_input"},
		{"an unknown field", append(images(img), part{name: "location", data: []byte("x")}), 400, "invalid_input"},
		{"two captions", append(images(img), part{name: "caption", data: []byte("a")}, part{name: "caption", data: []byte("b")}), 400, "invalid_input"},
		{"an empty image", images([]byte{}), 400, "invalid_input"},
		// A header can declare any size in a few bytes; clients would allocate for it.
		{"a PNG of 20 000 × 20 000 pixels", images(pngWithSize(20_000, 20_000)), 400, "invalid_input"},
		{"a PNG of 10 001 pixels a side", images(pngWithSize(10_001, 1)), 400, "invalid_input"},
		{"a PNG of 40 000 001 pixels", images(pngWithSize(10_000, 4_001)), 400, "invalid_input"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := a.createPost(t, 501, tt.parts)
			assert.Equal(t, tt.status, r.status, "%s", r.raw)
			assert.Equal(t, tt.code, r.errorCode())
			assert.NotEmpty(t, r.body["error"].(map[string]any)["message"])
		})
	}
	t.Run("the dimension bound is named", func(t *testing.T) {
		r := a.createPost(t, 501, images(pngWithSize(20_000, 20_000)))
		assert.Equal(t, "image 1: image is 20000x20000 pixels; the limit is 10000 a side and 40 megapixels: invalid input",
			r.body["error"].(map[string]any)["message"])
	})

	t.Run("not multipart", func(t *testing.T) {
		r := a.command(t, http.MethodPost, "/posts", 501, `{"caption":"x"}`)
		assert.Equal(t, http.StatusUnsupportedMediaType, r.status)
	})
	t.Run("malformed multipart", func(t *testing.T) {
		req := httptest.NewRequest(http.MethodPost, "/posts", strings.NewReader("--xyz\r\ngarbage"))
		req.Header.Set("Content-Type", "multipart/form-data; boundary=xyz")
		req.Header.Set("Authorization", "Bearer "+a.token(t, 501))
		r := a.do(t, req)
		assert.Equal(t, http.StatusBadRequest, r.status, "%s", r.raw)
	})
	t.Run("declared body over the limit is refused before reading", func(t *testing.T) {
		req := httptest.NewRequest(http.MethodPost, "/posts", strings.NewReader("x"))
		req.Header.Set("Content-Type", "multipart/form-data; boundary=xyz")
		req.Header.Set("Authorization", "Bearer "+a.token(t, 501))
		req.ContentLength = maxPostBody + 1
		req.Header.Set("Content-Length", fmt.Sprint(maxPostBody+1))
		resp, err := a.srv.App().Test(req, 5_000)
		// fasthttp may cut the connection after answering; either way no 2xx/5xx.
		if err == nil {
			defer resp.Body.Close()
			assert.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
		}
	})
	assert.Empty(t, a.records(t), "a refused command appends nothing")
}

func TestAuthFailures(t *testing.T) {
	a := newTestApp(t)
	now := time.Now()
	sign := func(secret string, method jwt.SigningMethod, c jwt.MapClaims) string {
		tok, err := jwt.NewWithClaims(method, c).SignedString([]byte(secret))
		require.NoError(t, err)
		return tok
	}
	valid := jwt.MapClaims{"sub": "501", "exp": now.Add(time.Hour).Unix()}
	none, err := jwt.NewWithClaims(jwt.SigningMethodNone, valid).SignedString(jwt.UnsafeAllowNoneSignatureType)
	require.NoError(t, err)
	headers := map[string]string{
		"missing":       "",
		"not bearer":    "Basic dXNlcjpwYXNz",
		"empty bearer":  "Bearer ",
		"malformed":     "Bearer not.a.jwt",
		"expired":       "Bearer " + sign(testSecret, jwt.SigningMethodHS256, jwt.MapClaims{"sub": "501", "exp": now.Add(-time.Minute).Unix()}),
		"no exp":        "Bearer " + sign(testSecret, jwt.SigningMethodHS256, jwt.MapClaims{"sub": "501"}),
		"wrong secret":  "Bearer " + sign("another-secret-of-16-bytes!", jwt.SigningMethodHS256, valid),
		"alg none":      "Bearer " + none,
		"alg HS512":     "Bearer " + sign(testSecret, jwt.SigningMethodHS512, valid),
		"sub not an id": "Bearer " + sign(testSecret, jwt.SigningMethodHS256, jwt.MapClaims{"sub": "alice", "exp": now.Add(time.Hour).Unix()}),
		"sub zero":      "Bearer " + sign(testSecret, jwt.SigningMethodHS256, jwt.MapClaims{"sub": "0", "exp": now.Add(time.Hour).Unix()}),
	}
	routes := [][2]string{
		{http.MethodPost, "/posts"}, {http.MethodPatch, "/posts/1"}, {http.MethodDelete, "/posts/1"},
		{http.MethodPost, "/users/2/follow"}, {http.MethodDelete, "/users/2/follow"},
		{http.MethodPost, "/posts/1/like"}, {http.MethodDelete, "/posts/1/like"}, {http.MethodPost, "/posts/1/comments"},
	}
	for name, h := range headers {
		for _, route := range routes {
			var body io.Reader
			if route[0] == http.MethodPatch || strings.HasSuffix(route[1], "/comments") {
				body = strings.NewReader(`{}`)
			}
			req := httptest.NewRequest(route[0], route[1], body)
			if h != "" {
				req.Header.Set("Authorization", h)
			}
			r := a.do(t, req)
			assert.Equal(t, http.StatusUnauthorized, r.status, "%s %s with %s", route[0], route[1], name)
			assert.Equal(t, "unauthenticated", r.errorCode())
		}
	}
	// The same claims correctly signed are accepted.
	r := a.do(t, func() *http.Request {
		req := httptest.NewRequest(http.MethodPost, "/users/2/follow", nil)
		req.Header.Set("Authorization", "Bearer "+sign(testSecret, jwt.SigningMethodHS256, valid))
		return req
	}())
	assert.Equal(t, http.StatusAccepted, r.status, "%s", r.raw)
}

func TestEditAndDeleteOnlyByOwner(t *testing.T) {
	a := newTestApp(t)
	id := a.post(t, 501)

	r := a.command(t, http.MethodPatch, "/posts/"+id, 502, `{"caption":"mine now"}`)
	assert.Equal(t, http.StatusForbidden, r.status)
	assert.Equal(t, "forbidden", r.errorCode())
	r = a.command(t, http.MethodDelete, "/posts/"+id, 502, "")
	assert.Equal(t, http.StatusForbidden, r.status)

	r = a.command(t, http.MethodPatch, "/posts/"+id, 501, `{"caption":"edited"}`)
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.raw)
	r = a.command(t, http.MethodPatch, "/posts/"+id, 501, `{"caption":""}`)
	require.Equal(t, http.StatusAccepted, r.status, "an empty caption is a caption")
	r = a.command(t, http.MethodDelete, "/posts/"+id, 501, "")
	require.Equal(t, http.StatusAccepted, r.status, "%s", r.raw)

	for _, tt := range []struct{ method, body string }{{http.MethodDelete, ""}, {http.MethodPatch, `{"caption":"x"}`}} {
		r = a.command(t, tt.method, "/posts/"+id, 501, tt.body)
		assert.Equal(t, http.StatusNotFound, r.status, "%s of a deleted post", tt.method)
		r = a.command(t, tt.method, "/posts/999999", 501, tt.body)
		assert.Equal(t, http.StatusNotFound, r.status, "%s of an unknown post", tt.method)
	}
	var types []string
	for _, rec := range a.records(t) {
		types = append(types, rec.Type)
		assert.Equal(t, "ev.501.post."+id, rec.Subject)
	}
	assert.Equal(t, []string{events.TypePostCreated, events.TypePostEdited, events.TypePostEdited, events.TypePostDeleted}, types)
	edited := a.records(t)[1].Event.(events.PostEdited)
	assert.Equal(t, "edited", edited.Caption)
	assert.Equal(t, domain.UserID(501), edited.UserID)
}

func TestBadJSONAndIDs(t *testing.T) {
	a := newTestApp(t)
	id := a.post(t, 501)
	tests := []struct {
		method, path, body string
		status             int
	}{
		{http.MethodPatch, "/posts/" + id, `{"caption":`, 400},
		{http.MethodPatch, "/posts/" + id, `{"caption":"a"} {"caption":"b"}`, 400},
		{http.MethodPatch, "/posts/" + id, `{"caption":42}`, 400},
		{http.MethodPatch, "/posts/" + id, `{}`, 400},
		{http.MethodPatch, "/posts/" + id, `{"caption":"x","extra":1}`, 400},
		{http.MethodPatch, "/posts/" + id, `{"caption":"` + strings.Repeat("x", 2201) + `"}`, 400},
		{http.MethodPatch, "/posts/" + id, `{"caption":"` + strings.Repeat("x", 70_000) + `"}`, 413},
		{http.MethodPost, "/posts/" + id + "/comments", `{"text":""}`, 400},
		{http.MethodPost, "/posts/" + id + "/comments", `{"text":"   "}`, 400},
		{http.MethodPost, "/posts/" + id + "/comments", `{"text":"` + strings.Repeat("ü", 2201) + `"}`, 400},
		{http.MethodPost, "/posts/" + id + "/comments", `[]`, 400},
		{http.MethodPost, "/posts/" + id + "/comments", `null`, 400},
		{http.MethodPatch, "/posts/abc", `{"caption":"x"}`, 400},
		{http.MethodPatch, "/posts/0", `{"caption":"x"}`, 400},
		{http.MethodDelete, "/posts/-5", "", 400},
		{http.MethodDelete, "/posts/9007199254740992", "", 400},
		{http.MethodPost, "/users/abc/follow", "", 400},
		{http.MethodPost, "/users/501/follow", "", 400}, // yourself
		{http.MethodDelete, "/users/501/follow", "", 400},
		{http.MethodPost, "/posts/1.5/like", "", 400},
		{http.MethodPost, "/posts/x/comments", `{"text":"hi"}`, 400},
	}
	for _, tt := range tests {
		r := a.command(t, tt.method, tt.path, 501, tt.body)
		body := tt.body
		if len(body) > 40 {
			body = body[:40] + "…"
		}
		assert.Equal(t, tt.status, r.status, "%s %s %s: %s", tt.method, tt.path, body, r.raw)
		assert.NotEmpty(t, r.errorCode())
	}
	// JSON with another content type.
	req := httptest.NewRequest(http.MethodPatch, "/posts/"+id, strings.NewReader(`{"caption":"x"}`))
	req.Header.Set("Content-Type", "text/plain")
	req.Header.Set("Authorization", "Bearer "+a.token(t, 501))
	assert.Equal(t, http.StatusUnsupportedMediaType, a.do(t, req).status)
	assert.Len(t, a.records(t), 1, "only the post itself was appended")
}

func TestGraphAndEngagement(t *testing.T) {
	a := newTestApp(t)
	id := a.post(t, 501)

	steps := []struct {
		method, path, body, typ, subject string
		payload                          events.Event
	}{
		{http.MethodPost, "/users/501/follow", "", events.TypeUserFollowed, "ev.404.follow.501", events.UserFollowed{FollowerID: 404, FolloweeID: 501}},
		{http.MethodPost, "/users/501/follow", "", events.TypeUserFollowed, "ev.404.follow.501", events.UserFollowed{FollowerID: 404, FolloweeID: 501}},
		{http.MethodDelete, "/users/501/follow", "", events.TypeUserUnfollowed, "ev.404.follow.501", events.UserUnfollowed{FollowerID: 404, FolloweeID: 501}},
		{http.MethodDelete, "/users/777/follow", "", events.TypeUserUnfollowed, "ev.404.follow.777", events.UserUnfollowed{FollowerID: 404, FolloweeID: 777}},
		{http.MethodPost, "/posts/" + id + "/like", "", events.TypePostLiked, "ev.404.like." + id, nil},
		{http.MethodPost, "/posts/" + id + "/like", "", events.TypePostLiked, "ev.404.like." + id, nil},
		{http.MethodDelete, "/posts/" + id + "/like", "", events.TypePostUnliked, "ev.404.like." + id, nil},
		{http.MethodPost, "/posts/" + id + "/comments", `{"text":"lovely"}`, events.TypeCommentAdded, "ev.404.comment." + id, nil},
	}
	for i, s := range steps {
		r := a.command(t, s.method, s.path, 404, s.body)
		require.Equal(t, http.StatusAccepted, r.status, "%s %s: %s", s.method, s.path, r.raw)
		recs := a.records(t)
		rec := recs[len(recs)-1]
		assert.Equal(t, events.Position(rec.Seq), r.body["position"])
		assert.Equal(t, s.typ, rec.Type, "step %d", i)
		assert.Equal(t, s.subject, rec.Subject, "step %d", i)
		if s.payload != nil {
			assert.Equal(t, s.payload, rec.Event)
		}
		if s.typ == events.TypeCommentAdded {
			c := rec.Event.(events.CommentAdded)
			assert.Equal(t, c.CommentID.String(), r.body["id"])
			assert.Equal(t, "lovely", c.Text)
			assert.Equal(t, domain.IDTime(int64(c.CommentID)), c.CreatedAt)
		}
	}

	// Likes and comments need a live post.
	for path, body := range map[string]string{"/posts/999/like": "", "/posts/999/comments": `{"text":"hi"}`} {
		r := a.command(t, http.MethodPost, path, 404, body)
		assert.Equal(t, http.StatusNotFound, r.status, path)
	}
	require.Equal(t, http.StatusAccepted, a.command(t, http.MethodDelete, "/posts/"+id, 501, "").status)
	for path, body := range map[string]string{"/posts/" + id + "/like": "", "/posts/" + id + "/comments": `{"text":"hi"}`} {
		r := a.command(t, http.MethodPost, path, 404, body)
		assert.Equal(t, http.StatusNotFound, r.status, path+" of a deleted post")
	}
}

// TestConcurrentDeletes races many deletes of one post: exactly one is accepted
// and the log holds one delete.
func TestConcurrentDeletes(t *testing.T) {
	a := newTestApp(t)
	for round := range 5 {
		id := a.post(t, 501)
		statuses := make([]int, 8)
		var wg sync.WaitGroup
		for i := range statuses {
			wg.Go(func() {
				statuses[i] = a.command(t, http.MethodDelete, "/posts/"+id, 501, "").status
			})
		}
		wg.Wait()
		accepted := 0
		for _, s := range statuses {
			if s == http.StatusAccepted {
				accepted++
			} else {
				assert.Equal(t, http.StatusNotFound, s, "round %d", round)
			}
		}
		assert.Equal(t, 1, accepted, "round %d: statuses %v", round, statuses)
	}
	deletes := map[string]int{}
	for _, rec := range a.records(t) {
		if rec.Type == events.TypePostDeleted {
			deletes[rec.Subject]++
		}
	}
	assert.Len(t, deletes, 5)
	for subject, n := range deletes {
		assert.Equal(t, 1, n, subject)
	}
}

// TestEditRacingDelete races edits against a delete of the same post. Each
// command has one outcome: accepted and in the log, refused as 404 (the post was
// gone), or 409 (lost every retry) with nothing appended; and no edit is ever
// appended after the delete.
func TestEditRacingDelete(t *testing.T) {
	a := newTestApp(t)
	for range 8 {
		id := a.post(t, 501)
		var wg sync.WaitGroup
		editStatuses := make([]int, 6)
		for i := range editStatuses {
			wg.Go(func() {
				editStatuses[i] = a.command(t, http.MethodPatch, "/posts/"+id, 501, fmt.Sprintf(`{"caption":"v%d"}`, i)).status
			})
		}
		var deleteStatus int
		wg.Go(func() { deleteStatus = a.command(t, http.MethodDelete, "/posts/"+id, 501, "").status })
		wg.Wait()
		assert.Contains(t, []int{http.StatusAccepted, http.StatusConflict}, deleteStatus)
		acceptedEdits := 0
		for _, s := range editStatuses {
			assert.Contains(t, []int{http.StatusAccepted, http.StatusNotFound, http.StatusConflict}, s)
			if s == http.StatusAccepted {
				acceptedEdits++
			}
		}
		var life []string
		for _, rec := range a.records(t) {
			if rec.Subject == "ev.501.post."+id {
				life = append(life, rec.Type)
			}
		}
		deletes := 0
		for i, typ := range life {
			if typ == events.TypePostDeleted {
				deletes++
				assert.Equal(t, len(life)-1, i, "nothing after the delete: %v", life)
			}
		}
		if deleteStatus == http.StatusAccepted {
			assert.Equal(t, 1, deletes, "%v", life)
		} else {
			assert.Equal(t, 0, deletes, "a 409 appended nothing: %v", life)
		}
		assert.Len(t, life, 1+acceptedEdits+deletes, "every accepted command is in the log, nothing else: %v", life)
	}
}

func TestIdempotentRetries(t *testing.T) {
	a := newTestApp(t)
	parts := images(pngImage(t, 5, 5))
	first := a.createPost(t, 501, parts, "Idempotency-Key", "post-1")
	require.Equal(t, http.StatusAccepted, first.status, "%s", first.raw)
	retry := a.createPost(t, 501, parts, "Idempotency-Key", "post-1")
	require.Equal(t, http.StatusAccepted, retry.status)
	assert.Equal(t, first.body, retry.body, "a retry gets the first answer")
	assert.Equal(t, first.header.Get("Location"), retry.header.Get("Location"))
	// The same key from another user is another command.
	other := a.createPost(t, 502, parts, "Idempotency-Key", "post-1")
	require.Equal(t, http.StatusAccepted, other.status)
	assert.NotEqual(t, first.body["id"], other.body["id"])

	id := first.body["id"].(string)
	f1 := a.command(t, http.MethodPost, "/users/9/follow", 501, "", "Idempotency-Key", "f")
	f2 := a.command(t, http.MethodPost, "/users/9/follow", 501, "", "Idempotency-Key", "f")
	assert.Equal(t, f1.body, f2.body)
	c1 := a.command(t, http.MethodPost, "/posts/"+id+"/comments", 501, `{"text":"one"}`, "Idempotency-Key", "c")
	c2 := a.command(t, http.MethodPost, "/posts/"+id+"/comments", 501, `{"text":"one"}`, "Idempotency-Key", "c")
	assert.Equal(t, c1.body, c2.body)
	c3 := a.command(t, http.MethodPost, "/posts/"+id+"/comments", 501, `{"text":"two"}`, "Idempotency-Key", "c")
	assert.Equal(t, http.StatusConflict, c3.status, "another comment under a used key: %s", c3.raw)
	e1 := a.command(t, http.MethodPatch, "/posts/"+id, 501, `{"caption":"e"}`, "Idempotency-Key", "e")
	e2 := a.command(t, http.MethodPatch, "/posts/"+id, 501, `{"caption":"e"}`, "Idempotency-Key", "e")
	assert.Equal(t, http.StatusAccepted, e2.status)
	assert.Equal(t, e1.body, e2.body)
	e3 := a.command(t, http.MethodPatch, "/posts/"+id, 501, `{"caption":"other"}`, "Idempotency-Key", "e")
	assert.Equal(t, http.StatusConflict, e3.status, "another caption under a used key: %s", e3.raw)
	d1 := a.command(t, http.MethodDelete, "/posts/"+id, 501, "", "Idempotency-Key", "d")
	d2 := a.command(t, http.MethodDelete, "/posts/"+id, 501, "", "Idempotency-Key", "d")
	assert.Equal(t, http.StatusAccepted, d2.status, "a retried delete is not a 404: %s", d2.raw)
	assert.Equal(t, d1.body, d2.body)

	// A key reused for a different command is a conflict, not a silent no-op.
	r := a.command(t, http.MethodPost, "/users/10/follow", 501, "", "Idempotency-Key", "c")
	assert.Equal(t, http.StatusConflict, r.status, "%s", r.raw)
	// So is the same command with another body: its content would be dropped.
	r = a.createPost(t, 501, images(pngImage(t, 6, 6)), "Idempotency-Key", "post-1")
	assert.Equal(t, http.StatusConflict, r.status, "another image under a used key: %s", r.raw)
	assert.Contains(t, r.errorMessage(), "Idempotency-Key")
	r = a.command(t, http.MethodPost, "/users/11/follow", 501, "", "Idempotency-Key", "f")
	assert.Equal(t, http.StatusConflict, r.status, "another followee under a used key: %s", r.raw)

	r = a.command(t, http.MethodPost, "/users/10/follow", 501, "", "Idempotency-Key", "bad key")
	assert.Equal(t, http.StatusBadRequest, r.status)

	var types []string
	for _, rec := range a.records(t) {
		types = append(types, rec.Type)
	}
	assert.Equal(t, []string{events.TypePostCreated, events.TypePostCreated, events.TypeUserFollowed,
		events.TypeCommentAdded, events.TypePostEdited, events.TypePostDeleted}, types)
}

func TestLogUnavailable(t *testing.T) {
	a := newTestApp(t)
	id := a.post(t, 501)
	a.nats.Shutdown()
	// The client knows the log is gone: nothing is sent, so nothing can be
	// stored. (A command sent before it knew has an unknown outcome: 504.)
	require.Eventually(t, func() bool { return !a.js.Conn().IsConnected() }, 5*time.Second, 10*time.Millisecond)
	for _, tt := range []struct{ method, path, body string }{
		{http.MethodPost, "/users/9/follow", ""},
		{http.MethodDelete, "/posts/" + id, ""},
		{http.MethodPost, "/posts/" + id + "/comments", `{"text":"x"}`},
	} {
		start := time.Now()
		r := a.command(t, tt.method, tt.path, 501, tt.body)
		assert.Equal(t, http.StatusServiceUnavailable, r.status, "%s %s: %s", tt.method, tt.path, r.raw)
		assert.Equal(t, "unavailable", r.errorCode())
		assert.Equal(t, "2", r.header.Get("Retry-After"))
		assert.NotContains(t, string(r.raw), "127.0.0.1", "no internals leak")
		assert.Less(t, time.Since(start), 7*time.Second)
	}
	r := a.createPost(t, 501, images(pngImage(t, 2, 2)))
	assert.Equal(t, http.StatusServiceUnavailable, r.status)
}

// TestRequestTimeoutClosesTheConnection: fasthttp reports a connection whose
// request did not arrive in time (an idle keep-alive one, as a rule) through
// the error handler. The answer is a 408 that closes the connection, which
// clients such as Go's net/http recognise on an idle connection; the 400 it
// was before, they logged as an unsolicited response.
func TestRequestTimeoutClosesTheConnection(t *testing.T) {
	app := fiber.New(fiber.Config{DisableStartupMessage: true, ErrorHandler: errorHandler(slog.New(slog.DiscardHandler))})
	app.Get("/", func(*fiber.Ctx) error { return fiber.ErrRequestTimeout })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = app.Listener(ln) }()
	t.Cleanup(func() { _ = app.Shutdown() })

	conn, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	_, err = io.WriteString(conn, "GET / HTTP/1.1\r\nHost: feed\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, http.StatusRequestTimeout, resp.StatusCode)
	assert.True(t, resp.Close, "Connection: close")
	var body errorBody
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	assert.Equal(t, "request_timeout", body.Error.Code)
}

func TestErrorBodiesAreJSON(t *testing.T) {
	a := newTestApp(t)
	r := a.command(t, http.MethodPut, "/posts/1", 501, "")
	assert.Contains(t, []int{http.StatusMethodNotAllowed, http.StatusNotFound}, r.status)
	var body errorBody
	require.NoError(t, json.Unmarshal(r.raw, &body))
	assert.NotEmpty(t, body.Error.Code)
	_ = io.Discard
}

// A command whose outcome the log could not tell in time is a 504 that says a
// retry with the same key is safe, never a 503, which promises nothing was stored.
func TestUnknownOutcomeIsA504(t *testing.T) {
	app := fiber.New(fiber.Config{DisableStartupMessage: true, ErrorHandler: errorHandler(slog.New(slog.DiscardHandler))})
	app.Post("/", func(*fiber.Ctx) error {
		return fmt.Errorf("append x: %w: lost", domain.ErrOutcomeUnknown)
	})
	resp, err := app.Test(httptest.NewRequest(http.MethodPost, "/", nil))
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, http.StatusGatewayTimeout, resp.StatusCode)
	assert.Equal(t, "2", resp.Header.Get("Retry-After"))
	var body errorBody
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	assert.Equal(t, "outcome_unknown", body.Error.Code)
	assert.Contains(t, body.Error.Message, "same Idempotency-Key is safe")
}
