package http

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/feedproject/feed/cmd/localstack"
	"github.com/feedproject/feed/cmd/localstack/localstacktest"
	"github.com/feedproject/feed/domain"
	"github.com/feedproject/feed/events"
	"github.com/feedproject/feed/http/media"
	"github.com/feedproject/feed/migrations"
	"github.com/feedproject/feed/projections"
	"github.com/feedproject/feed/projections/feeds"
	"github.com/feedproject/feed/projections/feeds/fanout"
	"github.com/feedproject/feed/projections/feeds/homefeed"
	"github.com/feedproject/feed/projections/feeds/inbox"
	"github.com/feedproject/feed/projections/feeds/repair"
	"github.com/feedproject/feed/projections/readmodel"
)

// feedWorld is the whole service in one test: the log, both projectors (the
// read model and the two stages of the feeds), and the app serving GET /feed.
type feedWorld struct {
	log     *events.Log
	rdb     redis.UniversalClient
	store   *feeds.Store
	read    *readmodel.Store
	srv     *Server
	auth    *Authenticator
	readRun *projections.Runner
	planRun *projections.Runner
	reader  *homefeed.Reader
	pages   *homefeed.PageCache // nil on a Redis Cluster
	posts   *readmodel.Cache
	redis   *localstack.Redis // nil on a Redis Cluster
	ids     *domain.IDGenerator
	n       int
	maint   *repair.Maintenance
	js      jetstream.JetStream
	plan    fanout.PlannerConfig
	// deps are srv's, less its metrics, for tests that build another server.
	deps  Deps
	pgURL string
	// beforeCmd, when set, runs (once) before the next command the service
	// sends to Redis that it matches: a fault injected at an exact moment.
	beforeCmd atomic.Pointer[redisFault]
}

type redisFault struct {
	match  func(redis.Cmder) bool
	inject func()
}

// faultHook runs an armed fault before the command it matches.
type faultHook struct{ w *feedWorld }

func (h faultHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h faultHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if f := h.w.beforeCmd.Load(); f != nil && f.match(cmd) && h.w.beforeCmd.CompareAndSwap(f, nil) {
			f.inject()
		}
		return next(ctx, cmd)
	}
}

func (h faultHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func newFeedWorld(t *testing.T, cfg feeds.Config) *feedWorld {
	t.Helper()
	return newFeedWorldWith(t, cfg, nil)
}

// newFeedWorldWith lets a test hold the read model projector back: it starts
// when startReadModel is closed (nil: at once).
func newFeedWorldWith(t *testing.T, cfg feeds.Config, startReadModel <-chan struct{}) *feedWorld {
	t.Helper()
	stack := localstacktest.ForTest(t)
	return buildFeedWorld(t, cfg, startReadModel, worldServers{
		nats: stack.NATS.ClientURL(), postgres: stack.Postgres.URL(), redis: stack.Redis,
		client: func() redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: stack.Redis.Addr()}) },
	})
}

// newClusterFeedWorld is newFeedWorld on a Redis Cluster of three masters
// and three replicas, without a page cache, as the service runs on one.
func newClusterFeedWorld(t *testing.T, cfg feeds.Config) (*feedWorld, *localstacktest.RedisCluster) {
	t.Helper()
	cluster := localstacktest.RedisClusterForTest(t)
	w := buildFeedWorld(t, cfg, nil, worldServers{
		nats: localstacktest.NATSForTest(t).ClientURL(), postgres: localstacktest.PostgresForTest(t).URL(),
		client: func() redis.UniversalClient { return cluster.Client(t) },
	})
	return w, cluster
}

// worldServers are the servers a feedWorld runs on.
type worldServers struct {
	nats, postgres string
	// redis is the one Redis server; nil for a Redis Cluster.
	redis *localstack.Redis
	// client makes a client of the Redis (server or cluster).
	client func() redis.UniversalClient
}

func buildFeedWorld(t *testing.T, cfg feeds.Config, startReadModel <-chan struct{}, servers worldServers) *feedWorld {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	nc, err := nats.Connect(servers.nats, nats.MaxReconnects(-1), nats.ReconnectBufSize(-1))
	require.NoError(t, err)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	log, err := events.OpenLog(ctx, js, events.Config{}, nil)
	require.NoError(t, err)
	pool, err := readmodel.OpenPool(ctx, servers.postgres, migrations.Schema, 0)
	require.NoError(t, err)
	rdb := servers.client()
	require.NoError(t, rdb.ConfigSet(ctx, "zset-max-listpack-entries", "1024").Err())

	quiet := slog.New(slog.DiscardHandler)
	w := &feedWorld{log: log, rdb: rdb, read: readmodel.NewStore(pool), redis: servers.redis}
	// The service's own client, so that faults can be timed to its commands.
	svc := servers.client()
	svc.AddHook(faultHook{w})
	w.store = feeds.NewStore(svc, cfg)
	w.ids, err = domain.NewIDGenerator(5)
	require.NoError(t, err)
	w.js, w.plan = js, fanout.PlannerConfig{Partitions: 3, ItemsPerMessage: 7}
	planner := fanout.NewPlanner(w.store, js, w.plan, nil)
	require.NoError(t, planner.EnsureStream(ctx))
	// Tests make maintenance passes themselves; every inbox is due at once.
	w.maint = repair.NewMaintenance(svc, w.store, planner, repair.MaintenanceConfig{Period: time.Millisecond, Batch: 1000}, quiet)
	fast := projections.RunnerConfig{FetchWait: 200 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}
	w.readRun = projections.NewRunner(log, readmodel.NewProjector(pool, nil), fast, nil, quiet)
	w.planRun = projections.NewRunner(log, planner, fast, nil, quiet)
	appliers := fanout.NewApplier(w.store, js, []int{0, 1, 2}, nil, quiet)
	// Pages are hydrated through the post cache, as the service does.
	w.posts = readmodel.NewCache(w.read, log, readmodel.CacheConfig{}, nil, quiet)
	var wg sync.WaitGroup
	wg.Go(func() { _ = w.posts.Run(ctx) })
	wg.Go(func() {
		if startReadModel != nil {
			select {
			case <-startReadModel:
			case <-ctx.Done():
				return
			}
		}
		_ = w.readRun.Run(ctx)
	})
	wg.Go(func() { _ = w.planRun.Run(ctx) })
	wg.Go(func() { _ = appliers.Run(ctx) })
	wg.Go(func() {
		for ctx.Err() == nil {
			_, _ = planner.Materialise(ctx, 100)
			time.Sleep(5 * time.Millisecond)
		}
	})
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		log.Close()
		nc.Close()
		pool.Close()
		_ = rdb.Close()
		_ = svc.Close()
	})

	w.auth, err = NewAuthenticator(testSecret, nil)
	require.NoError(t, err)
	store, err := media.NewDir(t.TempDir())
	require.NoError(t, err)
	ids, err := domain.NewIDGenerator(2)
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	w.reader = homefeed.NewReader(w.store, js)
	var feedCache HomeFeedCache = w.reader
	if servers.redis != nil {
		// Pages are read through the page cache, as the service does on one
		// Redis.
		w.pages = homefeed.NewPageCache(w.reader, &redis.Options{Addr: servers.redis.Addr()}, homefeed.PageCacheConfig{}, nil, quiet)
		wg.Go(func() { _ = w.pages.Run(ctx) })
		feedCache = w.pages
	}
	w.deps = Deps{
		Logger: quiet, Log: log, Media: store, Auth: w.auth, IDs: ids,
		ReadModel: w.read, FeedCache: feedCache, FeedModel: w.read, FeedPosts: w.posts,
	}
	w.pgURL = servers.postgres
	w.srv = w.server(Config{ConsistencyWait: 5 * time.Second}, reg)
	return w
}

// server is another server of the world's service, with its own metrics.
func (w *feedWorld) server(cfg Config, reg *prometheus.Registry) *Server {
	deps := w.deps
	deps.Registerer, deps.Gatherer = reg, reg
	return NewServer(deps, cfg)
}

// settle waits until both projectors have applied the whole log.
func (w *feedWorld) settle(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	head, err := w.log.Head(ctx)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		rm, err1 := w.read.Position(ctx)
		fp, err2 := w.reader.Position(ctx)
		return err1 == nil && err2 == nil && rm >= head && fp >= head && w.posts.Heard() >= head
	}, 60*time.Second, 10*time.Millisecond, "projectors and the post cache did not reach %d", head)
	if w.pages != nil {
		require.NoError(t, w.pages.Sync(ctx))
	}
}

// page gets one page of user's home feed.
func (w *feedWorld) page(t *testing.T, user domain.UserID, cursor string) feedPageView {
	t.Helper()
	url := "/feed"
	if cursor != "" {
		url += "?cursor=" + cursor
	}
	req := httptest.NewRequest(http.MethodGet, url, nil)
	tok, err := w.auth.Mint(user, false, time.Now(), time.Hour)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := w.srv.App().Test(req, 30_000)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var v feedPageView
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&v))
	return v
}

// pageAll pages the user's feed to has_more=false and returns the post ids.
func (w *feedWorld) pageAll(t *testing.T, user domain.UserID) []string {
	t.Helper()
	ids := []string{}
	cursor := ""
	for range 1000 {
		v := w.page(t, user, cursor)
		for _, p := range v.Posts {
			ids = append(ids, p.ID)
		}
		if !v.HasMore {
			require.Nil(t, v.NextCursor, "the last page has no cursor")
			return ids
		}
		require.NotNil(t, v.NextCursor)
		cursor = *v.NextCursor
	}
	t.Fatal("more than 1000 pages")
	return nil
}

// truth is the user's feed by the pull query over the read model.
func (w *feedWorld) truth(t *testing.T, user domain.UserID) []string {
	t.Helper()
	entries, err := w.read.Feed(context.Background(), user, nil, 1_000_000)
	require.NoError(t, err)
	ids := make([]string, len(entries))
	for i, e := range entries {
		ids[i] = e.PostID.String()
	}
	return ids
}

// model drives random operations and remembers who wrote what.
type model struct {
	t      *testing.T
	w      *feedWorld
	rng    *rand.Rand
	ids    *domain.IDGenerator
	clock  time.Time
	users  int
	author map[domain.PostID]domain.UserID
	live   []domain.PostID
	n      int
}

func (m *model) append(ev events.Event) {
	m.n++
	_, err := m.w.log.AppendEvent(context.Background(), fmt.Sprintf("m%d", m.n), m.clock, ev)
	require.NoError(m.t, err)
}

func (m *model) user() domain.UserID { return domain.UserID(m.rng.IntN(m.users) + 1) }

func (m *model) step() {
	ctx := context.Background()
	// Many posts share a millisecond; sometimes time jumps.
	if m.rng.IntN(4) == 0 {
		m.clock = m.clock.Add(time.Duration(m.rng.IntN(3000)) * time.Millisecond)
	}
	a, b := m.user(), m.user()
	switch k := m.rng.IntN(100); {
	case k < 28:
		// The first three users are big accounts in the making: they post more.
		if m.rng.IntN(3) == 0 {
			a = domain.UserID(m.rng.IntN(3) + 1)
		}
		id, at := m.ids.Next(m.clock)
		m.author[domain.PostID(id)] = a
		m.live = append(m.live, domain.PostID(id))
		m.append(events.PostCreated{PostID: domain.PostID(id), UserID: a, CreatedAt: at,
			Media: []events.Media{{Key: fmt.Sprintf("%064d.png", id), ContentType: "image/png", Width: 1, Height: 1, Size: 1}}})
	case k < 34 && len(m.live) > 0:
		i := m.rng.IntN(len(m.live))
		p := m.live[i]
		m.live = slices.Delete(m.live, i, i+1)
		m.append(events.PostDeleted{PostID: p, UserID: m.author[p], DeletedAt: m.clock})
	case k < 37 && len(m.live) > 0:
		p := m.live[m.rng.IntN(len(m.live))]
		m.append(events.PostEdited{PostID: p, UserID: m.author[p], Caption: "edited", EditedAt: m.clock})
	case k < 62:
		if m.rng.IntN(2) == 0 {
			b = domain.UserID(m.rng.IntN(3) + 1) // everyone follows the big ones
		}
		if a != b {
			m.append(events.UserFollowed{FollowerID: a, FolloweeID: b})
		}
	case k < 72:
		if a != b {
			m.append(events.UserUnfollowed{FollowerID: a, FolloweeID: b})
		}
	case k < 76:
		// Flapping: a burst of follow/unfollow of one pair.
		if a != b {
			for range 2 + m.rng.IntN(5) {
				if m.rng.IntN(2) == 0 {
					m.append(events.UserFollowed{FollowerID: a, FolloweeID: b})
				} else {
					m.append(events.UserUnfollowed{FollowerID: a, FolloweeID: b})
				}
			}
		}
	case k < 94:
		// A read: materialises the reader's inbox (served from Postgres meanwhile).
		m.w.page(m.t, a, "")
	default:
		// An inbox expires.
		require.NoError(m.t, m.w.rdb.Del(ctx, fmt.Sprintf("feed:v1:{%d}:iy", a)).Err())
	}
}

// check asserts the invariants for every user once the projectors caught up:
// paging GET /feed to the end equals the pull query exactly, and every
// materialised inbox holds exactly the feed's non-big posts above its floor.
func (m *model) check() {
	m.w.settle(m.t)
	ctx := context.Background()
	big, err := m.w.store.BigAccounts(ctx)
	require.NoError(m.t, err)
	materialised := 0
	for u := 1; u <= m.users; u++ {
		user := domain.UserID(u)
		truth := m.w.truth(m.t, user)
		got := m.w.pageAll(m.t, user)
		require.Equal(m.t, truth, got, "user %d: paging GET /feed must yield the pull feed", u)

		held, floor, _, ok, err := inbox.ReadAll(ctx, m.w.store, user)
		require.NoError(m.t, err)
		if !ok {
			continue
		}
		materialised++
		want := []string{}
		for _, id := range truth {
			p, _ := domain.ParsePostID(id)
			if int64(p) >= floor && !slices.Contains(big, m.author[p]) {
				want = append(want, id)
			}
		}
		have := []string{}
		for _, p := range held {
			if !slices.Contains(big, m.author[p]) {
				have = append(have, p.String())
			}
		}
		require.Equal(m.t, want, have, "user %d: the inbox above its floor %d", u, floor)
	}
	m.t.Logf("%d events, %d of %d users materialised, big accounts %v", m.n, materialised, m.users, big)
}

func runModel(t *testing.T, cfg feeds.Config, steps int, seed uint64) {
	runModelIn(t, newFeedWorld(t, cfg), steps, seed)
}

func runModelIn(t *testing.T, w *feedWorld, steps int, seed uint64) {
	ids, err := domain.NewIDGenerator(0)
	require.NoError(t, err)
	m := &model{t: t, w: w, rng: rand.New(rand.NewPCG(seed, seed)), ids: ids,
		clock: time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC), users: 50, author: map[domain.PostID]domain.UserID{}}
	for i := range steps {
		m.step()
		if i == steps/2 {
			// Redis is lost mid-run: the planner replays, inboxes come back on read.
			require.NoError(t, w.flushAll(context.Background()))
		}
		if i == steps/4 || i == 3*steps/4 {
			m.check()
		}
	}
	m.check()
	// In a correct system, checking every inbox repairs nothing.
	n, err := w.maint.Pass(context.Background())
	require.NoError(t, err)
	require.Positive(t, n, "maintenance visited the materialised inboxes")
	m.check()
	assert.Zero(t, w.store.Repairs(), "a correct system needs no repair")
}

// TestFeedInvariantsSmallCaps runs the model with caps of 20, so trimming,
// floors and the fall-back to Postgres below them happen all the time, a
// big-account threshold of 8 followers, and inboxes in segments of 3 posts,
// so that their edges are crossed all the time too.
func TestFeedInvariantsSmallCaps(t *testing.T) {
	runModel(t, feeds.Config{InboxCap: 20, SegmentSize: 3, OutboxCap: 20, BigThreshold: 8}, 1500, 1)
}

// TestFeedInvariantsRealCaps runs it with the production caps.
func TestFeedInvariantsRealCaps(t *testing.T) {
	runModel(t, feeds.Config{BigThreshold: 15}, 1500, 2)
}

func TestFeedOfSomeoneFollowingNobody(t *testing.T) {
	w := newFeedWorld(t, feeds.Config{})
	v := w.page(t, 77, "")
	assert.Empty(t, v.Posts)
	assert.NotNil(t, v.Posts, "an empty list, not null")
	assert.Nil(t, v.NextCursor)
	assert.False(t, v.HasMore)
}

// flushAll loses everything Redis holds: on a cluster, every master's share.
func (w *feedWorld) flushAll(ctx context.Context) error {
	if c, ok := w.rdb.(*redis.ClusterClient); ok {
		return c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return m.FlushAll(ctx).Err() })
	}
	return w.rdb.FlushAll(ctx).Err()
}
