package http

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/projections/feeds"
)

// streamed is an event as the model compares it: position, type and the id
// it names.
type streamed struct {
	id, event, key string
}

// streamViewer is a client that disconnects at random and resumes with the
// last id it saw, recording every event it receives.
type streamViewer struct {
	user  domain.UserID
	token string
	rng   *rand.Rand
	start uint64 // X-Position of the first connection
	last  string // Last-Event-ID to resume with
	got   []streamed
	errs  []string
	// authors is each post's author as the post events showed it.
	authors map[string]string
}

// session is one connection: it reads until it is cut (after a random time,
// or once the viewer has reached until, if until > 0).
func (v *streamViewer) session(addr string, until uint64) bool {
	c, err := dialStream(addr, v.token, v.last, v.rng.IntN(2) == 0, nil)
	if err != nil {
		v.errs = append(v.errs, err.Error())
		return false
	}
	defer c.close()
	if c.resp.StatusCode != http.StatusOK {
		v.errs = append(v.errs, fmt.Sprintf("status %d", c.resp.StatusCode))
		return false
	}
	if v.start == 0 && v.last == "" {
		v.start, _ = strconv.ParseUint(c.resp.Header.Get("X-Position"), 10, 64)
		v.last = events.Position(v.start)
	}
	cut := time.After(time.Duration(20+v.rng.IntN(300)) * time.Millisecond)
	if until > 0 {
		cut = time.After(20 * time.Second)
	}
	for {
		select {
		case m := <-c.msgs:
			if m.id != "" {
				v.last = m.id
			}
			if m.event != "" {
				v.record(m)
			}
			if until > 0 && m.id != "" {
				if pos, _ := strconv.ParseUint(m.id, 10, 64); pos >= until {
					return true
				}
			}
		case <-c.ended:
			return false
		case <-cut:
			return false
		}
	}
}

func (v *streamViewer) record(m sseMsg) {
	var body struct {
		ID     string `json:"id"`
		UserID string `json:"user_id"`
	}
	if err := json.Unmarshal([]byte(m.data), &body); err != nil {
		v.errs = append(v.errs, fmt.Sprintf("event %s %s: %v", m.id, m.event, err))
	}
	key := body.ID
	if m.event == "follow" || m.event == "unfollow" {
		key = body.UserID
	}
	if m.event == "post" {
		v.authors[body.ID] = body.UserID
	}
	v.got = append(v.got, streamed{id: m.id, event: m.event, key: key})
}

// expectedStream is what the log implies for user after position start: the
// reference the streams are compared with, written apart from them.
func expectedStream(recs []events.Record, user domain.UserID, start uint64) []streamed {
	follows := map[domain.UserID]bool{}
	var out []streamed
	for _, rec := range recs {
		id := events.Position(rec.Seq)
		switch e := rec.Event.(type) {
		case events.UserFollowed:
			if e.FollowerID == user {
				if rec.Seq > start && !follows[e.FolloweeID] {
					out = append(out, streamed{id, "follow", e.FolloweeID.String()})
				}
				follows[e.FolloweeID] = true
			}
		case events.UserUnfollowed:
			if e.FollowerID == user {
				if rec.Seq > start && follows[e.FolloweeID] {
					out = append(out, streamed{id, "unfollow", e.FolloweeID.String()})
				}
				follows[e.FolloweeID] = false
			}
		case events.PostCreated:
			if rec.Seq > start && follows[e.UserID] {
				out = append(out, streamed{id, "post", e.PostID.String()})
			}
		case events.PostDeleted:
			if rec.Seq > start && follows[e.UserID] {
				out = append(out, streamed{id, "delete", e.PostID.String()})
			}
		}
	}
	return out
}

// TestStreamModelExactAcrossReconnections drives random posts, deletes,
// follows, unfollows and refollows (some authors over the big account
// threshold) while viewers disconnect at random and resume with
// Last-Event-ID; each viewer's events, concatenated, must be exactly what the
// log implies from its first connection on.
func TestStreamModelExactAcrossReconnections(t *testing.T) {
	w := newFeedWorld(t, feeds.Config{InboxCap: 20, SegmentSize: 3, OutboxCap: 20, BigThreshold: 3})
	reg := prometheus.NewRegistry()
	// Few recent events: some resumptions catch up from memory, others
	// from the log.
	streams := NewStreams(StreamDeps{Log: w.log, Posts: w.posts, Registerer: reg}, StreamConfig{Ping: 20 * time.Millisecond, Recent: 16})
	deps := w.deps
	deps.Streams, deps.Registerer, deps.Gatherer = streams, reg, reg
	addr := runStreams(t, NewServer(deps, Config{}), streams)

	m := &model{t: t, w: w, rng: rand.New(rand.NewPCG(7, 7)), ids: w.ids, clock: time.Now(), users: 8, author: map[domain.PostID]domain.UserID{}}
	viewers := make([]*streamViewer, 5)
	for i := range viewers {
		u := domain.UserID(i + 1)
		tok, err := w.auth.Mint(u, false, time.Now(), time.Hour)
		require.NoError(t, err)
		viewers[i] = &streamViewer{user: u, token: tok, rng: rand.New(rand.NewPCG(uint64(i), 1)), authors: map[string]string{}}
	}
	// Some history before anyone connects.
	for range 40 {
		m.streamStep()
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, v := range viewers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				v.session(addr, 0)
				time.Sleep(time.Duration(v.rng.IntN(30)) * time.Millisecond)
			}
		})
	}
	for range 400 {
		m.streamStep()
		if m.rng.IntN(10) == 0 {
			time.Sleep(time.Duration(m.rng.IntN(20)) * time.Millisecond)
		}
	}
	close(stop)
	wg.Wait()
	head, err := w.log.Head(context.Background())
	require.NoError(t, err)
	for _, v := range viewers {
		for attempt := 0; !v.session(addr, head); attempt++ {
			require.Less(t, attempt, 5, "viewer %d did not reach the head %d from %s: %v", v.user, head, v.last, v.errs)
		}
	}

	var recs []events.Record
	require.NoError(t, w.log.Read(context.Background(), events.ReadOptions{StopAtEnd: true}, func(rec events.Record) error {
		recs = append(recs, rec)
		return nil
	}))
	total := 0
	for _, v := range viewers {
		assert.Empty(t, v.errs, "viewer %d", v.user)
		want := expectedStream(recs, v.user, v.start)
		require.Equal(t, want, v.got, "viewer %d from %d", v.user, v.start)
		for post, author := range v.authors {
			id, err := domain.ParsePostID(post)
			require.NoError(t, err)
			assert.Equal(t, m.author[id].String(), author, "post %s carries its author", post)
		}
		total += len(want)
	}
	assert.Greater(t, total, 100, "the run announced enough to mean something")
	for _, from := range []string{"memory", "log"} {
		assert.Positive(t, testutil.ToFloat64(streams.metrics.caughtUp.WithLabelValues(from)), "streams caught up from %s", from)
	}
	t.Logf("%d events over %d viewers", total, len(viewers))
}

// streamStep is one random command of the model, appended to the log.
func (m *model) streamStep() {
	a, b := m.user(), m.user()
	switch k := m.rng.IntN(100); {
	case k < 40:
		// The first two users post most and are followed most: big accounts.
		if m.rng.IntN(2) == 0 {
			a = domain.UserID(m.rng.IntN(2) + 1)
		}
		id, at := m.ids.Next(time.Now())
		m.author[domain.PostID(id)] = a
		m.live = append(m.live, domain.PostID(id))
		m.append(events.PostCreated{PostID: domain.PostID(id), UserID: a, CreatedAt: at,
			Media: []events.Media{{Key: fmt.Sprintf("%064d.png", id), ContentType: "image/png", Width: 1, Height: 1, Size: 1}}})
	case k < 50 && len(m.live) > 0:
		i := m.rng.IntN(len(m.live))
		id := m.live[i]
		m.live = append(m.live[:i], m.live[i+1:]...)
		m.append(events.PostDeleted{PostID: id, UserID: m.author[id], DeletedAt: time.Now()})
	case k < 80:
		if m.rng.IntN(2) == 0 {
			b = domain.UserID(m.rng.IntN(2) + 1)
		}
		if a != b {
			m.append(events.UserFollowed{FollowerID: a, FolloweeID: b})
		}
	default:
		if a != b {
			m.append(events.UserUnfollowed{FollowerID: a, FolloweeID: b})
		}
	}
}

// TestStreamThroughTwoReplicas runs two API servers on the same JetStream,
// Redis and Postgres, each with its own streams: a stream on one announces
// the follow and the post accepted by the other, and the post is on
// the viewer's home feed read with X-Min-Position at the announced id.
func TestStreamThroughTwoReplicas(t *testing.T) {
	w := newFeedWorld(t, feeds.Config{})
	replica := func(node int) string {
		log := openTestLog(t, w.js.Conn().ConnectedUrl())
		ids, err := domain.NewIDGenerator(node)
		require.NoError(t, err)
		reg := prometheus.NewRegistry()
		streams := NewStreams(StreamDeps{Log: log, Posts: w.posts, Registerer: reg}, StreamConfig{})
		deps := w.deps
		deps.Log, deps.IDs, deps.Streams, deps.Registerer, deps.Gatherer = log, ids, streams, reg, reg
		srv := NewServer(deps, Config{ConsistencyWait: 5 * time.Second})
		return runStreams(t, srv, streams)
	}
	addrA, addrB := replica(6), replica(7)
	viewer, author := domain.UserID(71), domain.UserID(72)
	token := func(u domain.UserID) string {
		tok, err := w.auth.Mint(u, false, time.Now(), time.Hour)
		require.NoError(t, err)
		return tok
	}
	send := func(addr string, req *http.Request, user domain.UserID) map[string]any {
		req.URL.Scheme, req.URL.Host = "http", addr
		req.Header.Set("Authorization", "Bearer "+token(user))
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Less(t, resp.StatusCode, 300)
		var body map[string]any
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
		return body
	}

	c := openStream(t, addrA, token(viewer), "", true)
	require.Equal(t, http.StatusOK, c.resp.StatusCode)
	req, err := http.NewRequest(http.MethodPost, "/users/"+author.String()+"/follow", nil)
	require.NoError(t, err)
	followed := send(addrB, req, viewer)
	m := c.nextEvent(t, 10*time.Second)
	assert.Equal(t, streamed{followed["position"].(string), "follow", author.String()}, streamed{m.id, m.event, jsonField(t, m.data, "user_id")})

	ct, body := multipartBody(t, append(images(pngImage(t, 4, 4)), part{name: "caption", data: []byte("from B")})...)
	req, err = http.NewRequest(http.MethodPost, "/posts", bytes.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", ct)
	posted := send(addrB, req, author)
	m = c.nextEvent(t, 10*time.Second)
	require.Equal(t, "post", m.event)
	assert.Equal(t, posted["position"], m.id)
	assert.Equal(t, posted["id"], jsonField(t, m.data, "id"))
	assert.Equal(t, "from B", jsonField(t, m.data, "caption"))

	req, err = http.NewRequest(http.MethodGet, "/feed", nil)
	require.NoError(t, err)
	req.Header.Set("X-Min-Position", m.id)
	page := send(addrA, req, viewer)
	posts := page["posts"].([]any)
	require.NotEmpty(t, posts, "the announced post is on the feed read at its position")
	assert.Equal(t, posted["id"], posts[0].(map[string]any)["id"])
}

func jsonField(t *testing.T, data, field string) string {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(data), &m))
	s, _ := m[field].(string)
	return s
}

// TestStreamAnnouncesALivePostWithoutWaitingForTheReadModel holds the read
// model back: a live post is announced from its event at once, exactly as
// GET /posts/{id} shows it at its position. Resumed after a like, a stream
// gets the same event again, whether it catches up from the recent events in
// memory or reads the log (beyond them).
func TestStreamAnnouncesALivePostWithoutWaitingForTheReadModel(t *testing.T) {
	for _, c := range []struct {
		name   string
		recent int
	}{{"from memory", 0}, {"from the log", 1}} {
		t.Run(c.name, func(t *testing.T) { testLivePost(t, c.recent) })
	}
}

func testLivePost(t *testing.T, recent int) {
	start := make(chan struct{})
	w := newFeedWorldWith(t, feeds.Config{}, start)
	reg := prometheus.NewRegistry()
	streams := NewStreams(StreamDeps{Log: w.log, Posts: w.posts, Registerer: reg}, StreamConfig{Recent: recent})
	deps := w.deps
	deps.Streams, deps.Registerer, deps.Gatherer = streams, reg, reg
	addr := runStreams(t, NewServer(deps, Config{ConsistencyWait: 10 * time.Second}), streams)
	viewer, author := domain.UserID(81), domain.UserID(82)
	token, err := w.auth.Mint(viewer, false, time.Now(), time.Hour)
	require.NoError(t, err)
	appendEvent := func(ev events.Event) uint64 {
		w.n++
		res, err := w.log.AppendEvent(context.Background(), fmt.Sprintf("live%d", w.n), time.Now(), ev)
		require.NoError(t, err)
		return res.Seq
	}
	followed := appendEvent(follow(viewer, author))

	c := openStream(t, addr, token, events.Position(followed), false)
	require.Equal(t, http.StatusOK, c.resp.StatusCode)
	id, at := w.ids.Next(time.Now())
	created := events.PostCreated{PostID: domain.PostID(id), UserID: author, Caption: "live <now>", CreatedAt: at,
		Media: []events.Media{{Key: fmt.Sprintf("%064d.png", id), ContentType: "image/png", Width: 3, Height: 2, Size: 1}}}
	posted := appendEvent(created)
	// Far under the 2 s a wait for the read model took before giving up.
	m := c.nextEvent(t, time.Second)
	require.Equal(t, "post", m.event, "announced while the read model has not applied it")
	assert.Equal(t, events.Position(posted), m.id)
	c.close()

	close(start)
	get := func(path string, minPos uint64) []byte {
		req, err := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("X-Min-Position", events.Position(minPos))
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		var buf bytes.Buffer
		_, err = buf.ReadFrom(resp.Body)
		require.NoError(t, err)
		return bytes.TrimSpace(buf.Bytes())
	}
	made := get("/posts/"+created.PostID.String(), posted)
	assert.JSONEq(t, string(made), m.data, "the live announcement is the post as GET /posts/{id} shows it at its position")

	liked := appendEvent(events.PostLiked{PostID: created.PostID, UserID: viewer})
	require.Contains(t, string(get("/posts/"+created.PostID.String(), liked)), `"has_liked":true`)
	resumed := openStream(t, addr, token, events.Position(followed), false)
	m = resumed.nextEvent(t, 5*time.Second)
	require.Equal(t, "post", m.event)
	assert.Equal(t, events.Position(posted), m.id)
	assert.JSONEq(t, string(made), m.data, "a resumed stream's post event is the live one: the post at its position")
	// The resumed stream's catch-up, once it has joined.
	from, want := "memory", 2.0
	if recent == 1 {
		from, want = "log", 1
	}
	caughtUp := streams.metrics.caughtUp
	assert.Eventually(t, func() bool { return testutil.ToFloat64(caughtUp.WithLabelValues(from)) == want }, 5*time.Second, 10*time.Millisecond,
		"caught up from %s", from)
}
