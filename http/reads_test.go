package http

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/migrations"
	"github.com/feedproject/feed/projections/readmodel"
)

// readModelDB starts a Postgres with the read model's schema.
func readModelDB(t *testing.T) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	pg := localstacktest.PostgresForTest(t)
	require.NoError(t, migrations.Up(ctx, pg.URL(), migrations.Schema))
	pool, err := readmodel.OpenPool(ctx, pg.URL(), migrations.Schema, 0)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// readApp is the real app (with its real JetStream, see newTestApp) reading
// from a real read model that the test seeds with SQL, as the projector would
// write it.
type readApp struct {
	*testApp
	pool *pgxpool.Pool
	ids  *domain.IDGenerator
	now  time.Time
}

func newReadApp(t *testing.T, pool *pgxpool.Pool, cfg Config) *readApp {
	t.Helper()
	a := newTestApp(t)
	ids, err := domain.NewIDGenerator(2)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	a.srv = NewServer(Deps{
		Logger:     slog.New(slog.DiscardHandler),
		Registerer: reg,
		Gatherer:   reg,
		Log:        a.log,
		Media:      a.media,
		Auth:       a.auth,
		IDs:        ids,
		ReadModel:  readmodel.NewStore(pool),
	}, cfg)
	return &readApp{testApp: a, pool: pool, ids: ids, now: time.Date(2025, 6, 1, 8, 0, 0, 0, time.UTC)}
}

func (a *readApp) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	_, err := a.pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err, sql)
}

// nextID returns a new time-ordered id a second after the last and its time.
func (a *readApp) nextID() (int64, time.Time) {
	a.now = a.now.Add(time.Second)
	return a.ids.Next(a.now)
}

// seedPost inserts a live post of user with n images, image i being
// (1000+i)×(2000+i) with key <post id>-<i>.
func (a *readApp) seedPost(t *testing.T, user domain.UserID, n int) (domain.PostID, time.Time) {
	t.Helper()
	id, at := a.nextID()
	a.exec(t, `INSERT INTO posts (id, user_id, caption, created_at) VALUES ($1, $2, $3, $4)`, id, int64(user), fmt.Sprintf("caption %d", id), at)
	for i := range n {
		a.exec(t, `INSERT INTO post_media (post_id, position, media_key, content_type, width, height, size)
			VALUES ($1, $2, $3, 'image/png', $4, $5, 100)`, id, i, mediaKey(id, i), 1000+i, 2000+i)
	}
	return domain.PostID(id), at
}

func mediaKey(post int64, i int) string { return fmt.Sprintf("%063x%d.png", post, i) }

func (a *readApp) setPosition(t *testing.T, pos uint64) {
	t.Helper()
	a.exec(t, `INSERT INTO projector_checkpoints (projector, position) VALUES ('readmodel', $1)
		ON CONFLICT (projector) DO UPDATE SET position = EXCLUDED.position`, int64(pos))
}

// get reads path as user (0: anonymous) with extra headers as name, value pairs.
func (a *readApp) get(t *testing.T, path string, user domain.UserID, headers ...string) response {
	t.Helper()
	return a.command(t, http.MethodGet, path, user, "", headers...)
}

// requireOK checks a 200 answer against the OpenAPI schema of the route.
func requireOK(t *testing.T, doc *openapi3.T, route string, r response) {
	t.Helper()
	require.Equal(t, http.StatusOK, r.status, "%s", r.raw)
	var value any
	require.NoError(t, json.Unmarshal(r.raw, &value))
	require.NoError(t, jsonSchema(t, doc, route, "200").VisitJSON(value), "%s", r.raw)
	assert.NotEmpty(t, r.header.Get(headerPosition), "a read answers X-Position")
}

// requireError checks an error answer: status, code and the Error schema.
func requireError(t *testing.T, doc *openapi3.T, r response, status int, code string) {
	t.Helper()
	require.Equal(t, status, r.status, "%s", r.raw)
	assert.Equal(t, code, r.errorCode(), "%s", r.raw)
	var value any
	require.NoError(t, json.Unmarshal(r.raw, &value))
	require.NoError(t, doc.Components.Schemas["Error"].Value.VisitJSON(value), "%s", r.raw)
}

func TestGetPost(t *testing.T) {
	t.Parallel()
	doc := loadOpenAPIDoc(t)
	a := newReadApp(t, readModelDB(t), Config{})
	const author, fan, stranger = domain.UserID(501), domain.UserID(502), domain.UserID(503)

	// Given a post with two images, an edited caption, two likes (one the
	// fan's) and a comment, read at position 7.
	id, created := a.seedPost(t, author, 2)
	edited := created.Add(90*time.Second + 250*time.Millisecond)
	a.exec(t, `UPDATE posts SET caption = 'sunset ☀', edited_at = $2, like_count = 2, comment_count = 1 WHERE id = $1`, int64(id), edited)
	a.exec(t, `INSERT INTO likes (post_id, user_id) VALUES ($1, $2), ($1, 504)`, int64(id), int64(fan))
	a.setPosition(t, 7)
	want := func(hasLiked bool) string {
		return fmt.Sprintf(`{"id": %q, "user_id": "501", "caption": "sunset ☀", "created_at": %q,
			"edited_at": %q, "like_count": 2, "comment_count": 1, "has_liked": %t,
			"media": [
				{"url": "/media/%s", "content_type": "image/png", "width": 1000, "height": 2000, "position": 0},
				{"url": "/media/%s", "content_type": "image/png", "width": 1001, "height": 2001, "position": 1}]}`,
			id.String(), formatTime(created), formatTime(edited), hasLiked, mediaKey(int64(id), 0), mediaKey(int64(id), 1))
	}
	path := "/posts/" + id.String()

	t.Run("anonymous", func(t *testing.T) {
		r := a.get(t, path, 0)
		requireOK(t, doc, "/posts/{id}", r)
		assert.JSONEq(t, want(false), string(r.raw))
		assert.Equal(t, "7", r.header.Get(headerPosition))
	})
	t.Run("a viewer who likes it", func(t *testing.T) {
		r := a.get(t, path, fan)
		requireOK(t, doc, "/posts/{id}", r)
		assert.JSONEq(t, want(true), string(r.raw))
	})
	t.Run("a viewer who does not", func(t *testing.T) {
		r := a.get(t, path, stranger)
		requireOK(t, doc, "/posts/{id}", r)
		assert.JSONEq(t, want(false), string(r.raw))
	})
	t.Run("never edited", func(t *testing.T) {
		other, _ := a.seedPost(t, author, 1)
		r := a.get(t, "/posts/"+other.String(), 0)
		requireOK(t, doc, "/posts/{id}", r)
		assert.Contains(t, string(r.raw), `"edited_at":null`)
	})
	t.Run("a token that is sent must be valid", func(t *testing.T) {
		expired, err := a.auth.Mint(fan, false, time.Now().Add(-2*time.Hour), time.Hour)
		require.NoError(t, err)
		forged, err := NewAuthenticator("another-secret-of-16-bytes-or-more", nil)
		require.NoError(t, err)
		forgedToken, err := forged.Mint(fan, false, time.Now(), time.Hour)
		require.NoError(t, err)
		for name, header := range map[string]string{
			"expired":   "Bearer " + expired,
			"forged":    "Bearer " + forgedToken,
			"malformed": "Bearer not.a.token",
			"no scheme": "Basic dXNlcjpwYXNz",
		} {
			r := a.get(t, path, 0, "Authorization", header)
			requireError(t, doc, r, http.StatusUnauthorized, "unauthenticated")
			assert.NotContains(t, string(r.raw), "sunset", name)
		}
	})
	t.Run("deleted or unknown is not found", func(t *testing.T) {
		gone, _ := a.seedPost(t, author, 1)
		a.exec(t, `UPDATE posts SET deleted_at = now() WHERE id = $1`, int64(gone))
		for _, p := range []string{"/posts/" + gone.String(), "/posts/" + (id + 1).String()} {
			requireError(t, doc, a.get(t, p, fan), http.StatusNotFound, "not_found")
		}
	})
	t.Run("bad ids", func(t *testing.T) {
		for _, bad := range []string{"abc", "0", "-5", "1.5", "9007199254740992", "%20"} {
			requireError(t, doc, a.get(t, "/posts/"+bad, 0), http.StatusBadRequest, "invalid_input")
		}
	})
}

func TestProfileGrid(t *testing.T) {
	t.Parallel()
	doc := loadOpenAPIDoc(t)
	a := newReadApp(t, readModelDB(t), Config{})
	const user, other = domain.UserID(601), domain.UserID(602)

	// Given 11 live posts of the user (and one deleted, and others' posts).
	type post struct {
		id domain.PostID
		at time.Time
	}
	var live []post
	for i := range 12 {
		id, at := a.seedPost(t, user, 1+i%3)
		a.seedPost(t, other, 1)
		if i == 5 {
			a.exec(t, `UPDATE posts SET deleted_at = now() WHERE id = $1`, int64(id))
			continue
		}
		live = append([]post{{id, at}}, live...) // newest first
	}
	a.exec(t, `UPDATE posts SET like_count = 3, comment_count = 4 WHERE id = $1`, int64(live[0].id))

	for _, route := range []struct{ name, openAPI, path string }{
		{"by query", "/users/feed", "/users/feed?userid=601"},
		{"by path", "/users/{id}/posts", "/users/601/posts?"},
	} {
		t.Run(route.name, func(t *testing.T) {
			// When the grid is read page by page.
			first := a.get(t, route.path, 0)
			requireOK(t, doc, route.openAPI, first)
			posts := first.body["posts"].([]any)
			require.Len(t, posts, 10)
			assert.Equal(t, true, first.body["has_more"])
			cursor := fmt.Sprintf("%d:%d", live[9].id, live[9].at.Unix())
			assert.Equal(t, cursor, first.body["next_cursor"])

			// Then the newest comes first, shaped as the contract says.
			newest, _ := json.Marshal(posts[0])
			assert.JSONEq(t, fmt.Sprintf(`{"id": %q, "created_at": %q, "like_count": 3, "comment_count": 4,
				"thumbnail": {"url": "/media/%s", "content_type": "image/png", "width": 1000, "height": 2000}}`,
				live[0].id.String(), formatTime(live[0].at), mediaKey(int64(live[0].id), 0)), string(newest))
			for i, p := range posts {
				assert.Equal(t, live[i].id.String(), p.(map[string]any)["id"])
			}

			// And the last page ends it.
			second := a.get(t, route.path+"&cursor="+url.QueryEscape(cursor), 0)
			requireOK(t, doc, route.openAPI, second)
			assert.JSONEq(t, fmt.Sprintf(`{"posts": [{"id": %q, "created_at": %q, "like_count": 0, "comment_count": 0,
				"thumbnail": {"url": "/media/%s", "content_type": "image/png", "width": 1000, "height": 2000}}],
				"next_cursor": null, "has_more": false}`,
				live[10].id.String(), formatTime(live[10].at), mediaKey(int64(live[10].id), 0)), string(second.raw))
		})
	}
	t.Run("a user without posts", func(t *testing.T) {
		for _, p := range []string{"/users/feed?userid=999", "/users/999/posts"} {
			r := a.get(t, p, 0)
			requireOK(t, doc, "/users/feed", r)
			assert.JSONEq(t, `{"posts": [], "next_cursor": null, "has_more": false}`, string(r.raw))
		}
	})
	t.Run("bad input", func(t *testing.T) {
		for _, p := range []string{
			"/users/feed", "/users/feed?userid=", "/users/feed?userid=abc", "/users/feed?userid=0",
			"/users/feed?userid=601&cursor=abc", "/users/feed?userid=601&cursor=12", "/users/feed?userid=601&cursor=12:-1",
			"/users/feed?userid=601&cursor=0:5", "/users/abc/posts", "/users/601/posts?cursor=1:2:3",
		} {
			requireError(t, doc, a.get(t, p, 0), http.StatusBadRequest, "invalid_input")
		}
	})
}

func TestListComments(t *testing.T) {
	t.Parallel()
	doc := loadOpenAPIDoc(t)
	a := newReadApp(t, readModelDB(t), Config{})

	// Given a post with 12 comments, a post without any, and a deleted post.
	post, _ := a.seedPost(t, 1, 1)
	quiet, _ := a.seedPost(t, 1, 1)
	gone, _ := a.seedPost(t, 1, 1)
	a.exec(t, `UPDATE posts SET deleted_at = now() WHERE id = $1`, int64(gone))
	type comment struct {
		id int64
		at time.Time
	}
	var comments []comment
	for i := range 12 {
		id, at := a.nextID()
		a.exec(t, `INSERT INTO comments (id, post_id, user_id, text, created_at) VALUES ($1, $2, $3, $4, $5)`,
			id, int64(post), 700+i, fmt.Sprintf("comment %d", i), at)
		comments = append(comments, comment{id, at})
	}
	path := "/posts/" + post.String() + "/comments"

	// When they are read, then they come oldest first, ten a page.
	first := a.get(t, path, 0)
	requireOK(t, doc, "/posts/{id}/comments", first)
	list := first.body["comments"].([]any)
	require.Len(t, list, 10)
	oldest, _ := json.Marshal(list[0])
	assert.JSONEq(t, fmt.Sprintf(`{"id": "%d", "user_id": "700", "text": "comment 0", "created_at": %q}`,
		comments[0].id, formatTime(comments[0].at)), string(oldest))
	cursor := fmt.Sprintf("%d:%d", comments[9].id, comments[9].at.Unix())
	assert.Equal(t, cursor, first.body["next_cursor"])
	assert.Equal(t, true, first.body["has_more"])

	second := a.get(t, path+"?cursor="+cursor, 0)
	requireOK(t, doc, "/posts/{id}/comments", second)
	assert.JSONEq(t, fmt.Sprintf(`{"comments": [
		{"id": "%d", "user_id": "710", "text": "comment 10", "created_at": %q},
		{"id": "%d", "user_id": "711", "text": "comment 11", "created_at": %q}],
		"next_cursor": null, "has_more": false}`,
		comments[10].id, formatTime(comments[10].at), comments[11].id, formatTime(comments[11].at)), string(second.raw))

	r := a.get(t, "/posts/"+quiet.String()+"/comments", 0)
	requireOK(t, doc, "/posts/{id}/comments", r)
	assert.JSONEq(t, `{"comments": [], "next_cursor": null, "has_more": false}`, string(r.raw))

	requireError(t, doc, a.get(t, "/posts/"+gone.String()+"/comments", 0), http.StatusNotFound, "not_found")
	requireError(t, doc, a.get(t, "/posts/12345/comments", 0), http.StatusNotFound, "not_found")
	requireError(t, doc, a.get(t, "/posts/x/comments", 0), http.StatusBadRequest, "invalid_input")
	requireError(t, doc, a.get(t, path+"?cursor=x", 0), http.StatusBadRequest, "invalid_input")
}

func TestFollowerLists(t *testing.T) {
	t.Parallel()
	doc := loadOpenAPIDoc(t)
	a := newReadApp(t, readModelDB(t), Config{})
	const star = domain.UserID(800)
	at := time.Date(2025, 7, 1, 9, 0, 0, 0, time.UTC)

	// Given 11 followers of the star, the first ten in one second, and the star
	// following two users.
	for i := range 11 {
		a.exec(t, `INSERT INTO follows (follower_id, followee_id, created_at) VALUES ($1, $2, $3)`,
			900+i, int64(star), at.Add(time.Duration(i/10)*time.Second))
	}
	a.exec(t, `INSERT INTO follows (follower_id, followee_id, created_at) VALUES ($1, 950, $2), ($1, 951, $3)`,
		int64(star), at, at.Add(time.Second))

	// When the followers are read, then the newest follow comes first and ties
	// go by id, descending.
	first := a.get(t, "/users/800/followers", 0)
	requireOK(t, doc, "/users/{id}/followers", first)
	assert.JSONEq(t, fmt.Sprintf(`{"users": ["910", "909", "908", "907", "906", "905", "904", "903", "902", "901"],
		"next_cursor": "901:%d", "has_more": true}`, at.Unix()), string(first.raw))
	second := a.get(t, "/users/800/followers?cursor="+first.body["next_cursor"].(string), 0)
	requireOK(t, doc, "/users/{id}/followers", second)
	assert.JSONEq(t, `{"users": ["900"], "next_cursor": null, "has_more": false}`, string(second.raw))

	r := a.get(t, "/users/800/following", 0)
	requireOK(t, doc, "/users/{id}/following", r)
	assert.JSONEq(t, `{"users": ["951", "950"], "next_cursor": null, "has_more": false}`, string(r.raw))

	r = a.get(t, "/users/4242/following", 0)
	requireOK(t, doc, "/users/{id}/following", r)
	assert.JSONEq(t, `{"users": [], "next_cursor": null, "has_more": false}`, string(r.raw))

	for _, p := range []string{"/users/0/followers", "/users/x/following", "/users/800/followers?cursor=800"} {
		requireError(t, doc, a.get(t, p, 0), http.StatusBadRequest, "invalid_input")
	}
}

// TestReadYourWrites checks X-Min-Position: a read waits until the read model
// has applied the position, and answers anyway, with the position it reached,
// once the consistency wait has passed.
func TestReadYourWrites(t *testing.T) {
	t.Parallel()
	doc := loadOpenAPIDoc(t)
	pool := readModelDB(t)
	patient := newReadApp(t, pool, Config{ConsistencyWait: 10 * time.Second})
	const wait = 300 * time.Millisecond
	impatient := newReadApp(t, pool, Config{ConsistencyWait: wait})
	post, _ := patient.seedPost(t, 1, 1)
	patient.exec(t, `INSERT INTO follows (follower_id, followee_id, created_at) VALUES (2, 1, now())`)
	routes := map[string]string{
		"/posts/{id}":           "/posts/" + post.String(),
		"/posts/{id}/comments":  "/posts/" + post.String() + "/comments",
		"/users/feed":           "/users/feed?userid=1",
		"/users/{id}/posts":     "/users/1/posts",
		"/users/{id}/followers": "/users/1/followers",
		"/users/{id}/following": "/users/2/following",
	}

	t.Run("before the projector's first batch the position is 0", func(t *testing.T) {
		for route, path := range routes {
			r := patient.get(t, path, 0)
			requireOK(t, doc, route, r)
			assert.Equal(t, "0", r.header.Get(headerPosition), route)
		}
	})

	patient.setPosition(t, 3)
	t.Run("a position already reached does not wait", func(t *testing.T) {
		for route, path := range routes {
			start := time.Now()
			r := impatient.get(t, path, 0, headerMinPosition, "3")
			requireOK(t, doc, route, r)
			assert.Equal(t, "3", r.header.Get(headerPosition), route)
			assert.Less(t, time.Since(start), wait, route)
		}
	})

	t.Run("a malformed position is refused at once", func(t *testing.T) {
		for route, path := range routes {
			for _, bad := range []string{"abc", "-1", "1.5", "0x10", "99999999999999999999"} {
				start := time.Now()
				r := impatient.get(t, path, 0, headerMinPosition, bad)
				requireError(t, doc, r, http.StatusBadRequest, "invalid_input")
				assert.Less(t, time.Since(start), wait, route)
			}
		}
	})

	t.Run("waits until the projector gets there", func(t *testing.T) {
		const delay = 200 * time.Millisecond
		advanced := make(chan error, 1)
		go func() {
			time.Sleep(delay)
			_, err := pool.Exec(context.Background(), `UPDATE projector_checkpoints SET position = 9 WHERE projector = 'readmodel'`)
			advanced <- err
		}()
		start := time.Now()
		r := patient.get(t, routes["/posts/{id}"], 0, headerMinPosition, "9")
		elapsed := time.Since(start)
		require.NoError(t, <-advanced)
		requireOK(t, doc, "/posts/{id}", r)
		assert.Equal(t, "9", r.header.Get(headerPosition))
		assert.GreaterOrEqual(t, elapsed, delay)
		assert.Less(t, elapsed, delay+time.Second, "the wait polls often enough to notice promptly")
	})

	t.Run("gives up after the consistency wait and answers anyway", func(t *testing.T) {
		for route, path := range routes {
			start := time.Now()
			r := impatient.get(t, path, 0, headerMinPosition, "1000")
			elapsed := time.Since(start)
			requireOK(t, doc, route, r)
			assert.Equal(t, "9", r.header.Get(headerPosition), route)
			assert.GreaterOrEqual(t, elapsed, wait, route)
			assert.Less(t, elapsed, wait+time.Second, route)
		}
	})
}

func TestReadsWithoutTheReadModel(t *testing.T) {
	t.Parallel()
	doc := loadOpenAPIDoc(t)
	paths := []string{"/posts/1", "/posts/1/comments", "/users/feed?userid=1", "/users/1/posts", "/users/1/followers", "/users/1/following"}

	t.Run("not configured", func(t *testing.T) {
		a := newTestApp(t)
		for _, p := range paths {
			r := a.command(t, http.MethodGet, p, 0, "")
			requireError(t, doc, r, http.StatusServiceUnavailable, "unavailable")
			assert.Equal(t, "2", r.header.Get("Retry-After"))
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		// Port 1 of the loopback refuses connections at once.
		pool, err := pgxpool.New(context.Background(), "postgres://feed@127.0.0.1:1/feed?connect_timeout=2")
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		a := newReadApp(t, pool, Config{})
		for _, p := range paths {
			r := a.get(t, p, 0)
			requireError(t, doc, r, http.StatusServiceUnavailable, "unavailable")
			assert.Equal(t, "2", r.header.Get("Retry-After"))
			assert.NotContains(t, string(r.raw), "127.0.0.1", "the answer names no internal host")
		}
	})
}
