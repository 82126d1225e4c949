package http

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

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
	"github.com/feedproject/feed/projections/readmodel"
)

const (
	// homeClients is how many clients read the home feed at once.
	homeClients = 16
	// homeLoadTime is how long each load runs; homePartTime, each load of a
	// part of a request.
	homeLoadTime = 2 * time.Second
	homePartTime = time.Second
	// The reader follows homeAuthors accounts of homePosts posts each.
	homeAuthors = 50
	homePosts   = 40
	// homeDeepPage is the deeper page measured (0 is the first): its posts are
	// still in the inbox (cap 500).
	homeDeepPage = 40
)

// homeReader is the user whose home feed is read.
const homeReader domain.UserID = 1

// homeBench is the whole service, served over loopback HTTP: the log, the
// read model and both feed stages projecting it, and the app.
type homeBench struct {
	log   *events.Log
	store *feeds.Store
	read  *readmodel.Store
	feeds *homefeed.Reader
	reg   *prometheus.Registry
	auth  *Authenticator
	base  string
	// pullBase is a second app on the same stores whose GET /feed serves every
	// page from the pull query (its cache never has the inbox) and hydrates
	// from Postgres: the same pages, the same HTTP path, without the caches.
	pullBase string
}

// pullOnly is a home feed cache that never has an inbox, so that GET /feed
// serves every page from the read model.
type pullOnly struct{ HomeFeedCache }

func (pullOnly) Page(context.Context, domain.UserID, int64, int, uint64) (inbox.Page, error) {
	return inbox.Page{}, nil
}

func (pullOnly) RequestMaterialise(context.Context, domain.UserID) error { return nil }

func newHomeBench(b *testing.B) *homeBench {
	b.Helper()
	stack := localstacktest.ForTest(b)
	ctx, cancel := context.WithCancel(context.Background())
	nc, err := nats.Connect(stack.NATS.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectBufSize(-1))
	if err != nil {
		b.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	log, err := events.OpenLog(ctx, js, events.Config{}, nil)
	if err != nil {
		b.Fatal(err)
	}
	pool, err := readmodel.OpenPool(ctx, stack.Postgres.URL(), migrations.Schema, 0)
	if err != nil {
		b.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: stack.Redis.Addr()})
	if err := rdb.ConfigSet(ctx, "zset-max-listpack-entries", "1024").Err(); err != nil {
		b.Fatal(err)
	}

	quiet := slog.New(slog.DiscardHandler)
	h := &homeBench{log: log, store: feeds.NewStore(rdb, feeds.Config{}), read: readmodel.NewStore(pool), reg: prometheus.NewRegistry()}
	planner := fanout.NewPlanner(h.store, js, fanout.PlannerConfig{}, nil)
	if err := planner.EnsureStream(ctx); err != nil {
		b.Fatal(err)
	}
	fast := projections.RunnerConfig{FetchWait: 200 * time.Millisecond, MaxBackoff: 50 * time.Millisecond}
	readRun := projections.NewRunner(log, readmodel.NewProjector(pool, nil), fast, nil, quiet)
	planRun := projections.NewRunner(log, planner, fast, nil, quiet)
	appliers := fanout.NewApplier(h.store, js, []int{0, 1, 2, 3}, nil, quiet)
	var wg sync.WaitGroup
	wg.Go(func() { _ = readRun.Run(ctx) })
	wg.Go(func() { _ = planRun.Run(ctx) })
	wg.Go(func() { _ = appliers.Run(ctx) })
	wg.Go(func() {
		for ctx.Err() == nil {
			_, _ = planner.Materialise(ctx, 100)
			time.Sleep(5 * time.Millisecond)
		}
	})

	h.auth, err = NewAuthenticator(testSecret, nil)
	if err != nil {
		b.Fatal(err)
	}
	dir, err := media.NewDir(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	ids, err := domain.NewIDGenerator(2)
	if err != nil {
		b.Fatal(err)
	}
	h.feeds = homefeed.NewReader(h.store, js)
	posts := readmodel.NewCache(h.read, log, readmodel.CacheConfig{}, h.reg, quiet)
	wg.Go(func() { _ = posts.Run(ctx) })
	pages := homefeed.NewPageCache(h.feeds, &redis.Options{Addr: stack.Redis.Addr()}, homefeed.PageCacheConfig{}, h.reg, quiet)
	wg.Go(func() { _ = pages.Run(ctx) })
	srv := NewServer(Deps{
		Logger: quiet, Registerer: h.reg, Gatherer: h.reg, Log: log, Media: dir, Auth: h.auth, IDs: ids,
		ReadModel: h.read, FeedCache: pages, FeedModel: h.read, FeedPosts: posts,
	}, Config{})
	pullReg := prometheus.NewRegistry()
	pullSrv := NewServer(Deps{
		Logger: quiet, Registerer: pullReg, Gatherer: pullReg, Log: log, Media: dir, Auth: h.auth, IDs: ids,
		ReadModel: h.read, FeedCache: pullOnly{h.feeds}, FeedModel: h.read,
	}, Config{})
	serve := func(srv *Server) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		go func() { _ = srv.Serve(ln) }()
		return "http://" + ln.Addr().String()
	}
	h.base, h.pullBase = serve(srv), serve(pullSrv)
	b.Cleanup(func() {
		_ = srv.Shutdown(context.Background())
		_ = pullSrv.Shutdown(context.Background())
		cancel()
		wg.Wait()
		log.Close()
		nc.Close()
		pool.Close()
		_ = rdb.Close()
	})
	return h
}

// seed has homeReader follow homeAuthors accounts, each of which then posts
// homePosts times, interleaved, and waits for both projections to apply it all.
func (h *homeBench) seed(b *testing.B) {
	b.Helper()
	ctx := context.Background()
	gen, err := domain.NewIDGenerator(0)
	if err != nil {
		b.Fatal(err)
	}
	clock := time.Now().Add(-24 * time.Hour)
	n := 0
	appendEvent := func(ev events.Event) {
		n++
		if _, err := h.log.AppendEvent(ctx, fmt.Sprintf("home-bench-%d", n), clock, ev); err != nil {
			b.Fatal(err)
		}
	}
	for a := range homeAuthors {
		appendEvent(events.UserFollowed{FollowerID: homeReader, FolloweeID: domain.UserID(100 + a)})
	}
	for i := range homePosts {
		for a := range homeAuthors {
			clock = clock.Add(7 * time.Second)
			id, at := gen.Next(clock)
			appendEvent(events.PostCreated{
				PostID: domain.PostID(id), UserID: domain.UserID(100 + a), CreatedAt: at,
				Caption: fmt.Sprintf("post %d of author %d, a caption of ordinary length", i, 100+a),
				Media:   []events.Media{{Key: fmt.Sprintf("%064d.jpg", id), ContentType: "image/jpeg", Width: 1080, Height: 1350, Size: 180_000}},
			})
		}
	}
	head, err := h.log.Head(ctx)
	if err != nil {
		b.Fatal(err)
	}
	h.await(b, "the projections to apply the log", func() bool {
		rm, err1 := h.read.Position(ctx)
		fp, err2 := h.feeds.Position(ctx)
		return err1 == nil && err2 == nil && rm >= head && fp >= head
	})
}

func (h *homeBench) await(b *testing.B, what string, ok func() bool) {
	b.Helper()
	for deadline := time.Now().Add(time.Minute); !ok(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			b.Fatalf("timed out waiting for %s", what)
		}
	}
}

// get is one GET /feed of the reader.
func (h *homeBench) get(client *http.Client, token, cursor string) (feedPageView, error) {
	return h.getFrom(h.base, client, token, cursor)
}

// getFrom is one GET /feed of the reader from the app at base.
func (h *homeBench) getFrom(base string, client *http.Client, token, cursor string) (feedPageView, error) {
	body, err := h.raw(base, client, token, cursor)
	if err != nil {
		return feedPageView{}, err
	}
	var v feedPageView
	if err := json.Unmarshal(body, &v); err != nil {
		return feedPageView{}, fmt.Errorf("GET /feed: %w", err)
	}
	return v, nil
}

// raw is the body of one GET /feed of the reader from the app at base.
func (h *homeBench) raw(base string, client *http.Client, token, cursor string) ([]byte, error) {
	url := base + "/feed"
	if cursor != "" {
		url += "?cursor=" + cursor
	}
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %d %s", url, resp.StatusCode, body)
	}
	return body, nil
}

// same gets the page at cursor from the app at base and checks it is want.
func (h *homeBench) same(base string, client *http.Client, token, cursor string, want []byte) error {
	body, err := h.raw(base, client, token, cursor)
	if err == nil && !bytes.Equal(body, want) {
		err = fmt.Errorf("GET /feed from %s: the page differs: %s", base, body)
	}
	return err
}

// pages served from the cache so far (feed_home_pages_total{source="cache"}).
func (h *homeBench) cachePages(b *testing.B) float64 {
	return h.counter(b, "feed_home_pages_total", "source", "cache")
}

// memoryPages is how many of them the page cache served from memory.
func (h *homeBench) memoryPages(b *testing.B) float64 {
	return h.counter(b, "feed_page_cache_lookups_total", "result", "hit")
}

// counter is the value of the counter family{label="value"}.
func (h *homeBench) counter(b *testing.B, family, label, value string) float64 {
	b.Helper()
	families, err := h.reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != family {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// pageBefore is the id a page starts below (0: the newest).
func pageBefore(after *domain.Cursor) int64 {
	if after == nil {
		return 0
	}
	return after.ID
}

// homeLoadStats summarises a load: operations per second and latency percentiles.
type homeLoadStats struct {
	rate     float64
	p50, p99 time.Duration
}

func (s homeLoadStats) String() string {
	return fmt.Sprintf("%8.0f/s  p50 %7.2f ms  p99 %7.2f ms", s.rate, millis(s.p50), millis(s.p99))
}

func millis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// homeLoad runs op from homeClients goroutines for d.
func homeLoad(b *testing.B, d time.Duration, op func(context.Context) error) homeLoadStats {
	b.Helper()
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		all      []time.Duration
		firstErr atomic.Value
	)
	start := time.Now()
	deadline := start.Add(d)
	for range homeClients {
		wg.Go(func() {
			var mine []time.Duration
			for time.Now().Before(deadline) {
				t := time.Now()
				if err := op(context.Background()); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				mine = append(mine, time.Since(t))
			}
			mu.Lock()
			all = append(all, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err, _ := firstErr.Load().(error); err != nil {
		b.Fatal(err)
	}
	if len(all) == 0 {
		b.Fatal("no operation completed")
	}
	slices.Sort(all)
	return homeLoadStats{
		rate: float64(len(all)) / elapsed.Seconds(),
		p50:  all[len(all)/2],
		p99:  all[len(all)*99/100],
	}
}

// BenchmarkHomeFeed measures, in one run on one machine: GET /feed requests/s
// and p50/p99 latency for cached pages, through the real app on loopback HTTP
// with 16 clients, for a reader following 50 accounts of 40 posts each whose
// inbox is materialised (every page checked to come from the cache by
// feed_home_pages_total{source="cache"}), read through the page cache (the
// share it served from memory is printed) and hydrated from the post cache;
// next to the same pages served by the same GET /feed from the pull query (an
// app whose feed cache never has the inbox and which hydrates from Postgres);
// and the ratio (target >= 10x). It also prints the pull query's own calls
// (Feed and Posts, no HTTP) by as many goroutines. It does so for the first page and
// for a deeper page still inside the inbox. Beside them it prints the parts a
// request is made of: the page's ids from the cache (homefeed.Reader.Page) and
// from the pull query (Feed), the hydration (Posts) that both paths run, and
// the feeds' position that every GET /feed reads.
//
//	go test -run '^$' -bench BenchmarkHomeFeed -benchtime 1x ./http
func BenchmarkHomeFeed(b *testing.B) {
	h := newHomeBench(b)
	h.seed(b)
	token, err := h.auth.Mint(homeReader, false, time.Now(), time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: homeClients}, Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()

	// The first read finds no inbox, is served by the pull query and asks for
	// the inbox, which the planner and an applier then build.
	if _, err := h.get(client, token, ""); err != nil {
		b.Fatal(err)
	}
	inboxCap := h.store.Config().InboxCap
	h.await(b, "the reader's inbox", func() bool {
		posts, _, _, ok, err := inbox.ReadAll(context.Background(), h.store, homeReader)
		return err == nil && ok && len(posts) == inboxCap
	})

	// The cursors of the pages measured, found by paging through the app; each
	// page must equal the pull query's.
	cursors := []string{""}
	for page := 0; page < homeDeepPage; page++ {
		v, err := h.get(client, token, cursors[page])
		if err != nil {
			b.Fatal(err)
		}
		if v.NextCursor == nil {
			b.Fatalf("page %d is the last", page)
		}
		cursors = append(cursors, *v.NextCursor)
	}
	pages := []struct {
		name   string
		cursor string
	}{{"first", cursors[0]}, {fmt.Sprintf("page-%d", homeDeepPage+1), cursors[homeDeepPage]}}
	for _, p := range pages {
		cur, _, err := domain.ParseCursor(p.cursor)
		if err != nil {
			b.Fatal(err)
		}
		var after *domain.Cursor
		if p.cursor != "" {
			after = &cur
		}
		pull := func(ctx context.Context) ([]domain.PostID, error) {
			entries, err := h.read.Feed(ctx, homeReader, after, domain.PageSize+1)
			if err != nil {
				return nil, err
			}
			ids := make([]domain.PostID, 0, domain.PageSize)
			for _, e := range entries[:min(len(entries), domain.PageSize)] {
				ids = append(ids, e.PostID)
			}
			posts, err := h.read.Posts(ctx, ids, homeReader)
			if err != nil {
				return nil, err
			}
			if len(posts) != len(ids) {
				return nil, fmt.Errorf("%d of %d posts hydrated", len(posts), len(ids))
			}
			return ids, nil
		}
		want, err := pull(context.Background())
		if err != nil {
			b.Fatal(err)
		}
		// Every response under load must be this page, byte for byte (the
		// posts do not change meanwhile): as strict as decoding it, and cheap
		// enough that the clients' work does not crowd out the server's.
		body, err := h.raw(h.base, client, token, p.cursor)
		if err != nil {
			b.Fatal(err)
		}
		for _, base := range []string{h.base, h.pullBase} {
			got, err := h.getFrom(base, client, token, p.cursor)
			if err != nil {
				b.Fatal(err)
			}
			if len(got.Posts) != domain.PageSize || len(want) != domain.PageSize {
				b.Fatalf("%s page: %d posts over HTTP, %d by the pull query; want %d", p.name, len(got.Posts), len(want), domain.PageSize)
			}
			for i, post := range got.Posts {
				if post.ID != want[i].String() {
					b.Fatalf("%s page: post %d is %s over HTTP, %s by the pull query", p.name, i, post.ID, want[i])
				}
			}
		}

		b.Run(p.name, func(b *testing.B) {
			for b.Loop() {
				servedBefore, memoryBefore := h.cachePages(b), h.memoryPages(b)
				var requests atomic.Int64
				cached := homeLoad(b, homeLoadTime, func(context.Context) error {
					requests.Add(1)
					return h.same(h.base, client, token, p.cursor, body)
				})
				if fromCache := h.cachePages(b) - servedBefore; fromCache != float64(requests.Load()) {
					b.Fatalf("%.0f of %d pages served from the cache", fromCache, requests.Load())
				}
				fromMemory := (h.memoryPages(b) - memoryBefore) / float64(requests.Load())
				pulled := homeLoad(b, homeLoadTime, func(context.Context) error {
					return h.same(h.pullBase, client, token, p.cursor, body)
				})
				direct := homeLoad(b, homeLoadTime, func(ctx context.Context) error {
					_, err := pull(ctx)
					return err
				})
				ratio := cached.rate / pulled.rate
				b.ReportMetric(cached.rate, "cached-req/s")
				b.ReportMetric(millis(cached.p50), "cached-p50-ms")
				b.ReportMetric(millis(cached.p99), "cached-p99-ms")
				b.ReportMetric(pulled.rate, "pull-req/s")
				b.ReportMetric(millis(pulled.p99), "pull-p99-ms")
				b.ReportMetric(direct.rate, "pull-queries/s")
				b.ReportMetric(ratio, "ratio")
				b.ReportMetric(fromMemory, "page-cache-hit-ratio")
				fmt.Fprintf(os.Stderr, "%-8s cached GET /feed %s | GET /feed by the pull query %s | ratio %.2fx (target >= 10x); %.1f %% of the ids from the page cache\n",
					p.name, cached, pulled, ratio, 100*fromMemory)
				fmt.Fprintf(os.Stderr, "%-8s   the pull query's Feed+Posts called directly, no HTTP %s: cached GET /feed is %.2fx that\n",
					p.name, direct, cached.rate/direct.rate)

				// The parts, to tell where a request's time goes: the page's
				// ids from the cache and from the pull query, and the hydration
				// both paths share.
				cacheIDs := homeLoad(b, homePartTime, func(ctx context.Context) error {
					page, err := h.feeds.Page(ctx, homeReader, pageBefore(after), domain.PageSize+1, 0)
					if err == nil && len(page.Posts) != domain.PageSize+1 {
						err = fmt.Errorf("the cache has %d posts of the page", len(page.Posts))
					}
					return err
				})
				pullIDs := homeLoad(b, homePartTime, func(ctx context.Context) error {
					_, err := h.read.Feed(ctx, homeReader, after, domain.PageSize+1)
					return err
				})
				hydrate := homeLoad(b, homePartTime, func(ctx context.Context) error {
					_, err := h.read.Posts(ctx, want, homeReader)
					return err
				})
				position := homeLoad(b, homePartTime, func(ctx context.Context) error {
					_, err := h.feeds.Position(ctx)
					return err
				})
				b.ReportMetric(cacheIDs.rate, "cache-ids/s")
				b.ReportMetric(pullIDs.rate, "pull-ids/s")
				b.ReportMetric(hydrate.rate, "hydrations/s")
				b.ReportMetric(position.rate, "positions/s")
				fmt.Fprintf(os.Stderr, "%-8s   parts: ids from the cache (Reader.Page) %s | ids from the pull query (Feed) %s: %.2fx\n",
					p.name, cacheIDs, pullIDs, cacheIDs.rate/pullIDs.rate)
				fmt.Fprintf(os.Stderr, "%-8s          hydration from Postgres (Posts: the pull path, and cache misses) %s | feeds position (Reader.Position, cached path) %s\n",
					p.name, hydrate, position)
			}
		})
	}
}
