package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"math/rand/v2"
	"mime/multipart"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack"
	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/cmd/localstack/natscluster"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	feedhttp "github.com/feedproject/feed/http"
)

// TestTopologyKeepsItsPromisesThroughFaults runs the clustered topology the
// operations guide describes, on loopback: three NATS nodes with R3 streams,
// a Redis Cluster of three masters and three replicas, Postgres, two API
// replicas sharing the media in the object store, and two projector
// processes running every projector role. Under mixed traffic through both
// replicas it kills, in turn and each restarted, the event stream's leader, a
// Redis master, an API replica and the active projector process. Then every
// command answered 202 is in the log at its position and in the read model,
// every user's paged home feed through either replica is the pull feed,
// every image is served by both replicas, nothing answered a 5xx other than
// 503, and the maintenance round repaired no inbox.
func TestTopologyKeepsItsPromisesThroughFaults(t *testing.T) {
	nc := natscluster.Start(t, natscluster.Config{})
	rc := localstacktest.RedisClusterForTest(t)
	pg := localstacktest.PostgresForTest(t)
	const secret = "topology-test-secret-0123456789"
	common := []string{
		"NATS_URL=" + nc.URLs(),
		"FEED_STREAM_REPLICAS=3",
		"REDIS_URL=" + rc.URL(),
		"DATABASE_URL=" + pg.URL(),
		"FEED_JWT_SECRET=" + secret,
		"FEED_MEDIA_STORE=objectstore",
		"FEED_LOG_LEVEL=warn",
	}
	dir := t.TempDir()
	newProc := func(name, roles string, node int) *feedProcess {
		port := freePort(t)
		p := &feedProcess{
			name: name,
			base: fmt.Sprintf("http://127.0.0.1:%d", port),
			log:  filepath.Join(dir, name+".log"),
			env: append(slices.Clone(common),
				"FEED_ROLES="+roles,
				"FEED_NODE_ID="+strconv.Itoa(node),
				fmt.Sprintf("FEED_HTTP_ADDR=127.0.0.1:%d", port),
				"FEED_DATA_DIR="+filepath.Join(dir, name)),
		}
		t.Cleanup(func() {
			p.kill()
			if t.Failed() {
				out, _ := os.ReadFile(p.log)
				t.Logf("%s's log, last 4 KiB:\n%s", name, lastBytes(out, 4096))
			}
		})
		return p
	}
	// The first projector process starts alone, so that it is the active
	// one that is killed later.
	projectors := []*feedProcess{newProc("projector-1", "readmodel,planner,appliers,activity", 11), newProc("projector-2", "readmodel,planner,appliers,activity", 12)}
	apis := []*feedProcess{newProc("api-1", "api", 1), newProc("api-2", "api", 2)}
	projectors[0].start(t)
	for _, p := range []*feedProcess{projectors[1], apis[0], apis[1]} {
		p.start(t)
	}

	auth, err := feedhttp.NewAuthenticator(secret, nil)
	require.NoError(t, err)
	load := newTopologyLoad(t, auth, apis)
	repairs := watchRepairs(t, projectors)
	stopLoad := load.run(6)
	waitFor := func(d time.Duration) {
		select {
		case <-time.After(d):
		case <-t.Context().Done():
		}
	}
	waitFor(5 * time.Second)

	// The event stream's leader.
	leader := nc.WaitForStreamLeader(eventsStream, 10*time.Second)
	t.Logf("killing NATS node %d, the leader of %s", leader, eventsStream)
	nc.Kill(leader)
	waitFor(4 * time.Second)
	nc.Restart(leader)
	nc.WaitForStreamCurrent(leader, eventsStream, 30*time.Second)
	waitFor(3 * time.Second)

	// A Redis master, once its replica has its writes; it comes back as the
	// replica of the node that took its slots.
	master := 0
	t.Logf("killing Redis master %s", rc.Nodes[master].Addr())
	rc.Kill(master)
	awaitRole(t, rc.Nodes[master+3], "master")
	waitFor(2 * time.Second)
	rc.Restart(master)
	awaitRole(t, rc.Nodes[master], "slave")
	waitFor(3 * time.Second)

	// An API replica.
	t.Logf("killing %s", apis[0].name)
	apis[0].kill()
	waitFor(3 * time.Second)
	apis[0].start(t)
	waitFor(3 * time.Second)

	// The active projector process: the standby takes its roles over.
	for _, role := range []string{"projector:readmodel", "projector:feeds", "projector:activity"} {
		require.Equal(t, "active", roleState(t, projectors[0], role), "%s of %s", role, projectors[0].name)
		require.Equal(t, "standby", roleState(t, projectors[1], role), "%s of %s", role, projectors[1].name)
	}
	t.Logf("killing %s", projectors[0].name)
	killed := time.Now()
	projectors[0].kill()
	require.Eventually(t, func() bool {
		return roleState(t, projectors[1], "projector:readmodel") == "active" &&
			roleState(t, projectors[1], "projector:feeds") == "active" &&
			roleState(t, projectors[1], "projector:activity") == "active"
	}, 30*time.Second, 100*time.Millisecond, "the standby did not take over")
	t.Logf("%s took over in %v", projectors[1].name, time.Since(killed).Round(100*time.Millisecond))
	waitFor(3 * time.Second)
	projectors[0].start(t)
	waitFor(5 * time.Second)

	stopLoad()
	load.check(t, nc.URLs(), apis, repairs)
}

// feedProcess is `feed serve` in a process of its own, which the test kills
// with SIGKILL and starts again on the same address.
type feedProcess struct {
	name, base, log string
	env             []string

	mu  sync.Mutex
	cmd *exec.Cmd
}

func (p *feedProcess) start(t *testing.T) {
	t.Helper()
	out, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	require.NoError(t, err)
	defer out.Close()
	cmd := exec.Command(os.Args[0], "serve")
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = out, out
	require.NoError(t, cmd.Start())
	p.mu.Lock()
	p.cmd = cmd
	p.mu.Unlock()
	require.Eventually(t, func() bool {
		resp, err := http.Get(p.base + "/readyz")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 90*time.Second, 100*time.Millisecond, "%s did not become ready", p.name)
}

func (p *feedProcess) kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	_ = p.cmd.Wait()
	p.cmd = nil
}

func lastBytes(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// roleState is the state (active or standby) p's /readyz gives its part in
// role, "" if it gives none.
func roleState(t *testing.T, p *feedProcess, role string) string {
	client := http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get(p.base + "/readyz")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var ready struct {
		Roles map[string]struct {
			State string `json:"state"`
		} `json:"roles"`
	}
	if json.NewDecoder(resp.Body).Decode(&ready) != nil {
		return ""
	}
	return ready.Roles[role].State
}

// awaitRole waits until node reports role (master or slave).
func awaitRole(t *testing.T, node *localstack.Redis, role string) {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: node.Addr()})
	defer rdb.Close()
	require.Eventually(t, func() bool {
		info, err := rdb.Info(t.Context(), "replication").Result()
		if err != nil || !strings.Contains(info, "role:"+role) {
			return false
		}
		return role == "master" || strings.Contains(info, "master_link_status:up")
	}, 30*time.Second, 100*time.Millisecond, "Redis node %s did not become %s", node.Addr(), role)
}

// watchRepairs polls the projector processes' feed_inbox_repairs_total
// until the test ends, and returns the largest value any of them showed.
func watchRepairs(t *testing.T, projectors []*feedProcess) func() float64 {
	var most atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			for _, p := range projectors {
				if v, ok := metricValue(p.base, "feed_inbox_repairs_total"); ok && int64(v) > most.Load() {
					most.Store(int64(v))
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(500 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return func() float64 {
		for _, p := range projectors {
			if v, ok := metricValue(p.base, "feed_inbox_repairs_total"); ok && int64(v) > most.Load() {
				most.Store(int64(v))
			}
		}
		return float64(most.Load())
	}
}

// metricValue is the value of an unlabelled metric on base's /metrics.
func metricValue(base, name string) (float64, bool) {
	client := http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get(base + "/metrics")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	text, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, false
	}
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindSubmatch(text)
	if m == nil {
		return 0, false
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	return v, err == nil
}

// topologyLoad is the mixed traffic of the topology test and what it was
// answered.
type topologyLoad struct {
	t      *testing.T
	tokens map[domain.UserID]string
	apis   []*feedProcess
	client *http.Client

	mu         sync.Mutex
	accepted   []acceptedCommand
	posts      []*postedImage // the posts accepted, to like, comment and delete
	violations []string       // answers the contract does not allow
	answers    map[string]int // status counts, by route kind
}

// acceptedCommand is a command answered 202, with what the log must hold.
type acceptedCommand struct {
	pos   uint64
	event events.Event
}

type postedImage struct {
	id     domain.PostID
	author domain.UserID
	image  []byte
}

const topologyUsers = 24

// eventsStream is the event stream's default name.
const eventsStream = "FEED_EVENTS"

func newTopologyLoad(t *testing.T, auth *feedhttp.Authenticator, apis []*feedProcess) *topologyLoad {
	l := &topologyLoad{t: t, tokens: map[domain.UserID]string{}, apis: apis,
		client: &http.Client{Timeout: 15 * time.Second}, answers: map[string]int{}}
	for u := domain.UserID(1); u <= topologyUsers; u++ {
		tok, err := auth.Mint(u, false, time.Now(), 2*time.Hour)
		require.NoError(t, err)
		l.tokens[u] = tok
	}
	return l
}

// run starts workers sending commands and reads until the returned
// function is called, which waits for them.
func (l *topologyLoad) run(workers int) func() {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := 0; ctx.Err() == nil; i++ {
				l.step(ctx, rng, fmt.Sprintf("w%d-%d", w, i))
				time.Sleep(time.Duration(rng.IntN(20)) * time.Millisecond)
			}
		})
	}
	return func() { cancel(); wg.Wait() }
}

func (l *topologyLoad) step(ctx context.Context, rng *rand.Rand, key string) {
	user := domain.UserID(1 + rng.IntN(topologyUsers))
	other := domain.UserID(1 + rng.IntN(topologyUsers))
	if other == user {
		other = other%topologyUsers + 1
	}
	l.mu.Lock()
	var post *postedImage
	if len(l.posts) > 0 {
		post = l.posts[rng.IntN(len(l.posts))]
	}
	l.mu.Unlock()
	switch n := rng.IntN(100); {
	case n < 20:
		img := pngOf(rng)
		var body bytes.Buffer
		form := multipart.NewWriter(&body)
		_ = form.WriteField("caption", key)
		w, _ := form.CreateFormFile("images", "p.png")
		_, _ = w.Write(img)
		_ = form.Close()
		var got struct {
			ID       string `json:"id"`
			Position string `json:"position"`
		}
		if l.command(ctx, "post", http.MethodPost, "/posts", user, key, form.FormDataContentType(), body.Bytes(), &got) {
			id, _ := strconv.ParseUint(got.ID, 10, 64)
			l.accept(got.Position, events.PostCreated{PostID: domain.PostID(id), UserID: user})
			l.mu.Lock()
			l.posts = append(l.posts, &postedImage{id: domain.PostID(id), author: user, image: img})
			l.mu.Unlock()
		}
	case n < 45:
		l.simple(ctx, "follow", http.MethodPost, fmt.Sprintf("/users/%d/follow", other), user, key,
			events.UserFollowed{FollowerID: user, FolloweeID: other})
	case n < 55:
		l.simple(ctx, "unfollow", http.MethodDelete, fmt.Sprintf("/users/%d/follow", other), user, key,
			events.UserUnfollowed{FollowerID: user, FolloweeID: other})
	case n < 70 && post != nil:
		l.simple(ctx, "like", http.MethodPost, fmt.Sprintf("/posts/%d/like", post.id), user, key,
			events.PostLiked{UserID: user, PostID: post.id})
	case n < 80 && post != nil:
		var got struct {
			ID       string `json:"id"`
			Position string `json:"position"`
		}
		body, _ := json.Marshal(map[string]string{"text": key})
		if l.command(ctx, "comment", http.MethodPost, fmt.Sprintf("/posts/%d/comments", post.id), user, key, "application/json", body, &got) {
			id, _ := strconv.ParseUint(got.ID, 10, 64)
			l.accept(got.Position, events.CommentAdded{CommentID: domain.CommentID(id), PostID: post.id, UserID: user})
		}
	case n < 84 && post != nil:
		l.simple(ctx, "delete", http.MethodDelete, fmt.Sprintf("/posts/%d", post.id), post.author, key,
			events.PostDeleted{PostID: post.id, UserID: post.author})
	default:
		l.read(ctx, user)
	}
}

// pngOf is a small PNG of a random colour, so that each post has an image
// of its own.
func pngOf(rng *rand.Rand) []byte {
	img := image.NewRGBA(image.Rect(0, 0, 4, 4))
	c := color.RGBA{uint8(rng.IntN(256)), uint8(rng.IntN(256)), uint8(rng.IntN(256)), 255}
	for x := range 4 {
		for y := range 4 {
			img.Set(x, y, c)
		}
	}
	var b bytes.Buffer
	_ = png.Encode(&b, img)
	return b.Bytes()
}

func (l *topologyLoad) simple(ctx context.Context, kind, method, path string, user domain.UserID, key string, ev events.Event) {
	var got struct {
		Position string `json:"position"`
	}
	if l.command(ctx, kind, method, path, user, key, "", nil, &got) {
		l.accept(got.Position, ev)
	}
}

func (l *topologyLoad) accept(position string, ev events.Event) {
	pos, err := strconv.ParseUint(position, 10, 64)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.violations = append(l.violations, fmt.Sprintf("202 with position %q", position))
		return
	}
	l.accepted = append(l.accepted, acceptedCommand{pos: pos, event: ev})
}

// command sends a command under an Idempotency-Key, to one replica and, if
// that one cannot answer (gone, or 503), again to the other, as a load
// balancer and a careful client would, for up to 30 s. It reports whether
// the command was accepted, with the answer decoded into out.
func (l *topologyLoad) command(ctx context.Context, kind, method, path string, user domain.UserID, key, contentType string, body []byte, out any) bool {
	deadline := time.Now().Add(30 * time.Second)
	for attempt := 0; time.Now().Before(deadline); attempt++ {
		api := l.apis[(int(user)+attempt)%len(l.apis)]
		req, err := http.NewRequestWithContext(context.WithoutCancel(ctx), method, api.base+path, bytes.NewReader(body))
		require.NoError(l.t, err)
		req.Header.Set("Authorization", "Bearer "+l.tokens[user])
		req.Header.Set("Idempotency-Key", key)
		if contentType != "" {
			req.Header.Set("Content-Type", contentType)
		}
		resp, err := l.client.Do(req)
		if err != nil {
			l.count(kind, "transport error")
			time.Sleep(100 * time.Millisecond)
			continue
		}
		raw, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		l.count(kind, strconv.Itoa(resp.StatusCode))
		switch {
		case resp.StatusCode == http.StatusAccepted:
			if err := json.Unmarshal(raw, out); err != nil {
				l.violate("%s %s: 202 with %s", method, path, raw)
				return false
			}
			return true
		case resp.StatusCode == http.StatusServiceUnavailable:
			time.Sleep(200 * time.Millisecond)
		case resp.StatusCode >= 500:
			l.violate("%s %s via %s: %d %s", method, path, api.name, resp.StatusCode, raw)
			return false
		default:
			// 404 (a post deleted meanwhile) and the like: not accepted.
			return false
		}
	}
	l.violate("%s %s: no answer but 503 or a dropped connection for 30 s", method, path)
	return false
}

// read pages once through user's home feed through a replica.
func (l *topologyLoad) read(ctx context.Context, user domain.UserID) {
	api := l.apis[int(user)%len(l.apis)]
	req, _ := http.NewRequestWithContext(context.WithoutCancel(ctx), http.MethodGet, api.base+"/feed", nil)
	req.Header.Set("Authorization", "Bearer "+l.tokens[user])
	resp, err := l.client.Do(req)
	if err != nil {
		l.count("read", "transport error")
		return
	}
	raw, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	l.count("read", strconv.Itoa(resp.StatusCode))
	if resp.StatusCode >= 500 && resp.StatusCode != http.StatusServiceUnavailable {
		l.violate("GET /feed via %s: %d %s", api.name, resp.StatusCode, raw)
	}
}

func (l *topologyLoad) count(kind, answer string) {
	l.mu.Lock()
	l.answers[kind+" "+answer]++
	l.mu.Unlock()
}

func (l *topologyLoad) violate(format string, args ...any) {
	l.mu.Lock()
	l.violations = append(l.violations, fmt.Sprintf(format, args...))
	l.mu.Unlock()
}

// topologyModel is what the accepted commands imply, applied in log order.
type topologyModel struct {
	follows  map[[2]domain.UserID]bool
	posts    map[domain.PostID]*modelPost
	maxPos   uint64
	accepted int
}

type modelPost struct {
	author   domain.UserID
	deleted  bool
	likes    map[domain.UserID]bool
	comments int
}

func (l *topologyLoad) model() topologyModel {
	cmds := slices.Clone(l.accepted)
	slices.SortFunc(cmds, func(a, b acceptedCommand) int { return cmp.Compare(a.pos, b.pos) })
	m := topologyModel{follows: map[[2]domain.UserID]bool{}, posts: map[domain.PostID]*modelPost{}, accepted: len(cmds)}
	for _, c := range cmds {
		m.maxPos = max(m.maxPos, c.pos)
		switch e := c.event.(type) {
		case events.PostCreated:
			m.posts[e.PostID] = &modelPost{author: e.UserID, likes: map[domain.UserID]bool{}}
		case events.PostDeleted:
			m.posts[e.PostID].deleted = true
		case events.UserFollowed:
			m.follows[[2]domain.UserID{e.FollowerID, e.FolloweeID}] = true
		case events.UserUnfollowed:
			delete(m.follows, [2]domain.UserID{e.FollowerID, e.FolloweeID})
		case events.PostLiked:
			if p := m.posts[e.PostID]; !p.deleted {
				p.likes[e.UserID] = true
			}
		case events.CommentAdded:
			if p := m.posts[e.PostID]; !p.deleted {
				p.comments++
			}
		}
	}
	return m
}

// check compares what the service holds with what it accepted.
func (l *topologyLoad) check(t *testing.T, natsURLs string, apis []*feedProcess, repairs func() float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	t.Logf("answers: %v", l.answers)
	assert.Empty(t, l.violations, "answers the contract does not allow")
	m := l.model()
	t.Logf("%d commands accepted, %d posts, up to position %d", m.accepted, len(m.posts), m.maxPos)
	require.Greater(t, m.accepted, 200, "the load ran")

	// In the log, each at its position.
	conn, err := nats.Connect(natsURLs)
	require.NoError(t, err)
	defer conn.Close()
	js, err := jetstream.New(conn)
	require.NoError(t, err)
	log, err := events.AttachLog(t.Context(), js, events.Config{}, nil)
	require.NoError(t, err)
	defer log.Close()
	for _, c := range l.accepted {
		rec, err := log.Get(t.Context(), c.pos)
		require.NoError(t, err, "the event at %d", c.pos)
		assert.True(t, sameEvent(c.event, rec.Event), "at %d the log has %#v, the client was answered for %#v", c.pos, rec.Event, c.event)
	}

	// The read model and the media, through both replicas.
	for id, p := range m.posts {
		var image []byte
		for _, pi := range l.posts {
			if pi.id == id {
				image = pi.image
			}
		}
		for _, api := range apis {
			status, raw := l.get(t, api, fmt.Sprintf("/posts/%d", id), 0, m.maxPos)
			if p.deleted {
				assert.Equal(t, http.StatusNotFound, status, "deleted post %d via %s: %s", id, api.name, raw)
				continue
			}
			if !assert.Equal(t, http.StatusOK, status, "post %d via %s: %s", id, api.name, raw) {
				continue
			}
			var view struct {
				LikeCount    int `json:"like_count"`
				CommentCount int `json:"comment_count"`
				Media        []struct {
					URL string `json:"url"`
				} `json:"media"`
			}
			require.NoError(t, json.Unmarshal(raw, &view))
			assert.Equal(t, len(p.likes), view.LikeCount, "likes of post %d via %s", id, api.name)
			assert.Equal(t, p.comments, view.CommentCount, "comments of post %d via %s", id, api.name)
			require.Len(t, view.Media, 1)
			for _, other := range apis {
				status, got := l.get(t, other, view.Media[0].URL, 0, 0)
				assert.Equal(t, http.StatusOK, status, "image of post %d via %s", id, other.name)
				assert.True(t, bytes.Equal(image, got), "image of post %d via %s is the one uploaded", id, other.name)
			}
		}
	}

	// Every user's home feed through both replicas is the pull feed.
	for u := domain.UserID(1); u <= topologyUsers; u++ {
		var want []domain.PostID
		for id, p := range m.posts {
			if !p.deleted && p.author != u && m.follows[[2]domain.UserID{u, p.author}] {
				want = append(want, id)
			}
		}
		for _, api := range apis {
			got := l.homeFeed(t, api, u, m.maxPos)
			assert.ElementsMatch(t, want, got, "user %d's home feed via %s", u, api.name)
		}
	}
	assert.Zero(t, repairs(), "inboxes the maintenance round repaired")
}

// sameEvent compares the fields the client knew when it was answered.
func sameEvent(want, got events.Event) bool {
	switch w := want.(type) {
	case events.PostCreated:
		g, ok := got.(events.PostCreated)
		return ok && g.PostID == w.PostID && g.UserID == w.UserID
	case events.CommentAdded:
		g, ok := got.(events.CommentAdded)
		return ok && g.CommentID == w.CommentID && g.PostID == w.PostID && g.UserID == w.UserID
	case events.PostDeleted:
		g, ok := got.(events.PostDeleted)
		return ok && g.PostID == w.PostID && g.UserID == w.UserID
	default:
		return want == got
	}
}

// get reads path through api as user (0: no token) at position min, and
// retries while the replica answers 503 or is not reading at min yet.
func (l *topologyLoad) get(t *testing.T, api *feedProcess, path string, user domain.UserID, min uint64) (int, []byte) {
	t.Helper()
	var status int
	var raw []byte
	require.EventuallyWithT(t, func(c *assert.CollectT) {
		req, err := http.NewRequest(http.MethodGet, api.base+path, nil)
		require.NoError(c, err)
		if user != 0 {
			req.Header.Set("Authorization", "Bearer "+l.tokens[user])
		}
		if min > 0 {
			req.Header.Set("X-Min-Position", strconv.FormatUint(min, 10))
		}
		resp, err := l.client.Do(req)
		require.NoError(c, err)
		defer resp.Body.Close()
		raw, err = io.ReadAll(resp.Body)
		require.NoError(c, err)
		status = resp.StatusCode
		require.NotEqual(c, http.StatusServiceUnavailable, status, "%s", raw)
		if min > 0 && (status == http.StatusOK || resp.Header.Get("X-Position") != "") {
			pos, err := strconv.ParseUint(resp.Header.Get("X-Position"), 10, 64)
			require.NoError(c, err, "X-Position")
			require.GreaterOrEqual(c, pos, min, "read at position")
		}
	}, 60*time.Second, 200*time.Millisecond, "GET %s via %s", path, api.name)
	return status, raw
}

// homeFeed pages through user's home feed through api read at min, and
// checks it is newest first and holds each post once.
func (l *topologyLoad) homeFeed(t *testing.T, api *feedProcess, user domain.UserID, min uint64) []domain.PostID {
	t.Helper()
	var ids []domain.PostID
	var last string
	cursor := ""
	for range 1000 {
		status, raw := l.get(t, api, "/feed?cursor="+cursor, user, min)
		require.Equal(t, http.StatusOK, status, "%s", raw)
		var page struct {
			Posts []struct {
				ID        string `json:"id"`
				CreatedAt string `json:"created_at"`
			} `json:"posts"`
			NextCursor *string `json:"next_cursor"`
			HasMore    bool    `json:"has_more"`
		}
		require.NoError(t, json.Unmarshal(raw, &page))
		for _, p := range page.Posts {
			id, err := strconv.ParseUint(p.ID, 10, 64)
			require.NoError(t, err)
			require.NotContains(t, ids, domain.PostID(id), "user %d's feed via %s holds post %d twice", user, api.name, id)
			if last != "" {
				assert.LessOrEqual(t, p.CreatedAt, last, "user %d's feed via %s is newest first", user, api.name)
			}
			last = p.CreatedAt
			ids = append(ids, domain.PostID(id))
		}
		if !page.HasMore {
			return ids
		}
		require.NotNil(t, page.NextCursor)
		cursor = *page.NextCursor
	}
	require.Fail(t, "the feed does not end")
	return nil
}
